"""The documentation stays buildable and true to the code: the MkDocs site builds with --strict (a
broken link or anchor fails), the README stays short and its links resolve, and the error and
settings tables in docs/ match the error tree and `Settings`."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

from tests.requirements import importorskip

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 200

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def markdown_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every pipe table of a markdown text as (header cells, rows of cells), fenced code skipped."""
    tables, lines, fenced, i = [], text.splitlines(), False, 0
    split = lambda line: [cell.strip() for cell in line.strip().strip("|").split("|")]  # noqa: E731
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\s*\|[\s:|-]+\|\s*", lines[i + 1]):
            header, rows, i = split(line), [], i + 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(split(lines[i]))
                i += 1
            tables.append((header, rows))
            continue
        i += 1
    return tables


def unquote(cell: str) -> str:
    return cell.strip().strip("`").strip()


def test_mkdocs_build_strict(tmp_path):
    importorskip("mkdocs")
    importorskip("material")  # mkdocs-material
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it ≤ {README_MAX_LINES} and move the rest to docs/"


def test_readme_starts_with_the_two_commands():
    text = README.read_text()
    first_block = text[text.index("```") : text.index("```", text.index("```") + 3)]
    assert "make serve" in first_block and "make test" in first_block


def test_readme_and_index_name_the_model_make_serve_serves():
    """`make serve` sets no FACEGATE_EMBEDDER: it serves the settings' default, and the README and
    the docs' home page must say which that is."""
    import re

    from service.core.settings import Settings

    served = Settings.model_fields["embedder"].default
    readme = re.findall(r"default embedder, \[([\w.-]+)\]", README.read_text())
    index = re.findall(r"`make serve` serves the default embedder, \[([\w.-]+)\]", (REPO / "docs" / "index.md").read_text())
    assert readme == [served] and index == [served], (served, readme, index)
    assert "FACEGATE_EMBEDDER" not in (REPO / "Makefile").read_text().split("\nserve:")[1].split("\n\n")[0]


def test_readme_relative_links_exist():
    text = README.read_text()
    targets = [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]
    assert targets, "the README links into docs/"
    missing = [t for t in targets if not (REPO / t.split("#", 1)[0]).exists()]
    assert missing == [], f"README.md links to files that do not exist: {missing}"


def _error_tree() -> dict[str, int]:
    """code → HTTP status of every concrete FacegateError subclass, the whole service imported so
    that subclasses defined outside service.core.errors are registered too."""
    import service
    from service.core.errors import FacegateError

    for module in pkgutil.walk_packages(service.__path__, "service."):
        importlib.import_module(module.name)
    tree: dict[str, int] = {}
    seen, stack = set(), list(FacegateError.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        stack.extend(cls.__subclasses__())
        if inspect.isabstract(cls) or "code" not in vars(cls):
            continue  # an intermediate base that names no code of its own
        assert tree.get(cls.code, cls.status) == cls.status, f"code {cls.code!r} has two statuses: {tree[cls.code]} and {cls.status}"
        tree[cls.code] = int(cls.status)
    return tree


def _documented_errors() -> list[tuple[str, int]]:
    text = (DOCS / "api.md").read_text()
    tables = [(h, rows) for h, rows in markdown_tables(text) if "code" in h and "status" in h]
    assert len(tables) == 1, "docs/api.md has exactly one table with `code` and `status` columns"
    header, rows = tables[0]
    code, status = header.index("code"), header.index("status")
    return [(unquote(row[code]), int(unquote(row[status]))) for row in rows]


def test_error_table_matches_error_tree():
    documented = _documented_errors()
    codes = [code for code, _ in documented]
    assert len(codes) == len(set(codes)), f"codes listed more than once: {sorted({c for c in codes if codes.count(c) > 1})}"
    tree = _error_tree()
    assert dict(documented) == tree, (
        f"docs/api.md's error table and the error tree differ:\n"
        f"  undocumented: {sorted(set(tree) - set(codes))}\n"
        f"  not in the tree: {sorted(set(codes) - set(tree))}\n"
        f"  wrong status: {sorted((c, s, tree[c]) for c, s in documented if c in tree and tree[c] != s)}"
    )


def _settings_table() -> dict[str, str]:
    text = (DOCS / "settings.md").read_text()
    tables = [rows for header, rows in markdown_tables(text) if header[:2] == ["variable", "default"]]
    assert len(tables) == 1, "docs/settings.md has one `variable | default | meaning` table"
    return {unquote(row[0]): row[1] for row in tables[0]}


def test_settings_documented():
    from service.core.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    assert prefix == "FACEGATE_"
    documented = _settings_table()
    expected = {f"{prefix}{name.upper()}": field for name, field in Settings.model_fields.items()}
    assert sorted(set(expected) - set(documented)) == [], "settings missing from docs/settings.md"
    assert sorted(set(documented) - set(expected)) == [], "docs/settings.md lists variables Settings does not have"
    for variable, field in expected.items():
        default = field.default
        if isinstance(default, bool):
            shown = str(default).lower()
        elif isinstance(default, (int, float, str)) and default != "":
            shown = str(default)
        else:
            continue  # paths, secrets and None are described in words
        assert f"`{shown}`" in documented[variable], (
            f"{variable}: the code's default is {shown!r}, docs/settings.md says {documented[variable]}"
        )
