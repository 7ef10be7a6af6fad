"""The fake NVML's MIG state: the MIG mode and the GPU / compute instances of each fake GPU,
NVML's rules for creating and destroying them, and the state file that keeps them across a
daemon restart.

The rules, as NVML applies them on the modelled GPUs (`fakenvml.migtables`): a GPU instance
needs one of its profile's placements (else NVML_ERROR_INVALID_ARGUMENT), memory slices no
other instance holds and a free instance of its profile (else
NVML_ERROR_INSUFFICIENT_RESOURCES); compute instances share their GPU instance's compute
slices (NVML_ERROR_INSUFFICIENT_RESOURCES when full); a GPU instance with a compute instance
cannot be destroyed (NVML_ERROR_IN_USE), nor a compute instance a process runs on.

State file: `<fake GPU file>.mig-state.json`, rewritten atomically (temporary file + rename)
after every change made through NVML (never for seeding alone), and read again whenever it
changes: another process (a restarted daemon) sees the same instances. Each GPU's entry
records the `seed` it grew from (its `name`, `memory_mib`, `mig`, `mig_pending` and
`mig_devices` in the fake GPU file): when the file's seed for a GPU changes, that GPU is
re-seeded from the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from hami_plugin.testing.fakenvml.errors import (
    NVMLError_InsufficientResources,
    NVMLError_InUse,
    NVMLError_InvalidArgument,
)
from hami_plugin.testing.fakenvml.gpufile import FakeGpuSpec
from hami_plugin.testing.fakenvml.mignames import CI_PROFILE_SLICES
from hami_plugin.testing.fakenvml.migtables import (
    FakeMigProfile,
    full_ci_profile,
    model_profiles,
    resolve_profile,
)

logger = logging.getLogger(__name__)

STATE_SUFFIX = ".mig-state.json"
_VERSION = 1


def state_path(gpu_file: str) -> str:
    """Where the MIG state of a fake GPU file lives."""
    return gpu_file + STATE_SUFFIX


def derived_mig_uuid(parent_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """A deterministic MIG UUID (`MIG-` + NVML's 8-4-4-4-12 hex shape) for an instance pair."""
    digest = hashlib.sha256(
        f"{parent_uuid}/{gpu_instance_id}/{compute_instance_id}".encode()
    ).hexdigest()
    return f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


@dataclass(slots=True)
class FakeComputeInstance:
    id: int
    profile: int
    """The NVML_COMPUTE_INSTANCE_PROFILE_* constant (also the CI profile id NVML reports)."""
    uuid: str
    serial: int
    processes: tuple[int, ...] = ()

    @property
    def slice_count(self) -> int:
        return CI_PROFILE_SLICES[self.profile]


@dataclass(slots=True)
class FakeGpuInstance:
    id: int
    profile: FakeMigProfile
    start: int
    serial: int
    compute_instances: dict[int, FakeComputeInstance] = field(default_factory=dict)

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.size)


@dataclass(slots=True)
class FakeGpuMig:
    """One GPU's MIG mode and instances."""

    uuid: str
    profiles: tuple[FakeMigProfile, ...]
    current: bool
    pending: bool
    seed: str
    gpu_instances: dict[int, FakeGpuInstance] = field(default_factory=dict)
    next_serial: int = 1

    def profile_by_id(self, profile_id: int) -> FakeMigProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)

    def mig_devices(self) -> list[tuple[FakeGpuInstance, FakeComputeInstance]]:
        """The MIG devices (GI, CI pairs) in MIG index order: by GI id, then CI id."""
        return [
            (gi, gi.compute_instances[ci_id])
            for gi_id in sorted(self.gpu_instances)
            for gi in (self.gpu_instances[gi_id],)
            for ci_id in sorted(gi.compute_instances)
        ]

    def _serial(self) -> int:
        serial = self.next_serial
        self.next_serial += 1
        return serial

    def free_placements(self, profile: FakeMigProfile) -> list[int]:
        """The starts of `profile` that are free now (all of them NVML would accept)."""
        held = sum(1 for gi in self.gpu_instances.values() if gi.profile.id == profile.id)
        if held >= profile.instance_count:
            return []
        used = {s for gi in self.gpu_instances.values() for s in gi.memory_slices}
        return [
            start
            for start in profile.starts
            if not used.intersection(range(start, start + profile.size))
        ]

    def create_gpu_instance(
        self, profile: FakeMigProfile, start: int, size: int
    ) -> FakeGpuInstance:
        if start not in profile.starts or size != profile.size:
            raise NVMLError_InvalidArgument(
                f"placement {{start: {start}, size: {size}}} is not one of profile "
                f"{profile.id}'s placements"
            )
        if start not in self.free_placements(profile):
            raise NVMLError_InsufficientResources()
        gi_id = next(
            i for i in range(1, len(self.gpu_instances) + 2) if i not in self.gpu_instances
        )
        gi = FakeGpuInstance(id=gi_id, profile=profile, start=start, serial=self._serial())
        self.gpu_instances[gi_id] = gi
        return gi

    def create_compute_instance(
        self, gi: FakeGpuInstance, ci_profile: int, uuid: str | None = None
    ) -> FakeComputeInstance:
        slices = CI_PROFILE_SLICES.get(ci_profile)
        if slices is None or slices > gi.profile.slice_count:
            raise NVMLError_InvalidArgument()
        used = sum(ci.slice_count for ci in gi.compute_instances.values())
        if used + slices > gi.profile.slice_count:
            raise NVMLError_InsufficientResources()
        ci_id = next(
            i for i in range(len(gi.compute_instances) + 1) if i not in gi.compute_instances
        )
        ci = FakeComputeInstance(
            id=ci_id,
            profile=ci_profile,
            uuid=uuid or derived_mig_uuid(self.uuid, gi.id, ci_id),
            serial=self._serial(),
        )
        gi.compute_instances[ci_id] = ci
        return ci

    def destroy_compute_instance(self, gi: FakeGpuInstance, ci: FakeComputeInstance) -> None:
        """(The caller refuses a compute instance with processes: it knows the test hooks.)"""
        del gi.compute_instances[ci.id]

    def destroy_gpu_instance(self, gi: FakeGpuInstance) -> None:
        if gi.compute_instances:
            raise NVMLError_InUse()
        del self.gpu_instances[gi.id]


def _seed_of(spec: FakeGpuSpec) -> str:
    return json.dumps(
        {
            "name": spec.name,
            "memory_mib": spec.memory_mib,
            "mig": spec.mig,
            "mig_pending": spec.mig_pending,
            "mig_devices": [
                {"profile": d.profile, "start": d.start, "uuid": d.uuid, "processes": d.processes}
                for d in spec.mig_devices
            ],
        },
        sort_keys=True,
    )


def seed_gpu(spec: FakeGpuSpec) -> FakeGpuMig:
    """A GPU's MIG state as the fake GPU file describes it (validated by `gpufile`)."""
    state = FakeGpuMig(
        uuid=spec.uuid,
        profiles=model_profiles(spec.name),
        current=spec.mig,
        pending=spec.mig if spec.mig_pending is None else spec.mig_pending,
        seed=_seed_of(spec),
    )
    for device in spec.mig_devices:
        profile = resolve_profile(spec.name, spec.memory_mib or 0, device.profile)
        assert profile is not None  # gpufile checked it
        gi = state.create_gpu_instance(profile, device.start, profile.size)
        ci = state.create_compute_instance(gi, full_ci_profile(profile.slice_count), device.uuid)
        ci.processes = device.processes
    return state


def _dump_gpu(state: FakeGpuMig) -> dict[str, object]:
    return {
        "seed": state.seed,
        "current": state.current,
        "pending": state.pending,
        "next_serial": state.next_serial,
        "gpu_instances": [
            {
                "id": gi.id,
                "profile_id": gi.profile.id,
                "start": gi.start,
                "serial": gi.serial,
                "compute_instances": [
                    {
                        "id": ci.id,
                        "profile": ci.profile,
                        "uuid": ci.uuid,
                        "serial": ci.serial,
                        "processes": list(ci.processes),
                    }
                    for ci in gi.compute_instances.values()
                ],
            }
            for gi in state.gpu_instances.values()
        ],
    }


def _load_gpu(uuid: str, profiles: tuple[FakeMigProfile, ...], raw: object) -> FakeGpuMig:
    """One GPU's entry of the state file; raises ValueError/KeyError/TypeError if malformed."""
    if not isinstance(raw, dict):
        raise ValueError("entry is not a mapping")
    state = FakeGpuMig(
        uuid=uuid,
        profiles=profiles,
        current=bool(raw["current"]),
        pending=bool(raw["pending"]),
        seed=str(raw["seed"]),
        next_serial=int(raw["next_serial"]),
    )
    for gi_raw in raw["gpu_instances"]:
        profile = state.profile_by_id(int(gi_raw["profile_id"]))
        if profile is None:
            raise ValueError(f"unknown GPU instance profile id {gi_raw['profile_id']}")
        gi = FakeGpuInstance(
            id=int(gi_raw["id"]),
            profile=profile,
            start=int(gi_raw["start"]),
            serial=int(gi_raw["serial"]),
        )
        for ci_raw in gi_raw["compute_instances"]:
            ci = FakeComputeInstance(
                id=int(ci_raw["id"]),
                profile=int(ci_raw["profile"]),
                uuid=str(ci_raw["uuid"]),
                serial=int(ci_raw["serial"]),
                processes=tuple(int(pid) for pid in ci_raw["processes"]),
            )
            if ci.profile not in CI_PROFILE_SLICES:
                raise ValueError(f"unknown compute instance profile {ci.profile}")
            gi.compute_instances[ci.id] = ci
        state.gpu_instances[gi.id] = gi
    return state


class FakeMigStore:
    """The MIG state of every GPU of one fake GPU file, kept in step with its state file.
    Not thread-safe: the fake NVML calls it under its lock."""

    def __init__(self, gpu_file: str) -> None:
        self.path = state_path(gpu_file)
        self._gpus: dict[str, FakeGpuMig] = {}
        self._signature: tuple[int, int, int] | None = None
        self._problem: str | None = None

    def sync(self, specs: Mapping[str, FakeGpuSpec]) -> None:
        """Read the state file again if it changed, then (re-)seed every MIG-capable GPU that
        is new or whose seed in the fake GPU file changed. Seeding writes nothing (seeding again
        gives the same state), so a fake GPU file nobody changes MIG on leaves no state file."""
        self._read_if_changed()
        for uuid, spec in specs.items():
            if not model_profiles(spec.name):
                self._gpus.pop(uuid, None)
                continue
            current = self._gpus.get(uuid)
            if current is None or current.seed != _seed_of(spec):
                self._gpus[uuid] = seed_gpu(spec)
        for uuid in [uuid for uuid in self._gpus if uuid not in specs]:
            del self._gpus[uuid]

    def gpu(self, uuid: str) -> FakeGpuMig | None:
        """A MIG-capable GPU's state (after `sync`); None for other GPUs."""
        return self._gpus.get(uuid)

    def gpus(self) -> list[FakeGpuMig]:
        return list(self._gpus.values())

    def _read_if_changed(self) -> None:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            self._signature = None
            return
        except OSError as error:
            self._report(f"cannot read: {error.strerror or error}")
            return
        signature = (status.st_ino, status.st_size, status.st_mtime_ns)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            with open(self.path, encoding="utf-8") as stream:
                document = json.load(stream)
            if not isinstance(document, dict) or document.get("version") != _VERSION:
                raise ValueError(f"expected a mapping with version {_VERSION}")
            raw_gpus = document["gpus"]
            if not isinstance(raw_gpus, dict):
                raise ValueError("'gpus' is not a mapping")
            loaded: dict[str, FakeGpuMig] = {}
            for uuid, raw in raw_gpus.items():
                loaded[str(uuid)] = _load_gpu(str(uuid), _profiles_from_seed(raw), raw)
        except (OSError, ValueError, KeyError, TypeError) as error:
            self._report(f"invalid ({error}); re-seeding from the fake GPU file")
            self._gpus = {}
            return
        self._problem = None
        self._gpus = loaded

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            logger.error("fake MIG state file %s: %s", self.path, problem)

    def save(self) -> None:
        """Write the state file atomically (a temporary file renamed over it)."""
        document = {
            "version": _VERSION,
            "gpus": {uuid: _dump_gpu(state) for uuid, state in sorted(self._gpus.items())},
        }
        directory = os.path.dirname(self.path) or "."
        try:
            descriptor, temporary = tempfile.mkstemp(
                prefix=".mig-state-", suffix=".tmp", dir=directory
            )
            with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
                json.dump(document, stream, indent=1, sort_keys=True)
            os.replace(temporary, self.path)
            status = os.stat(self.path)
        except OSError as error:
            self._report(f"cannot write: {error.strerror or error}")
            return
        self._signature = (status.st_ino, status.st_size, status.st_mtime_ns)


def _profiles_from_seed(raw: object) -> tuple[FakeMigProfile, ...]:
    if not isinstance(raw, dict):
        raise ValueError("entry is not a mapping")
    seed = json.loads(str(raw["seed"]))
    if not isinstance(seed, dict):
        raise ValueError("seed is not a mapping")
    return model_profiles(str(seed["name"]))
