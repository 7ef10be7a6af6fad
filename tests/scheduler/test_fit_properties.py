"""Properties of the fit: never over-commits a GPU, and the score-free screening gives
exactly HAMi's procedure's verdict, failure counts and GPUs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami_plugin.protocol.model import ScoringWeights
from hami_plugin.scheduler.fit import FitContext, FitFailure, fit_container
from hami_plugin.scheduler.pod_fit import fit_pod
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest, PodRequests
from hami_plugin.scheduler.usage import NodeUsage

from .helpers import context, gpu, node

POLICIES = [
    "binpack",
    "spread",
    "mutex",
    "topology-aware",
    "numa",
    "binpack,numa",
    "numa,spread",
    "spread,mutex",
    "mutex,topology-aware",
]


@st.composite
def nodes(draw: st.DrawFn) -> NodeUsage:
    size = draw(st.integers(1, 8))
    devices, used, memory, cores = [], [], [], []
    for index in range(size):
        count = draw(st.integers(1, 10))
        total_memory = draw(st.sampled_from([1000, 15360, 32768, 81920]))
        total_cores = draw(st.sampled_from([100, 100, 100, 200, 0]))
        devices.append(
            gpu(
                f"GPU-{index}",
                draw(st.sampled_from([index, index, 0])),  # duplicate indexes now and then
                numa=draw(st.integers(0, 2)),
                count=count,
                memory=total_memory,
                cores=total_cores,
                type=draw(
                    st.sampled_from(
                        ["NVIDIA-Tesla V100-PCIE-32GB"] * 4 + ["NVIDIA A100-SXM4-80GB", "Ascend910"]
                    )
                ),
                mode=draw(st.sampled_from(["hami-core"] * 12 + ["mig", "mps"])),
                healthy=draw(st.sampled_from([True] * 12 + [False])),
            )
        )
        # mostly lightly used GPUs, now and then a full one
        used.append(draw(st.sampled_from([0, 0, 1, count // 2, count])))
        memory.append(
            draw(st.sampled_from([0, 0, total_memory // 4, total_memory // 2, total_memory]))
        )
        cores.append(draw(st.sampled_from([0, 0, total_cores // 4, total_cores])))
    cordoned = draw(st.sets(st.sampled_from([f"GPU-{i}" for i in range(size)]), max_size=1))
    return node(*devices, used=used, memory=memory, cores=cores, cordoned=sorted(cordoned))


requests = st.builds(
    ContainerRequest,
    count=st.sampled_from([1, 1, 1, 2, 2, 4]),
    memory_mib=st.sampled_from([0, 0, 500, 4000, 16000, 40000]),
    memory_percent=st.sampled_from([PERCENTAGE_UNSET, PERCENTAGE_UNSET, 10, 50, 100]),
    cores_percent=st.sampled_from([0, 0, 10, 30, 50, 100, 150]),
).filter(lambda r: r.memory_mib > 0 or r.memory_percent != PERCENTAGE_UNSET)


@st.composite
def contexts(draw: st.DrawFn) -> FitContext:
    return context(
        draw(st.sampled_from(POLICIES)),
        numa_bind=draw(st.booleans()),
        grouped=draw(st.booleans()),
        weights=draw(
            st.none()
            | st.builds(ScoringWeights, st.integers(0, 3), st.integers(0, 3), st.integers(1, 3))
        ),
        use_gpu_uuids=draw(st.sampled_from([(), (), (), ("GPU-0", "GPU-1", "GPU-3")])),
        nouse_gpu_uuids=draw(st.sampled_from([(), (), (), ("GPU-1",)])),
        use_gpu_types=draw(st.sampled_from([(), (), (), ("V100",), ("a100", "T4")])),
    )


@st.composite
def pods(draw: st.DrawFn) -> PodRequests:
    containers = draw(st.lists(st.none() | requests, min_size=1, max_size=4))
    return PodRequests(tuple(containers), draw(st.integers(0, len(containers))))


@given(nodes(), requests, contexts())
def test_screening_matches_hamis_procedure(
    target: NodeUsage, request: ContainerRequest, ctx: FitContext
) -> None:
    assert fit_container(target, request, ctx) == fit_container(target, request, ctx, screen=False)


@given(nodes(), pods(), contexts())
def test_screening_matches_for_whole_pods(
    target: NodeUsage, pod: PodRequests, ctx: FitContext
) -> None:
    assert fit_pod(target, pod, ctx) == fit_pod(target, pod, ctx, screen=False)


@given(nodes(), requests, contexts())
def test_a_fit_never_over_commits_a_gpu(
    target: NodeUsage, request: ContainerRequest, ctx: FitContext
) -> None:
    result = fit_container(target, request, ctx)
    if isinstance(result, FitFailure):
        return
    positions, devices = result.positions, result.devices
    assert len(positions) == len(set(positions)) == request.count
    numas = set()
    for position, device in zip(positions, devices, strict=True):
        gpu_device = target.devices[position]
        assert device.uuid == gpu_device.uuid
        assert gpu_device.healthy
        assert gpu_device.uuid not in target.cordoned
        assert target.used[position] + 1 <= gpu_device.split_count
        assert target.used_memory_mib[position] + device.used_mem_mib <= gpu_device.memory_mib
        assert target.used_cores[position] + device.used_cores <= gpu_device.cores_percent
        assert device.used_cores <= 100
        numas.add(gpu_device.numa_node)
    if ctx.numa_bind:
        assert len(numas) == 1


@given(nodes(), pods(), contexts())
def test_a_pod_never_over_commits_a_gpu(
    target: NodeUsage, pod: PodRequests, ctx: FitContext
) -> None:
    result = fit_pod(target, pod, ctx)
    if isinstance(result, FitFailure):
        return
    assert len(result.devices) == len(pod.containers)
    position = {device.uuid: index for index, device in enumerate(target.devices)}
    app_slots = list(target.used)
    app_memory = list(target.used_memory_mib)
    app_cores = list(target.used_cores)
    for index, (request, devices) in enumerate(zip(pod.containers, result.devices, strict=True)):
        if request is None:
            assert devices == ()
            continue
        assert len(devices) == request.count
        if index < pod.init_count:  # alone on the node as it is
            slots, memory, cores = (
                list(target.used),
                list(target.used_memory_mib),
                list(target.used_cores),
            )
        else:  # together with the other app containers
            slots, memory, cores = app_slots, app_memory, app_cores
        for device in devices:
            at = position[device.uuid]
            slots[at] += 1
            memory[at] += device.used_mem_mib
            cores[at] += device.used_cores
            assert slots[at] <= target.devices[at].split_count
            assert memory[at] <= target.devices[at].memory_mib
            assert cores[at] <= target.devices[at].cores_percent
