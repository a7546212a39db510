"""The runtime layer, above core: what the launcher and the node tell a process. Which
launcher started it and what that launcher says (``launchers``: one class per launcher,
ranks, world, main address, GPUs, CPUs, the backends it can start); the batch job it runs
in (``schedulers``: Slurm, LSF or PBS, the job's id, nodes and submission directory;
``slurm``: Slurm's variables and node lists in full; ``variables``: the one reader of their
numbers); the rendezvous port, derived from the job id, checked on the main node and agreed
on (``rendezvous``); which GPUs it sees and which one a rank takes (``gpus``); command lines
for the local launchers (``launch``); and the one way of starting a launcher, several
workers or a tool on this machine, printing the command a reader would type (``local``, in
the workers' environment: ``local_env``)."""
