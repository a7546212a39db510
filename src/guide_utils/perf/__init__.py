"""Performance engineering: the communication benchmark (``comms``), the data-parallel step
model and allocation planner (``model``, ``planner``) and the step-wise tuning switches
(``tuning``)."""
