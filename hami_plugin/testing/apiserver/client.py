"""How a client reaches the double: a `kubernetes` client Configuration or ApiClient, or a
kubeconfig file for a daemon's `--kubeconfig`. The only module of the double that imports
`kubernetes`."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client as k8s


def configuration(url: str) -> k8s.Configuration:
    """A client Configuration pointing at the double serving on `url`."""
    configuration = k8s.Configuration(host=url)
    configuration.api_key = {"BearerToken": "Bearer fake-token"}
    return configuration


def api_client(url: str) -> k8s.ApiClient:
    """A fresh `kubernetes.client.ApiClient` bound to `url` (caller closes it)."""
    return k8s.ApiClient(configuration(url))


def write_kubeconfig(url: str, path: str | Path, *, token: str = "fake-token") -> Path:
    """Write a kubeconfig file for the double serving on `url`; returns the path."""
    path = Path(path)
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path
