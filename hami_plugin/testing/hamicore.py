"""A stand-in for HAMi-core on the node: the files the device plugin checks under its hook path.

On a real node `vgpu-init.sh <hook>/vgpu/` (HAMi's image, the DaemonSet's hami-core
initContainer) copies `libvgpu.so.<release>` there and writes `ld.so.preload` naming
`<hook>/vgpu/libvgpu.so`. The tests, the benchmarks and `make demo` run the device plugin
with a temporary hook path and no HAMi-core; without these files its Allocate refuses every
pod (`deviceplugin.hamicore`). The library written here only has an ELF header: nothing
loads it, containers do not run in those setups.
"""

from __future__ import annotations

import os

from hami_plugin.deviceplugin.hamicore import ELF_MAGIC
from hami_plugin.protocol import hostpaths

FAKE_LIBRARY = ELF_MAGIC + b" fake HAMi-core for tests and the demo: not a loadable library\n"


def install_fake_hamicore(hook_path: str | os.PathLike[str], *, version: str | None = None) -> str:
    """Write `<hook>/vgpu/libvgpu.so` (or `libvgpu.so.<version>`, as HAMi's image names it)
    and an `ld.so.preload` naming `<hook>/vgpu/libvgpu.so`, as `vgpu-init.sh` does; creates
    the directories. Returns the library's path."""
    hook = os.fspath(hook_path)
    os.makedirs(hostpaths.vgpu_dir(hook), exist_ok=True)
    library = hostpaths.libvgpu_path(hook, version)
    with open(library, "wb") as file:
        file.write(FAKE_LIBRARY)
    with open(hostpaths.ld_so_preload_path(hook), "w", encoding="utf-8") as file:
        file.write(f"{hostpaths.libvgpu_path(hook)}\n")
    return library
