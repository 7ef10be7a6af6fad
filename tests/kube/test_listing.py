"""hami_plugin.kube.listing.fetch_pod: a pod read through a LIST by name."""

from __future__ import annotations

from typing import Any

import pytest

from hami_plugin.kube.errors import KubeError
from hami_plugin.kube.fake import FakeKube
from hami_plugin.kube.listing import fetch_pod
from hami_plugin.kube.records import ObjectList
from hami_plugin.testing.apiserver import make_pod


def test_a_pod_is_read_by_a_list_by_name_and_an_absent_one_is_none() -> None:
    kube = FakeKube(pods=[make_pod("p", "ml", uid="u-1"), make_pod("q", "ml")])

    pod = fetch_pod(kube, "ml", "p")

    assert pod is not None and (pod.key, pod.uid) == ("ml/p", "u-1")
    assert fetch_pod(kube, "ml", "ghost") is None
    assert kube.calls == ["list_objects", "list_objects"]


class _Unreadable:
    def list_objects(self, path: str, **selectors: Any) -> ObjectList:
        return ObjectList([{"metadata": {"name": 7}}], "1")


def test_an_unreadable_pod_is_a_kube_error() -> None:
    with pytest.raises(KubeError, match=r"^pod ml/p unreadable: "):
        fetch_pod(_Unreadable(), "ml", "p")
