"""Where the client's configuration comes from, and its token refresh (hami_plugin.kube.config)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration

from hami_plugin.clock import ManualClock
from hami_plugin.kube.client import KubeClient
from hami_plugin.kube.errors import KubeError
from hami_plugin.testing.apiserver import FakeApiServer
from tests.kube.support import FAST

# --- configuration ----------------------------------------------------------------------------


def test_from_config_with_kubeconfig_file(
    apiserver: FakeApiServer,
    tmp_path: Path,
) -> None:
    apiserver.add_node("gpu-1")
    path = apiserver.write_kubeconfig(tmp_path / "kubeconfig", token="s3cret")

    with KubeClient.from_config(str(path), FAST) as kube:
        assert kube.get_node("gpu-1").name == "gpu-1"

    assert apiserver.requests[0].headers["authorization"] == "Bearer s3cret"


def test_bearer_token_is_read_from_the_configuration_again_on_a_later_attempt(
    apiserver: FakeApiServer,
) -> None:
    # The in-cluster loader rotates the service-account token through this hook (run at most
    # once a second: here the backoff before the retry takes 2 s of the test clock).
    apiserver.add_node("gpu-1")
    apiserver.inject_fault("GET", ".*", status=503)
    tokens = iter(["first", "second"])

    def refresh(configuration: Configuration) -> None:
        configuration.api_key["BearerToken"] = next(tokens)

    configuration = apiserver.configuration()
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    # The library annotates the hook as None only.
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]

    clock = ManualClock()

    def sleep(seconds: float) -> None:
        clock.advance(2.0)

    with KubeClient(ApiClient(configuration), FAST, sleep=sleep, clock=clock) as kube:
        kube.get_node("gpu-1")

    assert [r.headers["authorization"] for r in apiserver.requests] == [
        "Bearer first",
        "Bearer second",
    ]


def test_from_config_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"

    with pytest.raises(
        KubeError,
        match=f"cannot load Kubernetes configuration: kubeconfig '{missing}' does not exist",
    ):
        KubeClient.from_config(str(missing))


@pytest.mark.parametrize(
    "text",
    ["a: [b\n", "apiVersion: v1\nkind: Config\n", "- 1\n- 2\n"],
    ids=["yaml", "empty", "list"],
)
def test_from_config_broken_file_is_a_kube_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)

    with pytest.raises(KubeError, match="cannot load Kubernetes configuration from kubeconfig"):
        KubeClient.from_config(str(path))


def test_from_config_without_any_config_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)

    with pytest.raises(KubeError, match="in-cluster config"):
        KubeClient.from_config()


# --- token refresh --------------------------------------------------------------------------------


def test_the_token_refresh_hook_runs_at_most_once_a_second(
    apiserver: FakeApiServer,
) -> None:
    # The kubeconfig loader's hook re-applies the whole configuration before every request;
    # a busy scheduler makes hundreds a second. Rotated tokens still reach requests in 1 s.
    apiserver.add_node("n1")
    api_client = apiserver.api_client()
    clock = ManualClock()
    start = clock.monotonic()
    calls: list[float] = []
    api_client.configuration.refresh_api_key_hook = lambda configuration: calls.append(
        clock.monotonic() - start
    )
    with KubeClient(api_client, FAST, clock=clock) as client:
        for _ in range(5):
            client.get_node("n1")
        assert calls == [0.0]
        clock.advance(0.5)
        client.get_node("n1")
        assert calls == [0.0]
        clock.advance(0.75)
        client.get_node("n1")
        assert calls == [0.0, 1.25]


def test_a_refresh_hook_that_reinstalls_itself_stays_throttled(tmp_path: Path) -> None:
    # kubeconfig's loader: its hook re-applies the configuration, hook included, every time.
    with FakeApiServer() as server:
        server.add_node("n1")
        client_calls: list[int] = []
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        with KubeClient.from_config(str(kubeconfig), FAST) as kube:
            configuration = kube._api_client.configuration
            hook = configuration.refresh_api_key_hook
            assert hook is not None
            for _ in range(20):
                kube.get_node("n1")
                client_calls.append(id(configuration.refresh_api_key_hook))
            # still our throttle after the loader's hook ran and re-installed itself
            assert set(client_calls) == {id(hook)}
