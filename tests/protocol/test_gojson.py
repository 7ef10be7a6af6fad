"""Go's `encoding/json`, byte for byte: decoding errors, field-name folding, encoding.

The expected error messages were produced by Go's `encoding/json` (json.NewDecoder(...).Decode,
as HAMi v2.10's routes read the extender bodies, and json.Unmarshal, as its
`pkg/device/devices.go` reads the node register annotation); they come from scanner.go and
decode.go, whose texts have not changed between Go 1.19 and Go 1.26 (HAMi v2.10 builds with
1.26). The extender's own types are tested in tests/extender/test_wire.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hami_plugin.protocol import codec
from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.gojson import (
    GoJsonError,
    NumberText,
    decode_go_json,
    encode_go_json,
    fold_keys,
    fold_name,
    go_json_string,
    go_json_string_list,
    go_json_string_map,
    unmarshal_go_json,
)
from hami_plugin.protocol.gojson_scanner import go_syntax_error
from hami_plugin.protocol.model import GpuDevice
from tests.protocol.strategies import json_values

# --- decoding: Go's syntax errors -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "EOF"),
        (b"   ", "EOF"),
        (b"{", "unexpected EOF"),
        (b'{"Pod":', "unexpected EOF"),
        (b'"abc', "unexpected EOF"),
        (b"1.", "unexpected EOF"),
        (b"-", "unexpected EOF"),
        (b"x", "invalid character 'x' looking for beginning of value"),
        (b"{]", "invalid character ']' looking for beginning of object key string"),
        (b'{"Pod" 1}', "invalid character '1' after object key"),
        (b'{"Pod":{}x', "invalid character 'x' after object key:value pair"),
        (b'{"Pod":{},}', "invalid character '}' looking for beginning of object key string"),
        (b"[1,]", "invalid character ']' looking for beginning of value"),
        (b"[1 2]", "invalid character '2' after array element"),
        (b"[01]", "invalid character '1' after array element"),
        (b"[1.]", "invalid character ']' after decimal point in numeric literal"),
        (b"[1e+]", "invalid character ']' in exponent of numeric literal"),
        (b"[-x]", "invalid character 'x' in numeric literal"),
        (b"1.x", "invalid character 'x' after decimal point in numeric literal"),
        (b"[trux]", "invalid character 'x' in literal true (expecting 'e')"),
        (b"[nulx]", "invalid character 'x' in literal null (expecting 'l')"),
        (b"[fals3]", "invalid character '3' in literal false (expecting 'e')"),
        (b'"a\\qb"', "invalid character 'q' in string escape code"),
        (b'"a\\u12g4"', "invalid character 'g' in \\u hexadecimal character escape"),
        (b'"a\x01"', "invalid character '\\x01' in string literal"),
        (b'"a\tb"', "invalid character '\\t' in string literal"),
        (b"NaN", "invalid character 'N' looking for beginning of value"),
        (b"-Infinity", "invalid character 'I' in numeric literal"),
        (b"[Infinity]", "invalid character 'I' looking for beginning of value"),
        (b"\xef\xbb\xbf{}", "invalid character '\u00ef' looking for beginning of value"),
        (b"\x0c{}", "invalid character '\\f' looking for beginning of value"),
        (b"{'a':1}", "invalid character '\\'' looking for beginning of object key string"),
        (b'{"a"\x7f}', "invalid character '\\x7f' after object key"),
        (b'{"a":\x80}', "invalid character '\\u0080' looking for beginning of value"),
        (b'{"a":\xa0}', "invalid character '\\u00a0' looking for beginning of value"),
        (b'{"a":\xe9}', "invalid character '\u00e9' looking for beginning of value"),
        (b'{"a":\\}', "invalid character '\\\\' looking for beginning of value"),
        (b"[" * 10001, "invalid character '[' exceeded max depth"),
        (b"[" * 10000, "unexpected EOF"),
    ],
)
def test_decode_go_json_syntax_errors_as_go(body: bytes, message: str) -> None:
    with pytest.raises(GoJsonError) as raised:
        decode_go_json(body)
    assert str(raised.value) == message


def test_decoder_reads_only_the_first_value() -> None:
    assert decode_go_json(b' \t\r\n{"Pod":{}} trailing junk') == {"Pod": {}}
    assert decode_go_json(b"12 x") == 12


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "unexpected end of JSON input"),
        (b"  ", "unexpected end of JSON input"),
        (b'[{"id":"G"', "unexpected end of JSON input"),
        (b"1.", "unexpected end of JSON input"),
        (b"[1] x", "invalid character 'x' after top-level value"),
        (b"12 x", "invalid character 'x' after top-level value"),
        (b"1x", "invalid character 'x' after top-level value"),
        (b"[1]]", "invalid character ']' after top-level value"),
        (b"1.x", "invalid character 'x' after decimal point in numeric literal"),
        ("[1,]", "invalid character ']' looking for beginning of value"),
    ],
)
def test_unmarshal_go_json_errors_as_go(data: bytes | str, message: str) -> None:
    """json.Unmarshal wants exactly one value and names both EOFs alike."""
    with pytest.raises(GoJsonError) as raised:
        unmarshal_go_json(data)
    assert str(raised.value) == message


def test_unmarshal_go_json_reads_one_value_with_space_around() -> None:
    assert unmarshal_go_json(b' [1, {"a": null}] \n') == [1, {"a": None}]
    assert unmarshal_go_json(" 12 ") == 12
    assert unmarshal_go_json('"x\\ud800"') == "x\ufffd"


def test_nesting_python_cannot_follow_is_a_clear_error() -> None:
    # Go would decode 2,000 levels; Python's parser stops near 1,000 (module docstring).
    with pytest.raises(GoJsonError, match="nested too deeply"):
        decode_go_json(b"[" * 2000 + b"]" * 2000)


def test_numbers_python_cannot_hold_stay_as_written() -> None:
    value = decode_go_json(b'{"big":1e999,"long":' + b"7" * 5000 + b"}")
    assert value == {"big": "1e999", "long": "7" * 5000}
    assert isinstance(value["big"], NumberText) and repr(value["big"]) == "1e999"


def test_invalid_utf8_and_lone_surrogates_become_replacement_characters() -> None:
    value = decode_go_json(b'{"a":"x\xffy","b":"\\ud800z","c":"\\ud83d\\ude00"}')
    assert value == {"a": "x\ufffdy", "b": "\ufffdz", "c": "\U0001f600"}


# --- field names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("NodeNames", "nodenames"),
        ("Pod", "POD"),
        ("NodeName\u017f", "NodeNames"),  # the long s folds to S (encoding/json fold.go)
        ("\u212aey", "key"),  # the Kelvin sign folds to K
        ("\u0130d", "id"),  # the dotted capital I folds to I
    ],
)
def test_fold_name_matches_as_go(left: str, right: str) -> None:
    assert fold_name(left) == fold_name(right)


def test_fold_name_keeps_different_names_apart() -> None:
    assert fold_name("NodeNames") != fold_name("NodeName")
    assert fold_name("\u00e9") != fold_name("e")


# --- encoding ---------------------------------------------------------------------------------


def test_encode_go_json_floats_as_go() -> None:
    # encoding/json floatEncoder: 'f' form unless < 1e-6 or >= 1e21; e-07 written e-7
    values = [0.0, -0.0, 1.0, 1.5, 100.0, 1e20, 1e21, 1.5e-7, 1e-6, 0.000123, -2.5e-10]
    assert encode_go_json([*values, 123456789.125, 1e100, 5e-324]) == (
        b"[0,-0,1,1.5,100,100000000000000000000,1e+21,1.5e-7,0.000001,0.000123,-2.5e-10,"
        b"123456789.125,1e+100,5e-324]"
    )
    with pytest.raises(ValueError, match="unsupported value"):
        encode_go_json(float("nan"))


def test_encode_go_json_keeps_mapping_order() -> None:
    assert encode_go_json({"b": [1, True, None], "a": {"<": "&"}}) == (
        b'{"b":[1,true,null],"a":{"\\u003c":"\\u0026"}}'
    )


def test_numbers_kept_as_text_encode_back_as_numbers() -> None:
    body = b'{"big":1e999,"long":' + b"7" * 5000 + b"}"
    assert encode_go_json(decode_go_json(body)) == body


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<a&b>", '"\\u003ca\\u0026b\\u003e"'),
        ("\u2028x\u2029", '"\\u2028x\\u2029"'),
        ('é\x01"\\/', '"é\\u0001\\"\\\\/"'),
        ("\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'),  # Go 1.22+ writes \b and \f short
        ("a\ud800b", '"a\\ufffdb"'),  # a lone surrogate is invalid UTF-8 to Go
    ],
)
def test_go_json_string_escapes_as_go(text: str, expected: str) -> None:
    assert go_json_string(text) == expected
    assert encode_go_json(text) == expected.encode()


def test_slices_and_maps_as_go() -> None:
    assert go_json_string_list(None) == "null"
    assert go_json_string_list(()) == "[]"
    assert go_json_string_list(("<", "b")) == '["\\u003c","b"]'
    assert go_json_string_map(None) == "null"
    assert go_json_string_map({}) == "{}"
    # keys sorted by their UTF-8 bytes
    assert go_json_string_map({"é": "<", "node1": "x", "Node0": "z"}) == (
        '{"Node0":"z","node1":"x","é":"\\u003c"}'
    )


# --- the node register annotation reads and writes its JSON the same way -----------------------


def test_register_json_matches_keys_as_go_does() -> None:
    """Go's foldName matches the long s and the dotted capital I where lower() did not."""
    value = '[{"\u0130d":"G","count":2,"HEALTH":true,"type":"T"}]'
    assert codec.decode_node_devices(value) == (GpuDevice("G", 0, 2, 0, 0, "T", 0, "", True),)
    profile = '[{"id":"G","migProfiles":[{"name":"p","placement\u017f":[{"\u017ftart":3}]}]}]'
    (device,) = codec.decode_node_devices(profile)
    assert device.mig_profiles[0].placements[0].start == 3


def test_of_keys_that_fold_alike_the_one_written_last_wins_as_in_go() -> None:
    """Go assigns struct fields in document order: `id`, `ID`, `id` leaves the third value."""
    value = '[{"id":"GPU-a","ID":"GPU-b","id":"GPU-c","count":2}]'
    assert codec.decode_node_devices(value)[0].uuid == "GPU-c"
    assert fold_keys(unmarshal_go_json('{"a":1,"A":2,"a":3}')) == {"A": 3}


def test_register_json_errors_carry_gos_message() -> None:
    with pytest.raises(AnnotationError) as cut:
        codec.decode_node_devices('[{"id":"G"')
    assert cut.value.detail == "invalid JSON: unexpected end of JSON input"
    with pytest.raises(AnnotationError) as trailing:
        codec.decode_node_devices('[{"id":"G"}] x')
    assert trailing.value.detail == "invalid JSON: invalid character 'x' after top-level value"
    with pytest.raises(AnnotationError, match='cannot unmarshal "1e999" into field count'):
        codec.decode_node_devices('[{"id":"G","count":1e999}]')
    with pytest.raises(AnnotationError, match='cannot unmarshal "10000'):
        codec.decode_node_devices('[{"id":"G","type":1' + "0" * 5000 + "}]")


def test_register_json_lone_surrogates_as_go() -> None:
    """Go reads a lone surrogate escape as U+FFFD and writes invalid UTF-8 as `\\ufffd`."""
    (read,) = codec.decode_node_devices('[{"id":"G\\udc00","count":1}]')
    assert read.uuid == "G\ufffd"
    device = GpuDevice("G\ud800", 0, 1, 0, 0, "T\udfff", 0, "", False)
    written = codec.encode_node_devices([device])
    assert written == '[{"id":"G\\ufffd","count":1,"type":"T\\ufffd"}]'


# --- properties -------------------------------------------------------------------------------

_JSONISH = st.sampled_from(list(b'{}[]:,"\\ \nabcdeflnrstu0123456789.+-E\x01\xc3'))


@given(st.lists(json_values, max_size=3), st.data())
def test_go_scanner_agrees_with_pythons_json_on_validity(value: list[Any], data: Any) -> None:
    """Mutate a valid document: the Go-style scanner (which gives the error messages) and
    Python's parser (which gives the values) must agree on whether the first value is well
    formed. Top-level numbers are left out: there Python accepts a prefix (`1.` as 1) and the
    decoder asks the scanner (test_decode_go_json_syntax_errors_as_go)."""
    text = bytearray(json.dumps(value).encode())
    for _ in range(data.draw(st.integers(0, 3))):
        position = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        if action == "insert":
            text[position:position] = bytes([data.draw(_JSONISH)])
        elif position < len(text):
            replacement = b"" if action == "delete" else bytes([data.draw(_JSONISH)])
            text[position : position + 1] = replacement
    body = bytes(text)
    start = len(body) - len(body.lstrip(b" \t\r\n"))
    assume(body[start : start + 1] not in b"-0123456789" or start == len(body))
    try:
        json.JSONDecoder().raw_decode(body.decode("utf-8", "surrogateescape"), start)
        python_ok = True
    except ValueError:
        python_ok = False
    assert (go_syntax_error(body) == "") == python_ok


@given(st.binary(max_size=200))
def test_any_input_decodes_or_gives_a_go_error(data: bytes) -> None:
    for decode in (decode_go_json, unmarshal_go_json):
        try:
            decode(data)
        except GoJsonError as error:
            assert str(error)


@given(json_values)
def test_encoded_values_read_back(value: Any) -> None:
    encoded = encode_go_json(value)
    assert not any(char in encoded for char in b"<>&")
    assert unmarshal_go_json(encoded) == json.loads(encoded)
