"""The Makefile's targets that need no network: `make image` picks docker, else podman, names
the image after pyproject's version unless IMAGE= says otherwise, and says what is missing when
neither tool is there; `make clean` leaves none of the caches the other targets write.

Each test runs the real `make` on a copy of the Makefile in a temporary directory, with PATH
limited to stand-ins that record how they were called, so no container is built and the
checkout is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def make_binary() -> str:
    found = shutil.which("make")
    if found is None:
        message = "make not found on PATH (Debian package make)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true, so this test must run")
        pytest.skip(message)
    return found


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of the Makefile and pyproject.toml, and a bin/ that holds only `sed` (the
    Makefile reads the version with it) until a test adds stand-ins."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "bin").mkdir()
    sed = shutil.which("sed")
    assert sed is not None
    (tmp_path / "bin" / "sed").symlink_to(sed)
    return tmp_path


def stand_in(workdir: Path, name: str) -> None:
    """A `name` on PATH that appends its name and arguments to calls.log and succeeds."""
    script = workdir / "bin" / name
    script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{workdir}/calls.log"\n')
    script.chmod(0o755)


def make(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [make_binary(), "--no-print-directory", *args],
        cwd=workdir,
        env={"PATH": str(workdir / "bin"), "HOME": str(workdir)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def calls(workdir: Path) -> list[str]:
    log = workdir / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_make_image_builds_with_docker_named_after_the_version(workdir: Path) -> None:
    stand_in(workdir, "docker")
    stand_in(workdir, "podman")
    result = make(workdir, "image")
    assert result.returncode == 0, result.stderr
    assert calls(workdir) == [f"docker build -t hami-plugin:{VERSION} ."]


def test_make_image_uses_podman_when_there_is_no_docker(workdir: Path) -> None:
    stand_in(workdir, "podman")
    result = make(workdir, "image", "IMAGE=registry.example.com/hami-plugin:test")
    assert result.returncode == 0, result.stderr
    assert calls(workdir) == ["podman build -t registry.example.com/hami-plugin:test ."]


def test_make_image_without_docker_or_podman_says_so(workdir: Path) -> None:
    result = make(workdir, "image")
    assert result.returncode != 0
    assert "neither docker nor podman is on PATH" in result.stderr
    assert calls(workdir) == []


def test_make_clean_removes_every_cache_the_targets_write(workdir: Path) -> None:
    created = [
        ".venv/bin",
        ".mypy_cache/3.11",
        ".ruff_cache/0.17.5",
        ".hypothesis/examples",
        ".import_linter_cache/x",
        ".pytest_cache/v",
        "hami_plugin.egg-info/x",
        "build/lib",
        "dist/x",
        "hami_plugin/deviceplugin/__pycache__",
        "tests/__pycache__",
        "proto/__pycache__",
    ]
    for path in created:
        (workdir / path).mkdir(parents=True)
    (workdir / "hami_plugin" / "cli.py").write_text("")
    rm = shutil.which("rm")
    find = shutil.which("find")
    assert rm is not None and find is not None
    (workdir / "bin" / "rm").symlink_to(rm)
    (workdir / "bin" / "find").symlink_to(find)

    result = make(workdir, "clean")

    assert result.returncode == 0, result.stderr
    left = sorted(
        str(path.relative_to(workdir))
        for path in workdir.rglob("*")
        if path.relative_to(workdir).parts[0] != "bin"
    )
    assert left == [
        "Makefile",
        "hami_plugin",
        "hami_plugin/cli.py",
        "hami_plugin/deviceplugin",
        "proto",
        "pyproject.toml",
        "tests",
    ]


def _interpreter(version: str, log: Path | None) -> str:
    """A shell script standing in for a Python of `version`: answers the Makefile's version
    checks (`-c` ... `sys.exit(...)` and `-c` ... `print(...)`) as that version would; with
    `log`, appends every other call, with the PIP_CONSTRAINT it sees, as `python <args>`."""
    too_old = tuple(int(part) for part in version.split(".")[:2]) < (3, 11)
    logging = (
        f'echo "python $* | PIP_CONSTRAINT=${{PIP_CONSTRAINT-unset}}" >> "{log}"\n' if log else ""
    )
    return (
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then case "$2" in\n'
        f"  *exit*) exit {int(too_old)} ;;\n"
        f"  *print*) echo {version}; exit 0 ;;\n"
        "esac; fi\n" + logging
    )


def fake_python(workdir: Path, version: str = "3.11.7") -> None:
    """A `python3` of `version` on PATH whose `-m venv DIR` makes `DIR/bin/python` (the same
    version, logging its calls as the venv's pip would be run) and `DIR/bin/hami` (logging)."""
    log = workdir / "calls.log"
    hami = f'#!/bin/sh\necho "hami $*" >> "{log}"\n'
    script = workdir / "bin" / "python3"
    script.write_text(
        _interpreter(version, None) + 'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; '
        f"cat > \"$3/bin/python\" <<'PY'\n{_interpreter(version, log)}PY\n"
        f"cat > \"$3/bin/hami\" <<'PY'\n{hami}PY\n"
        'chmod +x "$3/bin/python" "$3/bin/hami"; fi\n'
    )
    script.chmod(0o755)
    for tool in ("touch", "mkdir", "cat", "chmod", "rm"):
        found = shutil.which(tool)
        assert found is not None
        (workdir / "bin" / tool).symlink_to(found)
    for lock in ("daemonset/requirements.lock", "tests/dev-requirements.lock"):
        (workdir / lock).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / lock, workdir / lock)


def locks(workdir: Path) -> str:
    return f"{workdir}/daemonset/requirements.lock {workdir}/tests/dev-requirements.lock"


def test_make_installs_the_locked_versions_unless_told_otherwise(workdir: Path) -> None:
    fake_python(workdir)
    result = make(workdir, ".venv/.installed-stamp")
    assert result.returncode == 0, result.stderr
    assert calls(workdir) == [
        f"python -m pip install --quiet --upgrade pip | PIP_CONSTRAINT={locks(workdir)}",
        f"python -m pip install --quiet -e . | PIP_CONSTRAINT={locks(workdir)}",
        f"python -m pip install --quiet -e .[dev] | PIP_CONSTRAINT={locks(workdir)}",
    ]
    # `make lock` upgrades without constraints, then writes the locks
    (workdir / "calls.log").unlink()
    result = make(workdir, "lock")
    assert result.returncode == 0, result.stderr
    assert calls(workdir) == [
        "python -m pip install --quiet --upgrade --upgrade-strategy eager -e .[dev] "
        "| PIP_CONSTRAINT=",
        f"python -m tests.deployment.lockfile | PIP_CONSTRAINT={locks(workdir)}",
    ]


def test_make_demo_installs_the_runtime_dependencies_only(workdir: Path) -> None:
    fake_python(workdir)
    result = make(workdir, "demo")
    assert result.returncode == 0, result.stderr
    assert calls(workdir) == [
        f"python -m pip install --quiet --upgrade pip | PIP_CONSTRAINT={locks(workdir)}",
        f"python -m pip install --quiet -e . | PIP_CONSTRAINT={locks(workdir)}",
        "hami demo",
    ]
    # `make test` after it adds the development extras to the same .venv, nothing else
    (workdir / "calls.log").unlink()
    result = make(workdir, ".venv/.installed-stamp")
    assert result.returncode == 0, result.stderr
    assert calls(workdir) == [
        f"python -m pip install --quiet -e .[dev] | PIP_CONSTRAINT={locks(workdir)}"
    ]
    # and a second `make demo` installs nothing
    (workdir / "calls.log").unlink()
    assert make(workdir, "demo").returncode == 0
    assert calls(workdir) == ["hami demo"]


def test_a_venv_made_by_an_older_python_is_made_again(workdir: Path) -> None:
    fake_python(workdir)
    old = workdir / ".venv" / "bin"
    old.mkdir(parents=True)
    (old / "python").write_text(_interpreter("3.9.18", workdir / "calls.log"))
    (old / "python").chmod(0o755)
    (old / "left-behind").write_text("")
    for stamp in (".runtime-stamp", ".installed-stamp"):
        (workdir / ".venv" / stamp).write_text("")  # up to date, as far as make can tell

    result = make(workdir, "demo")

    assert result.returncode == 0, result.stderr
    assert "made by Python 3.9.18, 3.11 or newer is needed: making it again" in result.stdout
    assert not (old / "left-behind").exists()
    assert calls(workdir) == [
        f"python -m pip install --quiet --upgrade pip | PIP_CONSTRAINT={locks(workdir)}",
        f"python -m pip install --quiet -e . | PIP_CONSTRAINT={locks(workdir)}",
        "hami demo",
    ]


def test_a_python_older_than_3_11_is_refused_with_what_to_do(workdir: Path) -> None:
    fake_python(workdir, version="3.10.13")
    result = make(workdir, "demo")
    assert result.returncode != 0
    assert (
        "hami-plugin needs Python 3.11 or newer; python3 is 3.10.13: "
        "run make PYTHON=python3.11 demo" in result.stderr
    )
    assert not (workdir / ".venv").exists()
    assert calls(workdir) == []
