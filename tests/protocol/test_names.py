"""Kubernetes names (RFC 1123) as the API server accepts them: labels and subdomains."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.names import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    dns1123_label_problem,
    dns1123_subdomain_problem,
)

# apimachinery's own examples and counter-examples (validation_test.go), plus path injection
LABELS = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2"]
NOT_LABELS = [
    "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a",
    "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b",
    "1 ", " 1", "1 2", "a/b", "..", "a\n", "é", "a@b",
]  # fmt: skip
SUBDOMAINS = [*LABELS, "a.a", "ab.c", "a1.b2", "0.0", "1.a", "a-1.b-2", "a--1.b--2", "a.b.c.d"]
NOT_SUBDOMAINS = [
    "", "A", "ABC", "aBc", "-", "a-", "-a", "_", "a_", "a_b", ".", "a.", ".a", "a..b", "a.-b",
    "a-.b", "a/b", "../kube-system", "a b", "a\n", "é", "a@b", "a:b",
]  # fmt: skip


@pytest.mark.parametrize("value", LABELS)
def test_labels(value: str) -> None:
    assert dns1123_label_problem(value) is None


@pytest.mark.parametrize("value", NOT_LABELS)
def test_not_labels(value: str) -> None:
    problem = dns1123_label_problem(value)
    assert problem is not None and problem.startswith("must be a DNS-1123 label")


@pytest.mark.parametrize("value", SUBDOMAINS)
def test_subdomains(value: str) -> None:
    assert dns1123_subdomain_problem(value) is None


@pytest.mark.parametrize("value", NOT_SUBDOMAINS)
def test_not_subdomains(value: str) -> None:
    problem = dns1123_subdomain_problem(value)
    assert problem is not None and problem.startswith("must be a DNS-1123 subdomain")


def test_lengths() -> None:
    assert dns1123_label_problem("a" * DNS1123_LABEL_MAX_LENGTH) is None
    assert dns1123_label_problem("a" * (DNS1123_LABEL_MAX_LENGTH + 1)) == (
        "must be a DNS-1123 label of no more than 63 characters"
    )
    longest = ".".join(["a" * 63] * 3 + ["a" * 61])
    assert len(longest) == DNS1123_SUBDOMAIN_MAX_LENGTH
    assert dns1123_subdomain_problem(longest) is None
    assert dns1123_subdomain_problem(longest + "a") == (
        "must be a DNS-1123 subdomain of no more than 253 characters"
    )


_ALNUM = string.ascii_lowercase + string.digits


def _reference_label(value: str) -> bool:
    """RFC 1123 labels written out by hand, independently of the regular expression."""
    return (
        0 < len(value) <= DNS1123_LABEL_MAX_LENGTH
        and all(c in _ALNUM or c == "-" for c in value)
        and value[0] in _ALNUM
        and value[-1] in _ALNUM
    )


def _reference_subdomain(value: str) -> bool:
    if not 0 < len(value) <= DNS1123_SUBDOMAIN_MAX_LENGTH:
        return False
    return all(_reference_label(part) for part in value.split("."))


_NAMEISH = st.text(alphabet=_ALNUM + "-._/A é\n", max_size=80)


@given(_NAMEISH)
def test_property_label_matches_the_definition(value: str) -> None:
    assert (dns1123_label_problem(value) is None) == _reference_label(value)


@given(_NAMEISH)
def test_property_subdomain_matches_the_definition(value: str) -> None:
    assert (dns1123_subdomain_problem(value) is None) == _reference_subdomain(value)
