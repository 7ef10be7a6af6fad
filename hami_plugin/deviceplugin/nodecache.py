"""This node's pods and its Node object, each kept by a watch: what Allocate reads when the API
server does not answer.

Two `kube.informer.Informer`s: the pods with `spec.nodeName=<node>` (the same watch serves the
metrics and the container scan, `metrics.NodePods.from_cache`) and the Node with
`metadata.name=<node>` (its lock annotation). A pod the watch delivered before the API server
went away can be served from here; one it never delivered cannot (`allocator.PodAllocator`
then fails that Allocate saying so). Reading before the first list raises `CacheNotListedError`.
"""

from __future__ import annotations

import threading

from hami_plugin.kube.api import WatchApi
from hami_plugin.kube.informer import Informer
from hami_plugin.protocol.objects import NodeInfo, PodInfo, read_node, read_pod


class CacheNotListedError(Exception):
    """The watch has not listed its collection yet (or the node is not in it)."""


class _IgnoreEvents:
    """The caches are read through their stores; their events need no handler."""

    def on_upsert(self, new: object, old: object | None) -> None:
        return None

    def on_delete(self, old: object) -> None:
        return None

    def on_synced(self) -> None:
        return None


class NodeCache:
    """The watch-backed view of one node: `pods()` and `node()` (thread-safe snapshots)."""

    def __init__(self, kube: WatchApi, node_name: str) -> None:
        self.node_name = node_name
        self._pods: Informer[PodInfo] = Informer(
            kube,
            "/api/v1/pods",
            read_pod,
            lambda pod: f"{pod.namespace}/{pod.name}",
            _IgnoreEvents(),
            name=f"pods on node {node_name}",
            field_selector=f"spec.nodeName={node_name}",
        )
        self._node: Informer[NodeInfo] = Informer(
            kube,
            "/api/v1/nodes",
            read_node,
            lambda node: node.name,
            _IgnoreEvents(),
            name=f"node {node_name}",
            field_selector=f"metadata.name={node_name}",
        )

    def start(self, stop: threading.Event) -> None:
        """Run both watches on daemon threads until `stop` is set."""
        for informer, name in ((self._pods, "node-pod-watch"), (self._node, "node-watch")):
            threading.Thread(target=informer.run, args=(stop,), name=name, daemon=True).start()

    def pods(self) -> list[PodInfo]:
        """Every pod bound to the node, as the watch last delivered it.

        Raises CacheNotListedError before the first list."""
        if not self._pods.synced.is_set():
            raise CacheNotListedError(
                f"the watch of node {self.node_name}'s pods has not listed yet"
            )
        return self._pods.items()

    def node(self) -> NodeInfo:
        """The Node, as the watch last delivered it. Raises CacheNotListedError before then."""
        node = self._node.get(self.node_name) if self._node.synced.is_set() else None
        if node is None:
            raise CacheNotListedError(f"the watch of node {self.node_name} has not listed it yet")
        return node
