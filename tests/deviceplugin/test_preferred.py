"""GetPreferredAllocation: booked GPUs, else a valid fallback (docs/hami-reference.md 4.5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.deviceplugin.preferred import PreferredRequest, decide_preferred
from hami_plugin.protocol import codec
from hami_plugin.protocol.model import ContainerDevice
from hami_plugin.protocol.objects import PodInfo
from tests.deviceplugin.records import GPU_A, GPU_B, GPU_C, make_pod

_GPUS = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(4)]


def slots(gpu: str, count: int = 3) -> list[str]:
    return [f"{gpu}-{i}" for i in range(count)]


def test_preferred_follows_the_scheduler_choice() -> None:
    pod = make_pod(f"{GPU_C},NVIDIA,1,0:{GPU_B},NVIDIA,1,0:;")
    available = slots(GPU_A) + slots(GPU_B) + slots(GPU_C)
    (answer,) = decide_preferred(pod, [PreferredRequest(available, (), 2)])
    assert answer.device_ids == (f"{GPU_C}-0", f"{GPU_B}-0")
    assert answer.fallback_note is None


def test_preferred_keeps_must_include_and_counts_it() -> None:
    pod = make_pod(f"{GPU_B},NVIDIA,1,0:{GPU_C},NVIDIA,1,0:;")
    available = slots(GPU_A) + slots(GPU_B) + slots(GPU_C)
    (answer,) = decide_preferred(pod, [PreferredRequest(available, [f"{GPU_B}-2"], 2)])
    assert answer.device_ids == (f"{GPU_B}-2", f"{GPU_C}-0")


def test_preferred_falls_back_when_a_chosen_gpu_is_gone() -> None:
    pod = make_pod(f"{GPU_C},NVIDIA,1,0:{GPU_B},NVIDIA,1,0:;")
    available = slots(GPU_A) + slots(GPU_B)  # GPU_C died: kubelet offers none of it
    (answer,) = decide_preferred(pod, [PreferredRequest(available, (), 2)])
    assert answer.device_ids == (f"{GPU_B}-0", f"{GPU_A}-0")
    assert answer.fallback_note is not None and GPU_C in answer.fallback_note


def test_preferred_without_a_pod_picks_distinct_gpus_first() -> None:
    available = slots(GPU_A, 2) + slots(GPU_B, 2)
    (answer,) = decide_preferred(None, [PreferredRequest(available, (), 3)])
    assert answer.device_ids == (f"{GPU_A}-0", f"{GPU_B}-0", f"{GPU_A}-1")


def test_preferred_with_an_unreadable_annotation_still_answers() -> None:
    pod = make_pod("garbage-without-fields:;")
    (answer,) = decide_preferred(pod, [PreferredRequest(slots(GPU_A), (), 1)])
    assert answer.device_ids == (f"{GPU_A}-0",)


# --- properties -------------------------------------------------------------------------------


@st.composite
def preferred_cases(draw: st.DrawFn) -> tuple[PodInfo | None, PreferredRequest]:
    available = draw(
        st.lists(
            st.sampled_from([f"{g}-{s}" for g in _GPUS for s in range(3)]),
            unique=True,
            max_size=12,
        )
    )
    must = draw(st.lists(st.sampled_from(available), unique=True)) if available else []
    size = draw(st.integers(min_value=len(must), max_value=len(available) + 1))
    wanted = draw(st.lists(st.sampled_from(_GPUS), max_size=4))
    pod = None
    if draw(st.booleans()):
        entry = tuple(ContainerDevice(g, "NVIDIA", 1, 0) for g in wanted)
        pod = make_pod(codec.encode_pod_devices((entry,)))
    return pod, PreferredRequest(available, must, size)


@given(preferred_cases())
def test_preferred_is_always_a_valid_answer(
    case: tuple[PodInfo | None, PreferredRequest],
) -> None:
    pod, request = case
    (answer,) = decide_preferred(pod, [request])
    ids = answer.device_ids
    assert len(ids) == len(set(ids))
    assert set(ids) <= set(request.available)
    assert set(request.must_include) <= set(ids)
    assert len(ids) == min(request.size, len(request.available))
