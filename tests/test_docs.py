"""Every citation in the code points at a section of a document in this repository.

Code and tests cite the design and the reference notes as `docs/<file>.md <section>` (for example
`docs/hami-reference.md 3.5.2`, `docs/design.md 5`, `docs/kubelet-deviceplugin.md 2.2, 2.3`).
These tests check that each cited file exists and has a heading numbered as cited, and that no
citation of a document outside the repository, or in a form that names no file, remains.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

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
