"""What the API server checks of an object before it stores it, for the rules its callers
depend on (the other kinds are stored as sent):

* Secrets: `type` defaults to `Opaque` and is immutable; every `data` value is base64 (the
  API's `[]byte`); `stringData` is folded into `data` and not stored; a `kubernetes.io/tls`
  Secret must have `tls.crt` and `tls.key` (k8s.io/kubernetes `pkg/apis/core/validation`
  `ValidateSecret`, `ValidateSecretUpdate`);
* MutatingWebhookConfigurations: every webhook has a name, and a `clientConfig.caBundle`, when
  set, is base64;
* PriorityClasses: `preemptionPolicy` defaults to `PreemptLowerPriority`
  (k8s.io/kubernetes `pkg/apis/scheduling/v1/defaults.go` `SetDefaults_PriorityClass`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from hami_plugin.testing.apiserver.objects import JsonObject
from hami_plugin.testing.apiserver.status import ApiError

_TLS_SECRET = "kubernetes.io/tls"


def admit(plural: str, obj: JsonObject, previous: JsonObject | None) -> JsonObject:
    """`obj` as the API server would store it (a new top-level dict when changed), `previous`
    the stored object it replaces (None for a create). Raises ApiError 400 for a value that
    does not decode, 422 for one that breaks a rule."""
    if plural == "secrets":
        return _admit_secret(obj, previous)
    if plural == "mutatingwebhookconfigurations":
        _check_webhooks(obj)
    if plural == "priorityclasses" and obj.get("preemptionPolicy") is None:
        # pkg/apis/scheduling/v1/defaults.go SetDefaults_PriorityClass
        return {**obj, "preemptionPolicy": "PreemptLowerPriority"}
    return obj


def _name(obj: JsonObject) -> str:
    return str(obj.get("metadata", {}).get("name") or "")


def _is_base64(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return False
    return True


def _admit_secret(obj: JsonObject, previous: JsonObject | None) -> JsonObject:
    name = _name(obj)
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        raise ApiError(400, "BadRequest", "Secret.data must be an object")
    for key, value in data.items():
        if not _is_base64(value):
            raise ApiError(
                400,
                "BadRequest",
                f'Secret in version "v1" cannot be handled: data[{key}]: illegal base64 data',
            )
    string_data = obj.get("stringData") or {}
    if not isinstance(string_data, dict):
        raise ApiError(400, "BadRequest", "Secret.stringData must be an object")
    data = dict(data)
    for key, value in string_data.items():
        data[key] = base64.b64encode(str(value).encode("utf-8")).decode("ascii")
    secret_type = obj.get("type") or "Opaque"
    if previous is not None and secret_type != (previous.get("type") or "Opaque"):
        raise ApiError(
            422,
            "Invalid",
            f'Secret "{name}" is invalid: type: Invalid value: "{secret_type}": field is immutable',
        )
    if secret_type == _TLS_SECRET:
        missing = [key for key in ("tls.crt", "tls.key") if key not in data]
        if missing:
            raise ApiError(
                422, "Invalid", f'Secret "{name}" is invalid: data[{missing[0]}]: Required value'
            )
    admitted = {key: value for key, value in obj.items() if key != "stringData"}
    admitted["type"] = secret_type
    admitted["data"] = data
    return admitted


def _check_webhooks(obj: JsonObject) -> None:
    name = _name(obj)
    webhooks = obj.get("webhooks") or []
    if not isinstance(webhooks, list):
        raise ApiError(400, "BadRequest", "MutatingWebhookConfiguration.webhooks must be a list")
    for index, webhook in enumerate(webhooks):
        if not isinstance(webhook, dict) or not webhook.get("name"):
            raise ApiError(
                422,
                "Invalid",
                f'MutatingWebhookConfiguration "{name}" is invalid: webhooks[{index}].name: '
                "Required value",
            )
        client_config = webhook.get("clientConfig") or {}
        bundle = client_config.get("caBundle") if isinstance(client_config, dict) else None
        if bundle is not None and not _is_base64(bundle):
            raise ApiError(
                400,
                "BadRequest",
                f'MutatingWebhookConfiguration in version "v1" cannot be handled: '
                f"webhooks[{index}].clientConfig.caBundle: illegal base64 data",
            )
