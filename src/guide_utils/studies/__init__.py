"""Named sets of runs: the thesis's nine experiments at two scales (``experiments``) and the
quality sweep over the scaling factor k (``sweep``)."""
