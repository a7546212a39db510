"""How fast this machine was while a test session ran: the CPU-seconds the whole machine
spent busy (every process: the tests, the book build beside them, the test Slurm's jobs)
and one fixed training step timed at the start and at the end of the session; and how much
memory it had in use at the worst moment, with the processes its kernel killed for memory.

Why: the CI budget is counted in wall-clock minutes on a shared virtual machine whose speed
varies by up to half between runs (the same nine `verify` trainings of the same code took
173 to 273 CPU-s on different runs; docs/setup.md). A run's minutes say little without
the machine's speed at the time; printed beside them, two runs can be compared by what
they did rather than by their neighbours. The step is the costliest computation of the
suite: a training step of the sweep's MNIST-1D CNN at batch 1024 on one thread, what
`verify` and the book's chapters 4-7 repeat hundreds of times.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

# CPU milliseconds of each of 10 steps (after 3 to warm up), one per line.
_STEP = """
import time, torch
torch.set_num_threads(1)
from guide_utils.engine.models import mnist1d_cnn
torch.manual_seed(0)
model = mnist1d_cnn(10)
x, y = torch.randn(1024, 1, 40), torch.randint(0, 10, (1024,))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for i in range(13):
    t = time.process_time()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if i >= 3:
        print((time.process_time() - t) * 1000)
"""


def busy_seconds(stat: str | None = None) -> tuple[float, float]:
    """CPU-seconds this machine has spent busy since it booted, all cores together (user,
    nice, system, interrupts), and the seconds its hypervisor gave to others (steal): from
    /proc/stat's first line, or ``stat``."""
    if stat is None:
        with open("/proc/stat") as f:
            stat = f.readline()
    name, *ticks = stat.split()
    if name != "cpu" or len(ticks) < 8:
        raise ValueError(f"not /proc/stat's first line: {stat!r}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(t) for t in ticks[:8])
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def memory_in_use(meminfo: str | None = None) -> tuple[float, float]:
    """(GiB in use, GiB in all): MemTotal less MemAvailable from /proc/meminfo (or ``meminfo``),
    the memory no process could get back without something being killed or swapped."""
    if meminfo is None:
        with open("/proc/meminfo") as f:
            meminfo = f.read()
    kib = {line.split(":")[0]: int(line.split()[1]) for line in meminfo.splitlines() if line.count(":") == 1
           and len(line.split()) >= 2 and line.split()[1].isdigit()}
    if "MemTotal" not in kib or "MemAvailable" not in kib:
        raise ValueError("no MemTotal or MemAvailable line: not /proc/meminfo")
    return (kib["MemTotal"] - kib["MemAvailable"]) / 2**20, kib["MemTotal"] / 2**20


def oom_kills(vmstat: str | None = None) -> int:
    """How many processes the kernel's out-of-memory killer has killed since boot (the
    ``oom_kill`` line of /proc/vmstat, or of ``vmstat``). A test job whose task dies with
    SIGKILL (exit 137) and nothing else to say may have been one of them: the count, compared
    before and after, tells."""
    if vmstat is None:
        with open("/proc/vmstat") as f:
            vmstat = f.read()
    for line in vmstat.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    raise ValueError("no oom_kill line (a kernel before 4.13?)")


def oom_lines(count: int = 3) -> list[str]:
    """The kernel log's last ``count`` lines about out-of-memory kills ("Out of memory: Killed
    process PID (NAME) ..."), which name the process; [] where the log cannot be read."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if "Killed process" in line][-count:]


def step_ms(timeout: float = 120) -> str:
    """The median CPU time of the reference step in a fresh process, as text ("41.2 ms"),
    or why it could not be measured; never raises."""
    try:
        out = subprocess.run([sys.executable, "-c", _STEP], capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not measured ({type(exc).__name__})"
    if out.returncode != 0:
        return f"not measured (exit {out.returncode}: {(out.stderr.strip().splitlines() or [''])[-1][:120]})"
    return f"{statistics.median(float(v) for v in out.stdout.split()):.1f} ms"
