"""Every page a message points to exists: each string of neuron_batch/ that a user reads (error
texts, hints, --help; not docstrings, which may cite other projects' files) is scanned for
`docs/<page>.md` and for README (or page) section references (`README 'On a host'`,
`docs/cron.md 'Exit codes'`); the file must be in this repository and the section must be
one of its headings. Pure: reads the sources with `ast`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "neuron_batch"

#: `docs/x.md` or `README` (`README.md`), with the section named after it in quotes, if any.
_REFERENCE = re.compile(r"(?P<page>docs/[\w.-]+\.md|README(?:\.md)?)(?:\s+'(?P<section>[^']+)')?")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def message_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string in `path` but its docstrings; an f-string's literal parts
    joined (the values in braces read as '{}')."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    found, inside = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            inside.update(id(v) for v in node.values)
            found.append((node.lineno, "".join(str(p) for p in parts)))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in skip and id(node) not in inside):
            found.append((node.lineno, node.value))
    return found


def headings(page: Path) -> set[str]:
    return {line.lstrip("#").strip() for line in page.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")}


def references() -> list[tuple[str, str, str | None]]:
    """(where, page, section) of every reference in a message."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in message_strings(path):
            for match in _REFERENCE.finditer(text):
                out.append((f"{path.relative_to(ROOT)}:{line}", match["page"],
                            match["section"]))
    return out


def test_the_scan_finds_references_in_messages_not_docstrings(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""See docs/nowhere.md."""\n'
                      'def f(x):\n    """docs/also-nowhere.md"""\n'
                      '    raise ValueError(f"{x}: see README \'On a host\'; "\n'
                      '                     "docs/cron.md")\n')
    texts = [text for _, text in message_strings(source)]
    assert texts == ["{}: see README 'On a host'; docs/cron.md"]
    assert [m.groups() for m in _REFERENCE.finditer(texts[0])] == [
        ("README", "On a host"), ("docs/cron.md", None)]


def test_every_page_and_section_a_message_names_exists():
    found = references()
    assert len(found) >= 3      # (the scan sees them: the --device neuron refusal's page, ...)
    missing = []
    for where, page, section in found:
        file = ROOT / ("README.md" if page.startswith("README") else page)
        if not file.is_file():
            missing.append(f"{where}: {page} does not exist")
        elif section is not None and section not in headings(file):
            missing.append(f"{where}: {page} has no section {section!r}")
    assert not missing, "\n".join(missing)
