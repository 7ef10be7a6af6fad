"""The AdmissionReview around the webhook's decision (`hami_plugin.scheduler.webhook`).

A POST /webhook body, or an AdmissionReview (v1 or v1beta1, as a decoded JSON object), goes in;
`admit_pod` decides for the pod it carries; the AdmissionReview response in the same apiVersion
comes out, with the changes as a base64 RFC 6902 JSON patch (`patchType: JSONPatch`), and is
rendered as Go's `json.Encoder` writes it. No I/O.

How controller-runtime (HAMi's webhook server) answers, and so does the extender's
`admission_reply` (`hami_plugin.extender.wire`): always HTTP 200 with an AdmissionReview; a
denial carries `status.code` 403 and reason `Forbidden`, an error carries `status.code` 500
(400 for an unreadable request) and `allowed: false`. kube-apiserver rejects the pod with the
message in both cases. (An HTTP 500 would instead be
a failed call, which the chart's `failurePolicy: Ignore` turns into admitting the pod.)
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami_plugin.logsafe import from_caller, safe_text
from hami_plugin.protocol.gojson import (
    JSON_CONTENT_TYPE,
    GoJsonError,
    decode_go_json,
    encode_go_json,
)
from hami_plugin.scheduler.webhook import (
    AdmissionVerdict,
    PodAdmission,
    WebhookSettings,
    admit_pod,
    errored,
)

__all__ = [
    "ADMISSION_V1",
    "ADMISSION_V1BETA1",
    "WEBHOOK_MAX_BODY_BYTES",
    "AdmissionOutcome",
    "render_admission_review",
    "review_admission",
    "review_admission_body",
]

logger = logging.getLogger(__name__)

ADMISSION_V1 = "admission.k8s.io/v1"
ADMISSION_V1BETA1 = "admission.k8s.io/v1beta1"
ADMISSION_REVIEW = "AdmissionReview"
WEBHOOK_MAX_BODY_BYTES = 7 * 1024 * 1024
"""controller-runtime v0.24's limit (webhook/admission/http.go maxRequestSize): two objects of
at most 3 MiB each plus the rest of the request."""


@dataclass(frozen=True, slots=True)
class AdmissionOutcome:
    """The answer (`admission`) and the AdmissionReview response that carries it (`review`,
    a JSON object in Go's field order, same apiVersion as the request)."""

    admission: PodAdmission
    review: Mapping[str, Any]


def _review(api_version: str, uid: str, admission: PodAdmission) -> dict[str, Any]:
    # metav1.Status: metadata (a struct, never omitted), message, reason, code.
    status: dict[str, Any] = {"metadata": {}}
    if admission.message:
        status["message"] = admission.message
    if admission.verdict is AdmissionVerdict.DENIED:
        status["reason"] = "Forbidden"
    status["code"] = admission.code
    response: dict[str, Any] = {"uid": uid, "allowed": admission.allowed, "status": status}
    if admission.patch:
        encoded = base64.b64encode(encode_go_json(list(admission.patch)))
        response["patch"] = encoded.decode("ascii")
        response["patchType"] = "JSONPatch"
    return {"kind": ADMISSION_REVIEW, "apiVersion": api_version, "response": response}


def _outcome(api_version: str, uid: str, admission: PodAdmission) -> AdmissionOutcome:
    return AdmissionOutcome(admission, _review(api_version, uid, admission))


def review_admission(review: object, settings: WebhookSettings) -> AdmissionOutcome:
    """Answer an AdmissionReview request (a decoded JSON object) in its own apiVersion
    (`admission.k8s.io/v1` when it names none). An unreadable review is answered as
    controller-runtime does, `allowed: false` with code 400. Never raises."""
    api_version, uid = ADMISSION_V1, ""
    if not isinstance(review, Mapping):
        return _outcome(api_version, uid, errored(400, "the admission review is not an object"))
    given_version = review.get("apiVersion") or ADMISSION_V1
    kind = review.get("kind") or ADMISSION_REVIEW
    if given_version not in (ADMISSION_V1, ADMISSION_V1BETA1) or kind != ADMISSION_REVIEW:
        message = f'no kind "{kind}" is registered for version "{given_version}"'
        return _outcome(api_version, uid, errored(400, message))
    api_version = str(given_version)
    request = review.get("request")
    if not isinstance(request, Mapping):
        return _outcome(api_version, uid, errored(400, "there is no content to decode"))
    given_uid = request.get("uid")
    uid = given_uid if isinstance(given_uid, str) else ""
    # Anyone may call the webhook: what it logs is escaped, cut (logsafe.safe_text, also
    # when no SafeFormatter is installed) and rate-limited per message (from_caller).
    try:
        admission = admit_pod(request.get("object"), settings)
    except Exception as error:  # a bug here must not take the webhook down
        logger.exception(
            "admission of pod %s failed unexpectedly", _pod_key(request), extra=_FROM_WEBHOOK
        )
        admission = errored(500, f"internal error: {error}")
    if admission.verdict is AdmissionVerdict.DENIED:
        logger.info(
            "denying pod %s (uid %s): %s",
            _pod_key(request),
            safe_text(uid),
            safe_text(admission.message),
            extra=_FROM_WEBHOOK,
        )
    elif admission.verdict is AdmissionVerdict.ERRORED:
        logger.warning(
            "rejecting pod %s (uid %s): %s",
            _pod_key(request),
            safe_text(uid),
            safe_text(admission.message),
            extra=_FROM_WEBHOOK,
        )
    return _outcome(api_version, uid, admission)


_FROM_WEBHOOK = from_caller("webhook")


def _pod_key(request: Mapping[str, Any]) -> str:
    """`<namespace>/<name>` as the request states them, escaped and cut for a log line."""
    pod = request.get("object")
    metadata = pod.get("metadata") if isinstance(pod, Mapping) else None
    name = request.get("name") or (metadata.get("name") if isinstance(metadata, Mapping) else "")
    return f"{safe_text(request.get('namespace') or '')}/{safe_text(name or '')}"


def review_admission_body(
    body: bytes,
    settings: WebhookSettings,
    *,
    content_type: str = JSON_CONTENT_TYPE,
    max_bytes: int = WEBHOOK_MAX_BODY_BYTES,
) -> AdmissionOutcome:
    """Answer a POST /webhook body as controller-runtime's webhook server does: an empty body,
    one over `max_bytes` (code 413), a Content-Type other than `application/json` or malformed
    JSON are answered `allowed: false` with the reason; anything else goes to
    `review_admission`. Never raises."""
    if not body:
        return _outcome(ADMISSION_V1, "", errored(400, "request body is empty"))
    if len(body) > max_bytes:
        message = f"request entity is too large; limit is {max_bytes} bytes"
        return _outcome(ADMISSION_V1, "", errored(413, message))
    if content_type != JSON_CONTENT_TYPE:
        message = f"contentType={content_type}, expected {JSON_CONTENT_TYPE}"
        return _outcome(ADMISSION_V1, "", errored(400, message))
    try:
        review = decode_go_json(body)
    except GoJsonError as error:
        return _outcome(ADMISSION_V1, "", errored(400, str(error)))
    return review_admission(review, settings)


def render_admission_review(review: Mapping[str, Any]) -> bytes:
    """The review as Go's `json.Encoder` writes it: compact, Go's escaping, a newline."""
    return encode_go_json(review) + b"\n"
