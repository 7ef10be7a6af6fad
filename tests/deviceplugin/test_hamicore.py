"""Whether HAMi-core is installed: the pure judgement, the files, and the watch's log lines."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from hami_plugin.clock import ManualClock
from hami_plugin.deviceplugin.hamicore import (
    ELF_MAGIC,
    HAMI_CORE_VERSION,
    INSTALLED_BY,
    HamiCoreCheck,
    HamiCoreWatch,
    LibraryFile,
    inspect_hamicore,
    judge_hamicore,
)
from hami_plugin.testing.hamicore import install_fake_hamicore

HOOK = "/usr/local"
ELF = ELF_MAGIC + b"\x02\x01"
PRELOAD = "/usr/local/vgpu/libvgpu.so\n"  # what vgpu-init.sh writes for /usr/local/vgpu/


def lib(name: str, head: bytes = ELF) -> LibraryFile:
    return LibraryFile(name, head)


# --- the judgement (pure) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("libraries", "chosen"),
    [
        ([lib("libvgpu.so")], "libvgpu.so"),
        # HAMi's image ships only the versioned file (docker/Dockerfile)
        ([lib(f"libvgpu.so.{HAMI_CORE_VERSION}")], f"libvgpu.so.{HAMI_CORE_VERSION}"),
        ([lib("libvgpu.so"), lib(f"libvgpu.so.{HAMI_CORE_VERSION}")], "libvgpu.so." + "v2.10.0"),
        # the release we pin wins over a newer one left by another image
        ([lib("libvgpu.so.v2.11.0"), lib("libvgpu.so.v2.10.0")], "libvgpu.so.v2.10.0"),
        # neither: the newest other release, by version and not by text
        ([lib("libvgpu.so.v2.9.1"), lib("libvgpu.so.v2.11.0")], "libvgpu.so.v2.11.0"),
    ],
)
def test_the_library_is_looked_for_as_hami_does_then_by_release(
    libraries: list[LibraryFile], chosen: str
) -> None:
    check = judge_hamicore(HOOK, libraries, PRELOAD)
    assert check == HamiCoreCheck(HOOK, f"/usr/local/vgpu/{chosen}")
    assert check.ready and check.problem is None


def test_no_library_names_the_file_and_what_installs_it() -> None:
    check = judge_hamicore(HOOK, [], PRELOAD)
    assert not check.ready
    assert check.library_host_path is None
    assert check.library_problem == (
        "HAMi-core is not installed: /usr/local/vgpu/libvgpu.so is missing (nor is "
        f"libvgpu.so.{HAMI_CORE_VERSION} there); it is put there by {INSTALLED_BY}"
    )
    assert "projecthami/hami vgpu-init.sh" in check.library_problem
    assert check.preload_problem is None


@pytest.mark.parametrize(("head", "why"), [(b"", "empty"), (b"#!/bin", "no ELF header")])
def test_a_library_that_is_not_a_shared_library_is_not_installed(head: bytes, why: str) -> None:
    check = judge_hamicore(HOOK, [lib("libvgpu.so", head)], PRELOAD)
    assert check.library_host_path is None
    assert check.library_problem is not None
    assert f"/usr/local/vgpu/libvgpu.so is not a shared library ({why})" in check.library_problem


@pytest.mark.parametrize(
    "preload",
    [
        PRELOAD,
        "/usr/local/vgpu/libvgpu.so",
        "/usr/local/vgpu//libvgpu.so\n",
        "/opt/other.so:/usr/local/vgpu/libvgpu.so",
        "  /opt/other.so\n\t/usr/local/vgpu/libvgpu.so  \n",
    ],
)
def test_a_preload_naming_the_library_as_containers_see_it_is_fine(preload: str) -> None:
    assert judge_hamicore(HOOK, [lib("libvgpu.so")], preload).ready


@pytest.mark.parametrize(
    ("hook", "preload", "expected"),
    [
        (
            HOOK,
            None,
            f"HAMi-core is not set up: /usr/local/vgpu/ld.so.preload is missing; it is written "
            f"by {INSTALLED_BY}",
        ),
        (
            # the static file of older HAMi images, under a moved hook path
            "/opt/hami",
            "/usr/local/vgpu/libvgpu.so\n",
            "HAMi-core is not set up: /opt/hami/vgpu/ld.so.preload names "
            "/usr/local/vgpu/libvgpu.so instead of /opt/hami/vgpu/libvgpu.so (the library as "
            "containers see it), so no process would load HAMi-core; rewrite it with "
            f"vgpu-init.sh /opt/hami/vgpu/ (as {INSTALLED_BY} does)",
        ),
        (
            HOOK,
            " \n",
            "HAMi-core is not set up: /usr/local/vgpu/ld.so.preload is empty instead of "
            "/usr/local/vgpu/libvgpu.so",
        ),
    ],
)
def test_a_missing_or_wrong_preload_is_a_problem_of_its_own(
    hook: str, preload: str | None, expected: str
) -> None:
    check = judge_hamicore(hook, [lib("libvgpu.so")], preload)
    assert check.library_problem is None
    assert check.library_host_path == f"{hook}/vgpu/libvgpu.so"
    assert check.preload_problem is not None
    assert check.preload_problem.startswith(expected)
    assert check.problem == check.preload_problem and not check.ready


def test_an_unreadable_preload_says_why() -> None:
    check = judge_hamicore(HOOK, [lib("libvgpu.so")], None, preload_error="Permission denied")
    assert check.preload_problem is not None
    assert "ld.so.preload cannot be read (Permission denied)" in check.preload_problem


def test_the_library_problem_comes_first() -> None:
    check = judge_hamicore(HOOK, [], None)
    assert check.library_problem is not None and check.preload_problem is not None
    assert check.problem == check.library_problem


# --- the files ---------------------------------------------------------------------------------


def test_an_empty_hook_directory_is_not_installed(tmp_path: Path) -> None:
    check = inspect_hamicore(str(tmp_path / "nothing-here"))
    assert check.library_problem is not None and check.preload_problem is not None


def test_what_vgpu_init_leaves_is_installed(tmp_path: Path) -> None:
    hook = str(tmp_path)
    library = install_fake_hamicore(hook, version=HAMI_CORE_VERSION)
    assert library == f"{hook}/vgpu/libvgpu.so.{HAMI_CORE_VERSION}"
    assert Path(f"{hook}/vgpu/ld.so.preload").read_text() == f"{hook}/vgpu/libvgpu.so\n"
    assert inspect_hamicore(hook) == HamiCoreCheck(hook, library)


def test_the_version_looked_for_first_can_be_given(tmp_path: Path) -> None:
    install_fake_hamicore(tmp_path)
    versioned = install_fake_hamicore(tmp_path, version="9.9.9")
    assert inspect_hamicore(str(tmp_path), version="9.9.9").library_host_path == versioned
    # not the release looked for: the plain name comes before any other release
    assert inspect_hamicore(str(tmp_path)).library_host_path == f"{tmp_path}/vgpu/libvgpu.so"


def test_a_directory_in_place_of_a_file_is_not_a_file(tmp_path: Path) -> None:
    os.makedirs(tmp_path / "vgpu" / "libvgpu.so")
    os.makedirs(tmp_path / "vgpu" / "ld.so.preload")
    check = inspect_hamicore(str(tmp_path))
    assert check.library_problem is not None and "is missing" in check.library_problem
    assert check.preload_problem is not None
    assert "ld.so.preload cannot be read (Is a directory)" in check.preload_problem


def test_a_library_without_an_elf_header_is_found_and_refused(tmp_path: Path) -> None:
    install_fake_hamicore(tmp_path)
    Path(tmp_path / "vgpu" / "libvgpu.so").write_bytes(b"")  # an interrupted copy
    check = inspect_hamicore(str(tmp_path))
    assert check.library_problem is not None and "(empty)" in check.library_problem


# --- the watch ---------------------------------------------------------------------------------


def test_the_watch_logs_each_change_once_and_tells_who_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="hami_plugin.deviceplugin.hamicore")
    install_fake_hamicore(tmp_path)
    clock = ManualClock()
    changes: list[HamiCoreCheck] = []
    watch = HamiCoreWatch(str(tmp_path), node_name="gpu-1", clock=clock, on_change=changes.append)

    assert watch.current().ready
    library = tmp_path / "vgpu" / "libvgpu.so"
    library.unlink()
    assert watch.current().ready, "one look answers for max_age_seconds"
    clock.advance(1.0)
    for _ in range(3):
        assert not watch.current().ready
        clock.advance(1.0)
    install_fake_hamicore(tmp_path)
    assert watch.current().ready
    assert watch.current().ready

    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"node gpu-1: HAMi-core is installed: {library}"),
        (
            "WARNING",
            f"node gpu-1: HAMi-core is not installed: {library} is missing (nor is "
            f"libvgpu.so.{HAMI_CORE_VERSION} there); it is put there by {INSTALLED_BY}; until "
            "it is, Allocate fails and the node registers every GPU unhealthy",
        ),
        ("INFO", f"node gpu-1: HAMi-core is installed again: {library}"),
    ]
    assert [check.ready for check in changes] == [False, True]


def test_a_different_problem_is_logged_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    watch = HamiCoreWatch(str(tmp_path), clock=clock, max_age_seconds=0.0)
    watch.current()  # nothing there: the library's problem
    install_fake_hamicore(tmp_path)
    (tmp_path / "vgpu" / "ld.so.preload").unlink()
    caplog.clear()
    for _ in range(2):
        watch.current()
    (warning,) = caplog.records
    assert "ld.so.preload is missing" in warning.getMessage()
    assert watch.on_node("x") == "x"  # no node name: the problem as it is
