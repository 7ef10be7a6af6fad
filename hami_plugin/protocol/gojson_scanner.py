"""Go's `encoding/json` scanner (scanner.go), for its syntax-error messages only.

Python's JSON parser gives the values; this scanner gives the text Go reports for a malformed
document (`invalid character 'x' looking for beginning of value`, `unexpected EOF`, ...), state
by state as scanner.go walks the bytes, so the messages match Go's byte for byte. The texts
have not changed between Go 1.19 and Go 1.26 (HAMi v2.10 builds with Go 1.26).
"""

from __future__ import annotations

import re

__all__ = ["go_syntax_error"]

_EOF = "EOF"
_UNEXPECTED_EOF = "unexpected EOF"
_UNEXPECTED_END = "unexpected end of JSON input"  # json.Unmarshal's word for both EOFs
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


def go_syntax_error(data: bytes, *, whole: bool = False) -> str:
    """The syntax error Go reports for `data`, "" when it is well formed.

    By default the first value is checked as `json.Decoder.Decode` reads it (what follows it
    is not looked at; `EOF` for a blank input, `unexpected EOF` for a cut one). With `whole`
    the input must be exactly one value as `json.Unmarshal` wants (`unexpected end of JSON
    input`, `invalid character 'x' after top-level value`).
    """
    try:
        end = _scan_value(data)
        if whole:
            end = _skip_space(data, end)
            if end < len(data):
                raise _invalid(data[end], "after top-level value")
    except _SyntaxError as error:
        message = str(error)
        if whole and message in (_EOF, _UNEXPECTED_EOF):
            return _UNEXPECTED_END
        return message
    return ""


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


def _skip_space(data: bytes, index: int) -> int:
    while index < len(data) and data[index] in _SPACE_BYTES:
        index += 1
    return index


def _scan_value(data: bytes) -> int:
    """Scan the first value of `data`; return the index just after it."""
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
                return index  # the first value is complete
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
