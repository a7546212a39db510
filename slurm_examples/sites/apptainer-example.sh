# shellcheck shell=bash disable=SC2034  # every value is read by slurm_examples/lib/guide.sh
# Every sbatch example through the guide's Apptainer image (containers/guide.def; book
# chapter 15) on a GPU cluster with node-local scratch. Build the image once, anywhere
# Apptainer runs, and copy it to the cluster:
#   apptainer build guide.sif containers/guide.def
# The job scripts stay on the host (srun, the dataset staging); only the commands that need
# the guide's stack (python, horovodrun, torchrun) run inside the image. Placeholders:
# replace them with your centre's values.
GUIDE_ACCOUNT="my_project"
GUIDE_PARTITION=gpu
GUIDE_TASKS_PER_NODE=4
GUIDE_CPUS_PER_TASK=8
GUIDE_GPU_REQUEST="--gpus-per-node=%d"
GUIDE_SCRATCH=$LOCAL_SCRATCH  # node-local disk (the dataset is staged there)
GUIDE_SOFTWARE=apptainer
GUIDE_CONTAINER=/projappl/my_project/guide.sif
# --nv: the host's NVIDIA driver inside the image. -B: the directories a job reads and writes
# besides the ones Apptainer binds by default ($HOME, the current directory, /tmp): the
# node-local scratch with the staged dataset, and the project directory with the archive,
# the results and the checkpoints. A path not bound is simply not there inside the image.
# --cleanenv: none of the host's environment goes in (a loaded module's PYTHONPATH or
# LD_LIBRARY_PATH would change what runs inside), except what srun and the job set for the
# training, which lib/guide.sh passes by name (lib/apptainer_env.sh).
GUIDE_APPTAINER_FLAGS=(--cleanenv --nv -B "$LOCAL_SCRATCH" -B /scratch/my_project)
GUIDE_DATASET_ARCHIVE=/scratch/my_project/datasets/ilsvrc2012.tar
GUIDE_DATASET_NAME=ilsvrc2012
GUIDE_TRAIN_PROFILE=full
GUIDE_TRAIN_ARGS=(--amp bf16 --channels-last)
# Horovod over MPI: srun starts one image per task and the image's Open MPI 4.1 (Debian 12's,
# with PMIx) joins srun's PMIx server: the "hybrid model", which works when the host's Slurm
# PMIx and the image's are compatible (`srun --mpi=list`; ask your centre). If they are not,
# run the DDP examples (DIST=ddp: no MPI at all) or Horovod over Gloo (horovodrun).
GUIDE_SRUN_MPI=pmix
GUIDE_SBATCH_EXTRA=()
# The image's Horovod is built without NCCL (containers/guide.def): on GPUs it would average
# the gradients through host memory. The scripts default to DDP (NCCL from the torch wheel);
# DIST=horovod still runs Horovod where that is wanted.
GUIDE_HOROVOD=no
# TensorFlow in the image is the lock's tensorflow-cpu (guide.def; the OCI image has none): 08 on GPUs
# stops at the doctor. Its network: no NCCL OFI plugin, no libfabric built for Slingshot; on HPE Slingshot name
# the host's here (folders or files, from `module show` of the site's modules; Cray's libfabric also
# needs the host's libcxi.so.1 and the other /usr/lib64 files `ldd` on its libfabric.so lists, named
# one by one: all of /usr/lib64 would shadow the image's own libraries), e.g.
# GUIDE_APPTAINER_NET_LIBS=(/opt/cray/libfabric/VERSION/lib64 /opt/aws-ofi-nccl/lib /usr/lib64/libcxi.so.1)  # placeholders
GUIDE_APPTAINER_NET_LIBS=()
GUIDE_OUTPUT=/scratch/my_project/$USER/guide  # run records and checkpoints, in the bound project directory
