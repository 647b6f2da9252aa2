"""House rules that code review alone would let slip."""

import ast
import subprocess
import sys
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service"


def test_service_never_imports_torch_or_training():
    offenders = []
    for path in SERVICE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in {"torch", "training", "torchvision"}]
    assert offenders == []


def test_serving_modules_and_cli_load_without_torch():
    code = (
        "import sys, importlib, pkgutil, service\n"
        "for m in pkgutil.walk_packages(service.__path__, 'service.'): importlib.import_module(m.name)\n"
        "from service.cli import app\n"
        "from training.cli import register\n"
        "register(app)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
