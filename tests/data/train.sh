#!/bin/bash
# A wrapper that runs the training command it is given as its child (no exec), as many a
# `bash train.sh` does after loading modules: Slurm's time-limit warning must reach the
# command, not this shell, which would die of it (tests/test_slurm_examples.py).
"$@"
