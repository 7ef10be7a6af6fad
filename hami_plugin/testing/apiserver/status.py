"""Failures as the API server answers them: `metav1.Status` bodies with its reasons and
messages."""

from __future__ import annotations

from hami_plugin.testing.apiserver.objects import JsonObject


class ApiError(Exception):
    """Raised inside the double to answer with a metav1.Status."""

    def __init__(self, code: int, reason: str, message: str, details: JsonObject | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status_body(self) -> JsonObject:
        """The metav1.Status failure body for this error."""
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    501: "NotImplemented",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str | None = None) -> JsonObject:
    """A metav1.Status failure body for `code`."""
    reason = _REASONS.get(code, "Unknown")
    return ApiError(code, reason, message or f"injected fault: {reason}").status_body()


def not_found(plural: str, name: str) -> ApiError:
    """The 404 for an object that is not stored."""
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


def expired_status(message: str) -> JsonObject:
    """The 410 Expired Status a watch from a compacted version gets in its ERROR event."""
    return ApiError(410, "Expired", message).status_body()
