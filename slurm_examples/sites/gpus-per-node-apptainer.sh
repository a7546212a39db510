# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# An illustrative layout for centres that request GPUs with --gpus-per-node and ship the
# software as an Apptainer image (common on newer systems): 8 GPUs per node, node-local
# NVMe at $LOCAL_SCRATCH, PMIx for srun. Every value is a placeholder for the numbers in
# your centre's user guide; only this file changes between centres, never the scripts.
GUIDE_ACCOUNT="my_project"
GUIDE_PARTITION=gpu
GUIDE_TASKS_PER_NODE=8
GUIDE_CPUS_PER_TASK=8
GUIDE_GPU_REQUEST="--gpus-per-node=%d"
GUIDE_SCRATCH=$LOCAL_SCRATCH  # placeholder name of the node-local disk (the job's copy goes in guide-<job id>)
GUIDE_SOFTWARE=apptainer
GUIDE_CONTAINER=$HOME/containers/guide.sif
GUIDE_APPTAINER_FLAGS=(--cleanenv --nv -B "$LOCAL_SCRATCH" -B /scratch/my_project)
GUIDE_DATASET_ARCHIVE=/scratch/my_project/datasets/ilsvrc2012.tar
GUIDE_DATASET_NAME=ilsvrc2012
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=(--amp bf16 --channels-last)
GUIDE_SRUN_MPI=pmix
GUIDE_SBATCH_EXTRA=(--exclusive)
# Jobs of fewer GPUs than a node: the same partition without --exclusive (an empty list would
# mean "as every job", --exclusive included: a one-GPU job billed for eight). Placeholder values.
GUIDE_SHARED_SBATCH=(--partition=gpu --mem-per-gpu=60G)
# The image's Horovod is built without NCCL (containers/guide.def): the scripts default to DDP.
GUIDE_HOROVOD=no
# TensorFlow in the image is the lock's tensorflow-cpu (guide.def; the OCI image has none): 08 on GPUs
# stops at the doctor. Its network: no NCCL OFI plugin, no libfabric built for Slingshot; on HPE Slingshot name
# the host's here (folders or files, from `module show` of the site's modules; Cray's libfabric also
# needs the host's libcxi.so.1 and the other /usr/lib64 files `ldd` on its libfabric.so lists, named
# one by one: all of /usr/lib64 would shadow the image's own libraries), e.g.
# GUIDE_APPTAINER_NET_LIBS=(/opt/cray/libfabric/VERSION/lib64 /opt/aws-ofi-nccl/lib /usr/lib64/libcxi.so.1)  # placeholders
GUIDE_APPTAINER_NET_LIBS=()
GUIDE_OUTPUT=/scratch/my_project/$USER/guide  # placeholder: run records and checkpoints on the project's scratch
