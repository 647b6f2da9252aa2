"""The commands' one progress bar (service.core.console.progress_bar) where stderr is not a terminal
(a log file, CI): rich draws nothing there until the end, so plain lines say how far a long step got
(issue 37: `facegate eval` looked stuck for minutes)."""

from __future__ import annotations

import io

from rich.console import Console

from service.core import console as console_module


def test_progress_prints_a_line_every_tenth_when_stderr_is_not_a_terminal(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(console_module, "console", Console(file=out, force_terminal=False, width=200))
    with console_module.progress_bar("align", 250) as advance:
        for _ in range(250):
            advance(1)
    lines = out.getvalue().splitlines()
    assert [line.split(",")[0] for line in lines] == [f"align: {25 * k}/250 ({10 * k}%)" for k in range(1, 11)]
    assert all(line.endswith(" s") for line in lines)


def test_progress_disabled_prints_nothing(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(console_module, "console", Console(file=out, force_terminal=False))
    with console_module.progress_bar("embed", 10, enabled=False) as advance:
        advance(10)
    assert out.getvalue() == ""
