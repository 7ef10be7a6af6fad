"""Namespace GPU quotas: HAMi v2.10's `pkg/device/quota_test.go` cases as tables, and the fit's
`ResourceQuotaNotFit` check (`pkg/device/nvidia/device.go:666-691`, 783-787)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hami_plugin.protocol.usage import DeviceTally
from hami_plugin.scheduler.fit import FitFailure, fit_container, render_failure
from hami_plugin.scheduler.pod_fit import fit_pod
from hami_plugin.scheduler.quota import Quota, QuotaBook, managed_quota_name, quota_limits
from hami_plugin.scheduler.requests import PERCENTAGE_UNSET, ContainerRequest, PodRequests
from hami_plugin.scheduler.settings import ResourceNames, SchedulerSettings
from hami_plugin.scheduler.webhook import QuotaCheck, WebhookSettings, admit_pod

from .helpers import context, gpu, node

MEM = "nvidia.com/gpumem"
# HAMi's test registers a mock backend whose core name is `nvidia.com/gpucore`.
HAMI_TEST_NAMES = ResourceNames(cores="nvidia.com/gpucore")
CORE = "nvidia.com/gpucore"


def hami_test_book() -> QuotaBook:
    return QuotaBook(resources=HAMI_TEST_NAMES)


# --- TestFitQuota (quota_test.go:121-162) ---------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "memory", "factor", "cores", "fits"),
    [
        ("testns", 500, 1, 100, True),  # within limits
        ("testns", 1500, 1, 100, False),  # memory exceeds
        ("testns", 500, 1, 300, False),  # cores exceed
        ("testns", 1000, 2, 100, True),  # memory factor doubles the limit
        ("testns", 5000, 2, 100, False),  # beyond even the doubled limit
        ("otherns", 1500, 1, 100, True),  # namespace without quota
    ],
)
def test_fit_quota(namespace: str, memory: int, factor: int, cores: int, fits: bool) -> None:
    book = hami_test_book()
    book.namespaces["testns"] = {
        MEM: Quota(used=1000, limit=2000, limit_set=True),
        CORE: Quota(used=200, limit=400, limit_set=True),
    }
    assert book.fit_quota(namespace, memory, factor, cores) is fits


def test_fit_quota_explicit_zero_blocks() -> None:
    """TestFitQuotaExplicitZeroBlocks (quota_test.go:164-182)."""
    book = hami_test_book()
    book.add_quota("team-zero", {"limits." + MEM: "0"})
    assert not book.fit_quota("team-zero", 500, 1, 0)


def test_add_usage_and_rm_usage() -> None:
    """TestAddUsageAndRmUsage (quota_test.go:184-231): Used goes up, down, never below 0."""
    book = hami_test_book()
    usage = {MEM: 1000, CORE: 100}
    book.add_usage("testns", usage)
    assert (book.namespaces["testns"][MEM].used, book.namespaces["testns"][CORE].used) == (
        1000,
        100,
    )
    book.rm_usage("testns", usage)
    assert book.namespaces["testns"][MEM].used == 0
    book.rm_usage("testns", usage)
    assert book.namespaces["testns"][MEM].used == 0
    assert book.namespaces["testns"][CORE].used == 0


@pytest.mark.parametrize(
    ("key", "managed"),
    [
        ("limits.nvidia.com/gpumem", MEM),  # TestIsManagedQuota (quota_test.go:233-244)
        ("limits.nvidia.com/gpucore", CORE),
        ("limits.other-resource", None),
        ("requests.nvidia.com/gpumem", None),  # TestDelQuotaNonLimitsKey (quota_test.go:277)
        ("0123456nvidia.com/gpumem", None),
    ],
)
def test_managed_quota_name(key: str, managed: str | None) -> None:
    assert managed_quota_name(key, HAMI_TEST_NAMES) == managed


def test_add_quota_and_del_quota() -> None:
    """TestAddQuotaAndDelQuota (quota_test.go:246-275)."""
    book = hami_test_book()
    hard = {"limits." + MEM: "100", "limits." + CORE: "10"}
    book.add_quota("testns", hard)
    assert book.namespaces["testns"][MEM] == Quota(0, 100, True)
    assert book.namespaces["testns"][CORE] == Quota(0, 10, True)
    assert book.has_limits("testns")
    book.del_quota("testns", hard)
    assert book.namespaces["testns"][MEM] == Quota(0, 0, False)
    assert book.namespaces["testns"][CORE] == Quota(0, 0, False)
    assert not book.has_limits("testns")


def test_del_quota_non_limits_key() -> None:
    """TestDelQuotaNonLimitsKey (quota_test.go:277-309)."""
    book = hami_test_book()
    book.add_quota("testns", {"limits." + MEM: "100", "limits." + CORE: "10"})
    book.del_quota("testns", {"requests." + MEM: "50", "0123456" + MEM: "50"})
    assert book.namespaces["testns"][MEM].limit == 100


def test_update_quota_keeps_limit_enforced() -> None:
    """TestUpdateQuotaKeepsLimitEnforced (quota_test.go:311-357): an update is one step, so a
    namespace at its limit stays refused (HAMi races two goroutines; here the step is
    atomic under the caller's lock, so one check after the update says the same)."""
    book = QuotaBook()
    hard = {"limits.nvidia.com/gpumem": "1000"}
    book.add_quota("update-window", hard)
    book.namespaces["update-window"][MEM].used = 1000
    book.update_quota("update-window", hard, hard)
    assert not book.fit_quota("update-window", 1, 1, 0)


def test_update_quota() -> None:
    """TestUpdateQuota (quota_test.go:359-400)."""
    book = hami_test_book()
    old = {"limits." + MEM: "1000", "limits." + CORE: "100"}
    book.add_quota("update-apply", old)
    book.update_quota("update-apply", old, {"limits." + MEM: "2000"})
    assert book.namespaces["update-apply"][MEM].limit == 2000
    assert book.namespaces["update-apply"][CORE].limit == 0
    book.namespaces["update-apply"][MEM].used = 500
    book.update_quota("update-apply", {"limits." + MEM: "2000"}, {"limits." + MEM: "3000"})
    assert book.namespaces["update-apply"][MEM] == Quota(500, 3000, True)


# --- quantities as the API server sends them (Go's AsInt64) ---------------------------------


@pytest.mark.parametrize(
    ("value", "limit"),
    [("20000", 20000), ("2k", 2000), ("1Ki", 1024), ("2000m", 2), ("1500m", None), ("1.5", None)],
)
def test_quota_limits_take_whole_numbers_only(value: str, limit: int | None) -> None:
    expected = {} if limit is None else {MEM: limit}
    assert quota_limits({"limits." + MEM: value}, ResourceNames()) == expected


def test_unparsable_and_unmanaged_keys_are_skipped() -> None:
    hard = {"limits.nvidia.com/gpumem": "lots", "limits.cpu": "4", "limits.nvidia.com/gpucores": 50}
    assert quota_limits(hard, ResourceNames()) == {"nvidia.com/gpucores": 50}


def test_pods_count_once_and_leave_exactly() -> None:
    """A 2-GPU pod counts both GPUs (countPodDevices, quota.go:101-117); re-adding replaces."""
    book = QuotaBook()
    tallies = (DeviceTally("A", 1, 10000, 30), DeviceTally("B", 1, 10000, 30))
    book.add_pod("ns/p", "ns", tallies)
    book.add_pod("ns/p", "ns", tallies)
    assert book.namespaces["ns"]["nvidia.com/gpumem"].used == 20000
    assert book.namespaces["ns"]["nvidia.com/gpucores"].used == 60
    book.remove_pod("ns/p")
    book.remove_pod("ns/p")
    assert book.namespaces["ns"]["nvidia.com/gpumem"].used == 0


def test_quota_fit_is_none_without_a_limit() -> None:
    book = QuotaBook()
    book.add_usage("ns", {"nvidia.com/gpumem": 10})
    assert book.quota_fit("ns", 1) is None
    book.add_quota("ns", {"limits.nvidia.com/gpumem": "100"})
    check = book.quota_fit("ns", 1)
    assert check is not None and check(90, 0) and not check(91, 0)


# --- the fit check (device.go:666-691, 783-787) ----------------------------------------------


def request(count: int, memory: int, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(count, memory, PERCENTAGE_UNSET, cores)


def limited(memory: int, used: int = 0, cores: int | None = None) -> QuotaBook:
    book = QuotaBook()
    hard: dict[str, object] = {"limits.nvidia.com/gpumem": str(memory)}
    if cores is not None:
        hard["limits.nvidia.com/gpucores"] = str(cores)
    book.add_quota("ns", hard)
    book.add_usage("ns", {"nvidia.com/gpumem": used})
    return book


def test_quota_fails_every_gpu_with_its_reason() -> None:
    book = limited(10000, used=8000)
    ctx = replace(context(), quota=book.quota_fit("ns", 1))
    result = fit_container(node(gpu("A"), gpu("B", 1)), request(1, 4000), ctx)
    assert isinstance(result, FitFailure)
    assert render_failure(result) == "2/2 ResourceQuotaNotFit"


def test_multi_gpu_request_counts_every_gpu_picked_so_far() -> None:
    """The second GPU of a 2-GPU request is checked with the first one's memory included: 2 x
    6000 MiB against a 10000 MiB quota fails on every GPU after the first pick."""
    book = limited(10000)
    ctx = replace(context(), quota=book.quota_fit("ns", 1))
    result = fit_container(node(gpu("A"), gpu("B", 1), gpu("C", 2)), request(2, 6000), ctx)
    assert isinstance(result, FitFailure)
    assert render_failure(result) == (
        "1/3 AllocatedCardsInsufficientRequest, 2/3 ResourceQuotaNotFit"
    )
    fits = fit_container(node(gpu("A"), gpu("B", 1)), request(2, 5000), ctx)
    assert not isinstance(fits, FitFailure)


def test_quota_comes_before_memory_and_after_mutex() -> None:
    book = limited(1000)
    ctx = replace(context(), quota=book.quota_fit("ns", 1))
    full = node(gpu("A", memory=1000), memory=[1000])
    result = fit_container(full, request(1, 2000), ctx)
    assert isinstance(result, FitFailure)
    assert render_failure(result) == "1/1 ResourceQuotaNotFit"
    # without a quota the same GPU fails on memory
    plain = fit_container(full, request(1, 2000), context())
    assert isinstance(plain, FitFailure)
    assert render_failure(plain) == "1/1 CardInsufficientMemory"


def test_cores_quota_and_memory_factor() -> None:
    book = limited(1000, cores=50)
    check = book.quota_fit("ns", 4)
    ctx = replace(context(), quota=check)
    assert not isinstance(fit_container(node(gpu("A")), request(1, 4000, 50), ctx), FitFailure)
    result = fit_container(node(gpu("A")), request(1, 4000, 60), ctx)
    assert isinstance(result, FitFailure)
    assert render_failure(result) == "1/1 ResourceQuotaNotFit"


def test_later_app_containers_count_the_earlier_ones() -> None:
    """HAMi's `allocated` carries the earlier app containers into the sum."""
    book = limited(10000)
    ctx = replace(context(), quota=book.quota_fit("ns", 1))
    requests = PodRequests((request(1, 6000), request(1, 6000)), 0)
    result = fit_pod(node(gpu("A"), gpu("B", 1)), requests, ctx)
    assert isinstance(result, FitFailure)
    assert render_failure(result) == "2/2 ResourceQuotaNotFit"


def test_init_containers_count_by_their_peak() -> None:
    """Two init containers of 6000 MiB on one GPU collapse to 6000: each fits a 10000 quota;
    the app container is checked apart from them (HAMi's phases, score.go:226-283)."""
    book = limited(10000)
    ctx = replace(context(), quota=book.quota_fit("ns", 1), init_count=2)
    requests = PodRequests((request(1, 6000), request(1, 6000), request(1, 6000)), 2)
    result = fit_pod(node(gpu("A")), requests, ctx)
    assert not isinstance(result, FitFailure), render_failure(result)


# --- the webhook's denial (webhook.go:114-116, 145-190) --------------------------------------


def admission(pod: dict[str, object], book: QuotaBook, default_memory: int = 0) -> str:
    reading = SchedulerSettings(default_memory_mib=default_memory)
    check = QuotaCheck(reading, lambda ns, mem, cores: book.fit_quota(ns, mem, 1, cores))
    result = admit_pod(pod, WebhookSettings(quota=check))
    return result.message if not result.allowed else "allowed"


def gpu_container(name: str, gpus: str, memory: str | None = None) -> dict[str, object]:
    limits = {"nvidia.com/gpu": gpus}
    if memory is not None:
        limits["nvidia.com/gpumem"] = memory
    return {"name": name, "image": "cuda", "resources": {"limits": limits}}


def pod_of(
    *containers: dict[str, object], init: tuple[dict[str, object], ...] = ()
) -> dict[str, object]:
    spec: dict[str, object] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


@pytest.mark.parametrize(
    ("pod", "verdict"),
    [
        # 2 GPUs x 3000 MiB = 6000 against 5000: HAMi multiplies by Nums
        (pod_of(gpu_container("a", "2", "3000")), "exceeding resource quota"),
        (pod_of(gpu_container("a", "1", "3000"), gpu_container("b", "1", "2000")), "allowed"),
        (
            pod_of(gpu_container("a", "1", "3000"), gpu_container("b", "1", "2001")),
            "exceeding resource quota",
        ),
        # init containers count by the largest, against the app containers' sum
        (
            pod_of(
                gpu_container("a", "1", "1000"),
                init=(gpu_container("i", "1", "5000"), gpu_container("j", "1", "5000")),
            ),
            "allowed",
        ),
        (
            pod_of(gpu_container("a", "1", "1000"), init=(gpu_container("i", "1", "5001"),)),
            "exceeding resource quota",
        ),
        # no GPU memory asked (a whole card by percentage): 0 MiB, nothing to check
        (pod_of(gpu_container("a", "4")), "allowed"),
    ],
)
def test_webhook_denies_a_pod_beyond_its_namespace_quota(
    pod: dict[str, object], verdict: str
) -> None:
    book = QuotaBook()
    book.add_quota("ns", {"limits.nvidia.com/gpumem": "5000"})
    assert admission(pod, book) == verdict


def test_webhook_counts_what_the_namespace_uses_and_the_scheduler_default() -> None:
    book = QuotaBook()
    book.add_quota("ns", {"limits.nvidia.com/gpumem": "5000"})
    book.add_usage("ns", {"nvidia.com/gpumem": 4000})
    assert admission(pod_of(gpu_container("a", "1", "1000")), book) == "allowed"
    assert admission(pod_of(gpu_container("a", "1", "1001")), book) == "exceeding resource quota"
    # the scheduler's default memory counts for a GPU asked without memory
    assert admission(pod_of(gpu_container("a", "1")), book, default_memory=2000) == (
        "exceeding resource quota"
    )
    # another namespace is not limited
    other = pod_of(gpu_container("a", "1", "9000"))
    other["metadata"] = {"name": "p", "namespace": "free"}
    assert admission(other, book) == "allowed"
