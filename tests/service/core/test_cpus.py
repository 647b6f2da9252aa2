"""Cores this process may use: affinity capped by a cgroup CPU quota, read from fake cgroup trees."""

import os

from service.core.cpus import available_cores, cgroup_cpu_limit


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_caps_the_affinity(tmp_path):
    proc = tmp_path / "proc-cgroup"
    _write(proc, "0::/\n")
    _write(tmp_path / "cg" / "cpu.max", "200000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "cg", proc) == 2.0
    assert available_cores(tmp_path / "cg", proc) == min(2, len(os.sched_getaffinity(0)))
    _write(tmp_path / "cg" / "cpu.max", "150000 100000\n")  # 1.5 CPUs: two threads, the second half-busy
    assert available_cores(tmp_path / "cg", proc) == min(2, len(os.sched_getaffinity(0)))


def test_no_quota_means_the_affinity_mask(tmp_path):
    proc = tmp_path / "proc-cgroup"
    _write(proc, "0::/\n")
    _write(tmp_path / "cg" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path / "cg", proc) is None
    assert available_cores(tmp_path / "cg", proc) == len(os.sched_getaffinity(0))
    assert cgroup_cpu_limit(tmp_path / "missing", tmp_path / "no-proc-file") is None


def test_a_nested_v2_cgroup_and_its_ancestors_are_read(tmp_path):
    proc = tmp_path / "proc-cgroup"
    _write(proc, "0::/system.slice/app.service\n")
    root = tmp_path / "cg"
    _write(root / "cpu.max", "max 100000\n")
    _write(root / "system.slice" / "cpu.max", "400000 100000\n")
    _write(root / "system.slice" / "app.service" / "cpu.max", "100000 100000\n")
    assert cgroup_cpu_limit(root, proc) == 1.0
    assert available_cores(root, proc) == 1


def test_cgroup_v1_cfs_quota(tmp_path):
    proc = tmp_path / "proc-cgroup"
    _write(proc, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n2:cpuset:/docker/abc\n")
    root = tmp_path / "cg"
    _write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "50000\n")
    _write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, proc) == 0.5
    assert available_cores(root, proc) == 1
    _write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "-1\n")  # unlimited
    assert cgroup_cpu_limit(root, proc) is None
