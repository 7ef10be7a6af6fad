"""Kubernetes object names as the API server accepts them (RFC 1123, as apimachinery checks).

A name that comes from outside (an extender call, a flag) and goes into an API path must be
checked first: `PodNamespace: "a/b"` would otherwise address another resource. The rules are
apimachinery's `IsDNS1123Label` (namespaces: at most 63 characters) and `IsDNS1123Subdomain`
(pod and node names: at most 253); the messages say what is wrong, apimachinery's wording.
Pure, no I/O.
"""

from __future__ import annotations

import re

__all__ = [
    "DNS1123_LABEL_MAX_LENGTH",
    "DNS1123_SUBDOMAIN_MAX_LENGTH",
    "dns1123_label_problem",
    "dns1123_subdomain_problem",
]

DNS1123_LABEL_MAX_LENGTH = 63
DNS1123_SUBDOMAIN_MAX_LENGTH = 253

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_RE = re.compile(_LABEL)
_SUBDOMAIN_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def dns1123_label_problem(value: str) -> str | None:
    """None when `value` is a DNS-1123 label (a namespace name), else what is wrong."""
    if len(value) > DNS1123_LABEL_MAX_LENGTH:
        return f"must be a DNS-1123 label of no more than {DNS1123_LABEL_MAX_LENGTH} characters"
    if _LABEL_RE.fullmatch(value) is None:
        return (
            "must be a DNS-1123 label: lower case alphanumeric characters or '-', starting "
            "and ending with an alphanumeric character"
        )
    return None


def dns1123_subdomain_problem(value: str) -> str | None:
    """None when `value` is a DNS-1123 subdomain (a pod or node name), else what is wrong."""
    if len(value) > DNS1123_SUBDOMAIN_MAX_LENGTH:
        return (
            "must be a DNS-1123 subdomain of no more than "
            f"{DNS1123_SUBDOMAIN_MAX_LENGTH} characters"
        )
    if _SUBDOMAIN_RE.fullmatch(value) is None:
        return (
            "must be a DNS-1123 subdomain: lower case alphanumeric characters, '-' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return None
