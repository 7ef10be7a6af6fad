"""The errors of the Kubernetes adapter and the one point that translates the client library's.

kopf's habit: `ApiException` (raised for a non-2xx answer, as the generated API would, and for a
watch ERROR event) and urllib3's errors become `NotFound`, `Conflict`, `Gone`, `Retryable` or
`KubeError` in `translate_errors`, chained with `from`, and nothing above this package sees the
library's types.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
from collections.abc import Iterator, Mapping
from datetime import UTC
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from hami_plugin.clock import Clock


class KubeError(Exception):
    """A Kubernetes API call failed; the message names the call and the object.

    `status` is the HTTP status when the server answered, else None.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):  # noqa: N818 - names are the shared contract
    """The object does not exist (HTTP 404)."""


class Conflict(KubeError):  # noqa: N818 - names are the shared contract
    """The write lost a race (HTTP 409): resourceVersion mismatch or the object already exists."""


class Gone(KubeError):  # noqa: N818 - names are the shared contract
    """The resourceVersion or continue token is older than the server keeps (HTTP 410, or a
    watch ERROR event with code 410): list again."""


class Retryable(KubeError):  # noqa: N818 - names are the shared contract
    """A transient failure (429, 5xx, connection error, timeout) that outlived the retries.

    Inside the retry loop it also carries the server's `Retry-After` hint, in seconds.
    """

    def __init__(
        self, message: str, status: int | None = None, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(message, status)
        self.retry_after_seconds = retry_after_seconds


class InvalidName(KubeError):  # noqa: N818 - names are the shared contract
    """A namespace, name or node name that cannot go into a request as it is (one that would
    change the API path or the selector, `hami_plugin.kube.paths`): refused before anything is
    sent, as client-go refuses it. Never retried."""


TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
"""Failures below HTTP: refused or dropped connections, timeouts, broken responses."""


@contextlib.contextmanager
def translate_errors(what: str, *, clock: Clock) -> Iterator[None]:
    """Map client-library failures inside the block to `KubeError` types, chained with `from`.

    `what` names the call and the object ("get pod default/p1"). A `ValueError` means a body we
    could not decode (bad JSON, wrong shape) and becomes a plain `KubeError`. `clock.now()`
    turns a `Retry-After` date into seconds.
    """
    try:
        yield
    except KubeError:
        raise
    except ApiException as exc:
        raise _from_api_exception(what, exc, clock) from exc
    except TRANSPORT_ERRORS as exc:
        raise Retryable(f"{what}: {describe_transport_error(exc)}") from exc
    except ValueError as exc:
        raise KubeError(f"{what}: malformed response from the API server: {exc}") from exc


def status_exception(status: Mapping[str, Any]) -> ApiException:
    """A watch ERROR event's metav1.Status as the ApiException an HTTP answer with its code would
    raise, for `translate_errors` (a code that is not a number counts as 500)."""
    code = status.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        code = 500
    return ApiException(
        status=code, reason=str(status.get("reason") or ""), body=json.dumps(dict(status))
    )


def describe_transport_error(exc: BaseException) -> str:
    """A transport failure in a few words: "timed out (...)" or "connection failed: ..."."""
    # MaxRetryError wraps the real cause; name that one.
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    # urllib3 makes NewConnectionError a ConnectTimeoutError; a refused connection is no timeout.
    timeout = urllib3.exceptions.TimeoutError | TimeoutError
    if isinstance(exc, timeout) and not isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"timed out ({exc})"
    return f"connection failed: {type(exc).__name__}: {exc}"


def _from_api_exception(what: str, exc: ApiException, clock: Clock) -> KubeError:
    status = exc.status if isinstance(exc.status, int) else None
    detail = _status_message(exc.body) or str(exc.reason or "").strip() or "no detail"
    if not status:
        # status 0: the client could not build or send the request (TLS setup, body encoding).
        return KubeError(f"{what}: {detail}")
    message = f"{what}: HTTP {status}: {detail}"
    if status == 404:
        return NotFound(message, status)
    if status == 409:
        return Conflict(message, status)
    if status == 410:
        return Gone(message, status)
    if status == 429 or 500 <= status <= 599:
        return Retryable(message, status, _retry_after_seconds(exc, clock))
    return KubeError(message, status)


def _status_message(body: object) -> str:
    """The `message` of a metav1.Status body, else the first 200 characters of the body."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body.strip():
        return ""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body.strip()[:200]
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return body.strip()[:200]


def _retry_after_seconds(exc: ApiException, clock: Clock) -> float | None:
    headers = exc.headers
    if not headers:
        return None
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" says UTC without claiming a zone; the parser leaves it naive
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - clock.now()).total_seconds())
