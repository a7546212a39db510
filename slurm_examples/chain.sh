#!/usr/bin/env bash
# Train longer than the time limit by a chain of jobs, each starting when the previous one
# finished successfully (--dependency=afterok) and resuming from its checkpoint: the way
# the thesis trained its single-GPU baseline, in 10-epoch chunks.
#
#   slurm_examples/chain.sh JOBS EPOCHS_PER_JOB SCRIPT [sbatch options...] [-- training flags...]
#   slurm_examples/chain.sh 9 10 slurm_examples/01_single_gpu_baseline.sbatch   # 90 epochs
#
# Job i trains up to epoch i*EPOCHS_PER_JOB. If one fails, Slurm cancels the jobs after it
# (--kill-on-invalid-dep=yes): otherwise they would wait in the queue forever, with reason
# DependencyNeverSatisfied. Resubmit from the failed link: the checkpoints are kept. The
# alternative, one job that requeues itself at the time limit, is built into
# 01_single_gpu_baseline.sbatch.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { printf 'error: %s\n' "$*" >&2; exit 2; }
usage="usage: slurm_examples/chain.sh JOBS EPOCHS_PER_JOB SCRIPT [sbatch options...] [-- training flags...]"
[[ $# -ge 3 ]] || die "$usage"
jobs=$1 chunk=$2 script=$3; shift 3
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "JOBS='$jobs' must be a positive integer; $usage"
[[ $chunk =~ ^[1-9][0-9]*$ ]] || die "EPOCHS_PER_JOB='$chunk' must be a positive integer; $usage"
sbatch_opts=() train_args=()
while (($#)); do
    if [[ $1 == -- ]]; then shift; train_args=("$@"); break; fi
    sbatch_opts+=("$1"); shift
done
for arg in ${train_args[@]+"${train_args[@]}"}; do
    [[ $arg != --epochs* && $arg != --checkpoint-dir* ]] ||
        die "do not pass $arg to chain.sh: job i trains to epoch i*EPOCHS_PER_JOB in one shared checkpoint folder"
done

# One checkpoint folder for the whole chain (each job has its own job id); the jobs find it
# in their environment (submit.sh passes it on with --export=ALL). Where the jobs keep theirs:
# under the site profile's GUIDE_OUTPUT, else in the repository (guide_checkpoint_root).
GUIDE_ROOT=${GUIDE_ROOT:-$(cd "$here/.." && pwd)}
# shellcheck source=slurm_examples/lib/guide.sh
source "$here/lib/guide.sh"
guide_load_site
ckpt=$(guide_checkpoint_root)/chain-$(date +%Y%m%d-%H%M%S)-$$
export GUIDE_CHAIN_CHECKPOINTS=$ckpt
echo "checkpoints: $ckpt"
prev=""
for ((i = 1; i <= jobs; i++)); do
    dep=()
    [[ -z $prev ]] || dep=(--dependency="afterok:$prev" --kill-on-invalid-dep=yes)
    prev=$("$here/submit.sh" "$script" --parsable ${dep[@]+"${dep[@]}"} ${sbatch_opts[@]+"${sbatch_opts[@]}"} \
           -- ${train_args[@]+"${train_args[@]}"} --epochs $((i * chunk)))
    prev=${prev%%;*}  # --parsable prints "jobid[;cluster]"
    echo "job $i/$jobs: $prev (to epoch $((i * chunk)))"
done
