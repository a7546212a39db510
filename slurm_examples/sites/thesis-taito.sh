# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# The layout of the thesis's runs (CSC Taito-GPU, 2019; thesis appendices 1-14): partition
# gpu, four P100s per node requested with --gres=gpu:p100:N, 7 cores per task, the ImageNet
# archive on $WRKDIR unpacked to the node-local $TMPDIR, whole-node memory. Taito has
# since been retired; this profile shows how a --gres centre is described, and what the
# thesis's scripts become here. Account and venv are placeholders to fill in.
GUIDE_ACCOUNT="project_0000000"
GUIDE_PARTITION=gpu
GUIDE_TASKS_PER_NODE=4
GUIDE_CPUS_PER_TASK=7
GUIDE_GPU_REQUEST="--gres=gpu:p100:%d"
GUIDE_SCRATCH=$TMPDIR
GUIDE_SOFTWARE=venv
GUIDE_VENV=$WRKDIR/guide-venv
GUIDE_DATASET_ARCHIVE=$WRKDIR/DONOTREMOVE/DATA/ilsvrc2012-torch-resized-new.tar
GUIDE_DATASET_NAME=ilsvrc2012-torch
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=()
GUIDE_SRUN_MPI=pmi2
GUIDE_SBATCH_EXTRA=(--mem=0)
# Jobs of fewer GPUs than a node leave the rest of its memory to others: the thesis's one- and
# two-GPU jobs asked for 60G or 200G (Appendices 1 and 2), not --mem=0, the whole node's.
GUIDE_SHARED_SBATCH=(--partition=gpu --mem=60G)
GUIDE_HOROVOD=yes  # the thesis's runs: Horovod
GUIDE_OUTPUT=$WRKDIR/guide  # run records and checkpoints on the work directory, not in $HOME
