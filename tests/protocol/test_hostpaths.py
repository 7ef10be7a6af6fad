"""The hook directory's layout: where Allocate puts HAMi-core's files and the monitor finds them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol import hostpaths


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (hostpaths.vgpu_dir("/usr/local"), "/usr/local/vgpu"),
        (hostpaths.vgpu_dir("/usr/local/"), "/usr/local/vgpu"),
        (hostpaths.libvgpu_path("/usr/local"), "/usr/local/vgpu/libvgpu.so"),
        (hostpaths.libvgpu_path("/usr/local", "2.10.0"), "/usr/local/vgpu/libvgpu.so.2.10.0"),
        (hostpaths.ld_so_preload_path("/opt/hami"), "/opt/hami/vgpu/ld.so.preload"),
        (hostpaths.license_path("/opt/hami"), "/opt/hami/vgpu/license"),
        (hostpaths.vgpu_validator_path("/opt/hami"), "/opt/hami/vgpu/vgpuvalidator"),
        (hostpaths.shared_cache_path("/usr/local", "c1"), "/usr/local/vgpu/c1.cache"),
        (hostpaths.containers_dir("/usr/local"), "/usr/local/vgpu/containers"),
        (
            hostpaths.container_dir("/usr/local", "uid-1", "main"),
            "/usr/local/vgpu/containers/uid-1_main",
        ),
    ],
)
def test_layout_under_the_hook_path(path: str, expected: str) -> None:
    assert path == expected


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("uid-1_main", ("uid-1", "main")),
        ("uid-1_side_car", ("uid-1", "side_car")),  # at the first `_`: pod UIDs have none
        ("nounderscore", None),
        ("_main", None),
        ("uid_", None),
    ],
)
def test_split_container_dir(name: str, parts: tuple[str, str] | None) -> None:
    assert hostpaths.split_container_dir(name) == parts


_uids = st.text(alphabet="0123456789abcdef-", min_size=1, max_size=36)
_containers = st.text(alphabet="abcdefghij-_0123456789", min_size=1, max_size=20)


@given(_uids, _containers)
def test_a_container_dir_splits_back_into_its_pod_and_container(uid: str, container: str) -> None:
    name = hostpaths.container_dir("/usr/local", uid, container).rsplit("/", 1)[1]
    assert hostpaths.split_container_dir(name) == (uid, container)
