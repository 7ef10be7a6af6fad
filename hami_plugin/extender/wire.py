"""The kube-scheduler extender wire format (`k8s.io/kube-scheduler/extender/v1`), as Go speaks it.

Pure: bytes in, values out, values in, bytes out; no sockets. The daemon's HTTP server reads a
body (at most `max_bytes + 1` bytes), hands it to `decode_filter_request` /
`decode_binding_request`, and sends the `HttpReply` it gets back or the one `filter_reply` /
`binding_reply` renders from its decision; `admission_reply` does the same for the webhook.

The v1 types carry no JSON tags (kubernetes `staging/src/k8s.io/kube-scheduler/extender/v1/
types.go`), so the keys are the Go field names and Go's decoder matches them case-insensitively
(`Pod`, `pod`, `POD`); unknown keys are ignored; for a key given twice the last one wins
(`hami_plugin.protocol.gojson_struct`). Malformed bodies give the message Go's `json.Decoder`
gives (`EOF`, `unexpected EOF`, `invalid character 'x' looking for beginning of value`,
`json: cannot unmarshal string into Go struct field ExtenderArgs.NodeNames of type []string`),
which HAMi v2.10 answers as the result's `Error` with HTTP 200 (`pkg/scheduler/routes/route.go`
lines 64-108); a body without a pod gives HAMi's `extender args missing pod` (route.go 72-77).

Results are rendered as Go's `encoding/json` renders the v1 structs (`hami_plugin.protocol.
gojson`): every field present in declaration order, `null` for a nil pointer or map, compact,
strings escaped as Go escapes them, map keys sorted.

Not modelled: the pod and the node objects are kept as the JSON objects they arrived as (read
them with `hami_plugin.protocol.objects`), so Go's type errors *inside* a pod or node are
reported by that reader instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami_plugin.protocol.gojson import (
    JSON_CONTENT_TYPE,
    GoJsonError,
    encode_go_json,
    go_json_string,
    go_json_string_list,
    go_json_string_map,
)
from hami_plugin.protocol.gojson_struct import (
    UNCHANGED,
    FieldDecoder,
    FieldErrors,
    decode_document,
    decode_struct,
    go_object,
    go_string,
    nullable,
    object_slice,
    string_map,
    string_slice,
)
from hami_plugin.scheduler.admission_review import AdmissionOutcome, render_admission_review

__all__ = [
    "MAX_BODY_BYTES",
    "MISSING_POD_MESSAGE",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "ExtenderPreemptionArgs",
    "ExtenderPreemptionResult",
    "ExtenderRequestError",
    "HttpReply",
    "MetaVictims",
    "admission_reply",
    "binding_reply",
    "body_too_large_message",
    "decode_binding_request",
    "decode_filter_request",
    "decode_preemption_request",
    "filter_reply",
    "parse_binding_args",
    "parse_binding_result",
    "parse_extender_args",
    "parse_filter_result",
    "parse_preemption_args",
    "parse_preemption_result",
    "preemption_reply",
    "render_binding_result",
    "render_filter_result",
    "render_preemption_result",
]

MAX_BODY_BYTES = 1024 * 1024
"""HAMi reads at most 1 MiB of a /filter or /bind body (route.go line 33)."""
MISSING_POD_MESSAGE = "extender args missing pod"
_TEXT = "text/plain; charset=utf-8"


class ExtenderRequestError(ValueError):
    """A request body that cannot be used; the message is what goes into the result's `Error`."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    """What the HTTP layer sends: status code, body bytes and the Content-Type header."""

    status: int
    body: bytes
    content_type: str = JSON_CONTENT_TYPE


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """ExtenderArgs: the pod, and the candidate nodes in one of two forms.

    `pod` is the v1.Pod JSON object as sent. `nodes` holds the NodeList's items (None when
    `Nodes` was null or absent); `node_names` the `NodeNames` (None when null or absent), sent
    instead of `nodes` when the extender is `nodeCacheCapable`.
    """

    pod: Mapping[str, Any]
    nodes: tuple[Mapping[str, Any], ...] | None = None
    node_names: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ExtenderFilterResult:
    """ExtenderFilterResult. None renders as `null`; an empty tuple or mapping as `[]` / `{}`.

    `nodes` are node objects, rendered as a v1.NodeList `{"metadata":{},"items":[...]}`.
    """

    nodes: tuple[Mapping[str, Any], ...] | None = None
    node_names: tuple[str, ...] | None = None
    failed_nodes: Mapping[str, str] | None = None
    failed_and_unresolvable_nodes: Mapping[str, str] | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class ExtenderBindingArgs:
    """ExtenderBindingArgs: bind pod `pod_namespace/pod_name` (uid `pod_uid`) to `node`."""

    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    node: str = ""


@dataclass(frozen=True, slots=True)
class ExtenderBindingResult:
    """ExtenderBindingResult: an empty `error` means bound."""

    error: str = ""


@dataclass(frozen=True, slots=True)
class MetaVictims:
    """MetaVictims: the victims' UIDs (`Pods`, each a `MetaPod{UID}`) and how many of them a
    PodDisruptionBudget protects."""

    uids: tuple[str, ...] = ()
    num_pdb_violations: int = 0


@dataclass(frozen=True, slots=True)
class ExtenderPreemptionArgs:
    """ExtenderPreemptionArgs: the preemptor (`Pod`) and kube-scheduler's candidates, node ->
    victims. A nodeCacheCapable extender gets `NodeNameToMetaVictims` (UIDs); otherwise
    `NodeNameToVictims` carries whole pods, of which only the UIDs are kept here."""

    pod: Mapping[str, Any]
    victims: Mapping[str, MetaVictims]


@dataclass(frozen=True, slots=True)
class ExtenderPreemptionResult:
    """ExtenderPreemptionResult: `NodeNameToMetaVictims` (None renders as null)."""

    victims: Mapping[str, MetaVictims] | None = None


# --- decoding -------------------------------------------------------------------------------

_NODE_FIELDS: Mapping[str, FieldDecoder] = {"items": nullable(object_slice("v1.Node"))}


def _node_list(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
    """A `*v1.NodeList` field: its items (its own `items` tag matched case-insensitively too)."""
    if not isinstance(value, dict):
        errors.add(value, struct, path, "v1.NodeList")
        return UNCHANGED
    fields = decode_struct(value, "NodeList", _NODE_FIELDS, errors, path + ".")
    return fields.get("items") or ()


_ARGS_FIELDS: Mapping[str, FieldDecoder] = {
    "Pod": nullable(go_object("v1.Pod")),
    "Nodes": nullable(_node_list),
    "NodeNames": nullable(string_slice),
}
_BINDING_ARGS_FIELDS: Mapping[str, FieldDecoder] = {
    "PodName": go_string("string"),
    "PodNamespace": go_string("string"),
    "PodUID": go_string("types.UID"),
    "Node": go_string("string"),
}
_FILTER_RESULT_FIELDS: Mapping[str, FieldDecoder] = {
    "Nodes": nullable(_node_list),
    "NodeNames": nullable(string_slice),
    "FailedNodes": nullable(string_map("v1.FailedNodesMap")),
    "FailedAndUnresolvableNodes": nullable(string_map("v1.FailedNodesMap")),
    "Error": go_string("string"),
}
_BINDING_RESULT_FIELDS: Mapping[str, FieldDecoder] = {"Error": go_string("string")}


def _go_int64(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
    if value is None:
        return UNCHANGED
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        errors.add(value, struct, path, "int64")
        return UNCHANGED
    return value


def _victims_map(element: str, pods_type: str) -> FieldDecoder:
    """A `map[string]*Victims` or `map[string]*MetaVictims`: node -> MetaVictims (the UIDs of
    `Pods`, read from `UID` of a MetaPod or `metadata.uid` of a v1.Pod)."""
    meta = element == "MetaVictims"
    fields: Mapping[str, FieldDecoder] = {
        "Pods": nullable(object_slice(pods_type)),
        "NumPDBViolations": _go_int64,
    }
    pod_fields: Mapping[str, FieldDecoder] = {"UID": go_string("string")}

    def decode(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
        if not isinstance(value, dict):
            errors.add(value, struct, path, f"map[string]*v1.{element}")
            return UNCHANGED
        result: dict[str, MetaVictims] = {}
        for node, entry in value.items():
            if entry is None:
                continue
            if not isinstance(entry, dict):
                errors.add(entry, struct, path, f"v1.{element}")
                continue
            parsed = decode_struct(entry, element, fields, errors, f"{path}.")
            uids = []
            for pod in parsed.get("Pods") or ():
                if meta:
                    uid = decode_struct(pod, "MetaPod", pod_fields, errors).get("UID", "")
                else:
                    metadata = pod.get("metadata")
                    uid = metadata.get("uid", "") if isinstance(metadata, dict) else ""
                uids.append(uid if isinstance(uid, str) else "")
            result[str(node)] = MetaVictims(tuple(uids), parsed.get("NumPDBViolations", 0))
        return result

    return decode


_PREEMPTION_ARGS_FIELDS: Mapping[str, FieldDecoder] = {
    "Pod": nullable(go_object("v1.Pod")),
    "NodeNameToVictims": nullable(_victims_map("Victims", "*v1.Pod")),
    "NodeNameToMetaVictims": nullable(_victims_map("MetaVictims", "*v1.MetaPod")),
}
_PREEMPTION_RESULT_FIELDS: Mapping[str, FieldDecoder] = {
    "NodeNameToMetaVictims": nullable(_victims_map("MetaVictims", "*v1.MetaPod")),
}


def _parse(body: bytes, struct: str, fields: Mapping[str, FieldDecoder]) -> dict[str, Any]:
    try:
        document = decode_document(body, f"v1.{struct}")
        errors = FieldErrors()
        values = decode_struct(document, struct, fields, errors)
        errors.raise_first()
    except GoJsonError as error:
        raise ExtenderRequestError(str(error)) from None
    return values


def parse_extender_args(body: bytes) -> ExtenderArgs:
    """Decode an ExtenderArgs body (POST /filter).

    Raises ExtenderRequestError with Go's decoder message for malformed JSON or a field of the
    wrong type, and with `extender args missing pod` when `Pod` is absent or null.
    """
    values = _parse(body, "ExtenderArgs", _ARGS_FIELDS)
    pod = values.get("Pod")
    if pod is None:
        raise ExtenderRequestError(MISSING_POD_MESSAGE)
    return ExtenderArgs(pod=pod, nodes=values.get("Nodes"), node_names=values.get("NodeNames"))


def parse_binding_args(body: bytes) -> ExtenderBindingArgs:
    """Decode an ExtenderBindingArgs body (POST /bind). A null or empty object gives empty
    fields, as in Go. Raises ExtenderRequestError with Go's decoder message."""
    values = _parse(body, "ExtenderBindingArgs", _BINDING_ARGS_FIELDS)
    return ExtenderBindingArgs(
        pod_name=values.get("PodName", ""),
        pod_namespace=values.get("PodNamespace", ""),
        pod_uid=values.get("PodUID", ""),
        node=values.get("Node", ""),
    )


def parse_filter_result(body: bytes) -> ExtenderFilterResult:
    """Decode an ExtenderFilterResult (what kube-scheduler reads back; for tests and tools).
    Raises ExtenderRequestError with Go's decoder message."""
    values = _parse(body, "ExtenderFilterResult", _FILTER_RESULT_FIELDS)
    return ExtenderFilterResult(
        nodes=values.get("Nodes"),
        node_names=values.get("NodeNames"),
        failed_nodes=values.get("FailedNodes"),
        failed_and_unresolvable_nodes=values.get("FailedAndUnresolvableNodes"),
        error=values.get("Error", ""),
    )


def parse_binding_result(body: bytes) -> ExtenderBindingResult:
    """Decode an ExtenderBindingResult. Raises ExtenderRequestError with Go's message."""
    values = _parse(body, "ExtenderBindingResult", _BINDING_RESULT_FIELDS)
    return ExtenderBindingResult(error=values.get("Error", ""))


def parse_preemption_args(body: bytes) -> ExtenderPreemptionArgs:
    """Decode an ExtenderPreemptionArgs body (POST /preempt): `NodeNameToMetaVictims` when
    given (nodeCacheCapable), else `NodeNameToVictims`. Raises ExtenderRequestError with Go's
    decoder message, or `extender args missing pod`."""
    values = _parse(body, "ExtenderPreemptionArgs", _PREEMPTION_ARGS_FIELDS)
    pod = values.get("Pod")
    if pod is None:
        raise ExtenderRequestError(MISSING_POD_MESSAGE)
    victims = values.get("NodeNameToMetaVictims")
    if victims is None:
        victims = values.get("NodeNameToVictims") or {}
    return ExtenderPreemptionArgs(pod=pod, victims=victims)


def parse_preemption_result(body: bytes) -> ExtenderPreemptionResult:
    """Decode an ExtenderPreemptionResult (what kube-scheduler reads back; for the tests'
    kube-scheduler). Raises ExtenderRequestError with Go's decoder message."""
    values = _parse(body, "ExtenderPreemptionResult", _PREEMPTION_RESULT_FIELDS)
    return ExtenderPreemptionResult(values.get("NodeNameToMetaVictims"))


# --- rendering ------------------------------------------------------------------------------


def _node_list_json(nodes: Sequence[Mapping[str, Any]] | None) -> str:
    if nodes is None:
        return "null"
    # v1.NodeList: TypeMeta (omitempty, unset), ListMeta `metadata` (a struct: never omitted).
    return '{"metadata":{},"items":' + encode_go_json(list(nodes)).decode("utf-8") + "}"


def render_filter_result(result: ExtenderFilterResult) -> bytes:
    """ExtenderFilterResult as Go's `json.Marshal` writes it, fields in declaration order
    (types.go: Nodes, NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error)."""
    return (
        '{"Nodes":'
        + _node_list_json(result.nodes)
        + ',"NodeNames":'
        + go_json_string_list(result.node_names)
        + ',"FailedNodes":'
        + go_json_string_map(result.failed_nodes)
        + ',"FailedAndUnresolvableNodes":'
        + go_json_string_map(result.failed_and_unresolvable_nodes)
        + ',"Error":'
        + go_json_string(result.error)
        + "}"
    ).encode("utf-8")


def render_binding_result(result: ExtenderBindingResult) -> bytes:
    """ExtenderBindingResult as Go writes it: `{"Error":""}`."""
    return ('{"Error":' + go_json_string(result.error) + "}").encode("utf-8")


# --- HTTP replies ---------------------------------------------------------------------------


def render_preemption_result(result: ExtenderPreemptionResult) -> bytes:
    """ExtenderPreemptionResult as Go writes it:
    `{"NodeNameToMetaVictims":{"<node>":{"Pods":[{"UID":"..."}],"NumPDBViolations":0}}}`."""
    if result.victims is None:
        return b'{"NodeNameToMetaVictims":null}'
    entries = []
    for node in sorted(result.victims):
        victims = result.victims[node]
        pods = ",".join('{"UID":' + go_json_string(uid) + "}" for uid in victims.uids)
        entries.append(
            go_json_string(node)
            + ':{"Pods":'
            + ("[" + pods + "]" if victims.uids else "null")
            + ',"NumPDBViolations":'
            + str(victims.num_pdb_violations)
            + "}"
        )
    return ('{"NodeNameToMetaVictims":{' + ",".join(entries) + "}}").encode("utf-8")


def preemption_reply(result: ExtenderPreemptionResult) -> HttpReply:
    return HttpReply(200, render_preemption_result(result))


def filter_reply(result: ExtenderFilterResult) -> HttpReply:
    """HTTP 200 with the rendered result, errors included (HAMi answers every decoded /filter
    call with 200, route.go lines 98-109)."""
    return HttpReply(200, render_filter_result(result))


def binding_reply(result: ExtenderBindingResult) -> HttpReply:
    """HTTP 200 with the rendered result (route.go lines 141-153)."""
    return HttpReply(200, render_binding_result(result))


def admission_reply(outcome: AdmissionOutcome) -> HttpReply:
    """HTTP 200 with the AdmissionReview, whatever the verdict: controller-runtime (HAMi's
    webhook server) answers a denial or an error inside the review, never with an HTTP error
    (see `hami_plugin.scheduler.admission_review`)."""
    return HttpReply(200, render_admission_review(outcome.review))


def body_too_large_message(max_bytes: int) -> str:
    """The `Error` for a body above the cap."""
    return f"request body larger than {max_bytes} bytes"


def _body_problem(body: bytes, max_bytes: int) -> str | None:
    # An empty body is no special case: HAMi's checkBody tests `r.Body == nil`, which Go's
    # server never passes (an empty body is http.NoBody), so json.Decoder answers `EOF`.
    if len(body) > max_bytes:
        return body_too_large_message(max_bytes)
    return None


def decode_filter_request(
    body: bytes, *, max_bytes: int = MAX_BODY_BYTES
) -> ExtenderArgs | HttpReply:
    """The ExtenderArgs of a /filter body, or the reply to send instead: HTTP 200 with `Error`
    for a body over `max_bytes`, an empty body (`EOF`, as HAMi answers), malformed JSON or no
    pod."""
    problem = _body_problem(body, max_bytes)
    try:
        if problem is not None:
            raise ExtenderRequestError(problem)
        return parse_extender_args(body)
    except ExtenderRequestError as error:
        return filter_reply(ExtenderFilterResult(error=str(error)))


def decode_binding_request(
    body: bytes, *, max_bytes: int = MAX_BODY_BYTES
) -> ExtenderBindingArgs | HttpReply:
    """The ExtenderBindingArgs of a /bind body, or the reply to send instead: HTTP 200 with
    `Error` for a body over `max_bytes`, an empty body (`EOF`) or malformed JSON."""
    problem = _body_problem(body, max_bytes)
    try:
        if problem is not None:
            raise ExtenderRequestError(problem)
        return parse_binding_args(body)
    except ExtenderRequestError as error:
        return binding_reply(ExtenderBindingResult(error=str(error)))


def decode_preemption_request(
    body: bytes, *, max_bytes: int = MAX_BODY_BYTES
) -> ExtenderPreemptionArgs | HttpReply:
    """The ExtenderPreemptionArgs of a /preempt body, or the reply to send instead: the
    result has no `Error` field, so a body over `max_bytes`, malformed JSON or no pod is an
    HTTP 400 whose text kube-scheduler logs with the preemption's failure."""
    problem = _body_problem(body, max_bytes)
    try:
        if problem is not None:
            raise ExtenderRequestError(problem)
        return parse_preemption_args(body)
    except ExtenderRequestError as error:
        return HttpReply(400, (str(error) + "\n").encode("utf-8"), _TEXT)
