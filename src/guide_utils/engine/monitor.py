"""Utilisation over time, sampled beside training (``--monitor SECONDS``).

A thread takes one sample every few seconds and hands it to the run record: CPU per core
and of the training process with its loader workers, memory, disk and network traffic
(psutil), and, where an NVIDIA driver answers, every GPU of the node: utilisation (the
share of time a kernel was running), memory and power (NVML through nvidia-ml-py). That is
what the thesis's figures 22, 23 and 27 show, and what tells an input-bound run (GPUs
waiting, loader workers busy) from a compute-bound one. Rank 0 samples its own node.

>>> samples = []
>>> m = Monitor(samples.append, interval=0.05).start()
>>> import time; time.sleep(0.3)
>>> m.stop()
>>> len(samples) >= 2 and {"t", "cpu_percent", "process_cpu_percent", "memory_used_gib"} <= set(samples[0])
True
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

GIB = 2**30
MB = 1e6


class Monitor:
    """Calls ``write(sample)`` every ``interval`` seconds from a daemon thread until stopped."""

    def __init__(self, write: Callable[[dict[str, Any]], None], interval: float = 1.0):
        import psutil

        self.write, self.interval = write, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guide-monitor", daemon=True)
        self._process = psutil.Process()
        self._gpus = _nvml_devices()
        self._start = time.monotonic()
        self._last: tuple[float, Any, Any] | None = None

    def start(self) -> "Monitor":
        import psutil

        psutil.cpu_percent(percpu=True)  # the first reading only sets the reference point
        self._tree_cpu()
        self._last = (time.monotonic(), psutil.disk_io_counters(), psutil.net_io_counters())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write(self.sample())
            except Exception:  # noqa: BLE001 - a failed sample must never stop the training
                continue

    def _tree_cpu(self) -> float:
        """CPU of this process and its children (DataLoader workers), in % of one core."""
        import psutil

        total = 0.0
        for proc in (self._process, *self._process.children(recursive=True)):
            try:
                total += proc.cpu_percent()
            except psutil.Error:  # a worker that just ended
                pass
        return total

    def sample(self) -> dict[str, Any]:
        import psutil

        now = time.monotonic()
        disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
        then, last_disk, last_net = self._last
        dt = max(now - then, 1e-9)
        self._last = (now, disk, net)
        per_core = psutil.cpu_percent(percpu=True)
        out: dict[str, Any] = {
            "t": round(now - self._start, 3),
            "cpu_percent": round(sum(per_core) / len(per_core), 1), "cpu_percent_per_core": per_core,
            "process_cpu_percent": round(self._tree_cpu(), 1),
            "memory_used_gib": round(psutil.virtual_memory().used / GIB, 3),
            "process_rss_gib": round(self._process.memory_info().rss / GIB, 3),
        }
        if disk and last_disk:
            out["disk_read_mb_s"] = round((disk.read_bytes - last_disk.read_bytes) / MB / dt, 3)
            out["disk_write_mb_s"] = round((disk.write_bytes - last_disk.write_bytes) / MB / dt, 3)
        if net and last_net:
            out["net_mb_s"] = round((net.bytes_sent + net.bytes_recv - last_net.bytes_sent - last_net.bytes_recv)
                                    / MB / dt, 3)
        if self._gpus:
            out["gpus"] = [_gpu_sample(i, handle) for i, handle in self._gpus]
        return out


def _nvml_devices() -> list[tuple[int, Any]]:
    """``(index, handle)`` of every GPU NVML sees on this node; none without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver, no GPU: CPU samples only
        return []


def _gpu_sample(index: int, handle) -> dict[str, Any]:
    import pynvml

    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    sample = {"index": index, "util_percent": util.gpu, "memory_used_gib": round(memory.used / GIB, 3)}
    try:
        sample["power_w"] = round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1)
    except pynvml.NVMLError:  # not every board reports power
        pass
    return sample
