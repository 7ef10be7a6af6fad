"""Publishes this node's GPUs to the scheduler: the `hami.io/node-nvidia-register` annotation.

HAMi's plugin rebuilds the value every 30 s and patches it only when it differs from the last
string it wrote (docs/hami-reference.md 4.2). Same here, plus an immediate round on every health
event (`poke`), and one thing HAMi lacks: a round whose value is unchanged reads the node and writes
the value again if the node lost it (a Node object deleted and re-created by kubelet comes back
without annotations, and HAMi's scheduler would then never see this node's GPUs again). API
failures are logged once per outage and retried at the next round (5 s after an error, as HAMi
does, or sooner when the interval is shorter); they never stop the daemon.

Annotations that describe this plugin rather than the GPUs (`also_annotate`: our device plugin
passes `hami-plugin.io/allocate-protocol: in-flight/v1`, see
`hami_plugin.protocol.inflight`) travel in the same patch, are checked and re-written like the
register value, and are removed by `withdraw()` on a clean shutdown, so a node whose plugin is
gone stops claiming them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from hami_plugin.kube.api import NodeApi
from hami_plugin.protocol.model import ANNOTATION_NODE_REGISTER
from hami_plugin.protocol.topology import (
    NODE_NVIDIA_SCORE_ANNOTATION,
    DeviceScore,
    encode_pair_scores,
)

logger = logging.getLogger(__name__)

RETRY_AFTER_ERROR_SECONDS = 5.0
WITHDRAW_BUDGET_SECONDS = 5.0
"""All API calls of `withdraw()`: shutdown must not wait on a hanging API server."""


class RegisterPublisher:
    """Writes the register annotation whenever `build_value()` returns a new string.

    `build_value` returns the encoded device list (`codec.encode_node_devices`); an exception
    from it is logged and the round skipped. `also_annotate` goes out in every patch and is
    written again when the node lost it; a callable is asked at every round (a changed value is
    written at once), and `on_written` is told what each written round carried.
    """

    def __init__(
        self,
        kube: NodeApi,
        node_name: str,
        build_value: Callable[[], str],
        *,
        interval_seconds: float = 30.0,
        also_annotate: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        on_written: Callable[[Mapping[str, str]], None] | None = None,
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._build_value = build_value
        self._interval = interval_seconds
        self._also_source = also_annotate if callable(also_annotate) else None
        self._also = dict(also_annotate or {}) if not callable(also_annotate) else {}
        self._on_written = on_written
        self._last_written: str | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @property
    def last_written(self) -> str | None:
        return self._last_written

    def publish_once(self) -> bool:
        """One round: patch the node if the value changed. True when nothing is left to do
        (written, or unchanged); False after a failure (retry later)."""
        try:
            value = self._build_value()
            if self._also_source is not None:
                also = dict(self._also_source())
                if also != self._also:
                    self._also = also
                    self._last_written = None  # write now, not only when the node lost it
        except Exception:
            logger.exception("cannot build the node register annotation")
            return False
        wanted = {ANNOTATION_NODE_REGISTER: value, **self._also}
        try:
            if value == self._last_written:
                node = self._kube.get_node(self._node_name)
                lost = sorted(k for k, v in wanted.items() if node.annotations.get(k) != v)
                if not lost:
                    if self._on_written is not None:
                        self._on_written(dict(self._also))
                    return self._recovered()
                logger.warning(
                    "node %s: %s missing or changed on the node; writing again",
                    self._node_name,
                    ", ".join(lost),
                )
            self._kube.patch_node_annotations(self._node_name, wanted)
        except Exception as error:
            if not self._failing:
                logger.warning(
                    "node %s: register annotation not written (%s); will retry",
                    self._node_name,
                    error,
                )
            self._failing = True
            return False
        self._recovered()
        self._last_written = value
        if self._on_written is not None:
            self._on_written(dict(self._also))
        logger.info("node %s: published %s", self._node_name, ANNOTATION_NODE_REGISTER)
        logger.debug("register annotation: %s", value)
        return True

    def _recovered(self) -> bool:
        if self._failing:
            logger.info("node %s: register annotation up to date again", self._node_name)
        self._failing = False
        return True

    def withdraw(self, budget_seconds: float = WITHDRAW_BUDGET_SECONDS) -> bool:
        """Remove the `also_annotate` keys from the node (call after `stop()`), within
        `budget_seconds` of API time when the client supports deadlines. Best effort: a
        failure is logged and False returned, never raised. The register value stays (HAMi's
        scheduler judges the node by it and its handshake)."""
        if not self._also:
            return True
        deadline: Callable[[float], contextlib.AbstractContextManager[object]] | None = getattr(
            self._kube, "deadline", None
        )
        try:
            with deadline(budget_seconds) if deadline is not None else contextlib.nullcontext():
                self._kube.patch_node_annotations(self._node_name, dict.fromkeys(self._also, None))
        except Exception as error:
            logger.warning(
                "node %s: %s not removed (%s)", self._node_name, ", ".join(self._also), error
            )
            return False
        logger.info("node %s: removed %s", self._node_name, ", ".join(self._also))
        return True

    def poke(self) -> None:
        """Run a round now (health or inventory changed)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="register-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            done = self.publish_once()
            timeout = self._interval if done else min(self._interval, RETRY_AFTER_ERROR_SECONDS)
            self._wake.wait(timeout)
            self._wake.clear()


class PairScores:
    """`hami.io/node-nvidia-score` of the registered GPUs (`--enable-topology-score`).

    As HAMi's register.go:279-300: the scores of the registered GPUs
    (`CalculateGPUScore(GetDevicesUUIDList(devices))`, here `measure`: `NvmlBackend.pair_scores`),
    measured again only when that list changes (HAMi: when the register value changes); a failed
    measurement raises, so the round fails and neither annotation is written until it succeeds.
    """

    def __init__(self, measure: Callable[[Sequence[str]], tuple[list[DeviceScore], bool]]) -> None:
        self._measure = measure
        self._last: tuple[tuple[str, ...], str] | None = None

    def annotation(self, uuids: tuple[str, ...]) -> dict[str, str]:
        """The annotation for the GPUs `uuids` (none for no GPU)."""
        if not uuids:
            return {}
        if self._last is None or self._last[0] != uuids:
            scores, asymmetric = self._measure(uuids)
            if asymmetric:
                logger.warning(
                    "AsymmetricGPUP2PLink: one or more GPU pairs on this node have asymmetric "
                    "P2P link data; affected pairs scored 0 (possible NVLink hardware or "
                    "driver issue)"
                )
            self._last = (uuids, encode_pair_scores(scores))
        return {NODE_NVIDIA_SCORE_ANNOTATION: self._last[1]}
