"""The core layer, the floor (CONTRIBUTING.md maps the layers): it imports nothing else of
the guide, and every layer may use it. The training settings and profiles (``config``), the
learning-rate scaling rules (``scaling``) and schedules (``schedules``), the thesis's
throughput formula (``throughput``), the run-record format (``records``), the guide's
one-line errors (``errors``), its strict command-line parser (``cli``), the training
flags (``flags``) and where packaged data and the repository are (``paths``)."""
