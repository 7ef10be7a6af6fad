"""Where the Kubernetes client's configuration comes from: a kubeconfig file (`--kubeconfig` or
`$KUBECONFIG`, which the commands resolve in `hami_plugin.config`) or the in-cluster service
account, and how often its token is refreshed."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from kubernetes.client.configuration import Configuration
from kubernetes.config.incluster_config import load_incluster_config

from hami_plugin.clock import Clock
from hami_plugin.kube.errors import KubeError


def load_configuration(kubeconfig: str | None = None) -> Configuration:
    """The configuration of the kubeconfig file given, else in-cluster, with urllib3's own
    retries off (`hami_plugin.kube.retry` does the retrying).

    Raises KubeError naming the source tried when it does not give a usable configuration.
    """
    configuration = Configuration()
    source = kubeconfig or ""
    # The loader merges a `:`-separated list, skipping paths that do not exist, and says only
    # "No configuration found" when none does.
    if source and not any(os.path.exists(path) for path in source.split(os.pathsep) if path):
        raise KubeError(
            f"cannot load Kubernetes configuration: kubeconfig {source!r} does not exist "
            "(--kubeconfig, else $KUBECONFIG)"
        )
    try:
        if source:
            # only here: the kubeconfig loader brings OAuth and its HTTP stack (in-cluster
            # daemons never need it)
            from kubernetes.config.kube_config import load_kube_config

            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=source, client_configuration=configuration, persist_config=False
            )
        else:
            load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
    # The loaders fail in many ways (ConfigException, OSError, YAML errors, KeyError or
    # TypeError on a wrong shape, exec-plugin errors); each means "this source is unusable".
    except Exception as exc:
        where = (
            f"kubeconfig {source!r}"
            if source
            else "in-cluster config (no --kubeconfig and no $KUBECONFIG)"
        )
        raise KubeError(f"cannot load Kubernetes configuration from {where}: {exc}") from exc
    configuration.retries = False
    return configuration


_AUTH_REFRESH_SECONDS = 1.0
"""How often the loaders' token refresh hook may run (it runs before every request otherwise)."""


def throttled_refresh(
    hook: Callable[[Configuration], None], clock: Clock
) -> Callable[[Configuration], None]:
    """`hook`, run at most once per `_AUTH_REFRESH_SECONDS` of `clock.monotonic()`.

    The kubeconfig loader's hook re-applies the whole loaded configuration on every request,
    and setting `host` re-reads the proxy environment: about a tenth of a busy scheduler's CPU.
    Tokens (in-cluster rotation, exec plugins) are still refreshed within a second of expiry.
    """
    lock = threading.Lock()
    last: list[float] = []
    inner = [hook]

    def refresh(configuration: Configuration) -> None:
        now = clock.monotonic()
        with lock:
            if last and now - last[0] < _AUTH_REFRESH_SECONDS:
                return
            last[:] = [now]
        inner[0](configuration)
        # The kubeconfig loader's hook installs itself again each time it runs.
        installed = configuration.refresh_api_key_hook
        if installed is not refresh and installed is not None:
            inner[0] = installed
            configuration.refresh_api_key_hook = refresh

    return refresh
