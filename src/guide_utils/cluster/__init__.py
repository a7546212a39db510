"""The tools layer, above studies (beside ``perf``): working on a cluster. Checking the
stack and the job (``doctor``), proving that workers train one model (``sync_check``),
packing a dataset the way clusters store it (``pack``), site profiles (``sites``), notebooks
driving engines on the cluster (``interactive``, ``watchdog``), the container recipe
(``container``) and the OCI image built and run with podman (``image``, ``podman``)."""
