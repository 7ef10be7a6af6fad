"""The kube-scheduler extender wire format (`k8s.io/kube-scheduler/extender/v1`), as Go speaks it.

Pure: bytes in, values out, values in, bytes out; no sockets. The daemon's HTTP server reads a
body (at most `max_bytes + 1` bytes), hands it to `decode_filter_request` /
`decode_binding_request`, and sends the `HttpReply` it gets back or the one `filter_reply` /
`binding_reply` renders from its decision.

The v1 types carry no JSON tags (kubernetes `staging/src/k8s.io/kube-scheduler/extender/v1/
types.go`), so the keys are the Go field names and Go's decoder matches them case-insensitively
(`Pod`, `pod`, `POD`); unknown keys are ignored; for a key given twice the last one wins.
Malformed bodies give the message Go's `json.Decoder` gives (`EOF`, `unexpected EOF`,
`invalid character 'x' looking for beginning of value`, `json: cannot unmarshal string into Go
struct field ExtenderArgs.NodeNames of type []string`), which HAMi v2.10 answers as the result's
`Error` with HTTP 200 (`pkg/scheduler/routes/route.go` lines 64-108); a body without a pod gives
HAMi's `extender args missing pod` (route.go 72-77).

Results are rendered as Go's `encoding/json` renders the v1 structs: every field present in
declaration order, `null` for a nil pointer or map, compact, strings escaped as Go escapes them
(`<` `>` `&` as `\\u003c` `\\u003e` `\\u0026`, U+2028/U+2029 escaped, invalid UTF-8 as
`\\ufffd`), map keys sorted. Reference: hami-reference.md section 3.8.

Not modelled: the pod and the node objects are kept as the JSON objects they arrived as (read
them with `hami_plugin.protocol.objects`), so Go's type errors *inside* a pod or node are
reported by that reader instead; duplicate keys do not merge objects as Go would (last wins);
Python's JSON parser stops at about 1,000 levels of nesting where Go stops at 10,000.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "JSON_CONTENT_TYPE",
    "MAX_BODY_BYTES",
    "MISSING_POD_MESSAGE",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "ExtenderRequestError",
    "HttpReply",
    "binding_reply",
    "body_too_large_message",
    "decode_binding_request",
    "decode_filter_request",
    "decode_go_json",
    "encode_go_json",
    "filter_reply",
    "parse_binding_args",
    "parse_binding_result",
    "parse_extender_args",
    "parse_filter_result",
    "render_binding_result",
    "render_filter_result",
]

MAX_BODY_BYTES = 1024 * 1024
"""HAMi reads at most 1 MiB of a /filter or /bind body (route.go line 33)."""
JSON_CONTENT_TYPE = "application/json"
MISSING_POD_MESSAGE = "extender args missing pod"


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


# --- Go JSON: decoding ---------------------------------------------------------------------


class _NumberText(str):
    """A JSON number Python cannot hold exactly (an integer of thousands of digits, or a float
    beyond the float range), kept as its text rather than coerced; rendered back as a number."""

    __slots__ = ()


def _number_or_text(parse: type[int] | type[float]) -> Any:
    def convert(text: str) -> object:
        try:
            value = parse(text)
        except ValueError:  # int: longer than Python's 4300-digit conversion limit
            return _NumberText(text)
        if isinstance(value, float) and not math.isfinite(value):
            return _NumberText(text)
        return value

    return convert


def _reject_constant(text: str) -> object:
    raise ValueError(f"{text} is not JSON")  # Python accepts NaN and Infinity, Go does not


_DECODER = json.JSONDecoder(
    parse_int=_number_or_text(int),
    parse_float=_number_or_text(float),
    parse_constant=_reject_constant,
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_JSON_SPACE = " \t\r\n"
_TOO_DEEP = "JSON nested too deeply (this decoder stops at about 1000 levels)"


def decode_go_json(body: bytes) -> Any:
    """The first JSON value of `body`, decoded as Go's `json.Decoder.Decode` reads it.

    Bytes after the first value are ignored, invalid UTF-8 and lone surrogate escapes inside
    strings become U+FFFD, and NaN/Infinity are errors. Raises ExtenderRequestError with
    Go's message (`EOF` for an empty or blank body).
    """
    text = body.decode("utf-8", "surrogateescape")
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    if start == len(text):
        raise ExtenderRequestError("EOF")
    try:
        value, _end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError) as error:
        message = _go_syntax_error(body)
        if not message:
            # Only nesting between Python's and Go's depth limits gets here.
            message = _TOO_DEEP if isinstance(error, RecursionError) else str(error)
        raise ExtenderRequestError(message) from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # Python reads `1.` or `1e` as the number 1 followed by junk; Go wants the rest.
        message = _go_syntax_error(body)
        if message:
            raise ExtenderRequestError(message)
    if (not text.isascii() and _SURROGATE.search(text)) or (
        "\\u" in text and _SURROGATE_ESCAPE.search(text)
    ):
        value = _replace_surrogates(value)
    return value


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, _NumberText):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_surrogates(key): _replace_surrogates(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(item) for item in value]
    return value


_EOF = "EOF"
_UNEXPECTED_EOF = "unexpected EOF"
_MAX_DEPTH = 10000  # encoding/json scanner.go maxNestingDepth
_SPACE_BYTES = frozenset(b" \t\r\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset(b'bfnrt\\/"')
_PLAIN_STRING = re.compile(rb'[^"\\\x00-\x1f]*')
_LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}
_IN_OBJECT_KEY, _IN_OBJECT_VALUE, _IN_ARRAY = 0, 1, 2
_GO_CHAR_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r"}


class _SyntaxError(Exception):
    pass


def _quote_char(byte: int) -> str:
    """encoding/json's quoteChar: the byte as a rune, in single quotes, `strconv.Quote`-d."""
    if byte == ord("'"):
        return "'\\''"
    if byte == ord('"'):
        return "'\"'"
    if byte == ord("\\"):
        return "'\\\\'"
    if byte in _GO_CHAR_ESCAPES:
        return f"'{_GO_CHAR_ESCAPES[byte]}'"
    if byte < 0x20 or byte == 0x7F:
        return f"'\\x{byte:02x}'"
    char = chr(byte)
    if byte >= 0x80 and not char.isprintable():
        return f"'\\u{byte:04x}'"
    return f"'{char}'"


def _invalid(byte: int, context: str) -> _SyntaxError:
    return _SyntaxError(f"invalid character {_quote_char(byte)} {context}")


def _go_syntax_error(data: bytes) -> str:
    """The error Go's `json.Decoder` reports for the first value of `data`, "" when it is
    well formed. Follows encoding/json scanner.go state by state, so the messages match."""
    try:
        _scan_value(data)
    except _SyntaxError as error:
        return str(error)
    return ""


def _skip_space(data: bytes, index: int) -> int:
    while index < len(data) and data[index] in _SPACE_BYTES:
        index += 1
    return index


def _scan_value(data: bytes) -> None:
    end = len(data)
    index = _skip_space(data, 0)
    if index == end:
        raise _SyntaxError(_EOF)
    stack: list[int] = []
    expect_key = False
    while True:
        # A value (or, right after `{` or `,` in an object, a key string) starts here.
        index = _skip_space(data, index)
        if index == end:
            raise _SyntaxError(_UNEXPECTED_EOF)
        byte = data[index]
        if expect_key:
            if byte != ord('"'):
                raise _invalid(byte, "looking for beginning of object key string")
            index = _scan_string(data, index + 1)
        elif byte in (ord("{"), ord("[")):
            stack.append(_IN_OBJECT_KEY if byte == ord("{") else _IN_ARRAY)
            if len(stack) > _MAX_DEPTH:
                raise _invalid(byte, "exceeded max depth")
            index = _skip_space(data, index + 1)
            if index == end:
                raise _SyntaxError(_UNEXPECTED_EOF)
            closing = ord("}") if byte == ord("{") else ord("]")
            if data[index] != closing:
                expect_key = byte == ord("{")
                continue
            stack.pop()
            index += 1
        elif byte == ord('"'):
            index = _scan_string(data, index + 1)
        elif byte == ord("-") or byte in _DIGITS:
            index = _scan_number(data, index)
        elif byte in _LITERALS:
            index = _scan_literal(data, index, _LITERALS[byte])
        else:
            raise _invalid(byte, "looking for beginning of value")
        expect_key = False
        # After a value: close containers, or find the next key or element.
        while True:
            if not stack:
                return  # the first value is complete; Go's Decoder reads no further
            index = _skip_space(data, index)
            if index == end:
                raise _SyntaxError(_UNEXPECTED_EOF)
            byte = data[index]
            state = stack[-1]
            index += 1
            if state == _IN_OBJECT_KEY:
                if byte != ord(":"):
                    raise _invalid(byte, "after object key")
                stack[-1] = _IN_OBJECT_VALUE
                break
            if state == _IN_OBJECT_VALUE:
                if byte == ord(","):
                    stack[-1] = _IN_OBJECT_KEY
                    expect_key = True
                    break
                if byte != ord("}"):
                    raise _invalid(byte, "after object key:value pair")
            else:
                if byte == ord(","):
                    break
                if byte != ord("]"):
                    raise _invalid(byte, "after array element")
            stack.pop()


def _scan_string(data: bytes, index: int) -> int:
    end = len(data)
    while True:
        match = _PLAIN_STRING.match(data, index)
        index = match.end() if match else index
        if index == end:
            raise _SyntaxError(_UNEXPECTED_EOF)
        byte = data[index]
        if byte == ord('"'):
            return index + 1
        if byte != ord("\\"):
            raise _invalid(byte, "in string literal")
        index += 1
        if index == end:
            raise _SyntaxError(_UNEXPECTED_EOF)
        byte = data[index]
        index += 1
        if byte in _SIMPLE_ESCAPES:
            continue
        if byte != ord("u"):
            raise _invalid(byte, "in string escape code")
        for _ in range(4):
            if index == end:
                raise _SyntaxError(_UNEXPECTED_EOF)
            if data[index] not in _HEX:
                raise _invalid(data[index], "in \\u hexadecimal character escape")
            index += 1


def _scan_digits(data: bytes, index: int) -> int:
    while index < len(data) and data[index] in _DIGITS:
        index += 1
    return index


def _scan_number(data: bytes, index: int) -> int:
    end = len(data)
    if data[index] == ord("-"):
        index += 1
        if index == end:
            raise _SyntaxError(_UNEXPECTED_EOF)
        if data[index] not in _DIGITS:
            raise _invalid(data[index], "in numeric literal")
    # A leading 0 takes no more digits (what follows ends the number).
    index = index + 1 if data[index] == ord("0") else _scan_digits(data, index)
    if index < end and data[index] == ord("."):
        index += 1
        if index == end:
            raise _SyntaxError(_UNEXPECTED_EOF)
        if data[index] not in _DIGITS:
            raise _invalid(data[index], "after decimal point in numeric literal")
        index = _scan_digits(data, index)
    if index < end and data[index] in b"eE":
        index += 1
        if index < end and data[index] in b"+-":
            index += 1
        if index == end:
            raise _SyntaxError(_UNEXPECTED_EOF)
        if data[index] not in _DIGITS:
            raise _invalid(data[index], "in exponent of numeric literal")
        index = _scan_digits(data, index)
    return index


def _scan_literal(data: bytes, index: int, literal: bytes) -> int:
    name = literal.decode()
    for position in range(1, len(literal)):
        at = index + position
        if at == len(data):
            raise _SyntaxError(_UNEXPECTED_EOF)
        if data[at] != literal[position]:
            expected = chr(literal[position])
            raise _invalid(data[at], f"in literal {name} (expecting '{expected}')")
    return index + len(literal)


def _go_fold(name: str) -> str:
    """encoding/json's case folding of a key: ASCII upper-cased, any other rune r mapped to
    ToUpper(ToLower(r)) (so the Kelvin sign folds to `K` and the long s to `S`)."""
    if name.isascii():
        return name.upper()
    folded = []
    for char in name:
        lower = "i" if char == "\u0130" else char.lower()
        if len(lower) != 1:
            lower = char
        upper = lower.upper()
        folded.append(upper if len(upper) == 1 else lower)
    return "".join(folded)


def _json_kind(value: object) -> str:
    """The JSON kind Go names in an UnmarshalTypeError."""
    if isinstance(value, _NumberText) or (
        isinstance(value, (int, float)) and not isinstance(value, bool)
    ):
        return "number"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _is_text(value: object) -> bool:
    return isinstance(value, str) and not isinstance(value, _NumberText)


class _FieldErrors:
    """Go's decoder goes on after a type error and reports the first one, in document order."""

    def __init__(self) -> None:
        self.first: str | None = None

    def add(self, value: object, struct: str, path: str, go_type: str) -> None:
        if self.first is None:
            self.first = (
                f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                f"{struct}.{path} of type {go_type}"
            )

    def raise_first(self) -> None:
        if self.first is not None:
            raise ExtenderRequestError(self.first)


_UNCHANGED: Any = object()
"""What a field decoder returns when Go would leave the field as it was (JSON null into a
string, or a value of the wrong type)."""

_FieldDecoder = Callable[[object, str, str, _FieldErrors], Any]
"""(JSON value, Go struct name, full field path, errors) -> the field's new value."""


def _document(body: bytes, go_type: str) -> dict[str, Any] | None:
    value = decode_go_json(body)
    if value is None or isinstance(value, dict):
        return value
    raise ExtenderRequestError(
        f"json: cannot unmarshal {_json_kind(value)} into Go value of type {go_type}"
    )


def _decode_struct(
    document: Mapping[str, Any] | None,
    struct: str,
    fields: Mapping[str, _FieldDecoder],
    errors: _FieldErrors,
    prefix: str = "",
) -> dict[str, Any]:
    """Decode a JSON object into a Go struct's fields as encoding/json does: keys in document
    order, matched to field names case-insensitively (unknown keys skipped), each value
    type-checked (the first error kept), the last key for a field winning."""
    by_folded = {name.upper(): name for name in fields}
    values: dict[str, Any] = {}
    for key, value in (document or {}).items():
        name = by_folded.get(_go_fold(key))
        if name is None:
            continue
        decoded = fields[name](value, struct, prefix + name, errors)
        if decoded is not _UNCHANGED:
            values[name] = decoded
    return values


def _go_string(go_type: str) -> _FieldDecoder:
    def decode(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
        if value is None:  # null leaves a Go string as it was
            return _UNCHANGED
        if not _is_text(value):
            errors.add(value, struct, path, go_type)
            return _UNCHANGED
        return value

    return decode


def _nullable(decode: _FieldDecoder) -> _FieldDecoder:
    """A pointer, slice or map field: null sets it to nil (None)."""

    def decode_nullable(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
        return None if value is None else decode(value, struct, path, errors)

    return decode_nullable


def _object(go_type: str) -> _FieldDecoder:
    def decode(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
        if not isinstance(value, dict):
            errors.add(value, struct, path, go_type)
            return _UNCHANGED
        return value

    return decode


_STR_ONLY = frozenset({str})


def _string_list(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
    if not isinstance(value, list):
        errors.add(value, struct, path, "[]string")
        return _UNCHANGED
    if set(map(type, value)) <= _STR_ONLY:  # thousands of node names: checked in C
        return tuple(value)
    items = []
    for item in value:
        if item is not None and not _is_text(item):
            errors.add(item, struct, path, "string")
        items.append(item if _is_text(item) else "")  # the element keeps its zero value
    return tuple(items)


def _node_items(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
    if not isinstance(value, list):
        errors.add(value, struct, path, "[]v1.Node")
        return _UNCHANGED
    nodes = []
    for item in value:
        if item is not None and not isinstance(item, dict):
            errors.add(item, struct, path, "v1.Node")
        nodes.append(item if isinstance(item, dict) else {})
    return tuple(nodes)


def _node_list(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
    if not isinstance(value, dict):
        errors.add(value, struct, path, "v1.NodeList")
        return _UNCHANGED
    fields = _decode_struct(
        value, "NodeList", {"items": _nullable(_node_items)}, errors, path + "."
    )
    return fields.get("items") or ()


def _failed_nodes(value: object, struct: str, path: str, errors: _FieldErrors) -> Any:
    if not isinstance(value, dict):
        errors.add(value, struct, path, "v1.FailedNodesMap")
        return _UNCHANGED
    result = {}
    for key, item in value.items():
        if item is not None and not _is_text(item):
            errors.add(item, struct, path, "string")
        result[key] = item if _is_text(item) else ""
    return result


_ARGS_FIELDS: Mapping[str, _FieldDecoder] = {
    "Pod": _nullable(_object("v1.Pod")),
    "Nodes": _nullable(_node_list),
    "NodeNames": _nullable(_string_list),
}
_BINDING_ARGS_FIELDS: Mapping[str, _FieldDecoder] = {
    "PodName": _go_string("string"),
    "PodNamespace": _go_string("string"),
    "PodUID": _go_string("types.UID"),
    "Node": _go_string("string"),
}
_FILTER_RESULT_FIELDS: Mapping[str, _FieldDecoder] = {
    "Nodes": _nullable(_node_list),
    "NodeNames": _nullable(_string_list),
    "FailedNodes": _nullable(_failed_nodes),
    "FailedAndUnresolvableNodes": _nullable(_failed_nodes),
    "Error": _go_string("string"),
}
_BINDING_RESULT_FIELDS: Mapping[str, _FieldDecoder] = {"Error": _go_string("string")}


def _parse(body: bytes, struct: str, fields: Mapping[str, _FieldDecoder]) -> dict[str, Any]:
    document = _document(body, f"v1.{struct}")
    errors = _FieldErrors()
    values = _decode_struct(document, struct, fields, errors)
    errors.raise_first()
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


# --- Go JSON: encoding ----------------------------------------------------------------------

_HTML_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"))
_LINE_ESCAPES = (("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _go_escape(encoded: str) -> str:
    """Turn `json.dumps(..., ensure_ascii=False)` output into Go's escaping.

    Both escape `"`, `\\` and control characters alike (Go 1.22+ also writes `\\b` and `\\f`);
    Go further escapes <, >, & and U+2028/U+2029, and writes invalid UTF-8 (here: lone
    surrogates) as `\\ufffd`. These characters only occur inside strings of a JSON text, so
    the whole document can be fixed at once.
    """
    for char, escape in _HTML_ESCAPES:
        if char in encoded:
            encoded = encoded.replace(char, escape)
    if not encoded.isascii():
        for char, escape in _LINE_ESCAPES:
            if char in encoded:
                encoded = encoded.replace(char, escape)
        if _SURROGATE.search(encoded):
            encoded = _SURROGATE.sub(r"\\ufffd", encoded)
    return encoded


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _go_float(value: float) -> str:
    """encoding/json's float64 form: shortest digits, plain notation unless the magnitude is
    below 1e-6 or at least 1e21, then exponent notation without a leading exponent zero."""
    if not math.isfinite(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    magnitude = abs(value)
    if magnitude == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    if magnitude < 1e-6 or magnitude >= 1e21:
        text = repr(value)
        return re.sub(r"e-0(\d)$", r"e-\1", text)
    return format(Decimal(repr(value)).normalize(), "f")


def _encode(value: object, out: list[str]) -> None:
    if isinstance(value, _NumberText):
        out.append(str(value))
    elif isinstance(value, str):
        out.append(_go_escape(_dumps(value)))
    elif value is None or isinstance(value, (bool, int)):
        out.append(_dumps(value))
    elif isinstance(value, float):
        out.append(_go_float(value))
    elif isinstance(value, Mapping):
        out.append("{")
        for position, (key, item) in enumerate(value.items()):
            if position:
                out.append(",")
            out.append(_go_escape(_dumps(str(key))))
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for position, item in enumerate(value):
            if position:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def encode_go_json(value: object) -> bytes:
    """Compact JSON of plain values (mappings in their own key order, lists, strings, numbers,
    booleans, None) with Go's escaping and float form, as UTF-8. Raises ValueError for NaN or
    infinity and TypeError for other types, as Go's Marshal fails on them."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")


def _string_list_json(items: Sequence[str] | None) -> str:
    if items is None:
        return "null"
    return _go_escape(_dumps(list(items)))


def _string_map_json(mapping: Mapping[str, str] | None) -> str:
    if mapping is None:
        return "null"
    # Go sorts map keys by their UTF-8 bytes, which is code point order: sort_keys.
    plain = mapping if isinstance(mapping, dict) else dict(mapping)
    return _go_escape(json.dumps(plain, ensure_ascii=False, separators=(",", ":"), sort_keys=True))


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
        + _string_list_json(result.node_names)
        + ',"FailedNodes":'
        + _string_map_json(result.failed_nodes)
        + ',"FailedAndUnresolvableNodes":'
        + _string_map_json(result.failed_and_unresolvable_nodes)
        + ',"Error":'
        + _go_escape(_dumps(result.error))
        + "}"
    ).encode("utf-8")


def render_binding_result(result: ExtenderBindingResult) -> bytes:
    """ExtenderBindingResult as Go writes it: `{"Error":""}`."""
    return ('{"Error":' + _go_escape(_dumps(result.error)) + "}").encode("utf-8")


# --- HTTP replies ---------------------------------------------------------------------------


def filter_reply(result: ExtenderFilterResult) -> HttpReply:
    """HTTP 200 with the rendered result, errors included (HAMi answers every decoded /filter
    call with 200, route.go lines 98-109)."""
    return HttpReply(200, render_filter_result(result))


def binding_reply(result: ExtenderBindingResult) -> HttpReply:
    """HTTP 200 with the rendered result (route.go lines 141-153)."""
    return HttpReply(200, render_binding_result(result))


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
