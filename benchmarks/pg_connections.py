"""PostgreSQL connections a `facegate serve --workers W` host holds with C collections (issue 50):
each worker's pool and LISTEN connection, counted in pg_stat_activity once every collection is
open and built (/readyz 200), and again after a burst of requests to every collection (a pool grows
with its concurrent users, up to FACEGATE_DATABASE_POOL_SIZE).

Uses the tests' tiny ONNX embedder and needs the detector for readiness (FACEGATE_MODEL_CACHE).
Without --database-url a throw-away PostgreSQL server is started from Debian's binaries.

    FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/pg_connections.py --collections 5 --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from benchmarks.loadtest import Serving, spawned  # noqa: E402
from benchmarks.replicas import database, fresh_database  # noqa: E402

SETTLE_SECONDS = 3.0  # after readiness: the indexes' builds' own connections closed


def sessions(url: str) -> dict[str, int]:
    """The database's sessions but this one, by application_name ('' for an unnamed one)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid != pg_backend_pid() GROUP BY 1"
        ).fetchall()
    return dict(rows)


def burst(server: str, keys: list[str], requests: int) -> None:
    """`requests` listings per collection, 8 at a time: every worker's pool in use by every collection."""
    with httpx.Client(base_url=server, timeout=60) as client, ThreadPoolExecutor(8) as pool:
        answers = pool.map(lambda key: client.get("/subjects", headers={"X-API-Key": key}).status_code, keys * requests)
        assert set(answers) == {200}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an admin URL of a server to use (default: a throw-away one)")
    parser.add_argument("--collections", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=8, help="FACEGATE_DATABASE_POOL_SIZE")
    parser.add_argument("--requests", type=int, default=20, help="listings per collection in the burst")
    args = parser.parse_args()
    from tests.onnx_models import write_test_embedder

    work = Path(tempfile.mkdtemp(prefix="facegate-bench-"))
    embedder = write_test_embedder(work / "embedder")
    keys = [f"key-{n}" for n in range(args.collections)]  # key-0: default's
    (work / "keys").write_text("".join(f"{key} collection=c{n}\n" if n else f"{key}\n" for n, key in enumerate(keys)))
    env = {
        "FACEGATE_EMBEDDER": str(embedder),
        "FACEGATE_DEVICE": "cpu",
        "FACEGATE_API_KEYS": "",
        "FACEGATE_API_KEYS_FILE": str(work / "keys"),
        "FACEGATE_DATABASE_POOL_SIZE": str(args.pool_size),
    }
    with database(args.database_url) as admin:
        url = fresh_database(admin, "bench_connections")
        with spawned({**env, "FACEGATE_DATABASE_URL": url}, serving=Serving(workers=args.workers)) as server:
            time.sleep(SETTLE_SECONDS)
            ready = sessions(url)
            burst(server, keys, args.requests)
            busy = sessions(url)
    for line in machine_lines():
        print(line)
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}; {args.collections} collections x {args.workers} workers, pool size {args.pool_size}")
    for when, found in (("ready", ready), (f"after {args.requests} listings per collection, 8 at a time", busy)):
        named = ", ".join(f"{name or '(unnamed)'}: {count}" for name, count in sorted(found.items()))
        print(f"  {when}: {sum(found.values())} connections ({named})")


if __name__ == "__main__":
    main()
