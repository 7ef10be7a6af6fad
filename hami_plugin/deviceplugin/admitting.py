"""Kubelet's word on which pod it is admitting, as one Allocate call asks it.

Kubelet's PodResources list (`podresources.PodResourcesClient.kubelet_pods`) shows the pod
kubelet is admitting without devices of the resource and does not show the pods it admits
later (docs/design.md 5.6). Without a booking key it is asked only when two or more pods are
pending on the node, to tell them apart (in-flight/v2); with a key on every call, to confirm
the chosen pod (`pending.admission_doubt`). A failing kubelet is logged once per outage, and
`KubeletAdmission.on_failed` hears of each failure (the register loop then stops claiming v2).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from hami_plugin.config.keys import BookingKeyFile
from hami_plugin.deviceplugin.pending import KubeletPods

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class KubeletAdmission:
    """Kubelet's word on which pod it is admitting (in-flight/v2).

    `pods` returns the pods kubelet lists, and those without a device of the served resource
    (`podresources.PodResourcesClient.kubelet_pods`), raising when kubelet does not answer.
    `on_failed` gets each of its errors and answers whether the node claimed in-flight/v2
    recently (then several not-started candidates are no answer, else the v1 rule chooses
    without kubelet's list).
    """

    pods: Callable[[], KubeletPods]
    on_failed: Callable[[Exception], bool] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class KubeletView:
    """What one call learnt of kubelet's PodResources list: `pods` (None: not asked, or no
    answer, `failure` saying why), and the pods to take as listed without devices for the
    in-flight choice (None: the v1 rule; empty: kubelet did not answer and the node claimed
    v2 recently, so no guess by creation order)."""

    pods: KubeletPods | None
    admitting: frozenset[tuple[str, str]] | None
    failure: str


NOT_ASKED = KubeletView(None, None, "")


class KubeletAdmitting:
    """Asks `admission` for one call; logs the first failure of an outage and the recovery.
    Thread-safe (Allocate calls may overlap). `node_name` is for the log lines."""

    def __init__(self, admission: KubeletAdmission, node_name: str) -> None:
        self._admission = admission
        self._node_name = node_name
        self._lock = threading.Lock()
        self._failing = False
        """Set by a failed call (logged once), cleared by the next success."""

    def view(self, *, confirming: bool) -> KubeletView:
        """Kubelet's list for this call. `confirming` (a booking key): the chosen pod must be
        confirmed by it, so a failure means no booking is served (said in the log line)."""
        try:
            listed = self._admission.pods()
        except Exception as error:
            with self._lock:
                first, self._failing = not self._failing, True
            if first:
                logger.warning(
                    "node %s: %s; until kubelet answers, %s",
                    self._node_name,
                    error,
                    "no booking is served (with a booking key only the pod kubelet lists as "
                    "being admitted gets one)"
                    if confirming
                    else "several pending pods are told apart by creation order alone "
                    "(in-flight/v1), and not at all while pods bound under in-flight/v2 may be "
                    "among them",
                )
            on_failed = self._admission.on_failed
            if on_failed is not None and on_failed(error):
                # pods bound under v2 may be here: no guess by creation order
                return KubeletView(None, frozenset(), str(error))
            return KubeletView(None, None, str(error))
        with self._lock:
            recovered, self._failing = self._failing, False
        if recovered:
            logger.info("node %s: kubelet's PodResources API answers again", self._node_name)
        return KubeletView(listed, listed.without_devices, "")


def log_trust(keys: BookingKeyFile | None, pod_resources_socket: str) -> None:
    """Once, after NVML (a node that cannot start says only why): which bookings are served."""
    if keys is None:
        logger.warning(
            "no --booking-key-file: Allocate serves every pod's hami.io booking annotations as "
            "HAMi does, so anyone who can create a pod can claim GPUs"
        )
        return
    logger.info("serving only bookings signed by the scheduler (keys from %s)", keys.path)
    if not pod_resources_socket:
        logger.warning(
            "--pod-resources-socket is empty: Allocate cannot ask kubelet which pod it is "
            "admitting, so a pod bound to this node without the scheduler can be served a "
            "signed booking pending here (docs/design.md 8.5)"
        )
