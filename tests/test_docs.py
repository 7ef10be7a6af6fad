"""The documents: citations that resolve, a README that fits on a screen, and pages that say
what the code and the manifests do.

Code and tests cite the design and the reference notes as `docs/<file>.md <section>` (for example
`docs/hami-reference.md 3.5.2`, `docs/design.md 5`, `docs/kubelet-deviceplugin.md 2.2, 2.3`).
These tests check that each cited file exists and has a heading numbered as cited, and that no
citation of a document outside the repository, or in a form that names no file, remains.

The rest keep the documents honest where they restate something the code or the manifests
decide: every flag the `hami` parsers accept is on docs/flags.md under its command (read from
the parsers, so a new flag fails here until it is documented) and nothing else is; the README
stays under 300 lines and links every page of docs/; the README's install commands name images,
chart values and namespace labels that exist; the Prometheus scrape example selects the labels,
namespace and ports the pods have.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_plugin.cli import build_parser
from hami_plugin.protocol.model import GpuPolicyName
from tests.deployment.manifests import NAMESPACE, load_all, of_kind, plain_manifests, pod_spec

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCANNED = ("hami_plugin", "tests", "daemonset", "README.md", "docs")
SUFFIXES = {".py", ".yaml", ".yml", ".md", ".txt", ".toml"}
SKIPPED_DIRS = {"__pycache__", "api"}
THIS_FILE = Path(__file__).resolve()

NUMBER = r"\d+(?:\.\d+)*"
# between the parts of a citation: spaces, or a line break (and a comment marker)
GAP = r"(?:[ \t]+|[ \t]*\n[ \t]*(?:#[ \t]*)?)"
JOIN = rf"(?:,{GAP}|{GAP}and{GAP}|-|/)"
CITATION = re.compile(
    rf"(?<![\w/.-])docs/(?P<file>[\w.-]+\.md)(?:{GAP}§?(?P<sections>{NUMBER}(?:{JOIN}{NUMBER})*))?"
)
HEADING = re.compile(rf"^#+[ \t]+(?P<number>{NUMBER})\.?(?:[ \t]|$)")

FORBIDDEN = {
    "a document outside the repository": re.compile(r"shared/docs|\.\./seeds|seed-summary"),
    "DESIGN.md (the design is docs/design.md)": re.compile(r"DESIGN\.md"),
    "a reference note without its docs/ path": re.compile(
        r"(?<![\w/.-])(?:hami-reference|kubelet-deviceplugin)\.md"
    ),
    "a bare 'reference N' (name the file: docs/hami-reference.md N)": re.compile(
        rf"\b[Rr]eference{GAP}(?:sections?{GAP})?\d"
    ),
    "a bare 'decision N' (docs/design.md 9.N)": re.compile(rf"\bdecision{GAP}\d"),
    "a bare 'design note N' (docs/design.md 10.N)": re.compile(rf"\bdesign note{GAP}\d"),
    "a label from while the code was written": re.compile(
        r"\btask [A-H]'s\b|\bthe brief\b|\blater issue\b|reported to the lead"
    ),
}


def scanned_files() -> Iterator[Path]:
    """Every text file of the package, the tests, the manifests and the README."""
    for top in SCANNED:
        path = ROOT / top
        if path.is_file():
            yield path
            continue
        for candidate in sorted(path.rglob("*")):
            relative = candidate.relative_to(ROOT)
            if (
                candidate.is_file()
                and candidate.suffix in SUFFIXES
                and candidate.resolve() != THIS_FILE
                and not SKIPPED_DIRS.intersection(relative.parts[:-1])
            ):
                yield candidate


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def section_numbers(document: Path) -> set[str]:
    """The numbers of a Markdown file's headings (`## 3. Scheduler`, `### 3.5.2 Per-device`),
    outside fenced code blocks."""
    numbers = set()
    fenced = False
    for line in read(document).splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is not None:
            numbers.add(match.group("number"))
    return numbers


def cited_sections(sections: str) -> list[str]:
    """`2.2, 2.3` -> [2.2, 2.3]; `1.4-1.7` -> both ends; `2 and 3.11` -> [2, 3.11]."""
    return re.findall(NUMBER, sections)


def test_the_documents_are_in_the_repository() -> None:
    for name in ("design.md", "hami-reference.md", "kubelet-deviceplugin.md"):
        assert section_numbers(DOCS / name), f"docs/{name} has no numbered section"


def test_section_numbers_are_unique_in_each_document() -> None:
    for document in sorted(DOCS.glob("*.md")):
        seen: list[str] = []
        for line in read(document).splitlines():
            match = HEADING.match(line)
            if match is not None:
                seen.append(match.group("number"))
        repeated = sorted({number for number in seen if seen.count(number) > 1})
        assert not repeated, f"{document.name}: sections numbered twice: {repeated}"


def test_every_citation_names_a_document_and_a_section_that_exist() -> None:
    sections_of: dict[str, set[str]] = {}
    wrong = []
    for path in [*scanned_files(), *sorted(DOCS.glob("*.md"))]:
        text = read(path)
        for match in CITATION.finditer(text):
            where = f"{path.relative_to(ROOT)}:{line_of(text, match.start())}"
            name = match.group("file")
            document = DOCS / name
            if not document.is_file():
                wrong.append(f"{where}: docs/{name} does not exist")
                continue
            known = sections_of.setdefault(name, section_numbers(document))
            for number in cited_sections(match.group("sections") or ""):
                if number not in known:
                    wrong.append(f"{where}: docs/{name} has no section {number}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_no_citation_points_outside_the_repository(what: str) -> None:
    pattern = FORBIDDEN[what]
    found = []
    for path in scanned_files():
        text = read(path)
        for match in pattern.finditer(text):
            line = text.splitlines()[line_of(text, match.start()) - 1].strip()
            found.append(f"{path.relative_to(ROOT)}:{line_of(text, match.start())}: {line}")
    assert not found, f"{what}:\n" + "\n".join(found)


README = ROOT / "README.md"
FLAGS_PAGE = DOCS / "flags.md"
README_MAX_LINES = 300
FLAG = re.compile(r"`(-{1,2}[A-Za-z][\w-]*)`")
SECTION = re.compile(r"^## (?P<title>.+)$", re.MULTILINE)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every `hami` sub-command's parser, by name, as `hami` itself builds them."""
    (choices,) = [
        action.choices
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    ]
    return dict(choices)


def accepted(parser: argparse.ArgumentParser) -> list[str]:
    """What a user may write to the parser: each option string (aliases too, hidden options
    too), and each positional as its upper-case name; `-h`/`--help` left out."""
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        words.extend(action.option_strings or [action.dest.upper()])
    return words


def flag_page_sections() -> dict[str, str]:
    """docs/flags.md cut at its `## ` headings: heading -> the text under it."""
    text = read(FLAGS_PAGE)
    matches = list(SECTION.finditer(text))
    return {
        match.group("title"): text[match.end() : next_.start() if next_ else len(text)]
        for match, next_ in zip(matches, [*matches[1:], None], strict=True)
    }


def section_of(command: str, sections: dict[str, str]) -> str:
    """The text of the one section whose heading names `hami <command>`."""
    found = [body for title, body in sections.items() if f"`hami {command}`" in title]
    assert len(found) == 1, f"docs/flags.md: expected one section for `hami {command}`"
    return found[0]


def test_the_flags_page_lists_every_flag_of_every_command() -> None:
    sections = flag_page_sections()
    missing: list[str] = []
    for command, parser in sorted(subcommands().items()):
        body = section_of(command, sections)
        missing.extend(
            f"hami {command} {word}" for word in accepted(parser) if f"`{word}`" not in body
        )
    assert not missing, "flags the parsers accept but docs/flags.md does not list:\n" + "\n".join(
        missing
    )


def test_the_flags_page_lists_no_flag_its_command_does_not_take() -> None:
    sections = flag_page_sections()
    parsers = subcommands()
    stale: list[str] = []
    for title, body in sections.items():
        commands = [name for name in parsers if f"`hami {name}`" in title]
        known = {word for name in commands for word in accepted(parsers[name])}
        for row in (line for line in body.splitlines() if line.startswith("| `")):
            first_cell = row.split("|")[1]
            stale.extend(
                f"{title}: {flag}" for flag in FLAG.findall(first_cell) if flag not in known
            )
    assert not stale, "rows of docs/flags.md for flags no parser takes:\n" + "\n".join(stale)


def test_the_readme_fits_on_a_screen() -> None:
    lines = len(read(README).splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference to docs/"
    )


def test_the_readme_links_every_page_of_docs() -> None:
    readme = read(README)
    unlinked = [
        f"docs/{page.name}"
        for page in sorted(DOCS.glob("*.md"))
        if f"docs/{page.name}" not in readme
    ]
    assert not unlinked, f"pages of docs/ the README does not name: {unlinked}"


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_the_readmes_sed_line_points_kustomize_at_the_registry(tmp_path: Path) -> None:
    """The README's one-line image change, run as written on a copy of kustomization.yaml,
    changes the hami-plugin entry's newName and nothing else."""
    kustomization = ROOT / "daemonset" / "kustomization.yaml"
    match = re.search(
        r"^sed -i '(?P<script>[^']+)' daemonset/kustomization\.yaml$", read(README), re.M
    )
    assert match, "the README shows no sed line for daemonset/kustomization.yaml"
    # s|newName: .*|newName: <registry>/hami-plugin|: the replacement is the last one
    *_, new_name = re.findall(r"newName: ([^|]+)\|", match.group("script"))
    copy = tmp_path / "kustomization.yaml"
    shutil.copy(kustomization, copy)
    sed = shutil.which("sed")
    assert sed is not None
    subprocess.run([sed, "-i", match.group("script"), str(copy)], check=True, timeout=30)

    before = yaml.safe_load(kustomization.read_text())
    after = yaml.safe_load(copy.read_text())
    expected = [
        {**entry, "newName": new_name} if entry["name"] == "hami-plugin" else entry
        for entry in before["images"]
    ]
    assert after["images"] == expected
    assert {key: value for key, value in after.items() if key != "images"} == {
        key: value for key, value in before.items() if key != "images"
    }


def chart_has_value(values: dict[str, Any], dotted: str) -> bool:
    node: Any = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_the_readme_helm_install_sets_values_the_chart_has() -> None:
    readme = read(README)
    values = yaml.safe_load((ROOT / "daemonset" / "chart" / "values.yaml").read_text())
    sets = re.findall(r"--set ([\w.-]+)=", readme)
    assert sets, "the README's Helm install sets no value"
    unknown = [key for key in sets if not chart_has_value(values, key)]
    assert not unknown, f"the README sets chart values that values.yaml does not have: {unknown}"
    assert re.search(rf"helm install \S+ daemonset/chart -n {NAMESPACE}\b", readme)


def test_the_readme_helm_install_goes_into_the_labelled_namespace_file() -> None:
    """Helm cannot label the namespace it installs into, and the pods start right after the
    pre-install hook: the README applies the manifests' labelled namespace first."""
    readme = read(README)
    (namespace,) = of_kind(
        load_all((ROOT / "daemonset" / "namespace.yaml").read_text()), "Namespace"
    )
    assert namespace["metadata"]["name"] == NAMESPACE
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["hami.io/webhook"] == "ignore"
    applied = readme.find("kubectl apply -f daemonset/namespace.yaml")
    installed = readme.find("helm install ")
    assert 0 <= applied < installed, "the README does not apply daemonset/namespace.yaml first"
    (command,) = re.findall(r"^helm install (?:[^\n]*\\\n)*[^\n]*$", readme, re.MULTILINE)
    assert "--create-namespace" not in command, command


def test_the_scrape_example_selects_the_pods_the_manifests_run() -> None:
    (block,) = [
        b for b in fenced_blocks(read(DOCS / "metrics.md"), "yaml") if "scrape_configs" in b
    ]
    jobs = yaml.safe_load(block)["scrape_configs"]
    pods = [
        (workload, pod_spec(workload))
        for kind in ("DaemonSet", "Deployment")
        for workload in of_kind(plain_manifests(), kind)
    ]
    assert len(jobs) == 2
    for job in jobs:
        (discovery,) = job["kubernetes_sd_configs"]
        assert discovery["role"] == "pod"
        assert discovery["namespaces"]["names"] == [NAMESPACE], job["job_name"]
        (keep,) = [rule for rule in job["relabel_configs"] if rule["action"] == "keep"]
        assert keep["source_labels"] == [
            "__meta_kubernetes_pod_label_app_kubernetes_io_component",
            "__meta_kubernetes_pod_container_port_number",
        ]
        component, port = keep["regex"].split(";")
        matching = [
            workload["metadata"]["name"]
            for workload, spec in pods
            if workload["metadata"]["namespace"] == NAMESPACE
            and workload["spec"]["template"]["metadata"]["labels"].get(
                "app.kubernetes.io/component"
            )
            == component
            and any(
                str(container_port.get("containerPort")) == port
                and container_port.get("name") == "metrics"
                for container in spec["containers"]
                for container_port in container.get("ports") or []
            )
        ]
        assert len(matching) == 1, f"{job['job_name']}: {component};{port} selects {matching}"


def test_the_gpu_policy_help_and_flags_page_name_every_policy() -> None:
    """`hami scheduler --help` (run as a command) and docs/flags.md name every GPU policy the
    scheduler accepts; `numa` was missing from the help once."""
    result = subprocess.run(
        [sys.executable, "-m", "hami_plugin", "scheduler", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    help_text = " ".join(result.stdout.split())
    start = help_text.index("--gpu-scheduler-policy P ")
    option = help_text[start : help_text.index(" --", start + 1)]
    (row,) = [
        line
        for line in (DOCS / "flags.md").read_text().splitlines()
        if line.startswith("| `--gpu-scheduler-policy`")
    ]
    for name in GpuPolicyName:
        assert re.search(rf"\b{re.escape(name)}\b", option), (name, option)
        assert f"`{name}`" in row, (name, row)
