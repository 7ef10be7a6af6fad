"""The image: hadolint-clean, the Python version pyproject.toml declares, `hami` as the
entrypoint, the user the manifests run it as, and dependencies from the lock of the versions
this suite ran with."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.deployment.lockfile import (
    DEV_HEADER,
    DEV_LOCK,
    LOCK,
    canonical,
    dev_closure,
    read_lock,
    render,
    runtime_closure,
)
from tests.deployment.manifests import (
    REPO,
    container,
    plain_manifests,
    run,
    tool,
    workload_running,
)

DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments left out."""
    joined: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    result = []
    for text in joined:
        word, _, rest = text.strip().partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def declared_python() -> str:
    """The oldest Python minor version requires-python allows, e.g. "3.11"."""
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    for minor in range(8, 30):
        if f"3.{minor}" in spec:
            return f"3.{minor}"
    raise AssertionError(f"no Python 3 version satisfies {spec}")


def test_hadolint_passes() -> None:
    run([tool("hadolint"), "--failure-threshold", "info", str(DOCKERFILE)])


def test_the_base_image_is_the_declared_python_slim() -> None:
    bases = [args.split()[0] for word, args in instructions() if word == "FROM"]
    assert bases, "no FROM"
    version = declared_python()
    for base in bases:
        assert re.fullmatch(rf"python:{re.escape(version)}-slim(-[a-z]+)?", base), base
    # the lock is resolved by the interpreter running this suite: it must be the image's
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == version


def test_the_entrypoint_is_the_hami_script_and_no_healthcheck() -> None:
    words = [word for word, _ in instructions()]
    assert "HEALTHCHECK" not in words
    (entrypoint,) = [args for word, args in instructions() if word == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["hami"]
    assert PYPROJECT["project"]["scripts"]["hami"] == "hami_plugin.cli:main"


def test_the_image_user_is_the_one_the_manifests_expect() -> None:
    users = [args for word, args in instructions() if word == "USER"]
    assert users, "the image runs as root by default"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root uid"
    objects = plain_manifests()
    scheduler = container(workload_running(objects, "scheduler"), "hami-scheduler")
    assert scheduler["securityContext"]["runAsUser"] == int(uid)
    # the device plugin needs root for kubelet's device-plugin directory: said explicitly
    plugin = container(workload_running(objects, "device-plugin"), "device-plugin")
    assert plugin["securityContext"]["runAsUser"] == 0


def test_the_image_installs_the_lock_and_nothing_else() -> None:
    runs = [args for word, args in instructions() if word == "RUN"]
    installs = [shlex.split(r) for r in runs if "pip install" in r]
    assert installs and all("--no-deps" in words for words in installs)
    assert any("requirements.lock" in words for words in installs)
    copies = [args.split() for word, args in instructions() if word == "COPY"]
    assert ["daemonset/requirements.lock", "./requirements.lock"] in copies
    for words in copies:
        if any(w.startswith("--from=") for w in words):
            continue  # from the build stage, not the build context
        for source in words[:-1]:
            if not source.startswith("--"):
                assert (REPO / source).exists(), f"COPY {source}: no such path"


def test_the_lock_pins_the_versions_this_suite_runs_with() -> None:
    expected = runtime_closure()
    assert read_lock() == expected, (
        f"{LOCK} differs from the installed runtime dependencies; `make lock` refreshes it "
        "(`make` installs with the locks as constraints, so there they are always equal)"
    )
    assert LOCK.read_text() == render(expected)


def test_the_dev_lock_pins_the_rest_of_this_suite() -> None:
    expected = dev_closure()
    assert read_lock(DEV_LOCK) == expected, f"{DEV_LOCK} is stale: `make lock` refreshes it"
    assert DEV_LOCK.read_text() == render(expected, DEV_HEADER)
    assert not set(expected) & set(read_lock()), "a package in both locks"


def test_the_lock_satisfies_pyproject() -> None:
    pins = read_lock()
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        version = pins.get(canonical(requirement.name))
        assert version is not None, f"{requirement.name} is not in the lock"
        assert version in requirement.specifier, f"{requirement.name}=={version} vs {text}"
