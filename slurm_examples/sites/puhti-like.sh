# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# Illustrative; check your centre's user guide. The layout of CSC's Puhti GPU nodes (4 V100
# and 40 cores per node, node-local NVMe) with the site's PyTorch module and no venv: the
# modules-only variant (guide.sh puts the repository's src/ on PYTHONPATH). Not run on
# Puhti; values marked "placeholder" are ours, the others are from these pages:
#   https://docs.csc.fi/computing/running/creating-job-scripts-puhti/  --gres=gpu:v100:N,nvme:GB, $LOCAL_SCRATCH, srun
#   https://docs.csc.fi/computing/running/batch-job-partitions/  gpu partition, at most 10 cores per GPU
#   https://docs.csc.fi/computing/systems-puhti/  GPU nodes: 2 x 20 cores, 4 V100, 384 GiB, 3.6 TB NVMe
#   https://docs.csc.fi/apps/pytorch/  module load pytorch/VERSION; Horovod removed from 2.1 on
#   https://docs.csc.fi/support/tutorials/ml-multi/  module purge first; cores and memory per GPU
#   https://docs.csc.fi/support/tutorials/python-usage-guide/  pip install --user with PYTHONUSERBASE
GUIDE_ACCOUNT="project_2001234"  # placeholder: your CSC project (Puhti has no default one)
GUIDE_PARTITION=gpu              # gputest: 15 minutes, 2 nodes, for a first try
GUIDE_TASKS_PER_NODE=4           # 4 V100 per node
GUIDE_CPUS_PER_TASK=10           # 40 cores / 4 GPUs, CSC's maximum per GPU
# GPUs and the node-local NVMe in one --gres list: Slurm keeps only the last --gres option.
# nvme is GB per node (at most 3600); 200 is a placeholder, the unpacked dataset plus room.
GUIDE_GPU_REQUEST="--gres=gpu:v100:%d,nvme:200"
GUIDE_SCRATCH=${LOCAL_SCRATCH:-}  # that NVMe: set in jobs that ask for nvme, emptied by CSC after each
GUIDE_SOFTWARE=modules
# CSC's module: PyTorch and CUDA, wrapped from a container so that `python` works as usual.
# 2.9 is Puhti's default in CSC's table (`module avail pytorch` shows today's); the examples of
# chapter 16 need 2.6 or later (torch.accelerator). From 2.1 on it has no Horovod, so run the
# DDP paths (DIST=ddp; 03 with LAUNCHER=torchrun or srun-ddp).
GUIDE_MODULES="pytorch/2.9"
# TensorFlow (08) needs a GPU build here, e.g. the site's TensorFlow module (not checked): one that sees
# no GPU, or none at all, stops 08 at the doctor instead of training on the CPU.
GUIDE_MODULE_PURGE=yes           # CSC's own examples purge before loading
GUIDE_HOROVOD=no                 # no Horovod in the module from 2.1 on: the scripts default to DDP
# Puhti's gpu partition allocates by resources (GPUs, cores, memory), not whole nodes: no
# GUIDE_SHARED_SBATCH needed. Run records and checkpoints on the project's scratch:
GUIDE_OUTPUT=/scratch/project_2001234/$USER/guide  # placeholder project
GUIDE_VENV=""                    # modules only
# The guide's own small packages (requirements.txt, "guide_utils' own needs") go beside the
# module, once, on a login node; pip leaves alone what the module already has:
#   module load pytorch/2.9; export PYTHONUSERBASE=/projappl/project_2001234/guide-python
#   pip install --user python-hostlist psutil nvidia-ml-py timm PyYAML Pillow tqdm mnist1d pandas scikit-learn
export PYTHONUSERBASE=/projappl/project_2001234/guide-python  # placeholder project, as above
GUIDE_DATASET_ARCHIVE=/scratch/project_2001234/datasets/ilsvrc2012.tar  # placeholder
GUIDE_DATASET_NAME=ilsvrc2012    # placeholder: the folder in the archive with train/ and val/
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=()              # e.g. (--amp fp16 --channels-last): V100 has no bf16
GUIDE_SRUN_ARGS=()               # no binding beyond Slurm's defaults
# Placeholder, not checked (`srun --mpi=list`). It matters only for Horovod under srun, which
# the modules above do not have. CSC asks for srun, not mpirun, for MPI jobs.
GUIDE_SRUN_MPI=pmix
# Memory in proportion to the GPUs (CSC's rule of thumb, about 95 GB per GPU): 9 GB per core
# is 90 GB per GPU with 10 cores each, 360 GB for a whole node. Billing counts what is asked.
GUIDE_SBATCH_EXTRA=(--mem-per-cpu=9G)
# Horovod (DIST=horovod): when some ranks wait for others that never send their tensors (a
# hung node, a rank stuck in I/O), Horovod warns after 60 s and by default never stops, so
# the job idles until its time limit. Ours: warn at 2 minutes, shut down at 10 (Horovod
# shuts down only when that is longer than the warning time; see horovodrun --help).
export HOROVOD_STALL_CHECK_TIME_SECONDS=120 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600
