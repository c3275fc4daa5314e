"""The CPU cores this process may use: what its container was given, not what the node has.

A pod with `limits.cpu: 2` on a 64-core node sees 64 cores in `os.cpu_count()` (and ONNX Runtime sizes
its default pools from the cores too); threads beyond the quota are throttled by the kernel's CFS, which
stalls every stage for the rest of each 100 ms period. The quota is read from the process's cgroup (v2
`cpu.max` on its own and every parent cgroup, or v1 `cpu.cfs_quota_us`), rounded up, and capped by the
affinity mask (cpusets, `taskset`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def quota_cores(quota: str, period: str) -> float | None:
    """Cores a CFS quota allows (`max` or a negative v1 quota: no limit)."""
    quota, period = quota.strip(), period.strip()
    if quota == "max" or quota.startswith("-"):
        return None
    q, p = int(quota), int(period)
    return q / p if q > 0 and p > 0 else None


def cgroup_cores(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The tightest CPU quota on this process's cgroup path (v2) or its v1 cpu controller; None if unlimited
    or unreadable."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    limits = []
    for line in proc_cgroup.splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":  # v2: the quota of every ancestor applies
            d = root / path.lstrip("/")
            while True:
                limits.append(_read_quota(d / "cpu.max"))
                if d == root or root not in d.parents:
                    break
                d = d.parent
        elif "cpu" in controllers.split(","):  # v1: the controller's own mount, as seen in the container
            for mount in (root / "cpu", root / "cpu,cpuacct"):
                limits.append(_read_quota(mount / "cpu.cfs_quota_us", mount / "cpu.cfs_period_us"))
    found = [c for c in limits if c is not None]
    return min(found) if found else None


def _read_quota(path: Path, period: Path | None = None) -> float | None:
    try:
        if period is None:  # v2: "quota period"
            quota, per = (path.read_text().split() + ["100000"])[:2]
            return quota_cores(quota, per)
        return quota_cores(path.read_text(), period.read_text())
    except (OSError, ValueError):
        return None


def cores_for(quota: float | None, affinity: int) -> int:
    """Whole cores to size thread pools by: the quota rounded up, at most the cores in the affinity mask."""
    return max(1, min(affinity, math.ceil(quota)) if quota is not None else affinity)


def usable_cores() -> int:
    return cores_for(cgroup_cores(), len(os.sched_getaffinity(0)))
