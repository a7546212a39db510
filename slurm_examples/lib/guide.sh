# shellcheck shell=bash
# What every sbatch example and submit.sh share: the site profile (loaded and checked),
# the software environment, the printed configuration and the dataset staging. Sourced,
# never run. Everything a centre changes lives in sites/<name>.sh, not here.

# The repository: submit.sh exports GUIDE_ROOT; with plain `sbatch` from the repository
# root, Slurm's submit directory is the same place. (A batch script runs from a copy in
# Slurm's spool directory, so its own location says nothing.)
GUIDE_ROOT=${GUIDE_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}

guide_die() {
    printf 'error: %s\n' "$*" >&2
    exit 2
}

# The shipped profiles, comma-separated (TEMPLATE is a form to copy, not a profile).
guide_site_names() {
    local known="" f
    for f in "$GUIDE_ROOT"/slurm_examples/sites/*.sh; do
        [[ -e $f && $f != */TEMPLATE.sh ]] && known+="${known:+, }$(basename "$f" .sh)"
    done
    printf '%s\n' "${known:-<none found>}"
}

# The profile file for GUIDE_SITE: a name under slurm_examples/sites/ or a path. There is
# no default: a job that silently ran with another centre's values (or the CI's smoke
# scale) would waste an allocation, so the site is always named.
guide_site_file() {
    [[ -n ${GUIDE_SITE:-} ]] ||
        guide_die "GUIDE_SITE is not set; export GUIDE_SITE=NAME with NAME one of $(guide_site_names)" \
                  "(slurm_examples/sites/NAME.sh), or the path of your own copy of sites/TEMPLATE.sh"
    local file=$GUIDE_SITE
    [[ $file == */* || $file == *.sh ]] || file=$GUIDE_ROOT/slurm_examples/sites/$GUIDE_SITE.sh
    [[ -f $file ]] ||
        guide_die "site profile '$file' not found; set GUIDE_SITE to one of $(guide_site_names) or to a file path" \
                  "(and run from the repository root or through slurm_examples/submit.sh)"
    printf '%s\n' "$file"
}

# Values every profile must set. Some may be set to empty (no account, the default
# partition, no GPUs, no archive), but must be set: an empty value is a decision, a missing
# one is usually a typo.
GUIDE_REQUIRED=(GUIDE_ACCOUNT GUIDE_PARTITION GUIDE_TASKS_PER_NODE GUIDE_CPUS_PER_TASK GUIDE_GPU_REQUEST
                GUIDE_SCRATCH GUIDE_SOFTWARE GUIDE_DATASET_ARCHIVE GUIDE_TRAIN_PROFILE GUIDE_SRUN_MPI)

guide_check_site() {
    local file=$1 name
    for name in "${GUIDE_REQUIRED[@]}"; do
        [[ -n ${!name+set} ]] || guide_die "site profile $file does not set $name; add it (see slurm_examples/sites/TEMPLATE.sh)"
    done
    [[ $GUIDE_TASKS_PER_NODE =~ ^[1-9][0-9]*$ ]] ||
        guide_die "GUIDE_TASKS_PER_NODE='$GUIDE_TASKS_PER_NODE' in $file must be a positive integer (one task per GPU)"
    [[ $GUIDE_CPUS_PER_TASK =~ ^[1-9][0-9]*$ ]] ||
        guide_die "GUIDE_CPUS_PER_TASK='$GUIDE_CPUS_PER_TASK' in $file must be a positive integer"
    [[ -z $GUIDE_GPU_REQUEST || $GUIDE_GPU_REQUEST == *%d* ]] ||
        guide_die "GUIDE_GPU_REQUEST='$GUIDE_GPU_REQUEST' in $file needs %d where the GPU count goes (e.g. --gres=gpu:v100:%d)"
    [[ $GUIDE_TRAIN_PROFILE == smoke || $GUIDE_TRAIN_PROFILE == full ]] ||
        guide_die "GUIDE_TRAIN_PROFILE='$GUIDE_TRAIN_PROFILE' in $file must be smoke or full"
    [[ ${GUIDE_DOCTOR:-full} == full || $GUIDE_DOCTOR == quick ]] ||
        guide_die "GUIDE_DOCTOR='$GUIDE_DOCTOR' in $file must be full or quick (or unset: full)"
    case $GUIDE_SOFTWARE in
        venv) [[ -n ${GUIDE_VENV:-} ]] || guide_die "GUIDE_SOFTWARE=venv in $file needs GUIDE_VENV (the virtual environment)" ;;
        modules) [[ -n ${GUIDE_MODULES:-} ]] || guide_die "GUIDE_SOFTWARE=modules in $file needs GUIDE_MODULES (what to module load)" ;;
        apptainer) [[ -n ${GUIDE_CONTAINER:-} ]] || guide_die "GUIDE_SOFTWARE=apptainer in $file needs GUIDE_CONTAINER (the .sif image)" ;;
        *) guide_die "GUIDE_SOFTWARE='$GUIDE_SOFTWARE' in $file must be venv, modules or apptainer" ;;
    esac
    [[ -z $GUIDE_DATASET_ARCHIVE || -n ${GUIDE_DATASET_NAME:-} ]] ||
        guide_die "GUIDE_DATASET_ARCHIVE is set in $file but GUIDE_DATASET_NAME (the folder inside the archive) is not"
    # Lists of arguments are arrays, so that a value with a space (a path) stays one argument.
    for name in GUIDE_TRAIN_ARGS GUIDE_SBATCH_EXTRA GUIDE_APPTAINER_FLAGS; do
        [[ -z ${!name+set} || $(declare -p "$name" 2>/dev/null) == "declare -a"* ]] ||
            guide_die "$name in $file must be an array, e.g. $name=(--one --two \"a value\"), not a string"
    done
}

# Source and check the profile. Inside a job, unset variables in it are errors (set -u);
# on the login node (submit.sh) job-time variables such as SLURM_JOB_ID do not exist yet.
guide_load_site() {
    GUIDE_SITE_FILE=$(guide_site_file) || exit
    if [[ -z ${SLURM_JOB_ID:-} ]]; then
        set +u
        # shellcheck source=/dev/null
        source "$GUIDE_SITE_FILE"
        set -u
    else
        # shellcheck source=/dev/null
        source "$GUIDE_SITE_FILE"
    fi
    guide_check_site "$GUIDE_SITE_FILE"
}

# GPUs requested per node by a script that runs N tasks per node: one per task, in the
# site's syntax. Empty on CPU sites.
guide_gpu_option() {
    # shellcheck disable=SC2059  # the site profile supplies the format on purpose
    [[ -z $GUIDE_GPU_REQUEST ]] || printf -- "$GUIDE_GPU_REQUEST\n" "$1"
}

# Make python, horovodrun and torchrun the guide's. GUIDE_EXEC prefixes every command that
# must run inside the software environment (empty unless it is a container).
guide_software() {
    GUIDE_EXEC=()
    case $GUIDE_SOFTWARE in
        modules)
            command -v module >/dev/null || guide_die "GUIDE_SOFTWARE=modules but this node has no 'module' command; use venv or apptainer"
            module purge
            # shellcheck disable=SC2086  # a list of module names
            module load $GUIDE_MODULES
            ;;&
        venv | modules)
            if [[ -n ${GUIDE_VENV:-} ]]; then
                [[ -f $GUIDE_VENV/bin/activate ]] || guide_die "GUIDE_VENV=$GUIDE_VENV has no bin/activate; run scripts/setup.sh or fix the path"
                # shellcheck source=/dev/null
                source "$GUIDE_VENV/bin/activate"
            fi
            ;;
        apptainer)
            [[ -f $GUIDE_CONTAINER ]] || guide_die "GUIDE_CONTAINER=$GUIDE_CONTAINER does not exist; build or copy the image first"
            GUIDE_EXEC=(apptainer exec ${GUIDE_APPTAINER_FLAGS[@]+"${GUIDE_APPTAINER_FLAGS[@]}"} "$GUIDE_CONTAINER")
            ;;
    esac
}

# Print what this job is and will do, then the doctor's view of the first node for this
# job's framework and --dist (a DDP job does not need Horovod, so a missing Horovod must not
# stop it). A job log that starts with its own configuration answers most "why was it
# slow/different" questions.
guide_banner() {
    printf '== %s: job %s on %s node(s) [%s], %s task(s)\n' "${SLURM_JOB_NAME:-?}" "${SLURM_JOB_ID:-?}" \
        "${SLURM_JOB_NUM_NODES:-?}" "${SLURM_JOB_NODELIST:-?}" "${SLURM_NTASKS:-?}"
    [[ -z ${SLURM_ARRAY_TASK_ID:-} ]] || printf '== array task %s of %s\n' "$SLURM_ARRAY_TASK_ID" "${SLURM_ARRAY_JOB_ID:-?}"
    [[ ${SLURM_RESTART_COUNT:-0} == 0 ]] || printf '== restart %s (requeued): resuming from the checkpoint\n' "$SLURM_RESTART_COUNT"
    printf '== site %s (%s): profile %s, software %s, scratch %s\n' "$GUIDE_SITE" "$GUIDE_SITE_FILE" \
        "$GUIDE_TRAIN_PROFILE" "$GUIDE_SOFTWARE" "$GUIDE_SCRATCH"
    printf '== dataset %s\n' "${GUIDE_DATASET_ARCHIVE:-"(none: the training profile's built-in data)"}"
    printf '== framework %s, --dist %s\n' "$GUIDE_FRAMEWORK" "$GUIDE_DIST"
    local quick=()
    [[ ${GUIDE_DOCTOR:-full} == full ]] || quick=(--quick)
    ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"} python -m guide_utils doctor --framework "$GUIDE_FRAMEWORK" --dist "$GUIDE_DIST" \
        --profile "$GUIDE_TRAIN_PROFILE" ${quick[@]+"${quick[@]}"} ||
        guide_die "guide_utils doctor: the software environment cannot run --framework $GUIDE_FRAMEWORK --dist $GUIDE_DIST (PROBLEM above)"
}

# Unpack the dataset archive to node-local disk, once per node (one task per node), and set
# GUIDE_DATA to what the training command gets as --data. Reading thousands of small files
# from the parallel filesystem on every epoch is what makes multi-node jobs slow; one big
# sequential read per node is not. Unpacks into a temporary folder and renames it, so a
# requeued job (or two nodes sharing a disk) finds either nothing or a complete copy. A
# failure (a full disk, a bad archive) stops the job here with one line per node, instead
# of a training that cannot find its data later.
guide_stage_data() {
    GUIDE_DATA_ARGS=()
    [[ -n $GUIDE_DATASET_ARCHIVE ]] || return 0
    [[ -f $GUIDE_DATASET_ARCHIVE ]] ||
        guide_die "dataset archive $GUIDE_DATASET_ARCHIVE not found; fix GUIDE_DATASET_ARCHIVE in $GUIDE_SITE_FILE" \
                  "(a test archive: python -m guide_utils pack-dataset digits FILE.tar)"
    local target=$GUIDE_SCRATCH/$GUIDE_DATASET_NAME
    echo "== staging $GUIDE_DATASET_ARCHIVE to $target on each node"
    # shellcheck disable=SC2016  # expanded by the per-node shell
    srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
        set -uo pipefail
        scratch=$1 archive=$2 name=$3 site=$4 node=${SLURMD_NODENAME:-$(hostname)} tmp=""
        fail() {  # one line: where, what failed, its first error line, the fix
            local first=""
            read -r first <<<"$2" || true
            [[ -z $tmp ]] || rm -rf "$tmp"
            echo "error: staging on node $node: $1 failed ($first); $3" >&2
            exit 2
        }
        [[ -d $scratch/$name ]] && exit 0
        fix="free space in $scratch or set GUIDE_SCRATCH in $site to a larger node-local disk"
        err=$(mkdir -p "$scratch" 2>&1) || fail "creating GUIDE_SCRATCH=$scratch" "$err" "$fix"
        err=$(mktemp -d "$scratch/.staging.XXXXXX" 2>&1) || fail "creating a folder in $scratch" "$err" "$fix"
        tmp=$err
        err=$(tar -xf "$archive" -C "$tmp" 2>&1) ||
            fail "unpacking $archive ($(du -h "$archive" | cut -f1)) to $scratch" "$err" "$fix"
        [[ -d $tmp/$name ]] || fail "unpacking $archive" "it has no top-level folder $name" "fix GUIDE_DATASET_NAME in $site"
        if ! err=$(mv -T "$tmp/$name" "$scratch/$name" 2>&1); then
            # Another task sharing this disk renamed its complete copy first: use that one.
            [[ -d $scratch/$name ]] || fail "moving the unpacked $name into $scratch" "$err" "$fix"
        fi
        rm -rf "$tmp"
    ' staging "$GUIDE_SCRATCH" "$GUIDE_DATASET_ARCHIVE" "$GUIDE_DATASET_NAME" "$GUIDE_SITE_FILE" || exit
    GUIDE_DATA_ARGS=(--data "$target")
}

# Everything a script does before its launch line: guide_setup FRAMEWORK DIST, the
# framework (pytorch | tensorflow) and --dist the launch line uses, for the doctor.
# GUIDE_TRAIN_FLAGS are the flags every launch passes to `python -m guide_utils.train`:
# profile, staged data, site extras, where the run records go (results/, where the
# notebooks look for them).
guide_setup() {
    (($# == 2)) || guide_die "guide_setup needs the job's framework and --dist, e.g. guide_setup pytorch ddp"
    GUIDE_FRAMEWORK=$1 GUIDE_DIST=$2
    guide_load_site
    guide_software
    guide_banner
    guide_stage_data
    GUIDE_RESULTS_DIR=${GUIDE_RESULTS_DIR:-$GUIDE_ROOT/results}
    # shellcheck disable=SC2034  # used by the sbatch scripts' launch lines
    GUIDE_TRAIN_FLAGS=(--profile "$GUIDE_TRAIN_PROFILE" ${GUIDE_DATA_ARGS[@]+"${GUIDE_DATA_ARGS[@]}"}
                       ${GUIDE_TRAIN_ARGS[@]+"${GUIDE_TRAIN_ARGS[@]}"} --results-dir "$GUIDE_RESULTS_DIR" --no-progress)
    GUIDE_CHECKPOINTS=${GUIDE_CHECKPOINT_ROOT:-$GUIDE_ROOT/checkpoints}/${SLURM_JOB_NAME:-job}-${SLURM_JOB_ID:-0}
}

# Run a launch command so that the job survives its time limit: Slurm's warning (USR1, from
# --signal=B:USR1@SECONDS) reaches only this batch shell, which passes it to the launcher
# (srun forwards it to every task); the training saves a checkpoint and exits 75; the job
# then requeues itself and its next start resumes from that checkpoint.
guide_run_requeueable() {
    local pid status usr1=0 warned=0
    "$@" &
    pid=$!
    trap 'usr1=1 warned=1; echo "== USR1: time limit near, asking the training to checkpoint"; kill -USR1 "$pid" 2>/dev/null || true' USR1
    while :; do
        usr1=0 status=0
        wait "$pid" || status=$?
        ((usr1)) || break  # an interrupted wait returns early; wait again for the real status
    done
    trap - USR1
    # 75: checkpoint saved. 138 (killed by USR1) after a warning: it came before Python could
    # catch it; nothing since the last checkpoint is lost, so resume from that one.
    if ((status == 75 || (warned && status == 138))); then
        echo "== checkpoint saved in $GUIDE_CHECKPOINTS; requeueing job $SLURM_JOB_ID to resume"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    return "$status"
}
