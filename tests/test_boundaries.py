"""The boundary between `service/` and `training/`, stated once (here) and checked on every import,
module-level or inside a function:

- `service.core` is the face core both sides run: decode, detect, align, embed (the pipeline), model
  manifests, files, providers and loading, batch shapes, decisions, errors, settings, console and
  the atomic write. It imports nothing of the service outside itself and never training, so
  training and serving decode, align and normalize a face, read a manifest and score a pair one way.
- `service/` never imports `training`, torch or torchvision: the serving image carries none of them.
- `training/` imports from `service` only `service.core`: what else it needs moves into the core.
- No module of either package reaches itself again through its imports (no import cycle).

DEVELOPERS.md and docs/architecture.md point here instead of repeating the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("service", "training")

CORE = "service.core"
SERVICE_NEVER_IMPORTS = frozenset({"training", "torch", "torchvision"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module `name` imports, anywhere in its body; `from a import b` names `a.b` where that is
    a module, `a` otherwise."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _packages_above(name: str) -> set[str]:
    """The packages whose `__init__.py` runs before `name` does: `service` and `service.core` for `service.core.pipeline`."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _runs() -> dict[str, set[str]]:
    """Everything importing each module executes: its imports, theirs, and the `__init__.py` of every
    package above each of them (a line added to service/__init__.py runs with any `import service.core…`)."""
    graph = _graph()
    closure = {}
    for start in graph:
        seen: set[str] = set()
        todo = [start]
        while todo:
            name = todo.pop()
            for target in graph.get(name, set()) | _packages_above(name):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        closure[start] = seen - {start}
    return closure


def _runs_from(package: str, forbidden) -> list[str]:
    """`name runs target` for each module a module of `package` executes on import that `forbidden(target)` refuses."""
    return [
        f"{name} runs {target}"
        for name, targets in _runs().items()
        if name.split(".")[0] == package
        for target in sorted(targets)
        if forbidden(target)
    ]


def test_service_never_imports_torch_or_training():
    assert _runs_from("service", lambda target: target.split(".")[0] in SERVICE_NEVER_IMPORTS) == []


def _in_core(target: str) -> bool:
    return target == CORE or target.startswith(CORE + ".")


def _outside_core(target: str) -> bool:
    """A module of the service outside its core (the `service` package's own `__init__.py`, which every
    import of the core runs, is held to the core's rule by what it imports), training, or torch."""
    return (
        target.split(".")[0] in {"service", "training", *SERVICE_NEVER_IMPORTS}
        and not _in_core(target)
        and target not in _packages_above(CORE)
    )


def test_training_imports_only_the_core_of_the_service():
    offenders = _runs_from("training", lambda target: target.split(".")[0] == "service" and _outside_core(target))
    assert offenders == [], f"training may import only {CORE}: move what both sides need into it"


def test_the_core_imports_nothing_of_the_service_outside_it():
    offenders = [
        f"{name} runs {target}"
        for name, targets in _runs().items()
        if _in_core(name)
        for target in sorted(targets)
        if _outside_core(target)
    ]
    assert offenders == []


def test_every_package_init_on_the_way_to_the_core_is_checked():
    """What the rules above read: `service/__init__.py` and `service/core/__init__.py` run with each import of the core."""
    assert {"service", CORE} <= _runs()[f"{CORE}.pipeline"] and {"service", CORE} <= set(_modules())


def test_the_core_holds_the_pipeline_and_model_loading():
    assert {CORE, f"{CORE}.pipeline", f"{CORE}.models.files"} <= set(_modules())


def test_no_import_cycles():
    graph = _graph()
    edges = {name: {t for t in targets if t in graph and t != name} for name, targets in graph.items()}
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target) :] + [name, target]))
            elif target not in state:
                visit(target, path + [name])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    assert cycles == []
