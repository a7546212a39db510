"""The studies layer, above results: named sets of runs. The thesis's nine experiments at
two scales (``experiments``) and the quality sweep over the scaling factor k (``sweep``),
the same question past the linear rule (``large_batch``), and the distributed-training
pitfalls, each reproduced (``pitfalls``)."""
