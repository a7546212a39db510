"""The tools layer, above studies (beside ``cluster``): performance engineering. The
communication benchmark (``comms``), the data-parallel step model and allocation planner
(``model``, ``planner``) and the step-wise tuning switches (``tuning``)."""
