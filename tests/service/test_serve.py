"""`facegate serve` is safe by default (issue 17, defect 5): without API keys it binds loopback
only, unless FACEGATE_ALLOW_ANONYMOUS=true; it hands uvicorn the connection limits from settings.
uvicorn.run is replaced: nothing is served."""

from __future__ import annotations

import logging
import os
import socket
from contextlib import nullcontext

import pytest
from typer.testing import CliRunner

from service import cli
from service.core.settings import get_settings
from service.runtime import serving


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve(monkeypatch):
    for name in ("FACEGATE_API_KEYS", "FACEGATE_API_KEYS_FILE", "FACEGATE_ALLOW_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr("uvicorn.run", lambda *args, **kwargs: calls.append(kwargs))
    monkeypatch.setattr(serving, "replace_process", serving.run)  # several workers: run here, not re-executed
    get_settings.cache_clear()

    def run(*args: str, **env: str):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        port = [] if "--port" in args else ["--port", str(_free_port())]
        result = CliRunner().invoke(cli.app, ["serve", *args, *port])
        return result, calls[-1] if calls else None

    saved = dict(os.environ)
    yield run
    os.environ.clear()  # what `facegate serve` sets for its workers (FACEGATE_WORKERS, FACEGATE_READY_WORKERS_DIR…) ends here
    os.environ.update(saved)
    get_settings.cache_clear()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.org"])
def test_a_network_bind_without_keys_is_refused(serve, host):
    result, started = serve("--host", host)
    assert result.exit_code == 2 and started is None
    assert "FACEGATE_ALLOW_ANONYMOUS" in result.output and "FACEGATE_API_KEYS" in result.output


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_without_keys_starts(serve, host):
    result, started = serve("--host", host)
    assert result.exit_code == 0, result.output
    assert started["host"] == host


def test_a_network_bind_with_keys_or_explicitly_anonymous_starts(serve, tmp_path):
    assert serve("--host", "0.0.0.0", FACEGATE_API_KEYS="sha256:" + "ab" * 32)[0].exit_code == 0
    keys = tmp_path / "keys"
    keys.write_text("# none yet\n")
    assert serve("--host", "0.0.0.0", FACEGATE_API_KEYS="", FACEGATE_API_KEYS_FILE=str(keys))[0].exit_code == 2  # an empty file is no key
    assert serve("--host", "0.0.0.0", FACEGATE_ALLOW_ANONYMOUS="true")[0].exit_code == 0


def test_uvicorn_limits_come_from_settings(serve):
    _, started = serve(FACEGATE_TIMEOUT_KEEP_ALIVE="3", FACEGATE_BACKLOG="64", FACEGATE_H11_MAX_INCOMPLETE_EVENT_SIZE="8192")
    assert (started["timeout_keep_alive"], started["backlog"], started["h11_max_incomplete_event_size"]) == (3, 64, 8192)
    assert started["http"] == "service.api.server:HeaderDeadlineProtocol"  # h11's, whose header limit that is
    assert "limit_concurrency" not in started  # it counts idle connections: admission control limits work instead


def test_start_without_keys_warns(tmp_path, make_client, caplog):
    from service.core.settings import Settings

    settings = Settings(model_cache=tmp_path / "cache", embedder="none", data_dir=tmp_path / "gallery", device="cpu")
    with caplog.at_level(logging.WARNING, logger="facegate.app"):
        make_client(settings)
    assert any(r.levelno == logging.WARNING and "NO API KEYS" in r.getMessage() for r in caplog.records)


def test_an_unusable_key_file_stops_serve_with_the_reason(serve, tmp_path):
    result, started = serve(FACEGATE_API_KEYS_FILE=str(tmp_path / "missing"))
    assert result.exit_code == 2 and started is None and "No such file" in result.output  # rich wraps the line
    comments = tmp_path / "keys"
    comments.write_text("# only a comment\n")
    result, started = serve(FACEGATE_API_KEYS_FILE=str(comments))
    assert result.exit_code == 2 and started is None and "holds no key" in " ".join(result.output.split())


def test_a_taken_port_is_one_line_before_anything_loads(serve):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        result, started = serve("--port", str(taken.getsockname()[1]))
    assert result.exit_code == 2 and started is None
    assert "cannot listen on 127.0.0.1" in result.output and "Traceback" not in result.output


def test_a_database_url_without_the_driver_names_the_extra(serve, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a))
    result, started = serve(FACEGATE_DATABASE_URL="postgresql://db/facegate")
    assert result.exit_code == 2 and started is None
    assert "pip install 'facegate[postgres]'" in result.output.replace("\n", "")


def test_a_milvus_uri_without_the_client_names_the_build_argument(serve, monkeypatch, tmp_path):
    """The image leaves Milvus' client out unless built with SERVE_EXTRAS=postgres,milvus (issue 37):
    `facegate serve`, and any command that opens the gallery, says so in one line."""
    import importlib.util

    from service.core.errors import GalleryUnavailable
    from service.gallery import factory

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pymilvus" else real(name, *a))
    result, started = serve(FACEGATE_MILVUS_URI="http://milvus:19530")
    assert result.exit_code == 2 and started is None
    assert "SERVE_EXTRAS=postgres,milvus" in result.output.replace("\n", "")
    with pytest.raises(GalleryUnavailable, match="facegate\\[milvus\\]"):
        factory.open_gallery(get_settings().model_copy(update={"milvus_uri": "http://milvus:19530", "data_dir": tmp_path}), None)


def test_a_start_up_failure_is_logged_as_its_reason():
    try:
        raise ConnectionError("database unreachable")
    except ConnectionError:
        import traceback

        record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, traceback.format_exc(), None, None)
    assert serving.OneLineStartupFailure().filter(record)
    assert record.getMessage() == "start-up failed: ConnectionError: database unreachable"


def test_a_taken_port_is_exactly_one_line_from_the_real_command(tmp_path):
    """The installed entry point as a user runs it (no terminal): one line, status 2, no abort."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "FACEGATE_DATA_DIR": str(tmp_path)}
    with socket.create_server(("127.0.0.1", 0)) as taken:
        command = [sys.executable, "-c", "from service.cli import main; main()", "serve", "--port", str(taken.getsockname()[1])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: cannot listen on 127.0.0.1"), lines


def test_where_the_models_run_in_the_http_processes_their_threads_share_two_malloc_arenas(serve, monkeypatch):
    """Without a model host each thread of the one process took a glibc arena of its own (20,000 faces:
    445 MiB PSS, 373 with two arenas; docs/benchmarks.md); the model host keeps two of its own, and
    the HTTP processes it serves one (the idle trim gives back a thread arena's pages, not its top)."""
    from service.runtime import heap, supervisor

    called: list[int] = []
    monkeypatch.setattr(heap, "fewer_arenas", called.append)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "unset below")  # recorded, so that what serve sets is undone after the test
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    result, _ = serve("--workers", "1")
    assert result.exit_code == 0, result.output
    assert called == [2] and os.environ["MALLOC_ARENA_MAX"] == "2"  # this process, and through glibc's variable its children

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the operator's
    assert serve("--workers", "1")[0].exit_code == 0 and called == [2] and os.environ["MALLOC_ARENA_MAX"] == "4"

    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setattr(supervisor, "model_host", lambda **_: nullcontext(None))  # a model host runs the models: its own two
    monkeypatch.setattr("service.runtime.preload.fork_workers", lambda: None)
    assert serve("--workers", "2")[0].exit_code == 0 and called == [2, 1] and os.environ["MALLOC_ARENA_MAX"] == "1"  # no model in them


def test_the_re_executed_supervisor_imports_the_service_not_a_package_of_the_working_directory(tmp_path):
    """`facegate serve --workers N` goes on as `python -c` (service/runtime/serving.py), which would put the
    working directory first on the import path: a `service` package there must not be what runs."""
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "__init__.py").write_text("raise SystemExit('the working directory of the command')\n")
    code = f"{serving.SAFE_PATH}; import service; print(service.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == str(REPO / "service" / "__init__.py")
