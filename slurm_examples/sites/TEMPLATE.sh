# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# A site profile: everything about one centre that the examples need, and nothing else.
# Copy this file to sites/<your-centre>.sh, fill it in, and select it with
#   export GUIDE_SITE=<your-centre>     # required: there is no default site
# Every GUIDE_* value below is required (some may be empty, as noted); a missing one stops
# submit.sh and every job before anything runs, naming it. Variables of the job (e.g.
# $TMPDIR, $SLURM_JOB_ID) may be used: the profile is read again inside each job.

GUIDE_ACCOUNT=""            # --account (billing project); empty: your default account
GUIDE_PARTITION=""          # --partition with GPU nodes; empty: the default partition
GUIDE_TASKS_PER_NODE=4      # training processes per node = GPUs per node (submit.sh --workers=N uses it)
GUIDE_CPUS_PER_TASK=8       # cores per process (data-loading workers); cores per node / tasks
GUIDE_GPU_REQUEST="--gpus-per-node=%d"  # or "--gres=gpu:v100:%d"; empty on CPU-only sites
GUIDE_SCRATCH='/tmp'        # node-local disk for the dataset copy, e.g. $TMPDIR, $LOCAL_SCRATCH
GUIDE_SOFTWARE=venv         # venv | modules | apptainer
GUIDE_VENV=""               # venv (and optionally on top of modules): path with bin/activate
GUIDE_MODULES=""            # modules: what to `module load`, e.g. "pytorch/2.4"
GUIDE_CONTAINER=""          # apptainer: path to the .sif image with guide_utils installed
GUIDE_APPTAINER_FLAGS=(--nv)  # apptainer (an array): --nv for NVIDIA GPUs, --rocm for AMD, binds (-B DIR)
GUIDE_DATASET_ARCHIVE=""    # tar on the shared filesystem; empty: the training profile's own data
GUIDE_DATASET_NAME=""       # folder inside the archive with train/ and val/
GUIDE_TRAIN_PROFILE=full    # full (ResNet-50, 90 epochs) | smoke (small model, seconds)
GUIDE_TRAIN_ARGS=()         # extra guide_utils.train flags for every run at this site
GUIDE_SRUN_MPI=pmix         # srun --mpi=... for Horovod under srun (`srun --mpi=list`); none: use mpirun
GUIDE_SBATCH_EXTRA=()       # more sbatch options, e.g. (--qos=normal --mem=0)
GUIDE_DOCTOR=full           # optional: full (default) checks the frameworks in every job; quick: the Slurm job only
