# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# A site profile: everything about one centre that the examples need, and nothing else.
# Copy this file to sites/<your-centre>.sh, fill it in, and select it with
#   export GUIDE_SITE=<your-centre>     # required: there is no default site
# Every GUIDE_* value below is required unless marked optional or named for one kind of
# software (some may be empty, as noted); a missing one stops submit.sh and every job before
# anything runs, naming it. Variables of the job (e.g. $TMPDIR, $LOCAL_SCRATCH, $SLURM_JOB_ID)
# may be used: the profile is read again inside each job, and on the login node they are
# simply empty. Worked examples: puhti-like.sh (--gres, modules only), lumi-like.sh (AMD,
# binding masks), perlmutter-like.sh (GPUs per task, SMT), thesis-taito.sh, ci.sh.

GUIDE_ACCOUNT=""            # --account (billing project); empty: your default account
GUIDE_PARTITION=""          # --partition with GPU nodes; empty: the default partition (or a constraint below)
GUIDE_TASKS_PER_NODE=4      # training processes per node = GPUs per node (submit.sh --workers=N uses it)
GUIDE_CPUS_PER_TASK=8       # CPUs per process (data-loading workers): the node's CPUs / tasks, in
                            # Slurm's unit of the site (cores, or hardware threads where SMT counts)
# The GPU request, in the site's syntax. With %d: GPUs per node, %d becoming the tasks per node
# ("--gres=gpu:v100:%d", "--gpus-per-node=%d"; other GRES go in the same list, e.g.
# "--gres=gpu:v100:%d,nvme:200"). Without %d: a per-task request, passed as it is
# ("--gpus-per-task=1"). Empty on CPU-only sites.
GUIDE_GPU_REQUEST="--gpus-per-node=%d"
# The node-local disk the dataset is unpacked to, once per node: the job's own folder
# guide-<job id> goes there and is removed at the end. Your centre's local-disk variable, e.g.
# ${LOCAL_SCRATCH:-} (set only inside jobs), or empty for $TMPDIR (else /tmp). A network file
# system (NFS, Lustre, GPFS, BeeGFS...) is refused: staging exists to stop reading from one.
GUIDE_SCRATCH=""
GUIDE_SOFTWARE=venv         # venv | modules | apptainer
# TensorFlow (the 08 scripts): the `make`-built venv (scripts/setup.sh) and the guide's image have the
# lock's tensorflow-cpu, so TensorFlow runs on the CPU there and a GPU job with it stops at the doctor;
# for GPUs put tensorflow==2.15.1 in place of tensorflow-cpu (docs/usage.md, cluster install) or use
# the site's TensorFlow module. PyTorch sees the GPUs either way.
GUIDE_VENV=""               # venv (and optionally on top of modules): path with bin/activate;
                            # modules with GUIDE_VENV="": the module brings PyTorch, the guide
                            # runs from src/ (PYTHONPATH), its small packages via pip install --user
GUIDE_MODULES=""            # modules: what to `module load`, e.g. "pytorch/2.7" (2.6 or later: torch.accelerator)
GUIDE_MODULE_PURGE=no       # optional, modules: yes runs `module purge` first; no (default) keeps
                            # what is loaded (Cray systems such as LUMI preload their stack)
GUIDE_CONTAINER=""          # apptainer: path to the .sif image with guide_utils installed
GUIDE_APPTAINER_FLAGS=(--cleanenv --nv)  # apptainer (an array): --nv for NVIDIA GPUs, --rocm for AMD,
                            # binds (-B DIR); --cleanenv: no host variables inside but srun's and
                            # the job's (lib/apptainer_env.sh passes those). Bind the scratch disk
                            # (GUIDE_SCRATCH; empty: $TMPDIR, unless that is under /tmp, which
                            # apptainer binds itself) and GUIDE_OUTPUT: the training runs in the image,
                            # which sees no other host folder (the staged data would be missing);
                            # not --contain/--containall (refused: no checkout, working directory or /tmp)
GUIDE_APPTAINER_NET_LIBS=() # optional, apptainer (an array): the host's libfabric and NCCL/RCCL network
                            # plugin (aws-ofi-nccl's libnccl-net.so), folders or files, e.g. from `module
                            # show` of the site's libfabric and aws-ofi-nccl modules; bound into the image
                            # at the same paths and put on its LD_LIBRARY_PATH. The image has no plugin and
                            # no libfabric built for Slingshot: left empty there, NCCL uses TCP sockets
                            # between the nodes (the doctor says so). Cray's libfabric also needs the
                            # host's libcxi.so.1 and other libraries from /usr/lib64 (`ldd` on its
                            # libfabric.so lists them): name those files, not /usr/lib64 itself, which
                            # would put all the host's system libraries before the image's
GUIDE_DATASET_ARCHIVE=""    # tar on the shared filesystem; empty: the training profile's own data
GUIDE_DATASET_NAME=""       # folder inside the archive with train/ and val/
GUIDE_TRAIN_PROFILE=full    # full (ResNet-50, 90 epochs) | smoke (small model, seconds)
GUIDE_TRAIN_ARGS=()         # extra guide_utils.train flags for every run at this site
# srun --mpi=... for Horovod under srun (`srun --mpi=list`: pmix, pmi2, cray_shasta for Cray
# MPICH); none: use mpirun. Cray systems have no mpirun: say so here, 03's LAUNCHER=mpirun stops.
GUIDE_SRUN_MPI=pmix
GUIDE_SRUN_ARGS=()          # optional (an array): more options for every srun that starts training
                            # tasks, e.g. (--cpu-bind=cores --gpu-bind=none), ("--cpu-bind=mask_cpu:...");
                            # not used for one-task-per-node steps. Not --hint=nomultithread here: with
                            # GUIDE_CPUS_PER_TASK in hardware threads it asks for twice the cores the job
                            # has, and it conflicts with --cpu-bind; it belongs in GUIDE_SBATCH_EXTRA, with
                            # GUIDE_CPUS_PER_TASK counted in cores
GUIDE_SBATCH_EXTRA=()       # more sbatch options, e.g. (--qos=normal --mem=0), (--constraint=gpu); a
                            # --time here wins over the scripts' own (24 h for 01 and 04-07): where the
                            # partition allows less, set it, or the jobs wait for ever (PartitionTimeLimit)
GUIDE_DOCTOR=full           # optional: full (default) checks the frameworks in every job; quick: the Slurm job only
                            # (the guide's engine and TensorFlow door still refuse to train on the CPU of a GPU
                            # job; your own script in 16 is then checked by nothing: keep full while you port it)
GUIDE_HOROVOD=no            # optional: yes only when the software has a Horovod built with NCCL for this
                            # site's GPUs (`horovodrun --check-build` ticks NCCL; the `make`-built one has
                            # none, and DIST=horovod on GPUs then stops at the doctor); no (default): the
                            # scripts default to DDP (DIST=ddp, 03's srun-ddp, 10's RUNTIME=torch)
GUIDE_SHARED_SBATCH=()      # optional (an array): sbatch options for a job smaller than one node (one node,
                            # fewer tasks than GUIDE_TASKS_PER_NODE) instead of GUIDE_PARTITION and
                            # GUIDE_SBATCH_EXTRA, where whole nodes are billed otherwise: e.g.
                            # (--partition=small-g), (--constraint=gpu --qos=shared). Empty: as every job
GUIDE_SHARED_SRUN_ARGS=()   # optional (an array): the srun options of such a job instead of GUIDE_SRUN_ARGS
                            # (binding masks meant for a whole node do not fit a part of one)
GUIDE_OUTPUT=""             # optional: a folder on the shared file system (a project's scratch) for the run
                            # records (results/) and checkpoints (checkpoints/); empty: the repository,
                            # often in $HOME with a small quota. GUIDE_RESULTS_DIR, GUIDE_CHECKPOINT_ROOT win
# optional: the network between the nodes, as sold ("10Gbit/s", "100Gbit/s"): every run record
# keeps it (environment.network), so runs on two networks can be told apart. Exported, so
# that the training processes see it; a value given at submission wins.
export GUIDE_NETWORK=${GUIDE_NETWORK:-}
# Environment the site needs, as plain export lines (optional): network interfaces and
# transport settings of NCCL/RCCL and libfabric, Horovod's stall timeouts, a PYTHONUSERBASE.
# OMP_NUM_THREADS is set by the jobs to the physical cores of GUIDE_CPUS_PER_TASK (half of it
# where Slurm counts two hardware threads per core as CPUs) unless exported here, and every
# job exports SRUN_CPUS_PER_TASK (srun in Slurm 22.05 to 23.02 does not inherit --cpus-per-task).
# The network, by what the nodes have (the doctor finds HPE Slingshot by the node itself,
# /sys/class/cxi and the hsn* interfaces, and stops a multi-node PyTorch GPU job whose NCCL uses TCP there):
#   Slingshot (HPE Cray EX): the site's aws-ofi-nccl module (RCCL: aws-ofi-rccl) loaded, or bound
#     into the image (GUIDE_APPTAINER_NET_LIBS), and, as lumi-like.sh and perlmutter-like.sh do
#     with their sources, e.g. export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3 NCCL_NET="AWS Libfabric"
#   InfiniBand: NCCL finds it by itself (the verbs library); name the cards only where a node has
#     several kinds, e.g. export NCCL_IB_HCA=mlx5_0,mlx5_1 NCCL_SOCKET_IFNAME=ib0
#   Ethernet: the interface between the nodes, e.g. export NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0
# export HOROVOD_STALL_CHECK_TIME_SECONDS=120 HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=600
