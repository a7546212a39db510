#!/usr/bin/env bash
# Runs its arguments (`apptainer exec --cleanenv ... IMAGE COMMAND`) with the variables a
# training task needs passed into the image by name. --cleanenv keeps the host's environment
# out of the image (a module's PYTHONPATH or LD_LIBRARY_PATH would change what runs inside),
# but it drops what srun sets for each task (its rank, its GPUs, PMIx's rendezvous) and what
# the job exports for the training too. Apptainer sets NAME inside the image from
# APPTAINERENV_NAME outside, also under --cleanenv: this sets those, in each task, for the
# names below, then runs the command. lib/guide.sh puts it in front of GUIDE_EXEC when
# GUIDE_APPTAINER_FLAGS has --cleanenv.
#
#   apptainer_env.sh apptainer exec --cleanenv guide.sif python -m guide_utils.train ...
set -euo pipefail

while read -r name; do
    case $name in
        # (FI_*: libfabric's settings for NCCL/RCCL's OFI plugin on Slingshot; MPICH_*: Cray MPICH's;
        # HSA_*, MIOPEN_*: ROCm's runtime and MIOpen's caches; PYTHONUNBUFFERED: each line at once)
        SLURM_* | SLURMD_* | SRUN_* | PMIX_* | PMI_* | OMPI_* | PRTE_* | UCX_* | NCCL_* | RCCL_* | GLOO_* | \
            FI_* | MPICH_* | HSA_* | MIOPEN_* | \
            HOROVOD_* | GUIDE_* | TORCH_* | TORCHELASTIC_* | TF_* | MASTER_ADDR | MASTER_PORT | WORLD_SIZE | \
            RANK | LOCAL_RANK | LOCAL_WORLD_SIZE | OMP_NUM_THREADS | CUDA_VISIBLE_DEVICES | \
            ROCR_VISIBLE_DEVICES | HIP_VISIBLE_DEVICES | TMPDIR | PYTHONUNBUFFERED)
            export "APPTAINERENV_$name=${!name}"
            ;;
    esac
done < <(compgen -e)
exec "$@"
