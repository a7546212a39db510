#!/usr/bin/env bash
# Submit an example with this site's values: the one place where the site profile becomes
# sbatch options (account, partition, tasks and GPUs per node, CPUs per task, log folder).
# #SBATCH lines are read before any shell runs, so they cannot read a profile themselves.
#
#   slurm_examples/submit.sh [--dry-run] SCRIPT [sbatch options...] [-- training flags...]
#
#   GUIDE_SITE=thesis-taito slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch --nodes=8
#   slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch -- --epochs 2
#
# GUIDE_SITE picks slurm_examples/sites/<name>.sh (default: ci) or names a file. sbatch
# options given here override the script's own; training flags go to guide_utils.train.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GUIDE_ROOT=${GUIDE_ROOT:-$(cd "$here/.." && pwd)}
# shellcheck source=slurm_examples/lib/guide.sh
source "$here/lib/guide.sh"

usage="usage: slurm_examples/submit.sh [--dry-run] SCRIPT [sbatch options...] [-- training flags...]"
dry_run=0
if [[ ${1:-} == --dry-run ]]; then dry_run=1; shift; fi
[[ $# -ge 1 && ${1:-} != -* ]] || guide_die "no sbatch script given; $usage"
script=$1; shift
[[ -f $script ]] || guide_die "sbatch script $script not found; the examples are slurm_examples/NN_*.sbatch"
sbatch_opts=() train_args=()
while (($#)); do
    if [[ $1 == -- ]]; then shift; train_args=("$@"); break; fi
    sbatch_opts+=("$1"); shift
done

guide_load_site

# Scripts that run one task per GPU on whole nodes leave --ntasks-per-node to the site;
# a script that pins it (the single-GPU baseline) keeps its own value.
tasks=$(sed -n 's/^#SBATCH[[:space:]]\{1,\}--ntasks-per-node[= ]\([0-9]\{1,\}\).*/\1/p' "$script" | head -n1)
opts=()
[[ -n $tasks ]] || { tasks=$GUIDE_TASKS_PER_NODE; opts+=(--ntasks-per-node="$tasks"); }
[[ -z $GUIDE_ACCOUNT ]] || opts+=(--account="$GUIDE_ACCOUNT")
[[ -z $GUIDE_PARTITION ]] || opts+=(--partition="$GUIDE_PARTITION")
opts+=(--cpus-per-task="$GUIDE_CPUS_PER_TASK")
gpu=$(guide_gpu_option "$tasks")
[[ -z $gpu ]] || opts+=("$gpu")
opts+=(${GUIDE_SBATCH_EXTRA[@]+"${GUIDE_SBATCH_EXTRA[@]}"})

log_dir=${GUIDE_LOG_DIR:-$GUIDE_ROOT/logs}
if grep -q '^#SBATCH[[:space:]]\{1,\}--array' "$script"; then
    opts+=(--output="$log_dir/%x-%A_%a.out")
else
    opts+=(--output="$log_dir/%x-%j.out")
fi
opts+=(--export="ALL,GUIDE_ROOT=$GUIDE_ROOT,GUIDE_SITE=$GUIDE_SITE")

cmd=(sbatch "${opts[@]}" ${sbatch_opts[@]+"${sbatch_opts[@]}"} "$script" ${train_args[@]+"${train_args[@]}"})
if ((dry_run)); then
    printf '%q ' "${cmd[@]}"; echo
    exit 0
fi
command -v sbatch >/dev/null || guide_die "sbatch not found: run this on a Slurm login node (or use --dry-run to see the command)"
mkdir -p "$log_dir"
"${cmd[@]}"
