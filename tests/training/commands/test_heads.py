"""The `facegate heads` commands (training/commands/heads.py)."""

from __future__ import annotations

from tests.requirements import importorskip

importorskip("torch")


def test_cli_module_imports_without_torch():
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; sys.modules['matplotlib'] = None; import training.commands.heads"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plot_logits_writes_a_png(tmp_path):
    importorskip("matplotlib")
    from typer.testing import CliRunner

    from training.commands.heads import heads_app

    result = CliRunner().invoke(heads_app, ["plot-logits", "--out", str(tmp_path / "logits.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "logits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_features_rejects_an_unknown_head(tmp_path):
    from typer.testing import CliRunner

    from training.commands.heads import heads_app

    result = CliRunner().invoke(heads_app, ["plot-features", "--head", "arcfce", "--out", str(tmp_path / "f.png")])
    assert result.exit_code != 0 and "arcfce" in result.output
