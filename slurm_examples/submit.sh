#!/usr/bin/env bash
# Submit an example with this site's values: the one place where the site profile becomes
# sbatch options (account, partition, tasks and GPUs per node, CPUs per task, log folder).
# #SBATCH lines are read before any shell runs, so they cannot read a profile themselves.
#
#   slurm_examples/submit.sh [--dry-run] SCRIPT [--workers=N] [sbatch options...] [-- training flags...]
#
#   GUIDE_SITE=thesis-taito slurm_examples/submit.sh slurm_examples/03_multi_node_horovod.sbatch --workers=32
#   GUIDE_SITE=ci slurm_examples/submit.sh slurm_examples/01_single_gpu_baseline.sbatch -- --epochs 2
#
# GUIDE_SITE (required) picks slurm_examples/sites/<name>.sh or names a file. --workers=N
# asks for N training processes (one per GPU): --nodes and --ntasks-per-node follow from
# the site's GPUs per node. Other sbatch options given here override the script's own;
# training flags go to guide_utils.train.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUIDE_ROOT=${GUIDE_ROOT:-$(cd "$here/.." && pwd)}
# shellcheck source=slurm_examples/lib/guide.sh
source "$here/lib/guide.sh"

usage="usage: slurm_examples/submit.sh [--dry-run] SCRIPT [--workers=N] [sbatch options...] [-- training flags...]"
dry_run=0
if [[ ${1:-} == --dry-run ]]; then dry_run=1; shift; fi
[[ $# -ge 1 && ${1:-} != -* ]] || guide_die "no sbatch script given; $usage"
script=$1; shift
[[ -f $script ]] || guide_die "sbatch script $script not found; the examples are slurm_examples/NN_*.sbatch"
sbatch_opts=() train_args=() workers="" user_tasks=""
while (($#)); do
    case $1 in
        --) shift; train_args=("$@"); break ;;
        --workers=*) workers=${1#*=} ;;
        --ntasks-per-node=*) user_tasks=${1#*=} ;;
        --workers | --ntasks-per-node)
            (($# >= 2)) || guide_die "$1 needs a number, e.g. $1=4; $usage"
            if [[ $1 == --workers ]]; then workers=$2; else user_tasks=$2; fi
            shift ;;
        *) sbatch_opts+=("$1") ;;
    esac
    shift
done

# Submitted from inside a job (salloc, a notebook kernel that runs as a job): the outer
# job's SLURM_* variables would reach the new job (--export=ALL), where srun reads the ones
# the new job does not set as its own options ("mutually exclusive" memory requests, the
# wrong CPUs). Drop them all but SLURM_CONF, as guide_utils.runtime.slurm.submission_env does.
if [[ -n ${SLURM_JOB_ID:-} ]]; then
    for var in "${!SLURM_@}"; do [[ $var == SLURM_CONF ]] || unset "$var"; done
fi

guide_load_site
# A script that runs your own command (16): one it could not pass Slurm's time-limit warning
# to is refused (or warned about) here, before it waits in the queue.
if grep -q '^guide_command_check' "$script"; then
    guide_command_check ${train_args[@]+"${train_args[@]}"}
fi
# A job of the guide's training programs whose data is missing is refused here too, rather
# than at its first line after the queue; a dry run says so and prints the command anyway
# (it leaves the archive's path alone: it may be planned away from the cluster).
plan=()
((!dry_run)) || plan=(--plan)
if grep -q 'guide_utils\.train' "$script" &&
    problem=$(guide_data_problem ${plan[@]+"${plan[@]}"} ${train_args[@]+"${train_args[@]}"}); then
    ((dry_run)) || guide_die "$problem"
    printf 'warning: %s\n' "$problem" >&2
fi

# Tasks (= GPUs) per node: an explicit --ntasks-per-node, else the script's own (the
# single-GPU baseline pins one), else the site's GPUs per node.
script_tasks=$(sed -n 's/^#SBATCH[[:space:]]\{1,\}--ntasks-per-node[= ]\([0-9]\{1,\}\).*/\1/p' "$script" | head -n1)
script_nodes=$(sed -n 's/^#SBATCH[[:space:]]\{1,\}--nodes[= ]\([0-9]\{1,\}\).*/\1/p' "$script" | head -n1)
if [[ -n $user_tasks ]]; then
    [[ $user_tasks =~ ^[1-9][0-9]*$ ]] || guide_die "--ntasks-per-node=$user_tasks must be a positive integer"
    tasks=$user_tasks from="--ntasks-per-node=$user_tasks"
elif [[ -n $script_tasks ]]; then
    tasks=$script_tasks from="$(basename "$script")'s #SBATCH --ntasks-per-node=$script_tasks"
else
    tasks=$GUIDE_TASKS_PER_NODE from="GUIDE_TASKS_PER_NODE=$GUIDE_TASKS_PER_NODE in $GUIDE_SITE_FILE"
fi

opts=()
if [[ -n $workers ]]; then
    # N workers on as few nodes as hold them, the same number on each: nodes = ceil(N / per
    # node), tasks per node = N / nodes. An uneven split is refused rather than rounded up,
    # which would change the global batch and so the learning rate.
    [[ $workers =~ ^[1-9][0-9]*$ ]] || guide_die "--workers=$workers must be a positive integer (training processes, one per GPU)"
    for opt in ${sbatch_opts[@]+"${sbatch_opts[@]}"}; do
        case $opt in
            --nodes | --nodes=* | -N* | --ntasks | --ntasks=* | -n*)
                guide_die "--workers=$workers sets --nodes and --ntasks-per-node itself; drop $opt" ;;
        esac
    done
    per_node=$tasks
    nodes=$(((workers + per_node - 1) / per_node))
    ((workers % nodes == 0)) ||
        guide_die "--workers=$workers cannot be spread evenly: it needs $nodes nodes of at most $per_node task(s)" \
                  "($from), and $workers is not a multiple of $nodes; use --workers=$((workers - workers % nodes))" \
                  "or --workers=$((nodes * ((workers + nodes - 1) / nodes)))"
    tasks=$((workers / nodes))
    [[ $script_nodes != 1 || $nodes == 1 ]] ||
        guide_die "$(basename "$script") runs on one node, but --workers=$workers needs $nodes nodes of at most" \
                  "$per_node task(s) ($from); use slurm_examples/03_multi_node_horovod.sbatch"
    opts+=(--nodes="$nodes" --ntasks-per-node="$tasks")
elif [[ -n $user_tasks || -z $script_tasks ]]; then
    opts+=(--ntasks-per-node="$tasks")
fi
# The job's nodes: --workers', else an explicit --nodes, else the script's.
job_nodes=${nodes:-$script_nodes}
for opt in ${sbatch_opts[@]+"${sbatch_opts[@]}"}; do
    [[ ! $opt =~ ^(--nodes=|-N)([0-9]+)$ ]] || job_nodes=${BASH_REMATCH[2]}
done
[[ -z $GUIDE_ACCOUNT ]] || opts+=(--account="$GUIDE_ACCOUNT")
shared=0
guide_shared_job "${job_nodes:-0}" "$tasks" && shared=1
# A job smaller than a node, at a site that bills whole nodes in its usual partition or QOS:
# the profile's options for shared nodes instead of the partition and the extras.
((shared)) || [[ -z $GUIDE_PARTITION ]] || opts+=(--partition="$GUIDE_PARTITION")
opts+=(--cpus-per-task="$GUIDE_CPUS_PER_TASK")
gpu=$(guide_gpu_option "$tasks")  # one GPU per task actually run on a node
# (one option or several: "--gpus-per-node=%d --gres=nvme:200" is two)
[[ -z $gpu ]] || { read -ra gpu_opts <<<"$gpu" && opts+=(${gpu_opts[@]+"${gpu_opts[@]}"}); }
if ((shared)); then
    opts+=(${GUIDE_SHARED_SBATCH[@]+"${GUIDE_SHARED_SBATCH[@]}"})
else
    opts+=(${GUIDE_SBATCH_EXTRA[@]+"${GUIDE_SBATCH_EXTRA[@]}"})
fi

log_dir=${GUIDE_LOG_DIR:-$GUIDE_ROOT/logs}
# A job array (the script's #SBATCH --array, or --array=... given here): one log per task.
array=0
grep -q '^#SBATCH[[:space:]]\{1,\}--array' "$script" && array=1
for opt in ${sbatch_opts[@]+"${sbatch_opts[@]}"}; do
    case $opt in --array | --array=* | -a*) array=1 ;; esac
done
if ((array)); then
    opts+=(--output="$log_dir/%x-%A_%a.out")
else
    opts+=(--output="$log_dir/%x-%j.out")
fi
# The job finds the repository and the site in its environment. Exported rather than
# listed in --export=ALL,NAME=value, which splits values at commas (a path may have one).
# GUIDE_SUBMITTED: the job's options come from the profile (guide_check_request trusts them).
export GUIDE_ROOT GUIDE_SITE GUIDE_SUBMITTED=submit.sh
opts+=(--export=ALL)

cmd=(sbatch ${opts[@]+"${opts[@]}"} ${sbatch_opts[@]+"${sbatch_opts[@]}"} "$script" ${train_args[@]+"${train_args[@]}"})
if ((dry_run)); then
    printf '%q ' "${cmd[@]}"; echo
    exit 0
fi
command -v sbatch >/dev/null || guide_die "sbatch not found: run this on a Slurm login node (or use --dry-run to see the command)"
mkdir -p "$log_dir"
"${cmd[@]}"
