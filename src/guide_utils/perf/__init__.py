"""The tools layer, above studies (beside ``cluster``): performance engineering. The
communication benchmark (``comms``), the data-parallel step model, the time to solution of
a whole training and its calibration on the thesis's runs, and the allocation planner
(``model``, ``solution``, ``thesis_runs``, ``planner``) and the step-wise tuning switches
(``tuning``)."""
