"""The SLICES slides' benchmark, predicted before it is run: ResNet on 1 to 10 nodes of one GPU
each, per-worker batch 32, 64 and 96, over a 1 and a 10 Gbit/s network.

The slides measured throughput and scaling efficiency on the Virtual Wall testbed; their text
gives the settings, not the numbers. This module gives the guide's step model's answer for
the same grid (:mod:`guide_utils.perf.model`, through the planner's candidates), from what one
GPU does alone at each batch: the throughput efficiency (``t_c / step``, what a benchmark of a
few hundred batches measures) and the planner's time-to-solution efficiency of a 90-epoch
ImageNet training with the thesis's overheads. The networks are Ethernet without RDMA, so
each ring step costs a TCP latency (30 us, the planner's figure for TCP).

The experiment ``slices`` of :mod:`guide_utils.studies.experiments` measures the same grid;
ten separate one-GPU jobs have no communication at all, so their efficiency is 1 by
construction, and the 10-node row is what "one job with ten GPUs" is predicted to reach.

>>> t = prediction({32: 200.0}, nodes=(1, 10))
>>> t[["network", "batch", "nodes", "efficiency"]].round(3).values.tolist()
[['1Gbit/s', 32, 1, 1.0], ['1Gbit/s', 32, 10, 0.098], ['10Gbit/s', 32, 1, 1.0], ['10Gbit/s', 32, 10, 0.52]]
"""

from __future__ import annotations

from ..core.errors import GuideError
from ..core.scaling import IMAGENET_TRAIN_IMAGES
from ..studies.experiment_plans import SLICES_BATCHES, SLICES_NODES
from .model import PARAMETERS, Network
from .planner import candidates

NETWORKS = ("1Gbit/s", "10Gbit/s")  # the slides' two Virtual Wall environments
TCP_LATENCY = "30us"  # per ring step over TCP (the planner's --latency hint for TCP)
COLUMNS = ("network", "batch", "nodes", "workers", "global_batch", "compute_s", "allreduce_s", "step_s",
           "images_per_second", "efficiency", "tts_efficiency")


def thesis_one_gpu_rates(batches=SLICES_BATCHES) -> dict[int, float]:
    """One P100's images/s at each of ``batches``, from the thesis's single-GPU baseline (Table 1:
    Horovod + TensorFlow at per-worker batch 32, 64 and 128), linear between the measured batches
    (96 lies between 64 and 128: an interpolation, not a measurement). The thesis's PyTorch
    tables have batch 128 only.

    >>> {b: round(r, 2) for b, r in thesis_one_gpu_rates().items()}
    {32: 210.15, 64: 234.01, 96: 241.64}
    """
    import numpy as np

    from ..results.sources import thesis_table

    table = thesis_table(1).sort_values("per_worker_batch")
    measured = table["per_worker_batch"].to_numpy()
    outside = [b for b in batches if not measured.min() <= b <= measured.max()]
    if outside:
        raise GuideError(f"the thesis measured one GPU at batches {', '.join(map(str, measured))}; "
                         f"{outside} lies outside them: give your own rates")
    rates = np.interp(batches, measured, table["images_per_second"].to_numpy())
    return {int(b): float(r) for b, r in zip(batches, rates)}


def prediction(rates: dict[int, float], *, networks=NETWORKS, latency: str = TCP_LATENCY, nodes=SLICES_NODES,
               model: str = "resnet50", overlap: float = 0.0, epochs: int = 90, images: int = IMAGENET_TRAIN_IMAGES):
    """The predicted grid, one row per network, batch and node count (one GPU per node).

    ``rates``: one GPU alone, ``{per-worker batch: images/s}`` (measure them: the experiment's
    runs 0-2). ``overlap``: the share of the backward pass that hides communication (0: none,
    the planner's default). ``epochs`` and ``images`` only feed ``tts_efficiency``."""
    import pandas as pd

    if model not in PARAMETERS:
        raise GuideError(f"unknown model {model!r}; choose from {', '.join(PARAMETERS)}")
    nodes = sorted(set(nodes))
    if not nodes or nodes[0] < 1:
        raise GuideError(f"node counts must be positive integers, got {nodes}")
    parts = []
    for net in networks:
        table = candidates(rates, PARAMETERS[model], Network.of(net, latency), gpus_per_node=1, max_nodes=nodes[-1],
                           epochs=epochs, images=images, overlap=overlap)
        parts.append(table[table["nodes"].isin(nodes)].assign(network=net))
    out = pd.concat(parts, ignore_index=True).rename(columns={"per_worker_batch": "batch"})
    return out[list(COLUMNS)].sort_values(["network", "batch", "nodes"], key=_network_order,
                                          ignore_index=True)


def _network_order(column):
    """Networks in the order given (``1Gbit/s`` before ``10Gbit/s``), other columns as they are."""
    if column.name != "network":
        return column
    from .units import parse_bandwidth

    return column.map(parse_bandwidth)
