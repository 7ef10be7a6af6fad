"""Kubernetes resource quantities (`1`, `1k`, `1Ki`, `500m`, `1e3`, `16Gi`) as exact values.

The grammar is Kubernetes' own (apimachinery `resource.ParseQuantity`):

    quantity        ::= signedNumber suffix
    signedNumber    ::= [ "+" | "-" ] number
    number          ::= digits | digits "." [ digits ] | "." digits
    suffix          ::= binarySI | decimalSI | decimalExponent
    binarySI        ::= Ki | Mi | Gi | Ti | Pi | Ei
    decimalSI       ::= n | u | m | "" | k | M | G | T | P | E
    decimalExponent ::= ( "e" | "E" ) [ "+" | "-" ] digits

The value is returned as an exact `Decimal`, built from the digits without any rounding
context, so `1.5Gi` is exactly 1610612736 and `1e999999999` costs no more than `1e3`. The
`kubernetes` client's `parse_quantity` accepts a superset (it hands the number to `Decimal`, so
`NaN`, ` 1`, `1_000` and `1K` pass there); where both accept a text they agree on the value.
"""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["QuantityError", "exact_integer", "parse_quantity"]

_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?"
    r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?"
)
_DECIMAL_EXPONENTS = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_POWERS = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_MAX_TEXT = 256
"""Longer texts are rejected outright: no Kubernetes quantity comes close."""
_MAX_EXPONENT = 10**6
"""Decimal exponents beyond this are rejected (Go caps them far lower than `Decimal` could)."""
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class QuantityError(ValueError):
    """A text that is not a Kubernetes quantity; the message quotes it."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a quantity as the API server serialises it (or as YAML typed it) to an exact value.

    `int` and `float` are accepted because a YAML file says `nvidia.com/gpu: 1`; a float is read
    through its shortest text form. Raises QuantityError for anything outside the grammar.
    """
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: a boolean is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    text = repr(value) if isinstance(value, float) else value
    if not isinstance(text, str):
        raise QuantityError(f"invalid quantity {value!r}: not a string")
    if len(text) > _MAX_TEXT:
        raise QuantityError(f"invalid quantity {text[:40]!r}...: longer than {_MAX_TEXT} chars")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(f"invalid quantity {text!r}")
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    if not whole and not fraction:
        raise QuantityError(f"invalid quantity {text!r}: no digits")
    coefficient = int(whole + fraction or "0")
    exponent = -len(fraction)
    if suffix:
        if suffix in _BINARY_POWERS:
            coefficient *= 1024 ** _BINARY_POWERS[suffix]
        elif suffix in _DECIMAL_EXPONENTS:
            exponent += _DECIMAL_EXPONENTS[suffix]
        else:
            exponent += int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(f"invalid quantity {text!r}: exponent out of range")
    digits = tuple(int(digit) for digit in str(coefficient))
    return Decimal((1 if sign == "-" else 0, digits, exponent))


def exact_integer(value: Decimal) -> int | None:
    """The value as an `int` when it is a whole number within int64, else None.

    Mirrors Go's `Quantity.AsInt64()` "ok" on the quantity as the API server hands it over
    (canonical form: `1.0` arrives as `1`, `1.5Ki` as `1536`). Not modelled: AsInt64 also says
    no for some canonical texts of 19 significant digits or of large binary suffixes
    (`100Ti`, `1Pi`); no resource request holds such a value. Callers range-check the result.
    """
    if value.is_zero():
        return 0
    adjusted = value.adjusted()  # position of the most significant digit
    if adjusted < 0 or adjusted > 18:
        return None  # |value| < 1 (and not 0), or larger than any int64
    integral = value.to_integral_value()
    if integral != value:
        return None
    result = int(integral)
    if not _INT64_MIN <= result <= _INT64_MAX:
        return None
    return result
