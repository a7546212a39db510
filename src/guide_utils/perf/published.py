"""Published scaling results, with every input the step model needs and where it comes from.

Each case is a training someone measured on many GPUs and published: the model, one GPU's
throughput at the per-worker batch, the interconnect, and the efficiency they report. Where
a source does not state an input the model needs, the case says which value was taken
instead and from where (``assumed``), so that the comparison in chapter 11 is honest about
what it is comparing. :func:`compare` predicts each case twice, with no overlap of backward
computation and communication and with full overlap: a published efficiency inside that
range is one the model explains; outside it, something the model leaves out dominated.

Efficiencies are against the same source's own single-GPU number unless ``relative_to``
says otherwise (Goyal et al. report 8 to 256 GPUs).
"""

from __future__ import annotations

from typing import Any

from .model import PARAMETERS, Network, Workload, predict

FDR_IB = "56Gbit/s"  # 4x FDR InfiniBand, the thesis's Taito nodes (thesis section 4.1)
A100_NVLINK = "300GB/s"  # third-generation NVLink: 600 GB/s per GPU, both directions together

CASES: list[dict[str, Any]] = [
    *({"case": f"thesis, Horovod + PyTorch, {n} P100", "source": "thesis", "model": "resnet50", "batch": 128,
       "rate": 207.79, "rate_source": "thesis Table 3", "network": FDR_IB, "network_source": "thesis 4.1 (FDR IB)",
       "gpus_per_node": 4, "workers": n, "published": round(rate / (n * 207.79), 4),
       "published_source": "thesis Tables 3 and 9", "assumed": ""}
      for n, rate in ((8, 1551.51), (16, 3150.76), (24, 4711.65), (32, 6104.32))),
    *({"case": f"thesis, Horovod + TensorFlow, 32 P100, batch {b}", "source": "thesis", "model": "resnet50",
       "batch": b, "rate": one, "rate_source": "thesis Table 1", "network": FDR_IB,
       "network_source": "thesis 4.1 (FDR IB)", "gpus_per_node": 4, "workers": 32,
       "published": round(rate / (32 * one), 4), "published_source": "thesis Tables 1 and 7", "assumed": ""}
      for b, one, rate in ((32, 210.15, 4767.74), (64, 234.01, 6210.3), (128, 249.28, 6643.48))),
    {"case": "NVIDIA DGX A100, 8 A100, TF32", "source": "nvidia_rn50", "model": "resnet50", "batch": 256,
     "rate": 938.0, "rate_source": "NVIDIA RN50 v1.5 README", "network": A100_NVLINK,
     "network_source": "A100 NVLink: 600 GB/s bidirectional", "gpus_per_node": 8, "workers": 8,
     "published": round(7248 / (8 * 938), 4), "published_source": "NVIDIA RN50 v1.5 README (7248 img/s)",
     "assumed": "batch 256 from the repository's configs.yml"},
    {"case": "NVIDIA DGX A100, 8 A100, AMP", "source": "nvidia_rn50", "model": "resnet50", "batch": 256,
     "rate": 2470.0, "rate_source": "NVIDIA RN50 v1.5 README", "network": A100_NVLINK,
     "network_source": "A100 NVLink: 600 GB/s bidirectional", "gpus_per_node": 8, "workers": 8,
     "published": round(16621 / (8 * 2470), 4), "published_source": "NVIDIA RN50 v1.5 README (16621 img/s)",
     "assumed": "batch 256 from the repository's configs.yml"},
    {"case": "Horovod docs, 512 Pascal GPUs, ResNet-101", "source": "horovod_docs", "model": "resnet101",
     "batch": 64, "rate": 1656.82 / 16, "rate_source": "the docs' example output (16 GPUs) per GPU",
     "network": "25Gbit/s", "network_source": "Horovod docs (RoCE)", "gpus_per_node": 4, "workers": 512,
     "published": 0.90, "published_source": "Horovod v0.28.1 docs, benchmarks",
     "assumed": "one GPU's rate: the docs' 16-GPU example output per GPU (no single-GPU number given)"},
    {"case": "Horovod docs, 512 Pascal GPUs, VGG-16", "source": "horovod_docs", "model": "vgg16", "batch": 64,
     "rate": 1656.82 / 16 * 7.801 / 15.47, "rate_source": "ResNet-101's rate x 7.801/15.47 GFLOPs",
     "network": "25Gbit/s", "network_source": "Horovod docs (RoCE)", "gpus_per_node": 4, "workers": 512,
     "published": 0.68, "published_source": "Horovod v0.28.1 docs, benchmarks",
     "assumed": "one GPU's rate scaled from ResNet-101's by the models' forward GFLOPs (torchvision: 7.801 "
                "vs 15.47)"},
    {"case": "Goyal et al., 256 P100 (vs 8), batch 32", "source": "goyal2017", "model": "resnet50", "batch": 32,
     "rate": 210.15, "rate_source": "thesis Table 1 (P100, batch 32)", "network": "50Gbit/s",
     "network_source": "Goyal et al. (50 Gbit Ethernet)", "gpus_per_node": 8, "workers": 256, "relative_to": 8,
     "published": 0.90, "published_source": "Goyal et al. 2017 (~90 % from 8 to 256 GPUs)",
     "assumed": "one P100's rate from the thesis (Caffe2's own is not given)"},
    {"case": "Summit, 6144 V100 (1024 nodes)", "source": "summit", "model": "resnet50", "batch": 256,
     "rate": 1200.0, "rate_source": "NVIDIA RN50 v1.5 README (V100, AMP)", "network": "25GB/s",
     "network_source": "Summit: dual-rail EDR InfiniBand, 2 x 100 Gbit/s per node", "gpus_per_node": 6,
     "workers": 6144, "published": 0.87, "published_source": "Yin et al. 2019 (abstract)",
     "assumed": "one V100's rate and batch from NVIDIA's AMP numbers (the abstract gives neither)"},
]


def predict_case(case: dict[str, Any], overlap: float, latency: str = "5us") -> float:
    """The model's efficiency for one case (against ``relative_to`` workers when given)."""
    work = Workload(PARAMETERS[case["model"]], case["batch"], case["rate"], overlap=overlap)
    net = Network.of(case["network"], latency)
    eff = predict(work, net, case["workers"]).efficiency
    base = case.get("relative_to")
    if base:  # within one node the GPUs' own links carry it (NVLink in Goyal et al.'s servers)
        eff /= predict(work, Network.of(A100_NVLINK, latency), base).efficiency
    return eff


def compare(cases: list[dict[str, Any]] | None = None, latency: str = "5us"):
    """Every case with the model's efficiency at no overlap and at full overlap, whether the
    published number falls inside that range, and by how much it misses it otherwise."""
    import pandas as pd

    rows = []
    for c in cases or CASES:
        low, high = predict_case(c, 0.0, latency), predict_case(c, 1.0, latency)
        pub = c["published"]
        miss = 0.0 if low - 1e-9 <= pub <= high + 1e-9 else (pub - low if pub < low else pub - high)
        compute = c["batch"] / c["rate"]
        # A published efficiency below the no-overlap prediction: the step time it implies,
        # minus the model's (compute + the whole allreduce), is what the model leaves out.
        unexplained = max(0.0, compute / pub - compute / low) if pub < low else 0.0
        rows.append({**c, "predicted_no_overlap": low, "predicted_full_overlap": high, "inside": miss == 0.0,
                     "miss": miss, "compute_ms": 1e3 * compute, "unexplained_ms_per_step": 1e3 * unexplained})
    return pd.DataFrame(rows)
