"""`facegate model-info`."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from training.backbones import BACKBONES


def test_model_info_command():
    from training.commands import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["model-info", "mobilefacenet", "iresnet18"])
    assert result.exit_code == 0, result.output
    assert "mobilefacenet" in result.stdout and "2.06" in result.stdout and "24.03" in result.stdout
    assert set(BACKBONES) == {"iresnet18", "iresnet34", "iresnet50", "iresnet100", "mobilefacenet", "dlib_resnet_v1"}
