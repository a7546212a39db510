# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# Illustrative; check your centre's user guide. The layout of LUMI-G (HPE Cray, Slingshot):
# 4 MI250X per node, each two GCDs that Slurm and ROCm count as one GPU each, so 8 GPUs per
# node; one 64-core CPU. Software from CSC's PyTorch module (ROCm) with a venv on top, no
# container, no forced module purge. Not run on LUMI; values marked "placeholder" are ours,
# the others are from these pages:
#   https://docs.lumi-supercomputer.eu/hardware/lumig/  8 GCDs, no local disk, 4 Slingshot NICs
#   https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/partitions/  standard-g, small-g
#   https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/distribution-binding/  56 cores, masks
#   https://docs.lumi-supercomputer.eu/runjobs/lumi_env/storing-data/  /project, /scratch, /tmp in memory
#   https://github.com/Lumi-supercomputer/LUMI-AI-Guide  (05 multi-GPU, 04 data storage) RCCL variables, --mem
#   https://lumi-supercomputer.github.io/LUMI-training-materials/  (2day-20250602: Slurm, CPE, modules;
#       intro-evolving, "Former AI containers on LUMI-G": MIOpen's caches moved to /tmp)
#   https://docs.csc.fi/apps/pytorch/  `module use /appl/local/csc/modulefiles/`, then module load pytorch
#   https://github.com/HewlettPackard/shs-ccl-docs  HPE's libfabric settings for NCCL/RCCL on Slingshot
GUIDE_ACCOUNT="project_465000000"  # placeholder: your LUMI project
# Whole nodes: CPU binding as below is meant for full-node allocations only (LUMI's binding
# page). A job of fewer GCDs than a node (01) goes to small-g, LUMI's partition that allocates
# by resources instead of by whole nodes (partitions page), with no masks and the memory of
# its GCDs (480G / 8 GCDs: our arithmetic, placeholder): GUIDE_SHARED_* below.
GUIDE_PARTITION=standard-g
GUIDE_TASKS_PER_NODE=8             # one task per GCD
GUIDE_CPUS_PER_TASK=7              # 56 usable cores / 8: the first core of each 8-core L3 group is reserved
GUIDE_GPU_REQUEST="--gpus-per-node=%d"
# Each task's 7 cores next to its GCD: task N drives GCD N (the engine picks the GPU by local
# rank), and GCDs 0-7 sit on NUMA nodes 3,3,1,1,0,0,2,2, so the masks are LUMI's, in that
# order. SMT: LUMI's Slurm counts a core as one CPU and starts job steps without the second
# hardware thread (--hint=nomultithread is its default); the masks name each core's first
# thread (ids 0-63; 64-127 are the second threads). Using both needs --hint=multithread in
# GUIDE_SBATCH_EXTRA and the sibling bits in every mask: not done here.
GUIDE_SRUN_ARGS=("--cpu-bind=mask_cpu:fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000")
# No node-local disk: /tmp is in memory and counts against the job's memory; on standard-g
# about 460 GB of it can hold files, and the unpacked dataset must fit there beside the job.
# (The staging accepts it: tmpfs is the node's own, not a network file system.) Where it
# does not fit (a few GCDs of small-g), leave GUIDE_DATASET_ARCHIVE empty and read an unpacked
# copy in place, e.g. GUIDE_TRAIN_ARGS=(--data /flash/project_465000000/ilsvrc2012) on LUMI-F:
# no staging, every small read then goes to the parallel file system (slower epochs).
GUIDE_SCRATCH=/tmp
GUIDE_SOFTWARE=modules
# CSC's PyTorch modules live outside LUMI's default module path. Putting the folder on
# MODULEPATH is what `module use` does; here it works before any module command runs.
[[ :${MODULEPATH:-}: == *:/appl/local/csc/modulefiles:* ]] ||
    export MODULEPATH=/appl/local/csc/modulefiles${MODULEPATH:+:$MODULEPATH}
# 2.7.1 on LUMI in CSC's table; no Horovod from 2.1 on. PyTorch 2.6 or later: the examples of
# chapter 16 call torch.accelerator. CSC's page also says that since LUMI's service break of
# January 2026 its LUMI modules do not reach Slingshot (multi-node jobs 10-20% slower) and calls
# them deprecated in favour of the LUMI AI Factory's containers: check before a multi-node run.
GUIDE_MODULES="pytorch/2.7"
# TensorFlow (08) needs a GPU build here, e.g. the site's TensorFlow module (not checked): one that sees
# no GPU, or none at all, stops 08 at the doctor instead of training on the CPU.
# Cray systems preload their programming environment as modules; LUMI reloads its sticky
# ones on a purge, which its course notes warn may have side effects. So no purge.
GUIDE_MODULE_PURGE=no
# The guide's small packages in a venv that also sees the module's (CSC's Python guide):
#   module load pytorch/2.7; python3 -m venv --system-site-packages /project/project_465000000/guide-venv
#   then activate it and pip install "guide_utils' own needs" from requirements.txt. (Where a
#   module's wrappers refuse a venv, use PYTHONUSERBASE and pip install --user: puhti-like.sh.)
GUIDE_VENV=/project/project_465000000/guide-venv  # placeholder project
# One large sequential read per node; /flash (LUMI-F) reads about 10x faster but is billed more.
GUIDE_DATASET_ARCHIVE=/scratch/project_465000000/datasets/ilsvrc2012.tar  # placeholder
GUIDE_DATASET_NAME=ilsvrc2012      # placeholder: the folder in the archive with train/ and val/
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=()                # e.g. (--amp bf16)
# Cray MPICH has no mpirun: srun starts MPI programs, through Slurm's plugin for the HPE Cray
# PMI. LAUNCHER=mpirun in 03 therefore stops with one line here; Horovod under srun would also
# need a Horovod built against Cray MPICH, which the module above does not include.
GUIDE_SRUN_MPI=cray_shasta
GUIDE_SBATCH_EXTRA=(--mem=480G)    # what LUMI's AI guide asks for a full node
GUIDE_SHARED_SBATCH=(--partition=small-g --mem-per-gpu=60G)
GUIDE_SHARED_SRUN_ARGS=()
# No Horovod in CSC's PyTorch modules from 2.1 on: the scripts default to DDP.
GUIDE_HOROVOD=no
# Run records and checkpoints on the project's scratch (LUMI-P Lustre), not in $HOME.
GUIDE_OUTPUT=/scratch/project_465000000/$USER/guide  # placeholder project
# RCCL reads the NCCL_* names. Without the Slingshot interfaces RCCL tries one it cannot use
# and inter-node GPU traffic fails; PHB lets GPU RDMA reach the NIC next to each GCD (the
# default from ROCm 6.2 on). HPE's RCCL note (shs-ccl-docs, rccl/rccl_tuning_guide.md):
# NCCL_NET="AWS Libfabric" makes RCCL stop when the libfabric (OFI) plugin does not load,
# instead of falling back to TCP sockets in silence; NCCL_CROSS_NIC=1 "has been found to
# improve performance on large systems". The job's doctor also reads RCCL's own line about
# the plugin (NCCL_DEBUG=INFO) from a short probe on multi-node GPU jobs.
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3 NCCL_NET_GDR_LEVEL=PHB NCCL_NET="AWS Libfabric" NCCL_CROSS_NIC=1
# Gloo (DDP's CPU-side collectives, such as the engine's stop flag; Horovod's Gloo) picks the
# interface of the node's name otherwise, often the management network: the high-speed one.
export GLOO_SOCKET_IFNAME=hsn0
# HPE's libfabric settings for NCCL/RCCL on Slingshot: a registration-cache monitor that
# notices remapped pages, no provider calls that may deadlock, a larger completion queue.
export FI_MR_CACHE_MONITOR=userfaultfd FI_CXI_DISABLE_HOST_REGISTER=1 FI_CXI_DEFAULT_CQ_SIZE=131072
# MIOpen (ROCm's convolutions) keeps its find database and compiled kernels under $HOME by
# default, and it "has problems with file/record locking on Lustre" (LUMI's course notes): the
# node's own /tmp instead, one folder per job (MIOpen creates it on each node), as LUMI's
# examples do.
export MIOPEN_USER_DB_PATH=/tmp/$USER-miopen-${SLURM_JOB_ID:-0}
export MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH
# Horovod (DIST=horovod): when some ranks wait for others that never send their tensors (a
# hung node, a rank stuck in I/O), Horovod warns after 60 s and by default never stops, so
# the job idles until its time limit. Ours: warn at 2 minutes, shut down at 10 (Horovod
# shuts down only when that is longer than the warning time; see horovodrun --help).
export HOROVOD_STALL_CHECK_TIME_SECONDS=120 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600
