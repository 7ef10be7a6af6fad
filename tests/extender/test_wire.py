"""The kube-scheduler extender wire format, byte for byte as Go writes and reads it.

Sources: kubernetes `staging/src/k8s.io/kube-scheduler/extender/v1/types.go` (the structs, no
JSON tags), HAMi v2.10 `pkg/scheduler/routes/route.go` (the handlers), docs/hami-reference.md 3.8.
The expected error messages were produced by Go's `encoding/json` (json.NewDecoder(...).Decode
into the v1 structs, as route.go lines 64-77 do); they come from scanner.go and decode.go,
whose texts have not changed between Go 1.19 and Go 1.26 (HAMi v2.10 builds with 1.26). Go's
syntax errors are tested one by one in tests/protocol/test_gojson.py; here they pass through.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.extender.wire import (
    MAX_BODY_BYTES,
    MISSING_POD_MESSAGE,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderRequestError,
    HttpReply,
    binding_reply,
    decode_binding_request,
    decode_filter_request,
    filter_reply,
    parse_binding_args,
    parse_binding_result,
    parse_extender_args,
    parse_filter_result,
    render_binding_result,
    render_filter_result,
)
from hami_plugin.protocol import codec
from hami_plugin.protocol.gojson import encode_go_json, go_json_string
from hami_plugin.protocol.model import GpuDevice
from hami_plugin.protocol.objects import read_pod
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings
from tests.protocol.strategies import json_names, json_values

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


def _body(document: object) -> bytes:
    return json.dumps(document).encode()


# --- ExtenderArgs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"Pod": POD, "Nodes": None, "NodeNames": ["n1", "n2"]},
         ExtenderArgs(POD, None, ("n1", "n2"))),
        # no JSON tags: Go matches the field names case-insensitively (docs/hami-reference.md 3.8)
        ({"pod": POD, "nodenames": ["n1"]}, ExtenderArgs(POD, None, ("n1",))),
        ({"POD": POD, "NODENAMES": []}, ExtenderArgs(POD, None, ())),
        ({"pOd": POD, "NoDeS": {"items": [{"metadata": {"name": "n1"}}]}},
         ExtenderArgs(POD, ({"metadata": {"name": "n1"}},), None)),
        # NodeList's own tag `items` is matched case-insensitively too
        ({"Pod": POD, "Nodes": {"Items": [{}], "metadata": {}}}, ExtenderArgs(POD, ({},), None)),
        ({"Pod": POD, "Nodes": {}}, ExtenderArgs(POD, (), None)),
        ({"Pod": POD, "Nodes": {"items": None}}, ExtenderArgs(POD, (), None)),
        # a null element decodes to the element's zero value
        ({"Pod": POD, "NodeNames": ["a", None]}, ExtenderArgs(POD, None, ("a", ""))),
        ({"Pod": POD, "Nodes": {"items": [None]}}, ExtenderArgs(POD, ({},), None)),
        # unknown keys are ignored; the last key for a field wins
        ({"Pod": POD, "Extra": 1, "NodeNames": ["x"], "nodeNames": ["y"]},
         ExtenderArgs(POD, None, ("y",))),
        # Go folds the long s and the Kelvin sign to S and K (encoding/json fold.go)
        ({"Pod": POD, "NodeName\u017f": ["n"]}, ExtenderArgs(POD, None, ("n",))),
    ],
)  # fmt: skip
def test_parse_extender_args(document: dict[str, Any], expected: ExtenderArgs) -> None:
    assert parse_extender_args(_body(document)) == expected


def test_quantities_arrive_as_kubernetes_sent_them() -> None:
    limits = {"nvidia.com/gpu": "1k", "nvidia.com/gpumem": "4e3", "cpu": 1.5, "memory": 10**30}
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"resources": {"limits": limits}}]}}
    args = parse_extender_args(_body({"Pod": pod, "NodeNames": ["n"]}))
    assert args.pod["spec"]["containers"][0]["resources"]["limits"] == limits
    request = pod_requests(read_pod(args.pod), SchedulerSettings()).containers[0]
    assert request is not None
    assert (request.count, request.memory_mib) == (1000, 4000)


def test_numbers_python_cannot_hold_stay_as_written() -> None:
    body = b'{"Pod":{"big":1e999,"long":' + b"7" * 5000 + b"}}"
    pod = parse_extender_args(body).pod
    assert (pod["big"], pod["long"]) == ("1e999", "7" * 5000)
    assert encode_go_json(pod) == body[7:-1]  # and render back as numbers


def test_go_decoder_reads_only_the_first_value() -> None:
    assert parse_extender_args(b' \t\r\n{"Pod":{}} trailing junk') == ExtenderArgs({})


def test_invalid_utf8_and_lone_surrogates_become_replacement_characters() -> None:
    body = b'{"Pod":{"a":"x\xffy","b":"\\ud800z","c":"\\ud83d\\ude00"},"NodeNames":["n\xc3"]}'
    args = parse_extender_args(body)
    assert args.pod == {"a": "x\ufffdy", "b": "\ufffdz", "c": "\U0001f600"}
    assert args.node_names == ("n\ufffd",)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # Go's syntax errors pass through (all of them: tests/protocol/test_gojson.py)
        (b"   ", "EOF"),
        (b"{", "unexpected EOF"),
        (b"x", "invalid character 'x' looking for beginning of value"),
        (b"[" * 10001, "invalid character '[' exceeded max depth"),
        # decode.go type errors: the first in document order
        (b"[]", "json: cannot unmarshal array into Go value of type v1.ExtenderArgs"),
        (b'"s"', "json: cannot unmarshal string into Go value of type v1.ExtenderArgs"),
        (b"12 x", "json: cannot unmarshal number into Go value of type v1.ExtenderArgs"),
        (b"true", "json: cannot unmarshal bool into Go value of type v1.ExtenderArgs"),
        (b'{"Pod":"x"}',
         "json: cannot unmarshal string into Go struct field ExtenderArgs.Pod of type v1.Pod"),
        (b'{"pod":[]}',
         "json: cannot unmarshal array into Go struct field ExtenderArgs.Pod of type v1.Pod"),
        (b'{"Pod":{},"NodeNames":5}',
         "json: cannot unmarshal number into Go struct field ExtenderArgs.NodeNames of type "
         "[]string"),
        (b'{"Pod":{},"nodenames":[1e999]}',
         "json: cannot unmarshal number into Go struct field ExtenderArgs.NodeNames of type "
         "string"),
        (b'{"Pod":{},"Nodes":5}',
         "json: cannot unmarshal number into Go struct field ExtenderArgs.Nodes of type "
         "v1.NodeList"),
        (b'{"Pod":{},"Nodes":{"items":5}}',
         "json: cannot unmarshal number into Go struct field NodeList.Nodes.items of type "
         "[]v1.Node"),
        (b'{"Pod":{},"Nodes":{"Items":[5]}}',
         "json: cannot unmarshal number into Go struct field NodeList.Nodes.items of type "
         "v1.Node"),
        (b'{"NodeNames":[true],"Pod":"x"}',
         "json: cannot unmarshal bool into Go struct field ExtenderArgs.NodeNames of type "
         "string"),
        # HAMi's own check after a clean decode (route.go 72-77)
        (b"null", MISSING_POD_MESSAGE),
        (b"{}", MISSING_POD_MESSAGE),
        (b'{"Pod":null,"NodeNames":["a"]}', MISSING_POD_MESSAGE),
        (b'{"Pod":{},"pod":null}', MISSING_POD_MESSAGE),
    ],
)  # fmt: skip
def test_parse_extender_args_errors_as_go(body: bytes, message: str) -> None:
    with pytest.raises(ExtenderRequestError) as raised:
        parse_extender_args(body)
    assert str(raised.value) == message


def test_nesting_python_cannot_follow_is_a_clear_error() -> None:
    # Go would decode 2,000 levels; Python's parser stops near 1,000 (module docstring).
    with pytest.raises(ExtenderRequestError, match="nested too deeply"):
        parse_extender_args(b"[" * 2000 + b"]" * 2000)


# --- ExtenderBindingArgs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n1"}',
         ExtenderBindingArgs("p", "ns", "u", "n1")),
        (b'{"podname":"p","PODNAMESPACE":"ns","poduid":"u","node":"n1","x":1}',
         ExtenderBindingArgs("p", "ns", "u", "n1")),
        # null leaves a Go string as it was
        (b'{"PodName":"p","podName":null}', ExtenderBindingArgs(pod_name="p")),
        (b"null", ExtenderBindingArgs()),
        (b"{}", ExtenderBindingArgs()),
    ],
)  # fmt: skip
def test_parse_binding_args(body: bytes, expected: ExtenderBindingArgs) -> None:
    assert parse_binding_args(body) == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"PodUID":5}', "json: cannot unmarshal number into Go struct field "
         "ExtenderBindingArgs.PodUID of type types.UID"),
        (b'{"Node":{}}', "json: cannot unmarshal object into Go struct field "
         "ExtenderBindingArgs.Node of type string"),
        (b"[]", "json: cannot unmarshal array into Go value of type v1.ExtenderBindingArgs"),
        (b'{"PodName":"p"', "unexpected EOF"),
    ],
)  # fmt: skip
def test_parse_binding_args_errors(body: bytes, message: str) -> None:
    with pytest.raises(ExtenderRequestError) as raised:
        parse_binding_args(body)
    assert str(raised.value) == message


# --- rendering ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        # docs/hami-reference.md 3.8, verbatim: the fit and the no-fit answers
        (ExtenderFilterResult(node_names=("node2",)),
         b'{"Nodes":null,"NodeNames":["node2"],"FailedNodes":null,'
         b'"FailedAndUnresolvableNodes":null,"Error":""}'),
        (ExtenderFilterResult(failed_nodes={"node3": "node unregistered",
                                            "node1": "1/1 CardInsufficientMemory"}),
         b'{"Nodes":null,"NodeNames":null,"FailedNodes":{"node1":"1/1 CardInsufficientMemory",'
         b'"node3":"node unregistered"},"FailedAndUnresolvableNodes":null,"Error":""}'),
        (ExtenderFilterResult(error="extender args missing pod"),
         b'{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,'
         b'"Error":"extender args missing pod"}'),
        # empty is not nil: [] and {} (Go: a non-nil empty slice or map)
        (ExtenderFilterResult(node_names=(), failed_nodes={}, failed_and_unresolvable_nodes={}),
         b'{"Nodes":null,"NodeNames":[],"FailedNodes":{},"FailedAndUnresolvableNodes":{},'
         b'"Error":""}'),
        # Go's escaping: HTML-safe, U+2028/U+2029, controls; UTF-8 kept; keys sorted by bytes
        (ExtenderFilterResult(node_names=("<a&b>", "\u2028x\u2029", 'é\x01"\\/'),
                              failed_nodes={"é": "<", "node1": "x", "Node0": "z"},
                              error="bad & <worse>"),
         '{"Nodes":null,"NodeNames":["\\u003ca\\u0026b\\u003e","\\u2028x\\u2029",'
         '"é\\u0001\\"\\\\/"],"FailedNodes":{"Node0":"z","node1":"x","é":"\\u003c"},'
         '"FailedAndUnresolvableNodes":null,"Error":"bad \\u0026 \\u003cworse\\u003e"}'.encode()),
        # Go 1.22+ writes \b and \f short (encoding/json encode.go appendString)
        (ExtenderFilterResult(error="\b\f\n\r\t"),
         b'{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,'
         b'"Error":"\\b\\f\\n\\r\\t"}'),
        # a lone surrogate (invalid UTF-8 in Go) is written as the \ufffd escape
        (ExtenderFilterResult(error="a\ud800b"),
         b'{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,'
         b'"Error":"a\\ufffdb"}'),
        # the Nodes form: a v1.NodeList, ListMeta `metadata` always written
        (ExtenderFilterResult(nodes=({"metadata": {"name": "n1"}},)),
         b'{"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1"}}]},"NodeNames":null,'
         b'"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}'),
    ],
)  # fmt: skip
def test_render_filter_result_as_go(result: ExtenderFilterResult, expected: bytes) -> None:
    assert render_filter_result(result) == expected


def test_render_binding_result_as_go() -> None:
    assert render_binding_result(ExtenderBindingResult()) == b'{"Error":""}'
    assert render_binding_result(ExtenderBindingResult("node lock <busy>")) == (
        b'{"Error":"node lock \\u003cbusy\\u003e"}'
    )


# --- HTTP replies ---------------------------------------------------------------------------


def test_empty_body_is_eof_as_hamis_decoder_says() -> None:
    # route.go's checkBody only refuses a nil body, which Go's server never hands over: an
    # empty POST reaches json.Decoder.Decode, whose error is io.EOF.
    reply = decode_filter_request(b"")
    assert isinstance(reply, HttpReply)
    assert (reply.status, reply.content_type) == (200, "application/json")
    assert reply.body == (
        b'{"Nodes":null,"NodeNames":null,"FailedNodes":null,'
        b'"FailedAndUnresolvableNodes":null,"Error":"EOF"}'
    )
    binding = decode_binding_request(b"")
    assert isinstance(binding, HttpReply)
    assert (binding.status, binding.body) == (200, b'{"Error":"EOF"}')


def test_filter_request_over_the_cap_is_an_error_result() -> None:
    body = _body({"Pod": POD, "NodeNames": ["n" * 100] * 20})
    reply = decode_filter_request(body, max_bytes=len(body) - 1)
    assert isinstance(reply, HttpReply)
    assert (reply.status, reply.content_type) == (200, "application/json")
    assert parse_filter_result(reply.body).error == (
        f"request body larger than {len(body) - 1} bytes"
    )
    assert isinstance(decode_filter_request(body, max_bytes=len(body)), ExtenderArgs)
    assert MAX_BODY_BYTES == 1024 * 1024


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{", "unexpected EOF"),
        (b'{"NodeNames":["n"]}', MISSING_POD_MESSAGE),
        (b" ", "EOF"),
    ],
)
def test_filter_request_errors_are_http_200_with_error(body: bytes, error: str) -> None:
    reply = decode_filter_request(body)
    assert reply == filter_reply(ExtenderFilterResult(error=error))
    assert isinstance(reply, HttpReply)
    assert reply.status == 200
    assert reply.body == (
        b'{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,'
        b'"Error":' + json.dumps(error).encode() + b"}"
    )


def test_binding_request_errors_are_http_200_with_error() -> None:
    reply = decode_binding_request(b'{"PodName":1}')
    assert reply == binding_reply(
        ExtenderBindingResult(
            "json: cannot unmarshal number into Go struct field ExtenderBindingArgs.PodName "
            "of type string"
        )
    )
    too_big = decode_binding_request(b'{"PodName":"p"}', max_bytes=4)
    assert isinstance(too_big, HttpReply)
    assert parse_binding_result(too_big.body).error == "request body larger than 4 bytes"
    assert decode_binding_request(b'{"PodName":"p","Node":"n"}') == ExtenderBindingArgs(
        pod_name="p", node="n"
    )


# --- properties -----------------------------------------------------------------------------

_nodes = st.lists(st.dictionaries(json_names, json_values, max_size=4), max_size=3)


def _same_json(left: object, right: object) -> bool:
    """Equal as JSON values: Go writes 1e16 as 10000000000000000, which Python reads back as
    an int (a typed Go field reads it back as the same float64)."""
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(map(_same_json, left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return list(left) == list(right) and all(_same_json(left[k], right[k]) for k in left)
    if isinstance(left, float) or isinstance(right, float):
        return (
            isinstance(left, (int, float))
            and isinstance(right, (int, float))
            and (float(left) == float(right))
        )
    return type(left) is type(right) and left == right


@given(
    nodes=st.none() | _nodes.map(tuple),
    names=st.none() | st.lists(json_names, max_size=6).map(tuple),
    failed=st.none() | st.dictionaries(json_names, json_names, max_size=6),
    unresolvable=st.none() | st.dictionaries(json_names, json_names, max_size=6),
    error=json_names,
)
def test_filter_result_round_trip(
    nodes: tuple[dict[str, Any], ...] | None,
    names: tuple[str, ...] | None,
    failed: dict[str, str] | None,
    unresolvable: dict[str, str] | None,
    error: str,
) -> None:
    result = ExtenderFilterResult(nodes, names, failed, unresolvable, error)
    body = render_filter_result(result)
    parsed = parse_filter_result(body)
    assert _same_json(parsed.nodes, result.nodes)
    assert parsed == ExtenderFilterResult(parsed.nodes, names, failed, unresolvable, error)
    document = json.loads(body)  # valid JSON, Go's field order, all keys present
    assert list(document) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]
    assert not any(char in body for char in b"<>&")


@given(st.binary(max_size=200))
def test_any_body_decodes_or_gives_a_go_error(body: bytes) -> None:
    try:
        parse_extender_args(body)
    except ExtenderRequestError as error:
        assert str(error)
    reply = decode_filter_request(body)
    assert isinstance(reply, (ExtenderArgs, HttpReply))


# Every character, lone surrogates (invalid UTF-8 to Go) included.
_any_text = st.text(st.characters(exclude_categories=()), min_size=1, max_size=12)


@given(_any_text)
def test_codec_and_wire_escape_strings_alike(text: str) -> None:
    """One Go string encoding: what the register annotation writes for a device type is what
    the extender writes for an `Error`, and what gojson writes for the string."""
    expected = go_json_string(text)
    assert encode_go_json(text) == expected.encode("utf-8")
    assert render_binding_result(ExtenderBindingResult(text)) == (
        b'{"Error":' + expected.encode("utf-8") + b"}"
    )
    device = GpuDevice("GPU-0", 0, 1, 0, 0, text, 0, "", False)
    assert codec.encode_node_devices([device]) == (
        '[{"id":"GPU-0","count":1,"type":' + expected + "}]"
    )


def test_of_field_names_that_fold_alike_the_one_written_last_wins_as_in_go() -> None:
    body = b'{"PodName":"x","podname":"y","PodName":"z","PodNamespace":"n","PodUID":"u","Node":"m"}'
    assert parse_binding_args(body).pod_name == "z"
