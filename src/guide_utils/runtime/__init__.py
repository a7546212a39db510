"""The runtime layer, above core: what the launcher and the node tell a process. The Slurm
job as a process sees it (``slurm``: job variables, node lists, the rendezvous) and which
launcher started it, with the checks that it was started as the chosen backend needs
(``launch``); which GPUs it sees and which one a rank takes (``gpus``); and the one way
of starting a launcher, several workers or a tool on this machine, printing the command a
reader would type (``local``)."""
