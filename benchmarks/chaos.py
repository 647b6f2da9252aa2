"""Hostile-client and outage figures for issue 23's targets, against `facegate serve` of this
checkout on a free 127.0.0.1 port (nothing else is contacted; every loop bounded):

1. 2,000 connections held (half idle, half trickling a header byte a second): /healthz p99, whether
   an authenticated /verify of two LFW photos succeeds, and when the trickling ones were closed.
2. 64 concurrent maximum-pixel images (39.7 MP PNGs, 120 KB each) to /embed: peak RSS over base, statuses.
3. PostgreSQL (its own server, tests/postgres.py) stopped with 60 gallery requests in flight: their
   answer time, /healthz p99 and /metrics time meanwhile, the first request after it is back.
4. `model-host` (not in the default run): `facegate serve` with 2 workers and its model host; the
   host killed (kill -9), then the next one stopped (SIGSTOP: a hang); /verify in a loop meanwhile:
   every answer's status and time, Retry-After, /readyz's reasons, and when requests are served again.

    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/chaos.py
    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/chaos.py model-host
"""

from __future__ import annotations

import io
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
KEY = "chaos-bench-key"
HEADER_TIMEOUT = 10.0  # the default


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(env: dict[str, str], ready_path: str = "/readyz"):
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="facegate-chaos-")
    env = {**os.environ, "FACEGATE_DATA_DIR": data_dir, "FACEGATE_API_KEYS": KEY, "FACEGATE_DEVICE": "cpu", **env}
    process = subprocess.Popen(
        [sys.executable, "-c", "from service.cli import app; app()", "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            try:
                if httpx.get(url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url, port, process.pid
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)


def p99(samples: list[float]) -> float:
    return float(np.percentile(samples, 99)) * 1000


def healthz_times(url: str, n: int) -> list[float]:
    times = []
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            started = time.perf_counter()
            assert client.get(url + "/healthz").status_code == 200
            times.append(time.perf_counter() - started)
    return times


def lfw_pair() -> tuple[bytes, bytes]:
    lfw = Path(os.environ["FACEGATE_TEST_DATA"]) / "lfw"
    for person in sorted(lfw.iterdir()):
        files = sorted(person.glob("*.jpg"))
        if len(files) >= 2:
            return files[0].read_bytes(), files[1].read_bytes()
    raise RuntimeError("no LFW person with two photos")


def connections(total: int = 2000) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    one, two = lfw_pair()
    with serve({}) as (url, port, _):
        held = []
        for _ in range(total):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        idle, trickling = held[: total // 2], held[total // 2 :]
        stop = threading.Event()
        closed_at: dict[int, float] = {}
        started = time.monotonic()

        def trickle():
            for step in range(int(HEADER_TIMEOUT * 3)):
                for i, s in enumerate(trickling):
                    if i in closed_at:
                        continue
                    try:
                        s.sendall(b"GET /healthz HTTP/1.1\r\n" if step == 0 else b"X")
                    except OSError:
                        closed_at[i] = time.monotonic() - started
                if stop.wait(1.0) or len(closed_at) == len(trickling):
                    return

        thread = threading.Thread(target=trickle)
        thread.start()
        times = healthz_times(url, 300)
        verify = httpx.post(
            url + "/verify", headers={"X-API-Key": KEY}, files={"image1": ("1.jpg", one), "image2": ("2.jpg", two)}, timeout=60
        )
        thread.join(HEADER_TIMEOUT * 3 + 5)
        stop.set()
        for s in held:
            s.close()
        closes = sorted(closed_at.values())
        print(
            f"[connections] {total} held ({len(idle)} idle, {len(trickling)} trickling a header byte/s): "
            f"/healthz p50 {np.median(times) * 1000:.1f} ms, p99 {p99(times):.1f} ms (300 requests)"
        )
        print(
            f"[connections] authenticated /verify while held: {verify.status_code} "
            f"match={verify.json().get('match') if verify.status_code == 200 else verify.text[:120]}"
        )
        print(
            f"[connections] trickling connections closed by the server: {len(closes)}/{len(trickling)}, "
            f"the last after {closes[-1] if closes else float('nan'):.1f} s "
            f"(FACEGATE_HEADER_TIMEOUT {HEADER_TIMEOUT:g} s; detected on the next 1 s write)"
        )


def pixel_bombs(n: int = 64) -> None:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((6300, 6300, 3), 127, np.uint8)).save(out, "PNG", compress_level=9)
    bomb = out.getvalue()

    def status_kb(pid: int, field: str) -> int:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(field + ":"))
        return int(line.split()[1])

    with serve({}) as (url, _, pid):
        base = status_kb(pid, "VmRSS") * 1024
        started = time.monotonic()
        with ThreadPoolExecutor(n) as pool:
            answers = list(
                pool.map(
                    lambda _: (
                        httpx.post(url + "/embed", headers={"X-API-Key": KEY}, files={"image": ("b.png", bomb)}, timeout=300).status_code
                    ),
                    range(n),
                )
            )
        peak = status_kb(pid, "VmHWM") * 1024
        counts = {s: answers.count(s) for s in sorted(set(answers))}
        print(
            f"[memory] {n} concurrent 6300x6300 (39.7 MP) PNGs of {len(bomb) // 1000} KB to /embed in {time.monotonic() - started:.1f} s: "
            f"base RSS {base / 1e9:.2f} GB, peak {peak / 1e9:.2f} GB (+{(peak - base) / 1e9:.2f} GB; target ≤ +1.5), statuses {counts}"
        )


def postgres_outage(in_flight: int = 60) -> None:
    from tests.postgres import PostgresServer, binaries

    if binaries() is None:
        print("[postgres] skipped: PostgreSQL server binaries not found (apt-get install postgresql)")
        return
    root = Path(tempfile.mkdtemp(prefix="facegate-pg-bench-"))
    database = PostgresServer(root).start()
    try:
        with serve({"FACEGATE_DATABASE_URL": database.url(), "FACEGATE_EMBEDDER": "none"}, ready_path="/healthz") as (url, _, _):
            auth = {"X-API-Key": KEY}
            assert httpx.post(url + "/subjects", headers=auth, json={"id": "a", "name": "A"}, timeout=10).status_code == 201
            database.stop()

            def gallery(_: int) -> tuple[int, float]:
                started = time.perf_counter()
                status = httpx.get(url + "/subjects", headers=auth, timeout=60).status_code
                return status, time.perf_counter() - started

            with ThreadPoolExecutor(in_flight) as pool:
                futures = [pool.submit(gallery, i) for i in range(in_flight)]
                time.sleep(0.2)
                health = healthz_times(url, 100)
                started = time.perf_counter()
                metrics = httpx.get(url + "/metrics", headers=auth, timeout=60)
                metrics_s = time.perf_counter() - started
                answers = [f.result() for f in futures]
            database.resume()
            first = httpx.get(url + "/subjects", headers=auth, timeout=30).status_code
        statuses = {s: [a[0] for a in answers].count(s) for s in {a[0] for a in answers}}
        print(
            f"[postgres] down, {in_flight} gallery requests in flight: statuses {statuses}, "
            f"slowest answer {max(a[1] for a in answers):.2f} s (target ≤ 3 s); "
            f"/healthz p99 {p99(health):.1f} ms (100 requests); /metrics {metrics.status_code} in {metrics_s * 1000:.0f} ms"
        )
        print(f"[postgres] first gallery request after PostgreSQL is back: {first}")
    finally:
        database.stop()
        shutil.rmtree(root, ignore_errors=True)


def model_host_outage(seconds: float = 60.0) -> None:
    import base64
    import signal

    one, two = lfw_pair()
    body = {"image1": base64.b64encode(one).decode(), "image2": base64.b64encode(two).decode()}
    with serve({"FACEGATE_WORKERS": "2"}) as (url, _, _), httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=60) as client:
        for what, sig in (("kill -9", signal.SIGKILL), ("SIGSTOP (hung)", signal.SIGSTOP)):
            host = client.get("/readyz").json()["serving"]["model_host"]["pid"]
            os.kill(host, sig)
            hit = time.monotonic()
            answers: list[tuple[float, int, float, str | None]] = []  # (sent after the signal, status, seconds, Retry-After)
            reasons: set[str] = set()
            while time.monotonic() - hit < seconds and sum(a[1] == 200 for a in answers[-3:]) < 3:
                sent = time.monotonic()
                response = client.post("/verify", json=body)
                answers.append((sent - hit, response.status_code, time.monotonic() - sent, response.headers.get("retry-after")))
                if response.status_code == 503:
                    problems = client.get("/readyz").json()["problems"]
                    reasons |= {p["error"].split(" (")[0] for p in problems if p["model"] == "model host"}
            refused = sorted(a[2] for a in answers if a[1] == 503)
            statuses = {s: [a[1] for a in answers].count(s) for s in {a[1] for a in answers}}
            back = next((a[0] for a in answers if a[1] == 200 and a[0] > 0), None)
            print(
                f"[model-host] {what}: statuses {statuses}; the request in flight answered in {answers[0][2]:.2f} s, "
                f"the 503s in {refused[len(refused) // 2] * 1000:.0f} ms median, {refused[-1]:.2f} s max, "
                f"Retry-After {sorted({str(a[3]) for a in answers if a[1] == 503})}; served again "
                f"{back:.1f} s after the signal; /readyz said {sorted(reasons)}"
            )


if __name__ == "__main__":
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            print("cpu:", line.split(":", 1)[1].strip())
            break
    parts = sys.argv[1:] or ["connections", "memory", "postgres"]
    if "connections" in parts:
        connections()
    if "memory" in parts:
        pixel_bombs()
    if "postgres" in parts:
        postgres_outage()
    if "model-host" in parts:
        model_host_outage()
