"""The Kubernetes API as the daemons use it; the only package that imports `kubernetes`.

* `client`: `KubeClient`, the calls (nodes, pods, patches, bindings, leases, events, Secrets,
  webhook caBundles), with `listing`'s (any list or watch, a pod read by a LIST by name);
* `transport`: how each call is sent through the `kubernetes` client's `ApiClient`: one
  `Request`, retried, timed, under the calling thread's time budget;
* `api`: the calls each role makes, as protocols (`AllocateApi`, `BindApi`, `LeaseApi`...);
* `fake`: `FakeKube`, those roles in memory, for unit tests;
* `errors`: `KubeError` and its kinds, and the one translation point from the library's errors;
* `paths`: API paths from names, each name checked as a path segment and percent-quoted;
* `retry`: the one retry policy of both daemons, and the API calls' retry loop;
* `nodelock`: compare-and-patch of a node annotation, and the node lock release both daemons
  use; `events`: the pod events both daemons record, and the sink protocol;
* `config`: where the configuration comes from;
* `records`: lists, watch events, leases and events as plain records (pods and nodes are read
  by the one model, `hami_plugin.protocol.objects`);
* `watch`: reading a watch stream; `informer`: list-then-watch into a local store.
"""

from __future__ import annotations

import importlib.util
import sys

_LEAN_PACKAGES = ("kubernetes", "kubernetes.config", "kubernetes.utils")
"""Packages of the `kubernetes` distribution whose `__init__` is not run: `kubernetes`'s imports
every part of it (dynamic and its schema validation, stream and websockets, watch, utils,
leaderelection, informer; about 11 MiB), `kubernetes.config`'s the kubeconfig loader with
OAuth and its HTTP stack (about 6 MiB) even for an in-cluster daemon, `kubernetes.utils`'s the
YAML-to-objects helpers (which `kubernetes.client.rest` does not need for its retry and
keep-alive helpers). The submodules used here (`kubernetes.client.*`,
`kubernetes.config.incluster_config`, `kubernetes.config.kube_config`, `kubernetes.utils.retry`,
`kubernetes.utils.keepalive`) import as usual; a test checks which modules a daemon loads."""


def _register_without_init(name: str) -> None:
    """Register package `name` as a module whose submodules import normally, without running
    its `__init__` (nothing when it is imported already or not installed)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


for _package in _LEAN_PACKAGES:
    _register_without_init(_package)
