"""Whether HAMi-core is installed on this node: `libvgpu.so` and the `ld.so.preload` naming it.

Allocate hands every vGPU container HAMi-core's library and an `/etc/ld.so.preload` that
makes each of its processes load it (`allocate.container_mounts`). Neither file comes with
this plugin: on the node they are written by HAMi's `vgpu-init.sh <hook>/vgpu/` (the
DaemonSet's hami-core initContainer runs it from `projecthami/hami`, as HAMi v2.10's own
device plugin does at postStart: `charts/hami/templates/device-plugin/daemonsetnvidia.yaml`),
or by whoever pre-installed HAMi-core. Without them a container fails late on a bind mount
whose source is missing, or, worse, starts without limits: glibc ignores a preload entry it
cannot load (one line on stderr) and the process runs on the whole GPU.

So the daemon checks the hook directory at start and on every Allocate (`HamiCoreWatch`,
cached for a second): while something is wrong, Allocate fails naming the node and the file,
the register annotation marks every GPU unhealthy (the scheduler stops placing vGPU pods on
the node) and `/metrics` says so. `judge_hamicore` decides from what was found (pure);
`inspect_hamicore` looks at the files.

The library is looked for as HAMi's `GetLibPath` does (`nvinternal/plugin/util.go`), with
HAMi's release in place of its plugin's version: `libvgpu.so.<HAMI_CORE_VERSION>` (the name
HAMi's image ships it under, `docker/Dockerfile`), else `libvgpu.so`; and, unlike HAMi, else
the newest other `libvgpu.so.<version>`, so that a hami-core initContainer image of another
release works too. The preload must name the library where containers see it,
`<hook>/vgpu/libvgpu.so`: `vgpu-init.sh` writes exactly that, and the static file of older
images names `/usr/local/vgpu/libvgpu.so` whatever the hook path.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass

from hami_plugin.clock import Clock, SystemClock
from hami_plugin.protocol import hostpaths

logger = logging.getLogger(__name__)

HAMI_CORE_VERSION = "v2.10.0"
"""The HAMi release whose HAMi-core this plugin is tested with and its DaemonSet installs."""

CHECK_MAX_AGE_SECONDS = 1.0
"""How long one look at the hook directory answers for (Allocate calls come in bursts)."""

INSTALLED_BY = (
    "the DaemonSet's hami-core initContainer (projecthami/hami vgpu-init.sh) "
    "or a pre-installed HAMi-core"
)

ELF_MAGIC = b"\x7fELF"
_PRELOAD_READ_BYTES = 65536
_PRELOAD_SEPARATORS = re.compile(r"[\s:]+")
"""glibc's loader splits `/etc/ld.so.preload` at white space and colons."""


@dataclass(frozen=True, slots=True)
class LibraryFile:
    """One `libvgpu.so*` file of `<hook>/vgpu` as found: its name and its first bytes."""

    name: str
    head: bytes


@dataclass(frozen=True, slots=True)
class HamiCoreCheck:
    """What is wrong with HAMi-core on this node, if anything.

    `library_host_path` is the host file Allocate mounts at `<hook>/vgpu/libvgpu.so` (None:
    none usable). `library_problem` (no usable library: no container can be served) and
    `preload_problem` (containers that get the preload cannot be served: all but those that
    set `CUDA_DISABLE_CONTROL=true` in a gpu-admin namespace, `allocate.gets_preload`) are one
    sentence each, naming the file and what installs it; None when fine.
    """

    hook_path: str
    library_host_path: str | None
    library_problem: str | None = None
    preload_problem: str | None = None

    @property
    def problem(self) -> str | None:
        """The first thing wrong (the library before the preload); None when ready."""
        return self.library_problem or self.preload_problem

    @property
    def ready(self) -> bool:
        return self.problem is None


def _version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Order `v2.9.1` before `v2.10.0`: numbers by value, other parts as text after them."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.findall(r"\d+|[^\d.]+", version)
    )


def _choose_library(libraries: Collection[LibraryFile], version: str) -> LibraryFile | None:
    by_name = {library.name: library for library in libraries}
    for name in (f"libvgpu.so.{version}", "libvgpu.so"):
        if name in by_name:
            return by_name[name]
    others = [library for library in libraries if library.name.startswith("libvgpu.so.")]
    if not others:
        return None
    return max(others, key=lambda library: _version_key(library.name[len("libvgpu.so.") :]))


def judge_hamicore(
    hook_path: str,
    libraries: Collection[LibraryFile],
    preload: str | None,
    *,
    version: str = HAMI_CORE_VERSION,
    preload_error: str | None = None,
) -> HamiCoreCheck:
    """Judge what `inspect_hamicore` found in `<hook>/vgpu` (pure).

    `libraries` are the regular `libvgpu.so*` files there; `preload` is the text of
    `ld.so.preload`, None when it is missing or cannot be read (`preload_error` says why,
    None: missing).
    """
    vgpu = hostpaths.vgpu_dir(hook_path)
    container_library = hostpaths.libvgpu_path(hook_path)
    chosen = _choose_library(libraries, version)
    library_path: str | None = None
    library_problem: str | None = None
    if chosen is None:
        library_problem = (
            f"HAMi-core is not installed: {container_library} is missing (nor is "
            f"libvgpu.so.{version} there); it is put there by {INSTALLED_BY}"
        )
    elif not chosen.head.startswith(ELF_MAGIC):
        library_problem = (
            f"HAMi-core is not installed: {vgpu}/{chosen.name} is not a shared library "
            f"({'empty' if not chosen.head else 'no ELF header'}); it is put there by "
            f"{INSTALLED_BY}"
        )
    else:
        library_path = f"{vgpu}/{chosen.name}"
    preload_path = hostpaths.ld_so_preload_path(hook_path)
    preload_problem: str | None = None
    if preload is None:
        preload_problem = (
            f"HAMi-core is not set up: {preload_path} "
            f"{f'cannot be read ({preload_error})' if preload_error else 'is missing'}; "
            f"it is written by {INSTALLED_BY}"
        )
    else:
        named = [entry for entry in _PRELOAD_SEPARATORS.split(preload) if entry]
        if posixpath.normpath(container_library) not in {posixpath.normpath(n) for n in named}:
            preload_problem = (
                f"HAMi-core is not set up: {preload_path} "
                f"{'names ' + ' '.join(named) if named else 'is empty'} instead of "
                f"{container_library} (the library as containers see it), so no process would "
                f"load HAMi-core; rewrite it with vgpu-init.sh {vgpu}/ (as {INSTALLED_BY} does)"
            )
    return HamiCoreCheck(
        hook_path=hook_path,
        library_host_path=library_path,
        library_problem=library_problem,
        preload_problem=preload_problem,
    )


def inspect_hamicore(hook_path: str, *, version: str = HAMI_CORE_VERSION) -> HamiCoreCheck:
    """Look at `<hook>/vgpu` now and judge it (`judge_hamicore`). Never raises: a directory
    or file that cannot be read is a problem named in the result."""
    vgpu = hostpaths.vgpu_dir(hook_path)
    libraries: list[LibraryFile] = []
    try:
        with os.scandir(vgpu) as entries:
            names = [e.name for e in entries if e.name.startswith("libvgpu.so") and e.is_file()]
    except OSError:
        names = []  # a missing directory is a missing library
    for name in names:
        try:
            with open(f"{vgpu}/{name}", "rb") as file:
                libraries.append(LibraryFile(name, file.read(len(ELF_MAGIC))))
        except OSError:
            continue  # unreadable here: mounting it would not help either
    preload: str | None = None
    preload_error: str | None = None
    preload_path = hostpaths.ld_so_preload_path(hook_path)
    try:
        with open(preload_path, "rb") as file:
            preload = file.read(_PRELOAD_READ_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        pass
    except OSError as error:
        preload_error = error.strerror or str(error)
    return judge_hamicore(
        hook_path, libraries, preload, version=version, preload_error=preload_error
    )


class HamiCoreWatch:
    """The node's current `HamiCoreCheck`, looked at again when older than `max_age_seconds`.

    Logs once when HAMi-core becomes unusable (a warning naming the node and the file, again
    only if the problem changes) and once when it is usable again (info), and tells
    `on_change` (outside its lock) whenever readiness or the problem changes. Thread-safe:
    Allocate, the register loop and `/metrics` share one watch.
    """

    def __init__(
        self,
        hook_path: str,
        *,
        node_name: str = "",
        version: str = HAMI_CORE_VERSION,
        max_age_seconds: float = CHECK_MAX_AGE_SECONDS,
        clock: Clock | None = None,
        on_change: Callable[[HamiCoreCheck], None] | None = None,
    ) -> None:
        self.hook_path = hook_path
        self._node = node_name
        self._version = version
        self._max_age = max_age_seconds
        self._clock: Clock = clock or SystemClock()
        self._on_change = on_change
        self._lock = threading.Lock()
        self._check: HamiCoreCheck | None = None
        self._checked_at = 0.0

    def on_node(self, problem: str) -> str:
        """`problem` as the user reads it: prefixed with the node name when there is one."""
        return f"node {self._node}: {problem}" if self._node else problem

    def current(self) -> HamiCoreCheck:
        """The check, looked at now unless the last look is younger than `max_age_seconds`."""
        with self._lock:
            now = self._clock.monotonic()
            if self._check is not None and now - self._checked_at < self._max_age:
                return self._check
            previous, check = self._check, inspect_hamicore(self.hook_path, version=self._version)
            self._check, self._checked_at = check, now
        changed = previous is None or (previous.ready, previous.problem) != (
            check.ready,
            check.problem,
        )
        if changed:
            self._log(previous, check)
        if changed and previous is not None and self._on_change is not None:
            self._on_change(check)
        return check

    def _log(self, previous: HamiCoreCheck | None, check: HamiCoreCheck) -> None:
        if check.problem is not None:
            logger.warning(
                "%s; until it is, Allocate fails and the node registers every GPU unhealthy",
                self.on_node(check.problem),
            )
        elif previous is None:
            logger.info(
                "%s",
                self.on_node(f"HAMi-core is installed: {check.library_host_path}"),
            )
        else:
            logger.info(
                "%s",
                self.on_node(f"HAMi-core is installed again: {check.library_host_path}"),
            )
