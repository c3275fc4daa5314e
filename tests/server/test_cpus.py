"""Thread pools are sized by the cores the container may use (its cgroup CPU quota, its affinity mask),
not by the node's: a pod limited to 2 of 64 cores must not run 64 flow threads into CFS throttling."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosyvoice_server.cpus import cgroup_cores, cores_for, quota_cores


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(("quota", "period", "want"), [
    ("200000", "100000", 2.0), ("150000", "100000", 1.5), ("max", "100000", None), ("-1", "100000", None),
    ("50000\n", "100000\n", 0.5)])
def test_quota_parses_as_the_kernel_writes_it(quota, period, want):
    assert quota_cores(quota, period) == want


def test_v2_takes_the_tightest_quota_on_the_path_to_the_root(tmp_path):
    root = _tree(tmp_path, {"kubepods/cpu.max": "150000 100000\n",  # the pod's limit
                            "kubepods/pod1/ctr/cpu.max": "max 100000\n"})
    assert cgroup_cores(root, "0::/kubepods/pod1/ctr\n") == 1.5
    assert cores_for(cgroup_cores(root, "0::/kubepods/pod1/ctr\n"), 64) == 2  # rounded up
    # a container's own namespace shows its cgroup as the root
    assert cgroup_cores(_tree(tmp_path / "ns", {"cpu.max": "300000 100000\n"}), "0::/\n") == 3.0


def test_v1_reads_the_cpu_controller(tmp_path):
    root = _tree(tmp_path, {"cpu,cpuacct/cpu.cfs_quota_us": "400000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cores(root, "4:memory:/x\n2:cpu,cpuacct:/\n") == 4.0
    unlimited = _tree(tmp_path / "u", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cores(unlimited, "2:cpu,cpuacct:/\n") is None


def test_no_quota_or_an_unreadable_one_falls_back_to_the_affinity_mask(tmp_path):
    assert cgroup_cores(tmp_path, "0::/missing\n") is None
    assert cgroup_cores(_tree(tmp_path / "bad", {"cpu.max": "garbage\n"}), "0::/\n") is None
    assert cores_for(None, 6) == 6
    assert cores_for(16.0, 6) == 6  # a quota above the cpuset: the cpuset
    assert cores_for(0.1, 6) == 1


@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset")
def test_the_flow_sessions_get_the_cores_the_process_may_use():
    """Run as the pod runs: the flow's sessions take every core of the affinity mask unless told otherwise."""
    probe = ("from cosyvoice_server.engine.runtime import Runtime, RuntimeOptions as O;"
             "print(Runtime('cpu').flow_threads, Runtime('cpu', O(flow_threads=3)).flow_threads)")
    one = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert one == ["1", "3"]
    every = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                           timeout=60).stdout.split()
    from cosyvoice_server.cpus import usable_cores
    assert every == [str(usable_cores()), "3"]
