"""GPU and MIG facts from NVML (pynvml): gauges for /metrics and lines for `doctor`.

Inside a pod that was given one MIG slice, NVML shows the parent GPU and the one MIG device the
container may use. Utilization is not reported per MIG device by NVML, memory is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

_PROFILE = re.compile(r"(\d+g\.\d+gb)")


@dataclass(frozen=True)
class Device:
    gpu_uuid: str
    name: str
    mig_uuid: str  # "" for a whole GPU
    mig_profile: str  # "" for a whole GPU, else e.g. "1g.10gb"
    memory_used: int
    memory_total: int
    utilization: float | None  # percent; None where NVML has no figure (MIG devices)


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def nvml_devices() -> tuple[list[Device], str | None]:
    """Visible devices and the driver version; ([], None) when NVML is not usable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library, or not an NVIDIA machine
        return [], None
    try:
        out: list[Device] = []
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid, name = _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h))
            try:
                mig_on = pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE
            except pynvml.NVMLError:
                mig_on = False
            if mig_on:
                for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except pynvml.NVMLError:
                        continue
                    mem = pynvml.nvmlDeviceGetMemoryInfo(m)
                    mname = _text(pynvml.nvmlDeviceGetName(m))
                    prof = _PROFILE.search(mname)
                    out.append(Device(uuid, name, _text(pynvml.nvmlDeviceGetUUID(m)), prof.group(1) if prof else mname,
                                      mem.used, mem.total, None))
            else:
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                out.append(Device(uuid, name, "", "", mem.used, mem.total, float(util)))
        return out, driver
    except Exception:
        return [], None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


class NVMLCollector(Collector):
    """Reads NVML at scrape time; yields nothing on machines without an NVIDIA GPU."""

    def collect(self):
        devices, _ = nvml_devices()
        if not devices:
            return
        labels = ["gpu_uuid", "mig_uuid", "mig_profile"]
        used = GaugeMetricFamily("cosyvoice_gpu_memory_used_bytes", "GPU (or MIG device) memory in use.", labels=labels)
        total = GaugeMetricFamily("cosyvoice_gpu_memory_total_bytes", "GPU (or MIG device) memory in all.", labels=labels)
        util = GaugeMetricFamily("cosyvoice_gpu_utilization_ratio", "GPU busy ratio over NVML's last sample period (whole GPUs).", labels=labels)
        for d in devices:
            key = [d.gpu_uuid, d.mig_uuid, d.mig_profile]
            used.add_metric(key, d.memory_used)
            total.add_metric(key, d.memory_total)
            if d.utilization is not None:
                util.add_metric(key, d.utilization / 100.0)
        yield from (used, total, util)
