"""Kubernetes quantities: exact values, Kubernetes' grammar, agreement with the client."""

from __future__ import annotations

import decimal
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from hami_plugin.protocol.quantity import QuantityError, exact_integer, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000", Decimal(1000)),
        ("1k", Decimal(1000)),
        ("1Ki", Decimal(1024)),
        ("500m", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("1e+3", Decimal(1000)),
        ("1E", Decimal(10) ** 18),  # exa, not an exponent
        ("1Ei", Decimal(2) ** 60),
        ("16Gi", Decimal(17179869184)),
        ("16.0Gi", Decimal(17179869184)),
        ("1.5Gi", Decimal(1610612736)),
        ("0.1n", Decimal("1e-10")),
        ("250u", Decimal("0.00025")),
        ("+7", Decimal(7)),
        ("-7", Decimal(-7)),
        (".5", Decimal("0.5")),
        ("5.", Decimal(5)),
        ("2M", Decimal(2_000_000)),
        (3, Decimal(3)),
        (2.5, Decimal("2.5")),
        (1e20, Decimal("1e20")),
    ],
)
def test_values(text: str | int | float, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        ".",
        "+",
        "1K",
        "1ki",
        " 1",
        "1 ",
        "NaN",
        "Infinity",
        "1_000",
        "1e",
        "1e1.5",
        "--1",
        "1Kib",
        "0x10",
        "1e99999999999",
        "9" * 300,
        "1 Gi",
    ],
)
def test_rejected(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_booleans_are_not_quantities() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


@pytest.mark.parametrize(
    ("text", "integer"),
    [
        ("1k", 1000),
        ("1Ki", 1024),
        ("1e3", 1000),
        ("16Gi", 17179869184),
        ("0", 0),
        ("-0", 0),
        ("-3", -3),
        ("500m", None),
        ("1500m", None),
        ("2000m", 2),
        ("1e-3", None),
        ("1e19", None),  # beyond int64
        ("9223372036854775807", 9223372036854775807),
        ("9223372036854775808", None),  # int64 max + 1
        ("9300P", None),  # 9.3e18, 19 digits but beyond int64
        ("-9223372036854775808", -9223372036854775808),
        ("-9223372036854775809", None),
        ("1e1000000", None),
        ("1e-1000000", None),
    ],
)
def test_exact_integer(text: str, integer: int | None) -> None:
    assert exact_integer(parse_quantity(text)) == integer


_DIGITS = st.text("0123456789", min_size=1, max_size=12)
_SUFFIX = st.sampled_from(
    ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]
)
_EXPONENT = st.builds(
    lambda letter, sign, digits: f"{letter}{sign}{digits}",
    st.sampled_from("eE"),
    st.sampled_from(["", "+", "-"]),
    st.text("0123456789", min_size=1, max_size=3),
)


@st.composite
def grammar_quantities(draw: st.DrawFn) -> str:
    """Texts of Kubernetes' quantity grammar."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    shape = draw(st.sampled_from(["int", "frac", "trailing-dot", "leading-dot"]))
    whole, fraction = draw(_DIGITS), draw(_DIGITS)
    number = {
        "int": whole,
        "frac": f"{whole}.{fraction}",
        "trailing-dot": f"{whole}.",
        "leading-dot": f".{fraction}",
    }[shape]
    suffix = draw(st.one_of(_SUFFIX, _EXPONENT))
    return sign + number + suffix


def _client_value(text: str) -> Decimal:
    with decimal.localcontext(prec=200):
        # the kubernetes client ships no type hints
        return Decimal(client_parse_quantity(text))  # type: ignore[no-untyped-call]


@given(grammar_quantities())
def test_grammar_values_agree_with_the_kubernetes_client(text: str) -> None:
    assert parse_quantity(text) == _client_value(text)


@given(st.text(alphabet="0123456789.+-eEKMGTPkmunix _", max_size=10))
def test_whatever_we_accept_the_client_reads_the_same(text: str) -> None:
    try:
        ours = parse_quantity(text)
    except QuantityError:
        return
    assert ours == _client_value(text)


@given(grammar_quantities())
def test_exact_integer_is_the_value_when_whole(text: str) -> None:
    value = parse_quantity(text)
    integer = exact_integer(value)
    in_int64 = -(2**63) <= value <= 2**63 - 1  # Go's AsInt64 range
    if integer is None:
        assert value != value.to_integral_value() or not in_int64
    else:
        assert Decimal(integer) == value
        assert in_int64
