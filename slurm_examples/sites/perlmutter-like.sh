# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# Illustrative; check your centre's user guide. The layout of NERSC Perlmutter's GPU nodes
# (HPE Cray, Slingshot): 4 A100 and one 64-core CPU with 2 hardware threads per core, GPU
# nodes chosen by a constraint and a QOS rather than a partition, GPUs asked per task.
# Software: the site's PyTorch module with a venv on top, no forced module purge. Not run on
# Perlmutter; values marked "placeholder" are ours, the others are from these pages:
#   https://docs.nersc.gov/systems/perlmutter/running-jobs/  -C gpu, -q regular, -c rule, --gpus-per-task
#   https://docs.nersc.gov/machinelearning/launchers/  -C gpu, 4 tasks per node, --cpus-per-task=32
#   https://github.com/NERSC/sc23-dl-tutorial  (submit_pm.sh) --gpus-per-task 1 --gpu-bind none, -q shared
#   https://docs.nersc.gov/filesystems/perlmutter-scratch/  $PSCRATCH
#   https://github.com/HewlettPackard/shs-ccl-docs  HPE's NCCL and libfabric settings for Slingshot
#   https://slurm.schedmd.com/srun.html  --gpus-per-task implies per-task GPU binding; --gpu-bind=none
GUIDE_ACCOUNT="m0000_g"   # placeholder: your NERSC project's GPU allocation
GUIDE_PARTITION=""        # none: NERSC's examples name no partition; -C gpu and a QOS choose the nodes
GUIDE_TASKS_PER_NODE=4    # 4 A100 per node
# Slurm counts hardware threads here: 64 cores x 2 = 128 CPUs, 32 per task for 4 tasks
# (NERSC's rule: -c = floor(64 / tasks per node) x 2); --cpu-bind=cores keeps each task on
# whole cores, 16 of them.
GUIDE_CPUS_PER_TASK=32
# One GPU per task, asked per task: the request does not scale with the tasks per node, so
# it has no %d. Slurm (21.08 on) then also binds each task to its GPU; --gpu-bind=none undoes it
# and every task sees the node's GPUs (the engine picks its own by local rank), as NERSC's
# SC23 tutorial does. Per-task binding kept NCCL off NVLink in one report (NVIDIA/nccl#1066).
GUIDE_GPU_REQUEST="--gpus-per-task=1"
GUIDE_SRUN_ARGS=(--cpu-bind=cores --gpu-bind=none)
# regular gives whole nodes; a job of fewer GPUs than a node (01) goes to the shared QOS, as
# NERSC's SC23 tutorial runs (-q shared; the QOSes: https://docs.nersc.gov/jobs/policy/).
GUIDE_SBATCH_EXTRA=(--constraint=gpu --qos=regular)
GUIDE_SHARED_SBATCH=(--constraint=gpu --qos=shared)
GUIDE_SHARED_SRUN_ARGS=(--cpu-bind=cores --gpu-bind=none)
# Placeholder: we did not check whether NERSC's PyTorch module has a Horovod built with NCCL;
# the scripts default to DDP, and DIST=horovod asks for Horovod where it is there.
GUIDE_HOROVOD=no
GUIDE_OUTPUT=$PSCRATCH/guide  # run records and checkpoints on the all-flash scratch, not in $HOME
GUIDE_SCRATCH=/tmp        # placeholder: we could not check what backs /tmp on the GPU nodes (the
                          # staging refuses it if it is a network file system; memory is fine)
GUIDE_SOFTWARE=modules
GUIDE_MODULES="pytorch"   # placeholder: NERSC's PyTorch module (`module avail pytorch`), version not checked
# TensorFlow (08) needs a GPU build here, e.g. the site's TensorFlow module (not checked): one that sees
# no GPU, or none at all, stops 08 at the doctor instead of training on the CPU.
GUIDE_MODULE_PURGE=no     # Cray systems preload their programming environment as modules
# The guide's small packages in a venv that also sees the module's packages:
#   module load pytorch; python -m venv --system-site-packages $HOME/venvs/guide-pm
#   then activate it and pip install "guide_utils' own needs" from requirements.txt
GUIDE_VENV=$HOME/venvs/guide-pm  # placeholder path
GUIDE_DATASET_ARCHIVE=$PSCRATCH/datasets/ilsvrc2012.tar  # placeholder; $PSCRATCH is all-flash Lustre
GUIDE_DATASET_NAME=ilsvrc2012    # placeholder: the folder in the archive with train/ and val/
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=()       # e.g. (--amp bf16 --channels-last)
# Cray MPICH has no mpirun: srun starts MPI programs, through Slurm's plugin for the HPE Cray
# PMI. LAUNCHER=mpirun in 03 therefore stops with one line here, and Horovod under srun needs
# a Horovod built against Cray MPICH (placeholder: not checked whether the module has one).
GUIDE_SRUN_MPI=cray_shasta
# NCCL over Slingshot goes through the libfabric (OFI) plugin; HPE's application note asks for
# the Slingshot interfaces (placeholder names: they must match the node's, `ip link`), RDMA
# between GPU and NIC (PHB), and libfabric's registration-cache monitor, no provider calls
# that may deadlock and a larger completion queue. NERSC's SC23 tutorial sets the monitor too.
# HPE's NCCL note (shs-ccl-docs, nccl/nccl_tuning_guide.md): NCCL_NET="AWS Libfabric" makes
# NCCL stop when the plugin does not load instead of falling back to TCP sockets in silence;
# NCCL_CROSS_NIC=1 "has been found to improve performance on large systems" (NERSC's own
# NCCL module for containers sets both). The job's doctor also reads NCCL's line about the
# plugin (NCCL_DEBUG=INFO) from a short probe on multi-node GPU jobs.
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3 NCCL_NET_GDR_LEVEL=PHB NCCL_NET="AWS Libfabric" NCCL_CROSS_NIC=1
# Gloo (DDP's CPU-side collectives, such as the engine's stop flag; Horovod's Gloo) picks the
# interface of the node's name otherwise, often the management network: the high-speed one.
export GLOO_SOCKET_IFNAME=hsn0
export FI_MR_CACHE_MONITOR=userfaultfd FI_CXI_DISABLE_HOST_REGISTER=1 FI_CXI_DEFAULT_CQ_SIZE=131072
# Horovod (DIST=horovod): when some ranks wait for others that never send their tensors (a
# hung node, a rank stuck in I/O), Horovod warns after 60 s and by default never stops, so
# the job idles until its time limit. Ours: warn at 2 minutes, shut down at 10 (Horovod
# shuts down only when that is longer than the warning time; see horovodrun --help).
export HOROVOD_STALL_CHECK_TIME_SECONDS=120 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600
