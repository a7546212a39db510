"""The doctor's report as a person reads it: one ``name: value`` line per fact, then the
warnings, the problems and the verdict.
"""

from __future__ import annotations

from typing import Mapping

from .diagnosis import Diagnosis
from .facts import Facts


def _mark(flags: Mapping[str, bool] | None) -> str:
    if flags is None:
        return "unknown (no framework extension of Horovod loads)"
    return "  ".join(f"[{'X' if on else ' '}] {name}" for name, on in flags.items())


def render(facts: Facts, diagnosis: Diagnosis) -> str:
    """The report a person reads; one ``name: value`` line per fact."""
    probed, skipped = facts.job.probes(), facts.job.skipped()
    rows: list[tuple[str, str]] = [("host", facts.host), ("python", facts.python)]
    t = facts.torch
    if "torch" in probed:
        t_ = t or {}
        build = f"ROCm {t_['torch_hip']}" if t_.get("torch_hip") else f"CUDA {t_.get('torch_cuda') or 'none'}"
        kernels = f"; kernels for {' '.join(t_['arch_list'])}" if t_.get("arch_list") else ""
        rows += [("torch", f"{t['torch']} ({build}{kernels})" if t else "not usable"),
                 ("torchvision", t["torchvision"] if t else "not usable")]
    else:
        rows.append(("torch", skipped))
    tf = facts.tensorflow
    tf_build = f"; {tf['build']} build" if tf and tf.get("build") else ""
    rows.append(("tensorflow", (f"{tf['tensorflow']} (Keras {tf['keras']}{tf_build})" if tf else "not usable")
                 if "tensorflow" in probed else skipped))
    h = facts.horovod
    if "horovod" not in probed:
        rows.append(("horovod", skipped))
    elif h:
        rows += [("horovod", h["horovod"]),
                 ("  frameworks", _mark(h["frameworks"])),
                 ("  controllers", _mark(h["controllers"])),
                 ("  tensor operations", _mark(h["operations"]))]
    else:
        rows.append(("horovod", "not usable"))
    if "horovod" in probed:
        rows.append(("mpi", facts.mpi or "none on PATH"))
    gpus = facts.gpus
    rows.append(("gpus", f"{len(gpus)} x {gpus[0]['name']} ({gpus[0]['memory_gib']} GiB)" if gpus
                 else skipped if facts.job.quick else "none"))
    if facts.slingshot:
        rows.append(("network", f"HPE Slingshot ({facts.slingshot}); OFI plugin: {facts.ofi_plugin or 'none found'}"))
    job = facts.slurm
    if job is None:
        rows.append(("slurm job", "none (not inside a Slurm allocation)"))
    else:
        rows += [("slurm job", str(job.job_id)),
                 ("  nodes", f"{job.num_nodes}: {','.join(job.nodes)}"),
                 ("  tasks", str(job.ntasks)),
                 ("  tasks per node", ",".join(map(str, job.tasks_per_node)) or "unknown"),
                 ("  cpus per task", str(job.cpus_per_task) if job.cpus_per_task is not None else "unset"),
                 ("  gpus per node", str(job.gpus_per_node) if job.gpus_per_node is not None else "none requested"),
                 ("  rendezvous", "%s:%d" % job.rendezvous() if job.nodes else "unknown")]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
    lines += [f"WARNING: {w}" for w in diagnosis.warnings]
    lines += [f"PROBLEM: {p}" for p in diagnosis.problems]
    verdict = "not checked (--quick)" if facts.job.quick else "yes" if diagnosis.usable else "NO"
    lines.append(f"stack usable: {verdict} (for {facts.job.describe()})")
    return "\n".join(lines)
