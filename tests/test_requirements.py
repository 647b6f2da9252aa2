"""No test can skip silently in CI (tests/requirements.py): every skip goes through `need` or its
`importorskip`, each names a need, docs/testing.md lists each need's flag with the tests it guards,
and `.ci/run` sets every flag, so that there a skip is a failure. Read from the sources, so a new
skip that bypasses the list fails here rather than passing quietly on a machine that lacks something."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.requirements import NEEDS, flag, need

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# Calls that skip or expect a failure, and marks that do (an xfail(strict=False) passes either way).
SKIPPING_CALLS = {"pytest.skip", "pytest.importorskip", "pytest.xfail", "unittest.SkipTest"}
SKIPPING_CALLS |= {f"unittest.{name}" for name in ("skip", "skipIf", "skipUnless", "expectedFailure")}
SKIPPING_MARKS = {"pytest.mark.skip", "pytest.mark.skipif", "pytest.mark.xfail"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _sources() -> dict[Path, ast.Module]:
    """The suite's Python files but the helper and this check of it."""
    own = {TESTS / "requirements.py", Path(__file__).resolve()}
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(TESTS.rglob("*.py")) if path not in own}


def _skips_around_need(tree: ast.Module) -> list[str]:
    """Every way of skipping that bypasses `need`: pytest's and unittest's skips and xfails."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func) in SKIPPING_CALLS or _dotted(node) in SKIPPING_MARKS:
            found.append(f"line {node.lineno}: {_dotted(getattr(node, 'func', node))}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("pytest", "unittest", "_pytest.outcomes"):
            names = {f"{module}.{a.name}" for a in node.names for module in ("pytest", "unittest")}
            found += [f"line {node.lineno}: from {node.module} import …" for _ in names & (SKIPPING_CALLS | {"pytest.mark"})]
    return found


def _need_sites(path: Path, tree: ast.Module) -> list[tuple[str, str]]:
    """(need, what a reader looks for in docs/testing.md) for each `need` / `importorskip` call: in a
    test module its path under tests/, elsewhere the fixture or helper the tests reach it through."""
    sites = []
    in_tests = path.name.startswith("test_")

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not in_tests:
            where = f"`{node.name}`"
        if isinstance(node, ast.Call) and _dotted(node.func) in ("need", "importorskip"):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            name = args[0] if _dotted(node.func) == "need" else (args[1] if len(args) > 1 else "EXTRAS")
            sites.append((name, where))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, f"`{path.relative_to(TESTS).as_posix()}`")
    return sites


def _docs_rows() -> dict[str, str]:
    """The table in docs/testing.md: each need's row by its flag."""
    rows = {}
    for line in (REPO / "docs" / "testing.md").read_text().splitlines():
        if line.startswith("|") and (found := re.findall(r"FACEGATE_REQUIRE_(\w+)", line.split("|")[1])):
            rows[found[0]] = line
    return rows


def test_no_test_skips_but_through_need():
    offenders = {str(path.relative_to(REPO)): found for path, tree in _sources().items() if (found := _skips_around_need(tree))}
    assert offenders == {}, "skip through tests/requirements.py's need / importorskip, which CI's flags turn into failures"


def test_every_skip_names_a_need_listed_with_its_tests():
    sites = {site for path, tree in _sources().items() for site in _need_sites(path, tree)}
    assert {name for name, _ in sites} <= set(NEEDS), sites
    rows = _docs_rows()
    assert set(rows) == set(NEEDS), "docs/testing.md lists each need of tests/requirements.py in one row of its table"
    unlisted = sorted(f"{name}: {where}" for name, where in sites if where not in rows[name])
    assert unlisted == [], "docs/testing.md's row of that flag names the test file, or the fixture, that can skip"
    assert len(sites) >= 15  # the scan sees the suite's skips (tests/conftest.py's test_data among them)


def test_ci_sets_every_flag_and_no_other():
    script = (REPO / ".ci" / "run").read_text()
    assert sorted(name for name in NEEDS if f"{flag(name)}=1" not in script) == []
    named = set(re.findall(r"FACEGATE_REQUIRE_(\w+)", script + (REPO / "docs" / "testing.md").read_text()))
    assert named <= set(NEEDS), named - set(NEEDS)


def test_a_need_skips_with_its_flag_and_fails_when_required(monkeypatch):
    monkeypatch.delenv("FACEGATE_REQUIRE_TEST_DATA", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"no photos \(FACEGATE_REQUIRE_TEST_DATA=1 makes this a failure\)"):
        need("TEST_DATA", "no photos")
    monkeypatch.setenv("FACEGATE_REQUIRE_TEST_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match="no photos; FACEGATE_REQUIRE_TEST_DATA=1 requires it"):
        need("TEST_DATA", "no photos")
    with pytest.raises(KeyError):
        need("NO_SUCH_NEED", "a typo")
