# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# Bring your own cluster: the cluster ansible/site.yml builds (book chapter 18), with the
# values of the playbook's defaults and of its slices-testbed inventory: partition gpu, the
# guide and its venv on the NFS share (/guide/guide), Slurm's PMIx plugin for srun, one GPU
# per node as on the SLICES testbed. Change GUIDE_TASKS_PER_NODE to the inventory's `gpus`
# (4 in head-gpu-nodes) and GUIDE_CPUS_PER_TASK to the nodes' CPUs / GPUs (sinfo -o '%c');
# tests/test_site_profiles.py checks the other values against ansible/.
GUIDE_ACCOUNT=""              # the playbook sets up no accounting: no --account
GUIDE_PARTITION=gpu           # slurm_partition_name
GUIDE_TASKS_PER_NODE=1        # the inventory's gpus per compute node (slices-testbed: 1)
GUIDE_CPUS_PER_TASK=4         # placeholder: the nodes' CPUs / GPUs
GUIDE_GPU_REQUEST="--gpus-per-node=%d"  # gres.conf lists each node's GPUs (roles/slurm)
GUIDE_SCRATCH=""              # $TMPDIR, else /tmp: the node's own disk, not the NFS share
GUIDE_SOFTWARE=venv
GUIDE_VENV=/guide/guide/.venv  # guide_venv: roles/guide_env ran scripts/setup.sh there
# The SLICES benchmark trains on synthetic images and needs no archive; for ImageNet, pack it
# into guide_data_dir (python -m guide_utils prepare-imagenet ... /guide/data/ilsvrc2012.tar)
# and set both values.
GUIDE_DATASET_ARCHIVE=${GUIDE_DATASET_ARCHIVE:-}
GUIDE_DATASET_NAME=${GUIDE_DATASET_NAME:-ilsvrc2012}
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=()
GUIDE_SRUN_MPI=pmix           # slurm_mpi_default; roles/slurm installs libpmix2 on the nodes
GUIDE_SBATCH_EXTRA=()
GUIDE_HOROVOD=no              # roles/guide_env's Horovod has Gloo and MPI, no NCCL: DDP by default on GPUs
# The link between the nodes, recorded with every run (the inventory's guide_network_gbit):
# the testbed's experiment network runs at 10 Gbit/s or, reconfigured, at 1 Gbit/s. Submit
# the runs on the slower one as GUIDE_NETWORK=1Gbit/s slurm_examples/submit.sh ...
export GUIDE_NETWORK=${GUIDE_NETWORK:-10Gbit/s}
# Ethernet without RDMA: NCCL and Gloo over TCP on the experiment network, whose interface
# name the testbed decides (ip -br addr on a node). Set both: without GLOO_SOCKET_IFNAME, Gloo
# takes the address of the node's name, which Debian's /etc/hosts maps to 127.0.1.1 before
# any line the playbook adds, and multi-node DDP fails at its start. E.g.
# export NCCL_SOCKET_IFNAME=enp2s0 GLOO_SOCKET_IFNAME=enp2s0
