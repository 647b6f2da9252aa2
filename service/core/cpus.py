"""How many CPU cores this process may really use: the affinity mask, capped by the cgroup's CPU
quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), which `os.cpu_count()` ignores — a container limited
to 2 CPUs on a 64-core host would otherwise start 64 threads per thread pool."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _own_cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The folders whose limits bind this process: its own cgroup and every ancestor (v2 and the
    v1 cpu controller), plus the root, which is what a container sees of its own cgroup."""
    dirs = [root, root / "cpu", root / "cpu,cpuacct"]
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers and "cpu" not in controllers.split(","):
            continue
        base = root if not controllers else root / ("cpu,cpuacct" if "cpuacct" in controllers else "cpu")
        parts = Path(path).parts[1:]
        dirs += [base.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]
    return dirs


def cgroup_cpu_limit(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota (in CPUs) of this process's cgroups, or None when there is none."""
    quotas = [q for d in _own_cgroup_dirs(root, proc_cgroup) for q in (_v2_quota(d), _v1_quota(d)) if q]
    return min(quotas) if quotas else None


def available_cores(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """Cores in the affinity mask, capped by the cgroup quota rounded up; at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    limit = cgroup_cpu_limit(root, proc_cgroup)
    return max(1, min(cores, math.ceil(limit))) if limit else max(1, cores)
