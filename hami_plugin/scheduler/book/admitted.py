"""Unsigned bookings kubelet has already served: counted, never trusted (docs/design.md 8.6).

A cluster that ran HAMi's scheduler, or ours without a booking key, has pods running on
bookings nobody signed. Once the scheduler has a key, `trust.untrusted_booking` refuses them,
and their GPUs would read as free while their containers hold them. What kubelet wrote about
the pod settles it instead of the annotations: a pod that asks for the GPU resource, is bound
to the node its booking names, and that kubelet on that node admitted (`status.startTime` or a
started container, which only kubelet writes: pod authors cannot write a pod's status) was
given its devices there, by whichever device plugin served the resource then. Such a booking is
counted as it stands until the pod ends; it is never "our own" (`BookingTrust` seals nothing
for it, our device plugin refuses to serve it, it changes no signature rule).

Why `status.startTime`: kubelet sets it in the first status it writes for a pod
(`pkg/kubelet/status/status_manager.go`, `updateStatusInternal`, v1.28: "if the status has no
start time, we need to set an initial time"), and it writes a status only for a pod it admitted
(`pkg/kubelet/kubelet.go`, `HandlePodAdditions`: a pod `canAdmitPod` refuses goes to
`rejectPod`, whose one status write is phase Failed; the device manager's Allocate runs inside
admission). So a pod with a start time and not Failed got its devices; a Pending pod without
one (never admitted, or admitted only now) did not, and counts for nothing.

A pod author cannot move the rule: a GPU-less pod, one bound elsewhere or never started counts
for nothing, and one that booked more GPUs than its containers ask (kubelet gave it no more)
counts for nothing either. Pure.
"""

from __future__ import annotations

from hami_plugin.protocol.codec import AnnotationError
from hami_plugin.protocol.objects import PodInfo
from hami_plugin.scheduler.requests import pod_requests
from hami_plugin.scheduler.settings import SchedulerSettings

__all__ = ["admitted_booking", "kubelet_admitted"]


def kubelet_admitted(info: PodInfo) -> bool:
    """Kubelet admitted the pod on its node and has not finished it: `status.startTime` is set
    or a container started, and the pod is neither Failed nor Succeeded."""
    return not info.finished and (info.start_time is not None or info.containers_started)


def admitted_booking(info: PodInfo, settings: SchedulerSettings) -> str | None:
    """None when the pod's booking counts although nobody signed it (the module docstring's
    rule), else why it does not."""
    booking = info.booking
    if booking is None or not booking.node:
        return "it books no node"
    if info.node_name != booking.node:
        return f"it is not bound to node {booking.node} its booking names"
    if not kubelet_admitted(info):
        return f"kubelet has not started it on node {booking.node}"
    requests = pod_requests(info, settings)
    if not requests.wants_gpu:
        return f"it asks for no {settings.resources.count}"
    try:
        devices = booking.allocated or ()
    except AnnotationError as error:
        return str(error)
    booked = sum(len(container) for container in devices)
    asked = sum(request.count for request in requests.containers if request is not None)
    if booked > asked:
        return f"it books {booked} GPUs and its containers ask for {asked}"
    return None
