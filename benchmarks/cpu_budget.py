"""`facegate bench cpu-budget`: where a host's CPU goes per image when `facegate serve --workers N`
serves it with its model host — µs of CPU per stage and per process crossing, in each kind of
process (HTTP worker, decoder process, model host) and thread, and the bytes copied per image.

A server of this checkout is spawned with `benchmarks.cpu_probe` installed in every one of its
processes (a `sitecustomize` on its PYTHONPATH: the service's code is not changed), warmed up,
then loaded route by route; each process's CPU clocks are read before and after each route's load,
so the figures are those of the load alone. Figures are printed, never asserted."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.bench import machine_lines
from benchmarks.cpu_probe import FOLDER, REGIONS, THREAD
from benchmarks.loadgen import LoadResult, offer, route_requests
from benchmarks.loadtest import REPO, Serving, enroll_gallery, spawned
from service.core.cpus import available_cores
from service.core.settings import Settings

SITE = f"""import os

if os.environ.get("{FOLDER}"):
    from benchmarks.cpu_probe import install

    install()
"""
ROLES = ("worker", "decoder", "model host", "other")
MODEL_ROWS = ("onnxruntime run", "onnxruntime threads")  # the models' own compute: what a GPU takes over
SNAPSHOT_TIMEOUT = 30.0
UNCOVERED = "(in no region)"
GENERIC = {"send", "recv", "poll", "shared-memory copy", "future set (wakes its waiter)", "probe (header)", "h11 parse", "h11 send"}


@dataclass
class Budget:
    """One route's load: every process's CPU over it, summed per kind of process."""

    load: LoadResult
    process_ns: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    processes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    thread_ns: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    # (process role, thread role, path) → [exclusive ns less the wrappers' cost, calls, bytes]
    regions: dict[tuple[str, str, tuple[str, ...]], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0, 0]))
    wrapper_ns: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    wrapper_call_ns: list[float] = field(default_factory=list)

    def add(self, before: dict | None, after: dict) -> None:
        """One process's difference between two snapshots (a process new since `before`: all of it)."""
        role = after["role"]
        self.processes[role] += 1
        self.process_ns[role] += after["process_ns"] - (before["process_ns"] if before else 0)
        earlier = before["threads"] if before else {}
        for tid, (thread, ns) in after["threads"].items():
            spent = ns - (earlier[tid][1] if tid in earlier else 0)
            if thread == THREAD:  # the probe's own: left out of the process too
                self.process_ns[role] -= spent
            else:
                self.thread_ns[role, thread] += spent
        inside, left = after["wrapper_ns"]
        self.wrapper_call_ns.append(inside + left)
        old = {(thread, tuple(path)): row for thread, path, *row in before["regions"]} if before else {}
        for thread, path, ns, calls, children, nbytes in after["regions"]:
            was = old.get((thread, tuple(path)), [0, 0, 0, 0])
            ns, calls, children, nbytes = ns - was[0], calls - was[1], children - was[2], nbytes - was[3]
            if calls == 0:
                continue
            row = self.regions[role, thread, tuple(path)]
            row[0] += ns - calls * inside - children * left
            row[1] += calls
            row[2] += nbytes
            self.wrapper_ns[role, thread] += calls * (inside + left)

    @property
    def images(self) -> int:
        """The images the load sent (a /verify request holds two)."""
        return sum(self.load.statuses.values()) * (2 if self.load.route == "/verify" else 1)

    def per_image(self, ns: float) -> float:
        return ns / 1000 / max(1, self.images)

    def remainder(self, process: str, thread: str) -> float:
        """A thread's CPU that no region covers (nor the wrappers): the event loop's own work, a pool's queue."""
        covered = sum(row[0] for (p, t, _), row in self.regions.items() if (p, t) == (process, thread))
        return self.thread_ns.get((process, thread), 0) - covered - self.wrapper_ns.get((process, thread), 0)

    def models_ns(self) -> float:
        """The models' own compute: their onnxruntime runs and onnxruntime's threads."""
        runs = sum(ns for (_, _, path), (ns, _, _) in self.regions.items() if path[-1] in MODEL_ROWS)
        return runs + sum(ns for (_, thread), ns in self.thread_ns.items() if thread.startswith(MODEL_ROWS))


def _snapshots(folder: Path, generation: int) -> dict[int, dict]:
    """Every live process's snapshot of `generation` (each writes its own when asked)."""
    request = folder / "generation"
    request.with_suffix(".tmp").write_text(str(generation))
    os.replace(request.with_suffix(".tmp"), request)
    deadline = time.monotonic() + SNAPSHOT_TIMEOUT
    while True:
        pids = (int(p.name.removeprefix("alive-")) for p in folder.glob("alive-*"))
        alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        found = {pid: folder / f"{generation}-{pid}.json" for pid in alive}
        if all(f.exists() for f in found.values()) or time.monotonic() > deadline:
            return {pid: json.loads(f.read_text()) for pid, f in found.items() if f.exists()}
        time.sleep(0.05)


def measure(
    settings: Settings,
    blobs: list[bytes],
    workers: int = 2,
    routes: tuple[str, ...] = ("verify", "identify"),
    concurrency: int = 8,
    requests: int = 200,
    enroll: int = 20,
    regions: bool = True,
) -> list[Budget]:
    """One Budget per route, from a spawned `facegate serve --workers N` with its model host;
    `regions` False: its processes' and threads' clocks only, no function wrapped (the control)."""
    folder = Path(tempfile.mkdtemp(prefix="facegate-cpu-budget-"))
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    probe = folder / "probe"
    probe.mkdir()
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {"FACEGATE_EMBEDDER": str(settings.embedder), "FACEGATE_DEVICE": settings.device, FOLDER: str(probe), "PYTHONPATH": path}
    env[REGIONS] = "1" if regions else "0"
    budgets = []
    try:
        with spawned(env, serving=Serving(workers, model_host=True)) as url:
            if "identify" in routes:
                enroll_gallery(url, blobs, enroll, {})
            built = {route: route_requests(url, f"/{route}", blobs) for route in routes}
            for route in routes:  # warm-up: every decoder process started, every code path run once
                offer(url, f"/{route}", built[route], concurrency, max(2 * concurrency, 8))
            before = _snapshots(probe, 0)
            for generation, route in enumerate(routes, 1):
                load = offer(url, f"/{route}", built[route], concurrency, requests)
                after = _snapshots(probe, generation)
                budget = Budget(load)
                for pid, snap in after.items():
                    budget.add(before.get(pid), snap)
                budgets.append(budget)
                before = after
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return budgets


def _label(path: tuple[str, ...]) -> str:
    return "  " * (len(path) - 1) + ("› " if len(path) > 1 else "") + path[-1]


def budget_table(budgets: list[Budget]) -> Table:
    """Per kind of process and thread: the thread's CPU per image, each region in it (exclusive),
    what no region covers, and the wrappers' own cost."""
    table = Table("process", "thread › region", title="CPU per image (µs; exclusive of the regions nested below each)")
    for b in budgets:
        table.add_column(f"{b.load.route} µs/image", justify="right")
        table.add_column("calls/image", justify="right")
    keys = sorted({k for b in budgets for k in b.regions}, key=lambda k: (ROLES.index(k[0]), k[1], k[2]))
    threads = sorted({k for b in budgets for k in b.thread_ns}, key=lambda k: (ROLES.index(k[0]), k[1]))

    def row(process: str, label: str, values: list[tuple[float, float | None] | None], style: str | None = None) -> None:
        """A row's cells: µs per image and calls per image (None: not a region's row)."""
        cells = []
        for v in values:
            cells += ["", ""] if v is None else [f"{v[0]:,.0f}", "" if v[1] is None else f"{v[1]:.2f}"]
        table.add_row(process, label, *cells, style=style)

    for role in ROLES:
        if not any(b.processes.get(role) for b in budgets):
            continue
        count = max(b.processes.get(role, 0) for b in budgets)
        row(
            f"{role} ×{count}",
            "all threads (getrusage, less the probe's)",
            [(b.per_image(b.process_ns[role]), None) for b in budgets],
            "bold",
        )
        for process, thread in (t for t in threads if t[0] == role):
            clocks = [b.thread_ns.get((process, thread), 0) for b in budgets]
            if not any(clocks):
                continue
            row("", thread, [(b.per_image(ns), None) for b, ns in zip(budgets, clocks, strict=True)], "italic")
            inside = [k for k in keys if k[:2] == (process, thread)]
            for key in inside:
                row("", "  " + _label(key[2]), [_cell(b, key) for b in budgets])
            if inside:
                row("", f"  {UNCOVERED}", [(b.per_image(b.remainder(process, thread)), None) for b in budgets])
                wrappers = [(b.per_image(b.wrapper_ns.get((process, thread), 0)), None) for b in budgets]
                row("", "  (the probe's wrappers)", wrappers, "dim")
        ended = [b.process_ns[role] - sum(ns for (p, _), ns in b.thread_ns.items() if p == role) for b in budgets]
        row("", "threads that ended during the load", [(b.per_image(ns), None) for b, ns in zip(budgets, ended, strict=True)], "dim")
    return table


def _short(path: tuple[str, ...]) -> str:
    """A region by its name, with its caller's where the name alone is ambiguous (`send`)."""
    return " › ".join(path[-2:]) if path[-1] in GENERIC and len(path) > 1 else path[-1]


def _cell(b: Budget, key) -> tuple[float, float] | None:
    if key not in b.regions:
        return None
    ns, calls, _ = b.regions[key]
    return b.per_image(ns), calls / max(1, b.images)


def _by_caller(b: Budget) -> dict[tuple[str, str, str], list[float]]:
    """The regions summed by process, thread and `_short` name: the same work reached by other
    paths (/verify's two images run as tasks of their own) in one row."""
    rows: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0])
    for (process, thread, path), values in b.regions.items():
        row = rows[process, thread, _short(path)]
        for i, value in enumerate(values):
            row[i] += value
    for process, thread in {(p, t) for p, t, _ in b.regions}:
        rows[process, thread, UNCOVERED][0] += b.remainder(process, thread)
    return rows


def copies_table(budgets: list[Budget]) -> Table:
    """Every region that copies or writes an image's bytes or pixels, with the bytes per image."""
    table = Table("process", "region", title="bytes copied or written per image (the copy count: calls/image)")
    for b in budgets:
        table.add_column(f"{b.load.route} KiB/image", justify="right")
        table.add_column("calls/image", justify="right")
    rows = [_by_caller(b) for b in budgets]
    keys = sorted({k for r in rows for k, v in r.items() if v[2]}, key=lambda k: (ROLES.index(k[0]), k[1], k[2]))
    for key in keys:
        cells = []
        for b, r in zip(budgets, rows, strict=True):
            _, calls, nbytes = r.get(key, (0, 0, 0))
            cells += [f"{nbytes / 1024 / max(1, b.images):,.1f}", f"{calls / max(1, b.images):.2f}"]
        table.add_row(key[0], key[2], *cells)
    return table


def _crossing_sides(b: Budget) -> dict[str, tuple[float, float]]:
    """Each process crossing's CPU (ns) on the side that starts it and on the other side, its
    stages proper (the probe and decode themselves, the model runs) left out."""

    def regions(test) -> float:
        return sum(row[0] for key, row in b.regions.items() if test(*key))

    def threads(process: str, *names: str) -> float:
        return sum(b.thread_ns.get((process, name), 0) - b.wrapper_ns.get((process, name), 0) for name in names)

    decoding = ("probe in a decoder", "decode in a decoder")
    decoder_work = regions(lambda p, t, path: p == "decoder" and path[-1] in ("decode (OpenCV)", "probe (header)"))
    decoder_wrappers = sum(ns for (p, _), ns in b.wrapper_ns.items() if p == "decoder")
    return {
        "worker → decoder process → worker (probe and decode round trips)": (
            regions(lambda p, t, path: p == "worker" and any(d in path for d in decoding)),
            b.process_ns["decoder"] - decoder_wrappers - decoder_work,
        ),
        "worker → model host → worker (detect and embed runs)": (
            regions(lambda p, t, path: p == "worker" and any(step.endswith("sent to the model host") for step in path))
            + threads("worker", "facegate-hosted-models"),
            threads("model host", "facegate-model-host-conn", "facegate-model-host-answers")
            + regions(lambda p, t, path: p == "model host" and path[-1] == "future set (wakes its waiter)"),
        ),
        "event loop → thread pool → event loop (the engine's steps)": (
            regions(lambda p, t, path: p == "worker" and path[-1] == "engine (its steps on the loop)"),
            regions(lambda p, t, path: p == "worker" and t == "facegate-infer" and path[-1] == "future set (wakes its waiter)"),
        ),
    }


def crossings_table(budgets: list[Budget]) -> Table:
    """The process crossings per image, each side's CPU (the stages themselves left out)."""
    table = Table("crossing", title="process crossings (µs of CPU per image: the side that starts it + the other side)")
    for b in budgets:
        table.add_column(b.load.route, justify="right")
    sides = [_crossing_sides(b) for b in budgets]
    for name in sides[0] if sides else ():
        cells = [f"{b.per_image(s[name][0]):,.0f} + {b.per_image(s[name][1]):,.0f}" for b, s in zip(budgets, sides, strict=True)]
        table.add_row(name, *cells)
    return table


def ranked(budgets: list[Budget], limit: int = 15) -> Table:
    """The largest rows outside the models' own compute, ranked by their mean over the routes: what
    a cut would save, largest first."""
    rows = [_by_caller(b) for b in budgets]
    keys = {k for r in rows for k in r if not k[2].endswith(MODEL_ROWS)}
    cost = {k: [b.per_image(r[k][0]) if k in r else 0.0 for b, r in zip(budgets, rows, strict=True)] for k in keys}
    table = Table("rank", "process", "thread", "region", title="outside the models, largest first (µs/image)")
    for b in budgets:
        table.add_column(b.load.route, justify="right")
    for rank, key in enumerate(sorted(keys, key=lambda k: -sum(cost[k]))[:limit], 1):
        table.add_row(str(rank), *key, *(f"{v:,.0f}" for v in cost[key]))
    return table


def run_cpu_budget(
    settings: Settings,
    images: list[Path],
    console: Console,
    workers: int = 2,
    routes: tuple[str, ...] = ("verify", "identify"),
    concurrency: int = 8,
    requests: int = 200,
    control: bool = True,
) -> list[Budget]:
    """Print the tables; `control`: a second server, loaded alike with no function wrapped, gives
    each route's CPU per image without the wrappers (what they cost beyond their calibration)."""
    for line in machine_lines():
        console.print(line)
    blobs = [p.read_bytes() for p in images[:64]]
    console.print(
        f"serving: facegate serve --workers {workers} + model host, embedder {settings.embedder}, "
        f"FACEGATE_WORKER_THREADS={os.environ.get('FACEGATE_WORKER_THREADS') or max(2, 2 * available_cores() // workers)}, "
        f"FACEGATE_INTRA_OP_THREADS={settings.intra_op_threads}, batching {'on' if settings.batching else 'off'}, "
        f"batch wait {settings.batch_wait_ms:g} ms"
    )
    mean = sum(map(len, blobs)) / len(blobs) / 1024
    console.print(f"photos: {len(blobs)} ({mean:.1f} KiB mean), {requests} requests a route at concurrency {concurrency}")
    budgets = measure(settings, blobs, workers, routes, concurrency, requests)
    controls = measure(settings, blobs, workers, routes, concurrency, requests, regions=False) if control else []
    for b, c in itertools.zip_longest(budgets, controls):
        r = b.load
        wrappers = sum(b.wrapper_ns.values())
        line = (
            f"{r.route}: {r.rps:.1f} req/s, p50 {r.p50:.1f} ms, p99 {r.p99:.1f} ms ({r.status_text()}); {b.images} images; "
            f"CPU of every process: {b.per_image(sum(b.process_ns.values()) - wrappers):,.0f} µs/image "
            f"(the wrappers' calibrated {b.per_image(wrappers):,.0f} taken out)"
        )
        if c is not None:
            line += (
                f"; without the wrappers (the control server, {c.load.rps:.1f} req/s, {c.load.status_text()}): "
                f"{c.per_image(sum(c.process_ns.values())):,.0f} µs/image"
            )
        console.print(line)
        outside = sum(b.process_ns.values()) - wrappers - b.models_ns()
        request = outside / 1000 / max(1, sum(r.statuses.values()))
        console.print(
            f"  outside the models' own compute: {b.per_image(outside):,.0f} µs/image, {request:,.0f} µs a request: "
            f"{1e6 / request:,.0f} requests/s a core of this machine, were the models' compute taken away (to a GPU)"
        )
    calls = [ns for b in budgets for ns in b.wrapper_call_ns]
    console.print(f"the probe's wrappers: {statistics.median(calls):.0f} ns a call (median over the processes), taken out of every row")
    console.print(budget_table(budgets))
    console.print(crossings_table(budgets))
    console.print(copies_table(budgets))
    console.print(ranked(budgets))
    return budgets
