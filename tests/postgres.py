"""A throw-away PostgreSQL server for the tests, from Debian's `postgresql` package binaries:
initdb + pg_ctl into a temporary folder, listening on a free 127.0.0.1 port (its unix socket in
that folder too). PostgreSQL refuses to run as root, so as root the folder is handed to `nobody`
and the binaries run as that user (runuser). Tests that need it skip with the reason when the
binaries or psycopg are missing, and fail instead when FACEGATE_REQUIRE_POSTGRES=1 (.ci/run sets it)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

from tests.requirements import need

SERVER_USER = "nobody"  # who runs initdb and postgres when the tests run as root


def binaries() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin with initdb and pg_ctl."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, root: Path):
        self.bin = binaries()
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", SERVER_USER, "--"]

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=120, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def start(self) -> PostgresServer:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "facegate", "--auth=trust", "--encoding=UTF8", "--no-instructions")
        return self.resume()

    def resume(self) -> PostgresServer:
        """Start the initialised server again (after `stop`), on the same port and data."""
        # fsync stays on: the server's durability is what a write's acknowledgement rests on.
        options = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} -c max_connections=200"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", options, "-w", "-t", "60", "start"
        )
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://facegate@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, encoding: str = "UTF8") -> str:
        """A new database; another `encoding` (SQL_ASCII: what some old clusters were made with) from template0."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            if encoding == "UTF8":
                conn.execute(f'CREATE DATABASE "{name}"')
            else:
                conn.execute(f"CREATE DATABASE \"{name}\" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
        return self.url(name)


def check_available() -> None:
    """Return when a server can be started here; else a skip (a failure under FACEGATE_REQUIRE_POSTGRES=1) saying what is missing."""
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        need("POSTGRES", "psycopg is not installed (pip install '.[postgres]')")
    if binaries() is None:
        need("POSTGRES", "PostgreSQL's server binaries are not installed (apt-get install postgresql)")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        need("POSTGRES", "running as root, and runuser (to start PostgreSQL as another user) is missing")
