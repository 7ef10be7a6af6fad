"""`NvmlMig.mig_device_has_processes` over the fake NVML: one MIG device's compute processes,
found by its MIG index as HAMi walks them (mig_startup.go:159-186), a failed query counting as
busy."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from hami_plugin.deviceplugin.mig.nvml import MigNvmlError, NvmlMig
from hami_plugin.testing.fakenvml.errors import nvml_error
from hami_plugin.testing.fakenvml.nvml import FakeNvml
from tests.deviceplugin.test_mig_nvml import fake as fake  # the fixtures
from tests.deviceplugin.test_mig_nvml import mig as mig


def test_only_the_mig_device_a_process_runs_on_has_processes(fake: FakeNvml, mig: NvmlMig) -> None:
    devices = mig.mig_devices(0)
    assert len(devices) == 2
    assert [mig.mig_device_has_processes(0, d.mig_index) for d in devices] == [False, False]
    fake.set_running_processes(devices[1].uuid, (4242,))
    assert [mig.mig_device_has_processes(0, d.mig_index) for d in devices] == [False, True]
    fake.set_running_processes(devices[1].uuid, ())
    assert not mig.mig_device_has_processes(0, devices[1].mig_index)


def test_a_mig_index_nvml_does_not_have_is_an_error(mig: NvmlMig) -> None:
    with pytest.raises(MigNvmlError) as caught:
        mig.mig_device_has_processes(0, 5)
    assert caught.value.code == pynvml.NVML_ERROR_NOT_FOUND
    assert str(caught.value) == "get MIG device 5 of gpu 0: Not Found"


class _FailingQuery:
    """The fake NVML, but every process query fails."""

    def __init__(self, inner: FakeNvml) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any:
        raise nvml_error(pynvml.NVML_ERROR_UNKNOWN)


def test_a_failed_process_query_on_a_mig_device_counts_as_busy(fake: FakeNvml) -> None:
    mig = NvmlMig(_FailingQuery(fake))
    assert mig.mig_device_has_processes(0, mig.mig_devices(0)[0].mig_index)
