"""Decoding a JSON object into a Go struct's fields as `encoding/json` (decode.go) does.

A struct is described by a mapping of Go field names to field decoders. Keys are matched to
the fields in document order with Go's folding (`gojson.fold_name`), unknown keys skipped, the
last key for a field winning; each value is type-checked, and, as Go's decoder goes on after a
type error, only the first error in document order is reported (`json: cannot unmarshal string
into Go struct field ExtenderArgs.NodeNames of type []string`).

Not modelled: duplicate keys holding objects do not merge as Go would (the last one wins).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hami_plugin.protocol.gojson import (
    GoJsonError,
    decode_go_json,
    fold_name,
    is_json_string,
    json_kind,
)

__all__ = [
    "UNCHANGED",
    "FieldDecoder",
    "FieldErrors",
    "decode_document",
    "decode_struct",
    "go_object",
    "go_string",
    "nullable",
    "object_slice",
    "string_map",
    "string_slice",
]


class FieldErrors:
    """The first type error of a document, as Go's decoder reports it after decoding the rest."""

    def __init__(self) -> None:
        self.first: str | None = None

    def add(self, value: object, struct: str, path: str, go_type: str) -> None:
        """Record that `value` does not fit field `path` of `struct` (type `go_type`)."""
        if self.first is None:
            self.first = (
                f"json: cannot unmarshal {json_kind(value)} into Go struct field "
                f"{struct}.{path} of type {go_type}"
            )

    def raise_first(self) -> None:
        """Raise GoJsonError with the first recorded error, if any."""
        if self.first is not None:
            raise GoJsonError(self.first)


UNCHANGED: Any = object()
"""What a field decoder returns when Go would leave the field as it was (JSON null into a
string, or a value of the wrong type)."""

FieldDecoder = Callable[[object, str, str, FieldErrors], Any]
"""(JSON value, Go struct name, full field path, errors) -> the field's new value."""


def decode_document(data: bytes, go_type: str) -> dict[str, Any] | None:
    """The first value of `data` (as `json.Decoder.Decode`), which must be an object or null
    to decode into the Go struct type `go_type`. Raises GoJsonError with Go's message."""
    value = decode_go_json(data)
    if value is None or isinstance(value, dict):
        return value
    raise GoJsonError(f"json: cannot unmarshal {json_kind(value)} into Go value of type {go_type}")


def decode_struct(
    document: Mapping[str, Any] | None,
    struct: str,
    fields: Mapping[str, FieldDecoder],
    errors: FieldErrors,
    prefix: str = "",
) -> dict[str, Any]:
    """The fields `document` sets, by Go field name. `prefix` is the path of an embedded
    struct's field in the outer one (`Nodes.`), as Go names it in errors."""
    by_folded = {fold_name(name): name for name in fields}
    values: dict[str, Any] = {}
    for key, value in (document or {}).items():
        name = by_folded.get(fold_name(key))
        if name is None:
            continue
        decoded = fields[name](value, struct, prefix + name, errors)
        if decoded is not UNCHANGED:
            values[name] = decoded
    return values


def go_string(go_type: str) -> FieldDecoder:
    """A string field (of Go type `go_type`, such as `types.UID`)."""

    def decode(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
        if value is None:  # null leaves a Go string as it was
            return UNCHANGED
        if not is_json_string(value):
            errors.add(value, struct, path, go_type)
            return UNCHANGED
        return value

    return decode


def nullable(decode: FieldDecoder) -> FieldDecoder:
    """A pointer, slice or map field: null sets it to nil (None)."""

    def decode_nullable(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
        return None if value is None else decode(value, struct, path, errors)

    return decode_nullable


def go_object(go_type: str) -> FieldDecoder:
    """A struct field kept as the JSON object it arrived as."""

    def decode(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
        if not isinstance(value, dict):
            errors.add(value, struct, path, go_type)
            return UNCHANGED
        return value

    return decode


_STR_ONLY = frozenset({str})


def string_slice(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
    """A `[]string` field, as a tuple; a null or mistyped element keeps its zero value."""
    if not isinstance(value, list):
        errors.add(value, struct, path, "[]string")
        return UNCHANGED
    if set(map(type, value)) <= _STR_ONLY:  # thousands of node names: checked in C
        return tuple(value)
    items = []
    for item in value:
        if item is not None and not is_json_string(item):
            errors.add(item, struct, path, "string")
        items.append(item if is_json_string(item) else "")
    return tuple(items)


def object_slice(element_type: str) -> FieldDecoder:
    """A slice of structs (elements of Go type `element_type`) kept as JSON objects, as a
    tuple; a null or mistyped element keeps its zero value (an empty object)."""

    def decode(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
        if not isinstance(value, list):
            errors.add(value, struct, path, f"[]{element_type}")
            return UNCHANGED
        items = []
        for item in value:
            if item is not None and not isinstance(item, dict):
                errors.add(item, struct, path, element_type)
            items.append(item if isinstance(item, dict) else {})
        return tuple(items)

    return decode


def string_map(go_type: str) -> FieldDecoder:
    """A `map[string]string` field (of Go type `go_type`); a null or mistyped value keeps
    its zero value."""

    def decode(value: object, struct: str, path: str, errors: FieldErrors) -> Any:
        if not isinstance(value, dict):
            errors.add(value, struct, path, go_type)
            return UNCHANGED
        result = {}
        for key, item in value.items():
            if item is not None and not is_json_string(item):
                errors.add(item, struct, path, "string")
            result[key] = item if is_json_string(item) else ""
        return result

    return decode
