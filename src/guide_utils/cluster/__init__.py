"""Running on a cluster: the Slurm job as a process sees it (``slurm``), starting workers
(``launch``), checking the stack and the job (``doctor``), proving that workers train one
model (``sync_check``) and packing a dataset the way clusters store it (``pack``)."""
