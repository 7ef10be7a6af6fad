"""JSON as Go's `encoding/json` reads and writes it: the one implementation in this project.

HAMi's two daemons speak JSON through Go's package: the node register annotation
(`json.Marshal` / `json.Unmarshal` of `[]*DeviceInfo`), the kube-scheduler extender's bodies
(`json.Decoder`), the admission webhook's reviews. What Go does differently from Python's
`json`, and so what this module adds:

* decoding: `decode_go_json` reads the first value as `json.Decoder.Decode` does (what follows
  is ignored), `unmarshal_go_json` the whole input as `json.Unmarshal` does; invalid UTF-8 and
  lone surrogate escapes become U+FFFD; NaN and Infinity are errors; numbers Python cannot hold
  exactly are kept as their text (`NumberText`); errors carry Go's message (`GoJsonError`, the
  texts from `gojson_scanner`);
* field names: Go matches a key to a struct field case-insensitively with its own folding
  (`fold_name`), the last key for a field winning;
* encoding: compact, `<` `>` `&` written `\\u003c` `\\u003e` `\\u0026`, U+2028/U+2029 escaped,
  invalid UTF-8 (here: lone surrogates) written `\\ufffd`, floats in Go's shortest form, map
  keys sorted (`go_json_string_map`).

A malformed document costs about what a valid one of the same size does: Python's parser finds
the error, and `gojson_scanner` gives Go's message from the bytes around it; the bodies decoded
here come from anyone who can reach the extender.

Decoding into typed Go structs, with Go's type errors, is `gojson_struct`. Pure: no I/O, no
logging. Not modelled: Python's parser stops at about 1,000 levels of nesting where Go stops at
10,000; such a document is refused, with Go's message when its error lies in its first 64 KiB.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeGuard

from hami_plugin.protocol.gojson_scanner import (
    go_syntax_error_after_value,
    go_syntax_error_at,
    go_syntax_error_prefix,
)

__all__ = [
    "JSON_CONTENT_TYPE",
    "GoJsonError",
    "NumberText",
    "decode_go_json",
    "encode_go_json",
    "fold_keys",
    "fold_name",
    "go_json_string",
    "go_json_string_list",
    "go_json_string_map",
    "is_json_string",
    "json_kind",
    "unmarshal_go_json",
]

JSON_CONTENT_TYPE = "application/json"
"""The media type of every JSON body HAMi's HTTP endpoints read and write."""


class GoJsonError(ValueError):
    """A document Go's `encoding/json` refuses; the message is the one Go gives."""


class NumberText(str):
    """A JSON number Python cannot hold exactly (an integer of thousands of digits, or a float
    beyond the float range), kept as its text rather than coerced; encoded back as a number."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__str__(self)  # a number in messages, not a quoted string


def _number_or_text(parse: type[int] | type[float]) -> Any:
    def convert(text: str) -> object:
        try:
            value = parse(text)
        except ValueError:  # int: longer than Python's 4300-digit conversion limit
            return NumberText(text)
        if isinstance(value, float) and not math.isfinite(value):
            return NumberText(text)
        return value

    return convert


class _ConstantError(ValueError):
    """NaN, Infinity or -Infinity: Python's parser reads them, Go's does not."""


def _reject_constant(text: str) -> object:
    raise _ConstantError(f"{text} is not JSON")


# Integers are parsed in C; only one longer than Python converts (rare) needs the slow
# decoder that keeps it as text. Floats always go through the hook, to catch 1e999.
def _members_in_order(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, a repeated key placed where it last appears: Go's decoder assigns
    fields in document order, so when `fold_keys` later folds `id` and `ID` together the member
    written last wins, as in Go (a plain dict keeps a repeated key at its first place)."""
    members = dict(pairs)
    if len(members) == len(pairs):
        return members
    members.clear()
    for name, item in pairs:
        members.pop(name, None)
        members[name] = item
    return members


_DECODER = json.JSONDecoder(
    parse_float=_number_or_text(float),
    parse_constant=_reject_constant,
    object_pairs_hook=_members_in_order,
)
_LONG_INT_DECODER = json.JSONDecoder(
    parse_int=_number_or_text(int),
    parse_float=_number_or_text(float),
    parse_constant=_reject_constant,
    object_pairs_hook=_members_in_order,
)
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_JSON_SPACE = " \t\r\n"
_TOO_DEEP = "JSON nested too deeply (this decoder stops at about 1000 levels)"
_REFERENCE_LIMIT = 64 * 1024
"""How much of a document the pure-Python reference scanner may walk (about 50 ms of CPU) when
Python's parser cannot say where it goes wrong."""


def decode_go_json(data: bytes) -> Any:
    """The first JSON value of `data`, decoded as Go's `json.Decoder.Decode` reads it.

    Bytes after the first value are ignored. Raises GoJsonError with Go's message (`EOF` for
    an empty or blank input).
    """
    return _decode(data.decode("utf-8", "surrogateescape"), data, whole=False)


def unmarshal_go_json(data: bytes | str) -> Any:
    """The one JSON value `data` holds, decoded as Go's `json.Unmarshal` reads it (a str is
    read as its UTF-8 text). Raises GoJsonError with Go's message (`unexpected end of JSON
    input`, `invalid character 'x' after top-level value`, ...)."""
    if isinstance(data, str):
        return _decode(data, None, whole=True)
    return _decode(data.decode("utf-8", "surrogateescape"), data, whole=True)


def _decode(text: str, data: bytes | None, *, whole: bool) -> Any:
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    decoder = _DECODER
    try:
        try:
            value, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, _ConstantError):
            raise
        except ValueError:  # an integer longer than int() converts: kept as its text
            decoder = _LONG_INT_DECODER
            value, end = decoder.raw_decode(text, start)
    except json.JSONDecodeError as error:
        raise GoJsonError(_syntax_error(text, data, error, whole=whole)) from None
    except _ConstantError:
        # Python stopped at the first NaN or Infinity without saying where: read again with
        # every N and I made `#`, which begins no value (`-#` neither) and is fine in a string.
        try:
            decoder.raw_decode(text.replace("N", "#").replace("I", "#"), start)
        except json.JSONDecodeError as error:
            raise GoJsonError(_syntax_error(text, data, error, whole=whole)) from None
        raise AssertionError("a document read with NaN and without it") from None
    except RecursionError:
        # Only nesting between Python's and Go's depth limits gets here.
        message = go_syntax_error_prefix(_bytes(text, data), _REFERENCE_LIMIT, whole=whole)
        raise GoJsonError(message or _TOO_DEEP) from None
    # Python reads `1.` or `1e` as the number 1 followed by junk, where Go wants the rest;
    # Unmarshal also refuses anything but space after the value.
    if text[start] in "-0123456789" or (whole and text[end:].strip(_JSON_SPACE)):
        raw = _bytes(text, data)
        message = go_syntax_error_after_value(
            raw, start, _byte_offset(text, end, data), whole=whole
        )
        if message:
            raise GoJsonError(message)
    if (not text.isascii() and _SURROGATE.search(text)) or (
        "\\u" in text and _SURROGATE_ESCAPE.search(text)
    ):
        try:
            value = _replace_surrogates(value)
        except RecursionError:
            raise GoJsonError(_TOO_DEEP) from None
    return value


def _bytes(text: str, data: bytes | None) -> bytes:
    return data if data is not None else text.encode("utf-8", "surrogatepass")


def _byte_offset(text: str, position: int, data: bytes | None) -> int:
    """Where character `position` of `text` lies in `_bytes(text, data)`."""
    if text.isascii():
        return position
    return len(
        text[:position].encode("utf-8", "surrogatepass" if data is None else "surrogateescape")
    )


def _syntax_error(
    text: str, data: bytes | None, error: json.JSONDecodeError, *, whole: bool
) -> str:
    """Go's message for the document Python's parser refused with `error`."""
    raw = _bytes(text, data)
    message = go_syntax_error_at(raw, _byte_offset(text, error.pos, data), error.msg, whole=whole)
    if message is None:
        message = go_syntax_error_prefix(raw, _REFERENCE_LIMIT, whole=whole)
    return message or str(error)


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, NumberText):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_surrogates(key): _replace_surrogates(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(item) for item in value]
    return value


def fold_name(name: str) -> str:
    """encoding/json's foldName: two keys name the same struct field when their folds are
    equal. ASCII is upper-cased, any other rune r mapped to ToUpper(ToLower(r)), so the Kelvin
    sign folds to `K`, the long s to `S` and the dotted capital I to `I`."""
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


def fold_keys(members: Mapping[str, Any]) -> dict[str, Any]:
    """An object's members by folded key (`fold_name`), as Go matches them to struct fields:
    of the keys that fold alike, the last one wins."""
    return {
        (name.upper() if name.isascii() else fold_name(name)): item
        for name, item in members.items()
    }


def json_kind(value: object) -> str:
    """The JSON kind of a decoded value as Go names it in an UnmarshalTypeError."""
    if isinstance(value, NumberText) or (
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


def is_json_string(value: object) -> TypeGuard[str]:
    """Whether a decoded value was a JSON string (a `NumberText` is a number)."""
    return isinstance(value, str) and not isinstance(value, NumberText)


# --- encoding ----------------------------------------------------------------------------------

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


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_SORTED_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)
_dumps = _ENCODER.encode


def go_json_string(text: str) -> str:
    """`text` as Go's encoding/json writes a string, quotes included."""
    return _go_escape(_dumps(text))


def go_json_string_list(items: Sequence[str] | None) -> str:
    """A Go `[]string` as encoding/json writes it: `null` for a nil slice (None)."""
    if items is None:
        return "null"
    return _go_escape(_dumps(list(items)))


def go_json_string_map(mapping: Mapping[str, str] | None) -> str:
    """A Go `map[string]string` as encoding/json writes it: keys sorted by their UTF-8 bytes
    (which is code point order), `null` for a nil map (None)."""
    if mapping is None:
        return "null"
    plain = mapping if isinstance(mapping, dict) else dict(mapping)
    return _go_escape(_SORTED_ENCODER.encode(plain))


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
    if isinstance(value, NumberText):
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
