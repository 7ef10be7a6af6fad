"""Where HAMi-core's files lie on the host, under the hook directory (`--hook-path`).

The device plugin's Allocate mounts these paths into every vGPU container, and its monitor
finds the containers' shared regions under them again; HAMi v2.10 uses the same layout
(`pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go` Allocate and
`pkg/monitor/nvidia/cudevshr.go`):

| host path                                     | in the container                     |
|-----------------------------------------------|--------------------------------------|
| `<hook>/vgpu/libvgpu.so[.<version>]`          | `<hook>/vgpu/libvgpu.so` (read-only) |
| `<hook>/vgpu/containers/<podUID>_<container>` | `<hook>/vgpu` (HAMi-core's regions)  |
| the vgpulock directory (`/tmp/vgpulock`)      | `/tmp/vgpulock`                      |
| `<hook>/vgpu/ld.so.preload`                   | `/etc/ld.so.preload` (read-only)     |
| `<hook>/vgpu/license`                         | `/tmp/license` (read-only)           |
| `<hook>/vgpu/vgpuvalidator`                   | `/usr/bin/vgpuvalidator` (read-only) |

The workload sees its own container directory at `<hook>/vgpu`, so the shared-region path
HAMi-core is told (`CUDA_DEVICE_MEMORY_SHARED_CACHE`) is under `<hook>/vgpu` too.
"""

from __future__ import annotations

DEFAULT_HOOK_PATH = "/usr/local"
VGPU_LOCK_HOST_PATH = "/tmp/vgpulock"
"""The host directory HAMi-core's processes share their locks in (HAMi creates it 0777)."""
VGPU_LOCK_CONTAINER_PATH = "/tmp/vgpulock"
LD_SO_PRELOAD_CONTAINER_PATH = "/etc/ld.so.preload"
LICENSE_CONTAINER_PATH = "/tmp/license"
VGPU_VALIDATOR_CONTAINER_PATH = "/usr/bin/vgpuvalidator"


def vgpu_dir(hook_path: str) -> str:
    """`<hook>/vgpu`, the directory HAMi-core lives in (the same path in the container)."""
    return hook_path.rstrip("/") + "/vgpu"


def libvgpu_path(hook_path: str, version: str | None = None) -> str:
    """`<hook>/vgpu/libvgpu.so`, or the versioned `libvgpu.so.<version>` HAMi looks for first."""
    library = f"{vgpu_dir(hook_path)}/libvgpu.so"
    return library if version is None else f"{library}.{version}"


def ld_so_preload_path(hook_path: str) -> str:
    """The `ld.so.preload` that makes every process of the container load libvgpu.so."""
    return f"{vgpu_dir(hook_path)}/ld.so.preload"


def license_path(hook_path: str) -> str:
    """The licence file; when it exists, Allocate also mounts the validator."""
    return f"{vgpu_dir(hook_path)}/license"


def vgpu_validator_path(hook_path: str) -> str:
    """HAMi's `vgpuvalidator` in the hook directory, mounted into the container."""
    return f"{vgpu_dir(hook_path)}/vgpuvalidator"


def shared_cache_path(hook_path: str, cache_id: str) -> str:
    """The region file HAMi-core creates, as the container sees it (its directory at `vgpu`)."""
    return f"{vgpu_dir(hook_path)}/{cache_id}.cache"


def containers_dir(hook_path: str) -> str:
    """`<hook>/vgpu/containers`, the parent of every `container_dir`."""
    return f"{vgpu_dir(hook_path)}/containers"


def container_dir(hook_path: str, pod_uid: str, container_name: str) -> str:
    """Host directory of one container's shared-region files: `<podUID>_<container>`."""
    return f"{containers_dir(hook_path)}/{pod_uid}_{container_name}"


def split_container_dir(name: str) -> tuple[str, str] | None:
    """A `container_dir` name split at the first `_` into pod UID and container name (as
    HAMi's monitor, cudevshr.go:188-192); None when either part is empty."""
    pod_uid, sep, container_name = name.partition("_")
    if not sep or not pod_uid or not container_name:
        return None
    return pod_uid, container_name
