"""klog's `-v` grammar (`Level.Set`: `strconv.ParseInt(value, 10, 32)`), which both daemons take
for HAMi's `-v`."""

from __future__ import annotations

import pytest

from hami_plugin.config import parse_klog_verbosity


@pytest.mark.parametrize(
    ("raw", "level"),
    [("4", 4), ("0", 0), ("+5", 5), ("-1", -1), ("2147483647", 2**31 - 1), (3, 3)],
)
def test_a_decimal_32_bit_integer(raw: object, level: int) -> None:
    assert parse_klog_verbosity(raw) == level


@pytest.mark.parametrize(
    "raw", ["", "four", "4.0", "0x4", " 4", "1_0", "2147483648", "-2147483649", True, 4.0, None]
)
def test_anything_else_is_refused(raw: object) -> None:
    with pytest.raises(ValueError, match=r"expected a klog verbosity \(a whole number such as 4\)"):
        parse_klog_verbosity(raw)
