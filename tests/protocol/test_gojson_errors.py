"""Go's syntax-error messages from Python's error position: the same text as the reference scan
(`gojson_scanner.go_syntax_error`), at the cost of a few bytes' walk.

The reference walks the whole document in Python; the decoders (`decode_go_json`,
`unmarshal_go_json`) must give exactly its message while walking only the bytes around the
error, so that a large malformed body costs what a valid one does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol import gojson_scanner
from hami_plugin.protocol.gojson import GoJsonError, decode_go_json, unmarshal_go_json
from hami_plugin.protocol.gojson_scanner import go_syntax_error, go_syntax_error_at
from tests.protocol.strategies import json_values

_DECODERS: tuple[tuple[Callable[[bytes], Any], bool], ...] = (
    (decode_go_json, False),
    (unmarshal_go_json, True),
)


def _message(decode: Callable[[bytes], Any], body: bytes) -> str:
    try:
        decode(body)
    except GoJsonError as error:
        return str(error)
    return ""


def _assert_as_reference(body: bytes) -> None:
    for decode, whole in _DECODERS:
        assert _message(decode, body) == go_syntax_error(body, whole=whole), (body, whole)


# --- properties -------------------------------------------------------------------------------

# Bytes that matter to the grammar, one of each kind of non-ASCII byte (a UTF-8 lead, a
# continuation, one never valid), the letters of the literals and of NaN/Infinity.
_MUTATION_BYTES = st.sampled_from(list(b'{}[]:,"\\/ \t\n\rabcdeflnrstuNIy0123456789.+-E\x01\x7f#'))
_NON_ASCII = st.sampled_from([0xC3, 0xA9, 0xFF])
_TEXT = st.text(
    st.sampled_from(['"', "\\", "/", "\n", "\x01", "\x7f", "é", "\u2028", "\U0001f600", "a", "["]),
    max_size=6,
)
_NUMBER_TEXT = st.text(st.sampled_from(list("-+.eE0123456789")), min_size=1, max_size=7)


@st.composite
def _documents(draw: st.DrawFn) -> bytes:
    """Valid JSON as Python or Go would write it: compact or indented, ASCII-escaped or not
    (`\\u` escapes, surrogate pairs included), or a number-like token in a container."""
    kind = draw(st.sampled_from(["value", "strings", "number"]))
    if kind == "number":
        token = draw(_NUMBER_TEXT)
        shape = draw(st.sampled_from(["{}", "[{}]", '{{"a":{}}}', "[1,{},2]", "[[{}]]"]))
        return shape.format(token).encode()
    value: Any = draw(json_values) if kind == "value" else draw(st.lists(_TEXT, max_size=3))
    text = json.dumps(
        value,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, 1])),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
    )
    return text.encode("utf-8", "surrogatepass")


@st.composite
def _malformed(draw: st.DrawFn) -> bytes:
    """A valid document with one byte changed, inserted or deleted, or cut short."""
    body = bytearray(draw(_documents()))
    position = draw(st.integers(0, len(body)))
    action = draw(st.sampled_from(["change", "insert", "delete", "cut"]))
    byte = draw(st.one_of(_MUTATION_BYTES, _NON_ASCII))
    if action == "cut":
        del body[position:]
    elif action == "insert":
        body[position:position] = bytes([byte])
    elif position < len(body):
        body[position : position + 1] = b"" if action == "delete" else bytes([byte])
    return bytes(body)


@given(_malformed())
def test_the_message_is_the_reference_message_for_any_malformed_document(body: bytes) -> None:
    """Both decoders (Decode's first value, Unmarshal's one value) give, byte for byte, what
    the whole-document reference scan gives: "" (no error) included."""
    _assert_as_reference(body)


@given(_malformed(), _malformed())
def test_a_second_document_after_the_first_is_judged_as_go_does(
    first: bytes, second: bytes
) -> None:
    """Decode ignores what follows the first value; Unmarshal refuses anything but space."""
    _assert_as_reference(first + b" " + second)


_SIBLINGS = b'[], {}, [[], {"a": [1, "]"]}], "}", 1.5, '


@given(
    st.lists(_malformed(), min_size=1, max_size=3),
    st.sampled_from([b"[@]", b'{"k":[@]}', b'{"a":{"b":[], "c":{}}, "d":[[@]]}']),
)
def test_errors_after_complete_siblings_find_their_container(
    parts: list[bytes], shape: bytes
) -> None:
    """The innermost open container decides Go's context (`after array element` or `after
    object key:value pair`): malformed parts after complete siblings of both kinds."""
    _assert_as_reference(shape.replace(b"@", _SIBLINGS + b",".join(parts)))


# --- each of Python's messages ----------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        # Expecting value: at the top, after `[`, `,` and `:`; literals, minus, NaN/Infinity
        b"",
        b" \n",
        b"}",
        b"[",
        b"[,",
        b"[1,]",
        b'{"a":}',
        b'{"a":',
        b"[tru",
        b"[trux]",
        b"[nul]",
        b"[fals3]",
        b"[-]",
        b"[-",
        b"[-x]",
        b"[NaN]",
        b'["NaN",NaN]',
        b'{"I":Infinity}',
        b"[-Infinity]",
        b"-Infinity",
        b"[-Inf]",
        b"[\xc3\xa9]",
        b"[\xff]",
        # Expecting property name: after `{` and after `,`
        b"{",
        b"{]",
        b'{"a":1,}',
        b'{"a":1,',
        b"{'a':1}",
        # Expecting ':' delimiter
        b'{"a"',
        b'{"a" 1}',
        b'{"a"\x7f}',
        # Expecting ',' delimiter: arrays, objects, after numbers Go reads on
        b"[1 2]",
        b"[1",
        b'{"a":1 x',
        b'{"a":"b" "c"}',
        b"[[1],[2] [3]]",
        b'[{"a":[1,{"b":2}]} x]',
        b'{"a":[1,2],"b":{"c":[]} x}',
        b'[{"[":"]"} x]',
        b'["\\"[",{"a":"\\\\"} x]',
        b"[1.]",
        b"[1.",
        b"[1.x]",
        b"[1.5.]",
        b"[01]",
        b"[-01]",
        b"[0.e]",
        b"[1e]",
        b"[1e+]",
        b"[1e+",
        b"[1E-x]",
        b"[1.5e3e]",
        b'{"a":1.}',
        b'{"a":-0e}',
        b"[" + b"7" * 5000 + b".]",
        # strings: control characters, escapes, \u escapes and pairs, cut anywhere
        b'"abc',
        b'["abc',
        b'"a\\',
        b'"a\x01"',
        b'"a\tb"',
        b'"a\\qb"',
        b'"a\\u12g4"',
        b'"a\\u12',
        b'"a\\u1234',
        b'"\\ud800\\u12g4"',
        b'"\\ud800\\u12"',
        b'"\\ud800\\',
        b'"\xff\\x"',
        # after the first value (Unmarshal) and numbers at the top
        b"[1] x",
        b"[1]]",
        b"12 x",
        b"1x",
        b"1.",
        b"1.x",
        b"1e",
        b"-",
        b"-0.5e+",
        b"0123",
        b"7" * 5000 + b".",
        b'"\xc3\xa9" \xc3\xa9',
    ],
)
def test_each_kind_of_error_gives_the_reference_message(body: bytes) -> None:
    _assert_as_reference(body)


def test_a_str_document_with_surrogates_is_read_as_its_utf8() -> None:
    """`unmarshal_go_json` of a str: positions count characters, Go counts bytes."""
    for text in ['["\ud800é" x]', '{"é":1,}', '["\U0001f600", \U0001f600]', '"\udc80\\q"']:
        expected = go_syntax_error(text.encode("utf-8", "surrogatepass"), whole=True)
        with pytest.raises(GoJsonError) as raised:
            unmarshal_go_json(text)
        assert str(raised.value) == expected


@pytest.mark.parametrize(
    ("body", "position", "python_message"),
    [
        # Python 3.13's messages and positions (its Lib/test/test_json/test_fail.py)
        (b'{"spam":42,}', 10, "Illegal trailing comma before end of object"),
        (b'{"spam":42 , }', 11, "Illegal trailing comma before end of object"),
        (b"[123  , ]", 6, "Illegal trailing comma before end of array"),
        (b"[123  ," + b" " * 50 + b"]", 6, "Illegal trailing comma before end of array"),
    ],
)
def test_newer_pythons_trailing_comma_messages_give_the_reference_message(
    body: bytes, position: int, python_message: str
) -> None:
    for whole in (False, True):
        expected = go_syntax_error(body, whole=whole)
        assert go_syntax_error_at(body, position, python_message, whole=whole) == expected


def test_an_unknown_python_message_is_left_to_the_caller() -> None:
    assert go_syntax_error_at(b"[1 2]", 3, "Something new") is None


# --- what is walked ---------------------------------------------------------------------------


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The lengths of the inputs the reference scan is run on."""
    lengths: list[int] = []
    reference = gojson_scanner.go_syntax_error

    def recording(data: bytes, *, whole: bool = False) -> str:
        lengths.append(len(data))
        return reference(data, whole=whole)

    monkeypatch.setattr(gojson_scanner, "go_syntax_error", recording)
    yield lengths


_MIB = 1024 * 1024
_NAMES = b",".join(b'"node-\\"%07d"' % index for index in range(_MIB // 14))
_LISTS = b"[]," * (_MIB // 3)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"NodeNames":[' + _NAMES + b" x]}", "invalid character 'x' after array element"),
        (
            b'{"NodeNames":[' + _NAMES + b'],"Pod":{"a":1 "b"}}',
            "invalid character '\"' after object key:value pair",
        ),
        (b"[" + _LISTS + b"x]", "invalid character 'x' looking for beginning of value"),
        (b"[" + _LISTS + b"[1.]]", "invalid character ']' after decimal point in numeric literal"),
        (b"[" + _LISTS, "unexpected EOF"),
        (b'{"a":"' + b"\\n" * (_MIB // 2), "unexpected EOF"),
        (
            b'{"NodeNames":[' + _NAMES + b",NaN]}",
            "invalid character 'N' looking for beginning of value",
        ),
        (b"[" + b"1" * _MIB + b"e+]", "invalid character ']' in exponent of numeric literal"),
        (b" " * _MIB + b"1" * _MIB + b".", "unexpected EOF"),
        (
            b"[" + b"[" * 500 + b"]" * 500 + b"," + _LISTS + b"}",
            "invalid character '}' looking for beginning of value",
        ),
    ],
)
def test_a_large_malformed_document_is_walked_only_near_its_error(
    walked: list[int], body: bytes, message: str
) -> None:
    with pytest.raises(GoJsonError) as raised:
        decode_go_json(body)
    assert str(raised.value) == message
    assert walked and max(walked) <= 64


def test_trailing_data_after_a_large_value_is_found_without_a_walk(walked: list[int]) -> None:
    body = b'{"NodeNames":[' + _NAMES + b"]}" + b" " * 1000 + b"x"
    with pytest.raises(GoJsonError, match="invalid character 'x' after top-level value"):
        unmarshal_go_json(body)
    assert walked == []


def test_nesting_python_cannot_follow_walks_a_bounded_prefix(walked: list[int]) -> None:
    """Python stops near 1,000 levels without saying where the document goes wrong: the
    reference may walk the first 64 KiB only (module docstring of gojson)."""
    with pytest.raises(GoJsonError) as early:
        decode_go_json(b"[" * 2000 + b"x" + _LISTS)
    assert str(early.value) == "invalid character 'x' looking for beginning of value"
    with pytest.raises(GoJsonError, match="nested too deeply"):
        decode_go_json(b"[" * 2000 + _LISTS + b"x")
    assert max(walked) == 64 * 1024
