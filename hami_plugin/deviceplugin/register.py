"""Publishes this node's GPUs to the scheduler: the `hami.io/node-nvidia-register` annotation.

HAMi's plugin rebuilds the value every 30 s and patches it only when it differs from the last
string it wrote (reference 4.2). Same here, plus an immediate round on every health event
(`poke`), and one thing HAMi lacks: a round whose value is unchanged reads the node and writes
the value again if the node lost it (a Node object deleted and re-created by kubelet comes back
without annotations, and HAMi's scheduler would then never see this node's GPUs again). API
failures are logged once per outage and retried at the next round (5 s after an error, as HAMi
does, or sooner when the interval is shorter); they never stop the daemon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from hami_plugin.model import ANNOTATION_NODE_REGISTER

logger = logging.getLogger(__name__)

RETRY_AFTER_ERROR_SECONDS = 5.0


class NodeWithAnnotations(Protocol):
    @property
    def annotations(self) -> Mapping[str, str]: ...


class NodeAnnotationApi(Protocol):
    """The calls the publisher makes (`k8s.KubeClient` provides them)."""

    def get_node(self, name: str) -> NodeWithAnnotations: ...

    def patch_node_annotations(
        self,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> object: ...


class RegisterPublisher:
    """Writes the register annotation whenever `build_value()` returns a new string.

    `build_value` returns the encoded device list (`codec.encode_node_devices`); an exception
    from it is logged and the round skipped.
    """

    def __init__(
        self,
        kube: NodeAnnotationApi,
        node_name: str,
        build_value: Callable[[], str],
        *,
        interval_seconds: float = 30.0,
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._build_value = build_value
        self._interval = interval_seconds
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
        except Exception:
            logger.exception("cannot build the node register annotation")
            return False
        try:
            if value == self._last_written:
                node = self._kube.get_node(self._node_name)
                if node.annotations.get(ANNOTATION_NODE_REGISTER) == value:
                    return self._recovered()
                logger.warning(
                    "node %s: %s is missing or changed on the node; writing it again",
                    self._node_name,
                    ANNOTATION_NODE_REGISTER,
                )
            self._kube.patch_node_annotations(self._node_name, {ANNOTATION_NODE_REGISTER: value})
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
        logger.info("node %s: published %s", self._node_name, ANNOTATION_NODE_REGISTER)
        logger.debug("register annotation: %s", value)
        return True

    def _recovered(self) -> bool:
        if self._failing:
            logger.info("node %s: register annotation up to date again", self._node_name)
        self._failing = False
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
