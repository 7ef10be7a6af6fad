"""Installing for real (issue 17), rendered with the real `helm` and `kubectl kustomize`:
HAMi-core put on the node by the device plugin's initContainer, one place per install method
for the image (the lines docs/install.md gives, run), kube-scheduler's tag from the cluster's
version, the values schema against what the daemons accept, the namespace sequence the docs
give, and HAMi's parity switches (ServiceMonitor, RuntimeClass, the GPU Operator toolkit wait)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hami_plugin.deviceplugin.device_list import parse_device_list_strategies
from hami_plugin.deviceplugin.hamicore import HAMI_CORE_VERSION, inspect_hamicore
from hami_plugin.protocol import hostpaths
from hami_plugin.protocol.codec import AnnotationError, parse_gpu_policy
from hami_plugin.protocol.govalues import parse_go_duration
from hami_plugin.testing.hamicore import FAKE_LIBRARY
from tests.deployment.exercise import device_plugin_settings, scheduler_config
from tests.deployment.manifests import (
    CHART,
    DAEMONSET,
    NAMESPACE,
    REPO,
    Obj,
    config_map_data,
    container,
    containers,
    hami_container,
    helm_template,
    helm_template_error,
    is_hook,
    kustomize,
    load_all,
    named,
    of_kind,
    plain_manifests,
    pod_spec,
    run,
    tool,
    workload_running,
)

SOURCES: dict[str, Callable[[], list[Obj]]] = {
    "manifests": plain_manifests,
    "kustomize": kustomize,
    "chart": helm_template,
}
INSTALL_DOC = REPO / "docs" / "install.md"
VGPU_INIT = "/k8s-vgpu/bin/vgpu-init.sh"
"""HAMi's installer in its image (`docker/Dockerfile`: COPY ./docker/vgpu-init.sh)."""
HAMI_IMAGE = f"docker.io/projecthami/hami:{HAMI_CORE_VERSION}"
WORKLOADS = ("Deployment", "DaemonSet", "Job", "CronJob")
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


@pytest.fixture(params=SOURCES, scope="module")
def objects(request: pytest.FixtureRequest) -> list[Obj]:
    return SOURCES[request.param]()


def _init_containers(workload: Obj) -> list[Obj]:
    return list(pod_spec(workload).get("initContainers") or [])


def _volume(workload: Obj, name: str) -> dict[str, Any]:
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == name]
    return dict(volume)


def _mount(item: Obj, path: str) -> dict[str, Any]:
    (mount,) = [m for m in item.get("volumeMounts") or [] if m["mountPath"] == path]
    return dict(mount)


def _images(objects: list[Obj]) -> dict[str, str]:
    """container name -> image, over every workload (one image per name)."""
    images: dict[str, set[str]] = {}
    for workload in objects:
        if workload.get("kind") in WORKLOADS:
            for item in containers(workload):
                images.setdefault(item["name"], set()).add(item["image"])
    assert all(len(found) == 1 for found in images.values()), images
    return {name: found.pop() for name, found in images.items()}


# --- HAMi-core on the node ----------------------------------------------------------------------


def _run_vgpu_init(command: list[str], release: str) -> None:
    """What HAMi v2.10's `docker/vgpu-init.sh <dest>` leaves in <dest> from its image's
    `/k8s-vgpu/lib/nvidia/` (`libvgpu.so.<release>`, `docker/Dockerfile`): the library copied
    there, and `ld.so.preload` rewritten to name `<dest>/libvgpu.so` (trailing slash cut)."""
    script, destination = command
    assert script == VGPU_INIT
    dest = destination.rstrip("/") or "/"
    os.makedirs(dest, exist_ok=True)
    Path(dest, f"libvgpu.so.{release}").write_bytes(FAKE_LIBRARY)
    Path(dest, "ld.so.preload").write_text(f"{dest}/libvgpu.so\n")


def test_the_hami_core_init_container_writes_into_the_device_plugins_hook_directory(
    objects: list[Obj], tmp_path: Path
) -> None:
    daemonset = workload_running(objects, "device-plugin")
    (init,) = [c for c in _init_containers(daemonset) if c["name"] == "hami-core"]
    assert init["image"] == HAMI_IMAGE, "the HAMi release the device plugin looks for first"
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    vgpu = hostpaths.vgpu_dir(settings.hook_path)
    assert init["command"] == [VGPU_INIT, f"{vgpu}/"]
    assert "args" not in init  # the image's ENTRYPOINT would start HAMi's daemons
    # the host directory the device plugin hands kubelet paths under, at the same path in both
    init_mount = _mount(init, vgpu)
    plugin_mount = _mount(hami_container(daemonset, "device-plugin"), vgpu)
    assert init_mount["name"] == plugin_mount["name"]
    assert not init_mount.get("readOnly")
    assert _volume(daemonset, init_mount["name"])["hostPath"]["path"] == vgpu
    # root for the root-owned host directory, nothing more
    security = init["securityContext"]
    assert security["runAsUser"] == 0 and not security.get("privileged")
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert init["resources"]["limits"]["memory"]


@pytest.mark.parametrize("hook", ["hook", "hook/"])
def test_what_vgpu_init_leaves_on_the_node_is_what_the_device_plugin_accepts(
    tmp_path: Path, hook: str
) -> None:
    """The chart with the hook directory moved: HAMi's script run with the initContainer's
    command leaves the library and a preload the device plugin, started as the DaemonSet
    starts it, finds complete."""
    hook_path = f"{tmp_path}/{hook}"
    objects = helm_template(f"global.gpuHookPath={hook_path}")
    daemonset = workload_running(objects, "device-plugin")
    (init,) = _init_containers(daemonset)
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert settings.hook_path.rstrip("/") == hook_path.rstrip("/")
    assert inspect_hamicore(settings.hook_path).library_problem, "nothing installed yet"
    release = init["image"].rsplit(":", 1)[1]
    _run_vgpu_init(init["command"], release)
    check = inspect_hamicore(settings.hook_path)
    assert check.ready, check.problem
    assert (
        check.library_host_path == f"{hostpaths.vgpu_dir(settings.hook_path)}/libvgpu.so.{release}"
    )


def test_hami_core_switched_off_leaves_the_hook_directory_to_a_pre_installed_one() -> None:
    objects = helm_template("devicePlugin.hamiCore.enabled=false")
    daemonset = workload_running(objects, "device-plugin")
    assert _init_containers(daemonset) == []
    assert HAMI_IMAGE not in _images(objects).values()
    plugin = hami_container(daemonset, "device-plugin")
    assert _volume(daemonset, _mount(plugin, "/usr/local/vgpu")["name"])["hostPath"]["path"] == (
        "/usr/local/vgpu"
    )


def test_the_hami_core_image_is_a_value() -> None:
    objects = helm_template(
        "devicePlugin.hamiCore.image.tag=v2.10.1",
        "devicePlugin.hamiCore.image.registry=mirror.example.com",
        "devicePlugin.hamiCore.image.pullPolicy=Always",
    )
    (init,) = _init_containers(workload_running(objects, "device-plugin"))
    assert (init["image"], init["imagePullPolicy"]) == (
        "mirror.example.com/projecthami/hami:v2.10.1",
        "Always",
    )


def test_hamis_lib_path_may_only_repeat_the_hook_directory() -> None:
    """HAMi mounts devicePlugin.libPath at <gpuHookPath>/vgpu; two different paths would hand
    kubelet host paths that do not exist."""
    objects = helm_template("devicePlugin.libPath=/usr/local/vgpu")  # HAMi's default
    daemonset = workload_running(objects, "device-plugin")
    assert _volume(daemonset, "hook")["hostPath"]["path"] == "/usr/local/vgpu"
    error = helm_template_error("devicePlugin.libPath=/opt/vgpu")
    assert "devicePlugin.libPath" in error and "global.gpuHookPath" in error


# --- the image: one place per install method -----------------------------------------------------


def _ours(images: dict[str, str]) -> dict[str, str]:
    """The containers that run the hami-plugin image (all but kube-scheduler and HAMi's)."""
    return {
        name: image for name, image in images.items() if name not in ("kube-scheduler", "hami-core")
    }


def test_every_pod_of_ours_runs_the_one_image(objects: list[Obj]) -> None:
    images = _images(objects)
    assert set(_ours(images)) == {"hami-scheduler", "device-plugin", "certs"}
    assert set(_ours(images).values()) == {f"hami-plugin:{APP_VERSION}"}
    assert images["hami-core"] == HAMI_IMAGE


def test_the_chart_image_values_reach_every_pod_of_ours() -> None:
    objects = helm_template(
        "image.repository=registry.example.com/team/hami-plugin",
        "image.tag=9.9.9",
        "image.pullPolicy=Always",
        "devicePlugin.gpuOperatorToolkitReady.enabled=true",
        kube_version="v1.31.8",
    )
    images = _images(objects)
    assert set(_ours(images)) == {"hami-scheduler", "device-plugin", "certs", "toolkit-validation"}
    assert set(_ours(images).values()) == {"registry.example.com/team/hami-plugin:9.9.9"}
    assert images["kube-scheduler"] == "registry.k8s.io/kube-scheduler:v1.31.8"
    assert images["hami-core"] == HAMI_IMAGE
    for workload in (o for o in objects if o.get("kind") in WORKLOADS):
        for item in containers(workload):
            if item["name"] in _ours(images):
                assert item["imagePullPolicy"] == "Always", item["name"]


def test_hamis_per_component_image_keys_are_not_read() -> None:
    """A HAMi values file names HAMi's image for the extender and the device plugin."""
    objects = helm_template(
        "devicePlugin.image.repository=projecthami/hami",
        "scheduler.extender.image.repository=projecthami/hami",
        "global.imageTag=v2.10.0",
    )
    assert set(_ours(_images(objects)).values()) == {f"hami-plugin:{APP_VERSION}"}


def test_global_image_registry_prefixes_every_image() -> None:
    objects = helm_template("global.imageRegistry=mirror.example.com:5000/hub")
    images = _images(objects)
    assert all(image.startswith("mirror.example.com:5000/hub/") for image in images.values())
    assert (
        images["hami-core"] == f"mirror.example.com:5000/hub/projecthami/hami:{HAMI_CORE_VERSION}"
    )


def _doc_commands() -> list[str]:
    """The shell commands of docs/install.md's fenced sh blocks, continuation lines joined and
    comments cut."""
    commands: list[str] = []
    in_block = False
    pending = ""
    for line in INSTALL_DOC.read_text().splitlines():
        if line.startswith("```"):
            in_block = line.strip() == "```sh" if not in_block else False
            continue
        if not in_block:
            continue
        text = pending + line
        if text.rstrip().endswith("\\"):
            pending = text.rstrip()[:-1] + " "
            continue
        pending = ""
        command = text.split("  #", 1)[0].strip()
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def _doc_command(prefix: str, contains: str = "") -> str:
    found = [c for c in _doc_commands() if c.startswith(prefix) and contains in c]
    assert len(found) == 1, f"docs/install.md: {len(found)} commands start with {prefix!r}"
    return found[0]


def test_the_documented_sed_line_points_kustomize_at_a_registry(tmp_path: Path) -> None:
    command = _doc_command("sed -i", "kustomization.yaml")
    shutil.copytree(DAEMONSET, tmp_path / "daemonset")
    written = (tmp_path / "daemonset" / "kustomization.yaml").read_text()

    def apply(line: str) -> dict[str, str]:
        subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True, timeout=30)
        rendered = run([tool("kubectl"), "kustomize", str(tmp_path / "daemonset")])
        return _images(load_all(rendered))

    images = apply(command)
    (registry,) = re.findall(r"s\|newName: \.\*\|newName: ([^|]+)\|", command)
    assert set(_ours(images).values()) == {f"{registry}:{APP_VERSION}"}
    assert images["kube-scheduler"].startswith("registry.k8s.io/kube-scheduler:")
    assert images["hami-core"] == HAMI_IMAGE
    changed = (tmp_path / "daemonset" / "kustomization.yaml").read_text().splitlines()
    assert [a for a, b in zip(written.splitlines(), changed, strict=True) if a != b] == [
        "    newName: hami-plugin"
    ], "one line changes"
    # the same line works again on the edited file (another registry)
    images = apply(command.replace(registry, "other.example.com/hami-plugin"))
    assert set(_ours(images).values()) == {f"other.example.com/hami-plugin:{APP_VERSION}"}


def test_the_documented_helm_lines_point_the_chart_at_a_registry() -> None:
    lines = [c for c in _doc_commands() if c.startswith("helm install")]
    assert len(lines) == 2, "the install and the Image section"
    for line in lines:
        words = shlex.split(line)
        sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
        values = dict(item.split("=", 1) for item in sets)
        images = _images(helm_template(*sets))
        wanted = f"{values['image.repository']}:{values['image.tag']}"
        assert set(_ours(images).values()) == {wanted}


# --- kube-scheduler's tag ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "tag"),
    [
        ("v1.30.2+k3s1", "v1.30.2"),
        ("v1.30.5-eks-ce1d5eb", "v1.30.5"),
        ("v1.29.8-gke.1211000", "v1.29.8"),
        ("v1.31.8", "v1.31.8"),
    ],
)
def test_kube_scheduler_runs_the_clusters_release(reported: str, tag: str) -> None:
    objects = helm_template(kube_version=reported)
    assert _images(objects)["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{tag}"
    objects = helm_template("scheduler.kubeScheduler.image.tag=v1.29.1", kube_version=reported)
    assert _images(objects)["kube-scheduler"] == "registry.k8s.io/kube-scheduler:v1.29.1"


def _kube_scheduler_entry(kustomization: dict[str, Any]) -> dict[str, str]:
    (entry,) = [i for i in kustomization["images"] if i["name"] == "registry.k8s.io/kube-scheduler"]
    return dict(entry)


def test_the_plain_manifests_kube_scheduler_tag_is_one_documented_line(tmp_path: Path) -> None:
    kustomization = yaml.safe_load((DAEMONSET / "kustomization.yaml").read_text())
    tag = _kube_scheduler_entry(kustomization)["newTag"]
    assert _images(plain_manifests())["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{tag}"
    # inside the supported range (Chart.yaml's kubeVersion and docs/install.md's "1.26 or newer")
    minimum = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    assert minimum == ">=1.26.0-0" and "Kubernetes 1.26 or newer" in INSTALL_DOC.read_text()
    major, minor, _patch = (int(part) for part in tag.removeprefix("v").split("."))
    assert (major, minor) >= (1, 26)
    assert f"`{tag}`" in INSTALL_DOC.read_text(), "the docs name the default"
    # that one line is what kustomize renders
    shutil.copytree(DAEMONSET, tmp_path / "daemonset")
    path = tmp_path / "daemonset" / "kustomization.yaml"
    path.write_text(path.read_text().replace(f"newTag: {tag}", "newTag: v1.30.2"))
    images = _images(load_all(run([tool("kubectl"), "kustomize", str(tmp_path / "daemonset")])))
    assert images["kube-scheduler"] == "registry.k8s.io/kube-scheduler:v1.30.2"


# --- the values schema ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=packbin", '"binpack", "spread"'),
        ("scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=numa\\,packbin", "binpack|spread"),
        ("scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=", "pattern"),
        ("scheduler.nodeLockExpire=5min", "pattern"),
        ("scheduler.nodeLockExpire=0s", "pattern"),
        ("scheduler.allocationTimeout=-1m", "pattern"),
        ("scheduler.nodeLockRetryTimeout=28", "less than or equal to 0"),
        ("scheduler.nodeLockRetryTimeout=28m5", "pattern"),
        ("scheduler.patch.renewBefore=30d", "pattern"),
        ("devicePlugin.deviceSplitCount=0", "greater than or equal to 1"),
        ("devicePlugin.deviceSplitCount=2.5", "integer"),
        ("devicePlugin.deviceMemoryScaling=0", "greater than 0"),
        ("devicePlugin.deviceCoreScaling=-1", "greater than 0"),
        ("devicePlugin.deviceCoreScaling=0.0", "pattern"),
        ("scheduler.leaderElect=yes", "boolean"),
        ("devicePlugin.hamiCore.enabled=no", "boolean"),
        ("image.repository=hami-plugin:0.2.0", "pattern"),
        ("image.pullPolicy=Sometimes", "IfNotPresent"),
        ("devicePlugin.hamiCore.image.tag=", "pattern"),
        ("admissionPolicy.enabled=maybe", "auto"),
        ("devicePlugin.deviceListStrategy=cdi", "pattern"),
        ("devicePlugin.gdrcopyEnabled=yes", "boolean"),
    ],
)
def test_the_schema_refuses_what_the_daemons_refuse(setting: str, says: str) -> None:
    key = setting.split("=", 1)[0]
    error = helm_template_error(setting)
    assert "don't meet the specifications of the schema" in error
    assert f"- {key}:" in error, error
    assert says in error, error


def _schema_accepts(key: str, value: str) -> bool:
    escaped = value.replace(",", "\\,")  # --set splits at commas
    command = [tool("helm"), "template", "hami", str(CHART), "--set-string", f"{key}={escaped}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 or "schema" in result.stderr, result.stderr
    return result.returncode == 0


def _parser_accepts(parse: Callable[[str], object], value: str) -> bool:
    try:
        parse(value)
    except (AnnotationError, ValueError):
        return False
    return True


def _positive_duration(text: str) -> timedelta:
    value = parse_go_duration(text)
    if value <= timedelta(0):
        raise ValueError(text)
    return value


@pytest.mark.parametrize(
    ("key", "parse", "samples"),
    [
        (
            "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy",
            parse_gpu_policy,
            {"spread": True, "numa,binpack": True, "binpack,spread,mutex": True,
             "topology-aware": True, "numa": True, "packbin": False, "numa,packbin": False,
             "spread ": False, "Spread": False},
        ),
        (
            "scheduler.nodeLockExpire",
            _positive_duration,
            {"5m": True, "1h30m": True, "1.5h": True, ".5s": True, "300ms": True, "10µs": True,
             "0": False, "0s": False, "0.0m": False, "5min": False, "5": False, "-1m": False,
             "1d": False},
        ),
        (
            "scheduler.nodeLockRetryTimeout",
            parse_go_duration,
            {"28s": True, "0": True, "0s": True, "2m30s": True, "28": False, "1.5": False},
        ),
        (
            "devicePlugin.deviceListStrategy",
            parse_device_list_strategies,
            {"envvar": True, "cdi-cri,envvar": True, "volume-mounts,cdi-annotations": True,
             "cdi-annotations,cdi-cri": True, "cdi": False, "Envvar": False, "": False,
             "envvar,": False, "envvar, cdi-cri": False},
        ),
    ],
)  # fmt: skip
def test_what_the_schema_accepts_the_daemon_accepts(
    key: str, parse: Callable[[str], object], samples: dict[str, bool]
) -> None:
    """The schema's patterns against the daemon's own parsers: it accepts exactly the samples
    marked so, and the daemon accepts each of those (the schema may be stricter: no blanks)."""
    for value, accepted in samples.items():
        assert _schema_accepts(key, value) is accepted, f"{key}={value!r}"
        if accepted:
            assert _parser_accepts(parse, value), f"{key}={value!r}"
        elif key.endswith("Policy") and value.strip() == value:
            assert not _parser_accepts(parse, value), f"{key}={value!r}"


def test_the_schema_lets_through_what_the_daemons_take(tmp_path: Path) -> None:
    objects = helm_template(
        "scheduler.defaultSchedulerPolicy.gpuSchedulerPolicy=numa\\,binpack",
        "devicePlugin.deviceMemoryScaling=1.5",  # --set passes it as text
        "devicePlugin.deviceSplitCount=1",
        "scheduler.nodeLockRetryTimeout=0",
        "scheduler.patch.validity=2160h",
        "devicePlugin.disablecorelimit=true",
    )
    config, _ = scheduler_config(objects, tmp_path)
    assert [name.value for name in config.settings.gpu_policy.names] == ["numa", "binpack"]
    settings = device_plugin_settings(objects, tmp_path, "node-a")
    assert (settings.memory_scaling, settings.split_count) == (1.5, 1)


def test_a_hami_values_file_still_installs(tmp_path: Path) -> None:
    """Keys of HAMi v2.10's values.yaml this chart does not read, and HAMi's spellings of those
    it does (string booleans, null lists), pass the schema."""
    values = tmp_path / "hami-values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "global": {"imageTag": "v2.10.0", "managedNodeSelectorEnable": False},
                "mluResourceName": "cambricon.com/vmlu",
                "scheduler": {
                    "overwriteEnv": "false",
                    "livenessProbe": False,
                    "replicas": 1,
                    "extender": {"image": {"repository": "projecthami/hami"}},
                    "admissionWebhook": {
                        "whitelistNamespaces": None,
                        "namespaceSelector": {"matchLabels": None, "matchExpressions": []},
                        "customURL": {"enabled": False},
                    },
                    "patch": {"runAsUser": 2000, "imageNew": {"tag": "v1.1.1"}},
                    "service": {"type": "NodePort", "monitorTargetPort": 9395},
                },
                "devicePlugin": {
                    "migStrategy": "none",
                    "disablecorelimit": "false",
                    "libPath": "/usr/local/vgpu",
                    "monitor": {"ctrPath": "/usr/local/vgpu/containers"},
                    "image": {"registry": "docker.io", "repository": "projecthami/hami"},
                    "runtimeClassName": "",
                    "createRuntimeClass": False,
                },
                "devices": {"ascend": {"enabled": False}},
                "prometheus": {"enabled": False},
            }
        )
    )
    objects = helm_template(values=[values])
    assert set(_ours(_images(objects)).values()) == {f"hami-plugin:{APP_VERSION}"}


# --- the namespace, in one command sequence ------------------------------------------------------


def test_the_documented_helm_sequence_labels_the_namespace_before_the_release() -> None:
    commands = _doc_commands()
    (install,) = [c for c in commands if c.startswith("helm install") and "Policy" in c]
    assert "--create-namespace" not in install
    words = shlex.split(install)
    namespace = words[words.index("-n") + 1]
    before = commands[: commands.index(install)]
    assert "kubectl apply -f daemonset/namespace.yaml" in before
    (item,) = load_all((DAEMONSET / "namespace.yaml").read_text())
    assert item["metadata"]["name"] == namespace == NAMESPACE
    labels = item["metadata"]["labels"]
    # the device plugin's host paths and root need the privileged Pod Security level
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["hami.io/webhook"] == "ignore"


def test_every_pod_of_the_chart_keeps_the_webhook_away_by_itself() -> None:
    """What the docs rely on for a namespace without the hami.io/webhook label."""
    objects = helm_template("devicePlugin.gpuOperatorToolkitReady.enabled=true")
    workloads = [o for o in objects if o.get("kind") in WORKLOADS]
    assert {o["kind"] for o in workloads} == set(WORKLOADS)
    for workload in workloads:
        spec = workload["spec"]
        template = (spec["jobTemplate"]["spec"] if workload["kind"] == "CronJob" else spec)[
            "template"
        ]
        assert template["metadata"]["labels"]["hami.io/webhook"] == "ignore", workload["kind"]


# --- ServiceMonitor (HAMi's prometheus.enabled) --------------------------------------------------

_MONITOR_SPEC = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels",
                 "podTargetLabels", "sampleLimit"}  # fmt: skip
_ENDPOINT = {"port", "path", "scheme", "interval", "scrapeTimeout", "tlsConfig", "relabelings",
             "metricRelabelings", "honorLabels"}  # fmt: skip


def check_service_monitor(item: Obj) -> None:
    """Raise AssertionError where the Prometheus Operator would refuse a ServiceMonitor (the
    fields of monitoring.coreos.com/v1 used here; no Kubernetes schema ships for it)."""
    assert item["apiVersion"] == "monitoring.coreos.com/v1" and item["kind"] == "ServiceMonitor"
    assert set(item) == {"apiVersion", "kind", "metadata", "spec"}
    assert item["metadata"]["name"] and item["metadata"]["namespace"]
    spec = item["spec"]
    assert set(spec) <= _MONITOR_SPEC, set(spec) - _MONITOR_SPEC
    assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"}
    assert set(spec.get("namespaceSelector", {})) <= {"matchNames", "any"}
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= _ENDPOINT, set(endpoint) - _ENDPOINT
        assert endpoint.get("scheme", "http") in ("http", "https")


def _scraped(objects: list[Obj], monitor: Obj) -> list[tuple[str, int]]:
    """(Service, port) pairs the ServiceMonitor makes Prometheus scrape."""
    spec = monitor["spec"]
    namespaces = spec.get("namespaceSelector", {}).get(
        "matchNames", [monitor["metadata"]["namespace"]]
    )
    selected = [
        s
        for s in of_kind(objects, "Service")
        if s["metadata"]["namespace"] in namespaces
        and all(
            s["metadata"]["labels"].get(k) == v for k, v in spec["selector"]["matchLabels"].items()
        )
    ]
    return [
        (s["metadata"]["name"], p["port"])
        for endpoint in spec["endpoints"]
        for s in selected
        for p in s["spec"]["ports"]
        if p["name"] == endpoint["port"]
    ]


def test_service_monitors_only_when_switched_on() -> None:
    assert of_kind(helm_template(), "ServiceMonitor") == []
    objects = helm_template("prometheus.enabled=true", "prometheus.labels.release=kube-prometheus")
    monitors = {m["metadata"]["name"]: m for m in of_kind(objects, "ServiceMonitor")}
    assert set(monitors) == {"hami-scheduler-metrics-monitor", "hami-device-plugin-metrics-monitor"}
    for monitor in monitors.values():
        check_service_monitor(monitor)
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
        assert not is_hook(monitor)
    # each scrapes the metrics port its daemon serves, on the one Service that carries it
    scheduler = _scraped(objects, monitors["hami-scheduler-metrics-monitor"])
    assert scheduler == [("hami-scheduler-extender", 9395)]
    config_port = int(
        named(objects, "Service", "hami-scheduler-extender")["spec"]["ports"][1]["port"]
    )
    assert config_port == 9395
    assert _scraped(objects, monitors["hami-device-plugin-metrics-monitor"]) == [
        ("hami-device-plugin", 9394)
    ]
    without_plugin = helm_template("prometheus.enabled=true", "devicePlugin.enabled=false")
    assert [m["metadata"]["name"] for m in of_kind(without_plugin, "ServiceMonitor")] == [
        "hami-scheduler-metrics-monitor"
    ]


# --- RuntimeClass (GPU Operator 25.10: CDI by default) -------------------------------------------


def test_no_runtime_class_unless_asked() -> None:
    objects = helm_template()
    assert of_kind(objects, "RuntimeClass") == []
    assert "runtimeClassName" not in pod_spec(workload_running(objects, "device-plugin"))
    assert "runtimeClassName" not in pod_spec(workload_running(plain_manifests(), "device-plugin"))


def test_the_runtime_class_name_reaches_the_plugin_pod_and_gpu_pods(tmp_path: Path) -> None:
    objects = helm_template("devicePlugin.runtimeClassName=nvidia")
    assert pod_spec(workload_running(objects, "device-plugin"))["runtimeClassName"] == "nvidia"
    device = yaml.safe_load(config_map_data(objects, "hami-scheduler-device", "device-config.yaml"))
    assert device["nvidia"]["runtimeClassName"] == "nvidia"
    config, _ = scheduler_config(objects, tmp_path)
    assert config.webhook.runtime_class_name == "nvidia"  # the webhook sets it on GPU pods
    assert of_kind(objects, "RuntimeClass") == []  # the GPU Operator's own


def test_create_runtime_class_makes_the_one_the_pods_name() -> None:
    objects = helm_template(
        "devicePlugin.runtimeClassName=nvidia", "devicePlugin.createRuntimeClass=true"
    )
    runtime_class = named(objects, "RuntimeClass", "nvidia")
    assert runtime_class["handler"] == "nvidia"
    assert not is_hook(runtime_class), "a release object: Helm owns, upgrades and removes it"
    kubernetes_validate.validate(runtime_class, "1.26.0", strict=True)
    assert pod_spec(workload_running(objects, "device-plugin"))["runtimeClassName"] == "nvidia"
    error = helm_template_error("devicePlugin.createRuntimeClass=true")
    assert "devicePlugin.runtimeClassName" in error


# --- the GPU Operator's toolkit wait (HAMi's gpuOperatorToolkitReady) ----------------------------


def _toolkit_wait(objects: list[Obj]) -> Obj:
    daemonset = workload_running(objects, "device-plugin")
    names = [c["name"] for c in _init_containers(daemonset)]
    assert names == ["toolkit-validation", "hami-core"], "the wait comes first"
    return container(daemonset, "toolkit-validation")


def test_the_toolkit_wait_only_when_switched_on() -> None:
    assert "toolkit-validation" not in _images(helm_template())
    objects = helm_template("devicePlugin.gpuOperatorToolkitReady.enabled=true")
    wait = _toolkit_wait(objects)
    daemonset = workload_running(objects, "device-plugin")
    mount = _mount(wait, "/run/nvidia/validations")
    assert mount["readOnly"] is True and mount["mountPropagation"] == "HostToContainer"
    assert _volume(daemonset, mount["name"])["hostPath"]["path"] == "/run/nvidia/validations"
    assert wait["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not wait["securityContext"].get("privileged")


def test_the_toolkit_wait_ends_when_the_operator_says_ready(tmp_path: Path) -> None:
    objects = helm_template(
        "devicePlugin.gpuOperatorToolkitReady.enabled=true",
        f"devicePlugin.gpuOperatorToolkitReady.hostPath={tmp_path}",
    )
    command = _toolkit_wait(objects)["command"]
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(command, capture_output=True, timeout=1, check=False)  # not yet
    (tmp_path / "toolkit-ready").write_text("")
    assert subprocess.run(command, capture_output=True, timeout=30, check=False).returncode == 0


def test_the_documented_gpu_operator_line_sets_the_runtime_class_and_the_toolkit_wait() -> None:
    words = shlex.split(_doc_command("helm upgrade hami", "runtimeClassName"))
    assert words[words.index("-n") + 1] == NAMESPACE
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    objects = helm_template(*sets)
    assert pod_spec(workload_running(objects, "device-plugin"))["runtimeClassName"] == "nvidia"
    assert _toolkit_wait(objects)["name"] == "toolkit-validation"
    assert of_kind(objects, "RuntimeClass") == []  # the operator's own
    operator = shlex.split(_doc_command("helm upgrade gpu-operator"))
    assert "devicePlugin.enabled=false" in operator
