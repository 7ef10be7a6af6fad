"""The Kubernetes API as the daemons use it; the only package that imports `kubernetes`.

* `client`: `KubeClient`, the calls (nodes, pods, patches, bindings, leases, events, Secrets,
  webhook caBundles, list, watch);
* `transport`: how each call is sent through the `kubernetes` client's `ApiClient`: one
  `Request`, retried, timed, under the calling thread's time budget;
* `api`: the calls each role makes, as protocols (`AllocateApi`, `BindApi`, `LeaseApi`...);
* `fake`: `FakeKube`, those roles in memory, for unit tests;
* `errors`: `KubeError` and its kinds, and the one translation point from the library's errors;
* `paths`: API paths from names, each name checked as a path segment and percent-quoted;
* `retry`: the retry policy and loop; `config`: where the configuration comes from;
* `records`: lists, watch events, leases and events as plain records (pods and nodes are read
  by the one model, `hami_plugin.protocol.objects`);
* `watch`: reading a watch stream; `informer`: list-then-watch into a local store.
"""
