"""The environment is read in one place: `hami_plugin.config` (the option tables), and by the
entry points that start processes. Every other module gets resolved settings, so a variable
cannot be read late, deep inside a loop, or twice with two meanings (import-linter cannot say
this: `os` is imported everywhere for its paths)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hami_plugin"
ALLOWED = ("config/", "demo/", "cli.py", "codec_cli.py", "__main__.py")
"""The settings layer, and the entry points (the demo passes its environment to the daemons it
starts)."""
READS = {"environ", "environb", "getenv", "getenvb"}


def environment_reads(source: str) -> list[int]:
    """The lines of `source` that touch `os.environ`, `os.getenv` and the like, or import them
    from `os`."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        attribute = (
            isinstance(node, ast.Attribute)
            and node.attr in READS
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        )
        imported = (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in READS for alias in node.names)
        )
        if (attribute or imported) and isinstance(node, ast.stmt | ast.expr):
            lines.add(node.lineno)
    return sorted(lines)


def test_only_the_settings_layer_reads_the_environment() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(ALLOWED):
            continue
        found += [f"{relative}:{line}" for line in environment_reads(path.read_text("utf-8"))]
    assert not found, "environment read outside hami_plugin.config:\n" + "\n".join(found)


def test_the_check_sees_every_spelling() -> None:
    source = "import os\nfrom os import getenv\nos.environ['A']\nos.getenv('B')\nos.path.join()\n"
    assert environment_reads(source) == [2, 3, 4]
