"""The role protocols of hami_plugin.kube.api against what provides them: `KubeClient` and the
in-memory `FakeKube` have every call of every role, with the same signature, so the protocols
cannot drift from the client again."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from hami_plugin.kube import api
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.fake import FakeKube

ROLES = [getattr(api, name) for name in api.__all__]


def _calls(protocol: type[Any]) -> list[str]:
    """The calls a protocol asks for, its bases' included."""
    return sorted(
        name
        for name, value in inspect.getmembers(protocol, inspect.isfunction)
        if not name.startswith("_")
    )


def _shape(function: Any) -> list[tuple[str, Any, Any, str]]:
    """Each parameter's name, kind, default and annotation (as written: the modules use
    postponed annotations), and the return annotation last."""
    signature = inspect.signature(function)
    shape = [(p.name, p.kind, p.default, str(p.annotation)) for p in signature.parameters.values()]
    return [*shape, ("return", None, None, str(signature.return_annotation))]


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.__name__)
@pytest.mark.parametrize("implementation", [KubeClient, FakeKube], ids=lambda c: c.__name__)
def test_every_role_call_has_the_protocol_signature(
    role: type[Any], implementation: type[Any]
) -> None:
    calls = _calls(role)
    assert calls, f"{role.__name__} asks for no call"
    for name in calls:
        provided = getattr(implementation, name, None)
        assert provided is not None, f"{implementation.__name__} has no {name}"
        expected = _shape(getattr(role, name))
        actual = _shape(provided)
        if name == "deadline":
            # A @contextmanager generator is written `-> Iterator[None]`; the protocol says what
            # calling it gives: a context manager.
            expected, actual = expected[:-1], actual[:-1]
        assert actual == expected, f"{implementation.__name__}.{name} differs from {role.__name__}"


def test_every_role_is_listed() -> None:
    defined = {
        name
        for name, value in vars(api).items()
        if isinstance(value, type)
        and getattr(value, "_is_protocol", False)
        and value.__module__ == api.__name__
    }
    assert defined == set(api.__all__)
