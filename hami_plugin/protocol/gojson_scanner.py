"""Go's `encoding/json` scanner (scanner.go), for its syntax-error messages only.

Python's JSON parser gives the values; this scanner gives the text Go reports for a malformed
document (`invalid character 'x' looking for beginning of value`, `unexpected EOF`, ...), state
by state as scanner.go walks the bytes, so the messages match Go's byte for byte. The texts
have not changed between Go 1.19 and Go 1.26 (HAMi v2.10 builds with Go 1.26).

`go_syntax_error` walks the whole document in Python: the reference, up to a few hundred ms
of CPU per MiB of small tokens. The decoders of untrusted bodies use `go_syntax_error_at` and
`go_syntax_error_after_value` instead: Python's C parser has already found where the document
goes wrong, and the two grammars agree up to there (but for numbers, of which Python may read
only a prefix), so only a few bytes from there are walked, after a stand-in prefix that puts
the scanner in the state it would be in at that point. Finding that state takes a few C-speed
passes of bytes operations over the prefix, so a malformed document costs about what decoding a
valid one of the same size does (tests/protocol/test_gojson_errors.py holds the two to the same
messages).
"""

from __future__ import annotations

import operator
import re
from array import array
from itertools import accumulate

__all__ = [
    "go_syntax_error",
    "go_syntax_error_after_value",
    "go_syntax_error_at",
    "go_syntax_error_prefix",
]

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


def go_syntax_error_at(
    data: bytes, position: int, python_message: str, *, whole: bool = False
) -> str | None:
    """The syntax error Go reports for `data` (as `go_syntax_error` gives it), a document
    Python's `json` parser refused at byte `position` with `python_message` (the
    `JSONDecodeError`'s `msg`).

    None when `python_message` is not one Python's parser is known to give, or when Go's error
    would lie beyond the bytes walked (not known to happen); the caller then settles it some
    other way (`go_syntax_error_prefix`).
    """
    if python_message.startswith("Unterminated string"):
        # Python read the string to the end of the input and found nothing wrong on the way
        stand_in, position = b'"', len(data)
    elif python_message == "Expecting ',' delimiter":
        stand_in = _container_and_value(data, position)
    elif python_message == "Expecting value" and position == _non_space(data, 0):
        stand_in = b""  # the first value itself: a blank document is Go's `EOF`
    elif python_message.startswith("Illegal trailing comma"):  # Python 3.13+, at the comma
        stand_in = b'{"":0,' if python_message.endswith("object") else b"[0,"
        position = _non_space(data, position + 1)
    elif python_message in _STAND_INS:
        stand_in = _STAND_INS[python_message]
    else:
        return None
    end = position + _WINDOW
    message = go_syntax_error(stand_in + data[position:end])
    if not message or (message in (_EOF, _UNEXPECTED_EOF) and end < len(data)):
        return None
    return _UNEXPECTED_END if whole and message in (_EOF, _UNEXPECTED_EOF) else message


def go_syntax_error_after_value(data: bytes, start: int, end: int, *, whole: bool = False) -> str:
    """The syntax error Go reports for `data` whose first value Python's `json` parser read
    as `data[start:end]`, "" for none. Go may read on where Python stopped, after a number
    (Python reads `1.` as 1 followed by junk), and with `whole` nothing but space may follow."""
    if data[start] in _NUMBER_START:
        message = go_syntax_error(_number_stand_in(data, start, end) + data[end : end + _WINDOW])
        if message:
            return _UNEXPECTED_END if whole and message == _UNEXPECTED_EOF else message
    if whole:
        after = _non_space(data, end)
        if after < len(data):
            return str(_invalid(data[after], "after top-level value"))
    return ""


def go_syntax_error_prefix(data: bytes, limit: int, *, whole: bool = False) -> str | None:
    """`go_syntax_error` for `data` when its first `limit` bytes tell: always for a document
    no longer than that; for a longer one, an error inside them other than the end of input,
    or ("") a first value complete inside them (`whole` false). None otherwise."""
    if len(data) <= limit:
        return go_syntax_error(data, whole=whole)
    message = go_syntax_error(data[:limit])
    if message in (_EOF, _UNEXPECTED_EOF) or (whole and not message):
        return None
    return message


# --- from Python's error position ---------------------------------------------------------------

_WINDOW = 8
"""Bytes of the document walked from Python's error position: Go's error lies at most 5 bytes
further (the last hex digit of a `\\u` escape; the last letter of `false`)."""
_NON_SPACE = re.compile(rb"[^ \t\r\n]")
_NUMBER_START = frozenset(b"-0123456789")
_NUMBER_BYTES = b"+-.0123456789eE"
_DIGIT_RUN = re.compile(rb"[0-9]{2,}")
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))
_BACK_STEPS = bytes.maketrans(b"[]{}", b"\xff\x01\xff\x01")  # signed: opener -1, closer +1

# Where Python's parser stops, what it was expecting names the state of Go's scanner there;
# each stand-in prefix leads the scanner into that state, so it reads the bytes from the error
# position on as it would inside the whole document.
_STAND_INS = {
    # after `[`, `,` or `:` alike a value must begin (`[0,]` is refused where `[]` is not)
    "Expecting value": b"[0,",
    # after `{` or `,` alike (a `}` right after `{` is an empty object to both parsers)
    "Expecting property name enclosed in double quotes": b'{"":0,',
    "Expecting ':' delimiter": b'{""',
    "Invalid control character at": b'"',
    "Invalid \\escape": b'"',  # at the backslash
    "Invalid \\uXXXX escape": b'"\\',  # at the `u`
}


def _non_space(data: bytes, index: int) -> int:
    """The first byte at or after `index` that is not JSON space (`len(data)`: none)."""
    match = _NON_SPACE.search(data, index)
    return match.start() if match else len(data)


def _container_and_value(data: bytes, position: int) -> bytes:
    """A stand-in for the container open at `position` and the value that ends there. A
    number is kept (its digit runs shortened): Python reads `1.`, `1e+` or `01` as a number
    followed by junk, where Go reads on; any other value stands in as `""`."""
    opener = b'{"":' if _innermost_open(data, position) == ord("{") else b"["
    if data[position - 1] in _DIGITS:  # only a number ends in a digit
        start = len(data[:position].rstrip(_NUMBER_BYTES))
        return opener + _number_stand_in(data, start, position)
    return opener + b'""'


def _number_stand_in(data: bytes, start: int, end: int) -> bytes:
    """The number `data[start:end]` with every run of digits longer than one cut to `11`: the
    same to Go's scanner (a lone `0` stays), and short however long the number."""
    return _DIGIT_RUN.sub(b"11", data[start:end])


def _innermost_open(data: bytes, end: int) -> int:
    """The opening bracket of the innermost container open at `end`, in a prefix that Python's
    parser read as well formed, in C-speed passes: escaped backslashes and quotes dropped, then
    everything but quotes and brackets, then strings (two quotes side by side enclose no
    bracket), then empty pairs twice over (a list of lists shrinks to its outer bracket); then
    the first step back from the end that leaves the depth at -1."""
    skeleton = (
        data[:end]
        .replace(b"\\\\", b"")
        .replace(b'\\"', b"")
        .translate(None, _NOT_STRUCTURE)
        .replace(b'""', b"")
    )
    if b'"' in skeleton:
        skeleton = b"".join(skeleton.split(b'"')[::2])
    for _ in range(2):
        skeleton = skeleton.replace(b"[]", b"").replace(b"{}", b"")
    depths = accumulate(array("b", skeleton[::-1].translate(_BACK_STEPS)))
    return skeleton[-1 - operator.indexOf(depths, -1)]


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
