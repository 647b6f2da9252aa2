"""House rules that code review alone would let slip (the import boundary itself: tests/test_boundaries.py)."""

import subprocess
import sys


def test_serving_modules_and_cli_load_without_torch():
    code = (
        "import sys, importlib, pkgutil, service\n"
        "for m in pkgutil.walk_packages(service.__path__, 'service.'): importlib.import_module(m.name)\n"
        "from service.cli import app\n"
        "from training.commands import register\n"
        "register(app)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
