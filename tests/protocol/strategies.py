"""Hypothesis strategies for JSON documents, shared by the Go JSON and extender wire tests."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["json_names", "json_values"]

json_names = st.text(min_size=0, max_size=12)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    json_names,
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(json_names, inner, max_size=4)
    ),
    max_leaves=12,
)
