"""Events about pods: the value both daemons record, and the sink they record it into.

The scheduler's sink is `hami_plugin.extender.events.EventRecorder` (correlated as client-go's
recorder does, sent from one thread), the device plugin's `deviceplugin.writebehind.WriteBehind`
(sent at once, queued while the API server is away). Either writes one core/v1 Event per
event (`KubeClient.create_event`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hami_plugin.kube.records import ObjectRef
from hami_plugin.protocol.objects import PodInfo

__all__ = ["EventSink", "PodEvent"]


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Kubernetes Event to record about a pod. `resource_version` names the version of the
    pod it is about ("": none, as the scheduler's events)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    event_type: str = "Normal"
    resource_version: str = ""

    @classmethod
    def of_pod(cls, pod: PodInfo, reason: str, message: str, event_type: str) -> PodEvent:
        """An event about `pod` at the version it was read."""
        return cls(
            pod.namespace, pod.name, pod.uid, reason, message, event_type, pod.resource_version
        )

    def ref(self) -> ObjectRef:
        """The Event's `involvedObject`."""
        return ObjectRef(
            "Pod", self.namespace, self.name, uid=self.uid, resource_version=self.resource_version
        )


class EventSink(Protocol):
    """Records events about pods, best effort: never raises, never blocks for long."""

    def record(self, event: PodEvent) -> None: ...
