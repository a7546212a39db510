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
    [[ -z $GUIDE_GPU_REQUEST || $GUIDE_GPU_REQUEST == *%d* || $GUIDE_GPU_REQUEST == *per-task* ]] ||
        guide_die "GUIDE_GPU_REQUEST='$GUIDE_GPU_REQUEST' in $file needs %d where the GPUs per node go" \
                  "(e.g. --gres=gpu:v100:%d), or must be a per-task request (e.g. --gpus-per-task=1)"
    [[ ! $GUIDE_GPU_REQUEST =~ (^|[[:space:]])(--gpus[=[:space:]]|-G) ]] ||
        guide_die "GUIDE_GPU_REQUEST='$GUIDE_GPU_REQUEST' in $file asks for the job's GPUs in all (--gpus), which Slurm" \
                  "may spread unevenly over the nodes; ask per node (--gpus-per-node=%d) or per task (--gpus-per-task=1)"
    [[ -z ${GUIDE_MODULE_PURGE:-} || $GUIDE_MODULE_PURGE == yes || $GUIDE_MODULE_PURGE == no ]] ||
        guide_die "GUIDE_MODULE_PURGE='$GUIDE_MODULE_PURGE' in $file must be yes or no (or unset: no)"
    [[ $GUIDE_TRAIN_PROFILE == smoke || $GUIDE_TRAIN_PROFILE == full ]] ||
        guide_die "GUIDE_TRAIN_PROFILE='$GUIDE_TRAIN_PROFILE' in $file must be smoke or full"
    [[ ${GUIDE_DOCTOR:-full} == full || $GUIDE_DOCTOR == quick ]] ||
        guide_die "GUIDE_DOCTOR='$GUIDE_DOCTOR' in $file must be full or quick (or unset: full)"
    [[ ${GUIDE_HOROVOD:-no} == no || $GUIDE_HOROVOD == yes ]] ||
        guide_die "GUIDE_HOROVOD='$GUIDE_HOROVOD' in $file must be yes or no (or unset: no)"
    case $GUIDE_SOFTWARE in
        venv) [[ -n ${GUIDE_VENV:-} ]] || guide_die "GUIDE_SOFTWARE=venv in $file needs GUIDE_VENV (the virtual environment)" ;;
        modules) [[ -n ${GUIDE_MODULES:-} ]] || guide_die "GUIDE_SOFTWARE=modules in $file needs GUIDE_MODULES (what to module load)" ;;
        apptainer) [[ -n ${GUIDE_CONTAINER:-} ]] || guide_die "GUIDE_SOFTWARE=apptainer in $file needs GUIDE_CONTAINER (the .sif image)" ;;
        *) guide_die "GUIDE_SOFTWARE='$GUIDE_SOFTWARE' in $file must be venv, modules or apptainer" ;;
    esac
    [[ -z $GUIDE_DATASET_ARCHIVE || -n ${GUIDE_DATASET_NAME:-} ]] ||
        guide_die "GUIDE_DATASET_ARCHIVE is set in $file but GUIDE_DATASET_NAME (the folder inside the archive) is not"
    # Lists of arguments are arrays, so that a value with a space (a path) stays one argument.
    for name in GUIDE_TRAIN_ARGS GUIDE_SBATCH_EXTRA GUIDE_APPTAINER_FLAGS GUIDE_APPTAINER_NET_LIBS GUIDE_SRUN_ARGS GUIDE_SHARED_SBATCH GUIDE_SHARED_SRUN_ARGS; do
        [[ -z ${!name+set} || $(declare -p "$name" 2>/dev/null) == "declare -a"* ]] ||
            guide_die "$name in $file must be an array, e.g. $name=(--one --two \"a value\"), not a string"
    done
    # --contain(all) hides the checkout, the working directory and /tmp from the image, which
    # the jobs write results to and stage data in: every job would fail after its queue wait.
    local flag
    for flag in ${GUIDE_APPTAINER_FLAGS[@]+"${GUIDE_APPTAINER_FLAGS[@]}"}; do
        case $flag in
            --contain | --containall | -c | -C)
                guide_die "GUIDE_APPTAINER_FLAGS in $file has $flag, which hides the checkout, the working directory" \
                          "and /tmp from the image (results, staged data): use --cleanenv, and -B for the folders the jobs use" ;;
        esac
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
        guide_check_site_variables "$GUIDE_SITE_FILE"
        # shellcheck source=/dev/null
        source "$GUIDE_SITE_FILE"
    fi
    guide_check_site "$GUIDE_SITE_FILE"
}

# A profile that names a variable this job does not set (a bare $LOCAL_SCRATCH at a centre
# whose node-local disk has another name) would end the job with bash's "unbound variable" and
# status 1. Sourced first in a subshell, where such a variable is found and named in one line.
guide_check_site_variables() {  # FILE
    local err
    # shellcheck source=/dev/null
    err=$(set -u; source "$1" 2>&1 >/dev/null) && return 0
    [[ $err =~ line\ ([0-9]+):\ ([A-Za-z_][A-Za-z0-9_]*):\ unbound\ variable ]] || return 0
    guide_die "site profile $1 line ${BASH_REMATCH[1]} uses \$${BASH_REMATCH[2]}, which this job does not set;" \
              "name your centre's variable for it, or write \${${BASH_REMATCH[2]}:-} where it may be unset"
}

# Whether this job got what the profile asks for. #SBATCH lines cannot read a profile, so the
# GPUs, CPUs per task and account come from submit.sh, which marks its jobs (GUIDE_SUBMITTED).
# A script given to plain `sbatch` gets none of them: at a site with a default account it would
# train on the CPU with one CPU per task and pass the doctor as a CPU job. Such a job stops
# here, unless its sbatch options carried the profile's GPUs and CPUs per task themselves.
guide_check_request() {
    local submitted=${GUIDE_SUBMITTED:-}
    # The mark is this job's: a plain sbatch run from inside it (a notebook's cell, your command
    # in 16) must not inherit it and pass unchecked.
    [[ -z ${SLURM_JOB_ID:-} ]] || unset GUIDE_SUBMITTED
    [[ -n ${SLURM_JOB_ID:-} && -z $submitted ]] || return 0
    local missing="" gpus=${SLURM_GPUS_ON_NODE:-${SLURM_JOB_GPUS:-}}
    [[ ${SLURM_CPUS_PER_TASK:-1} == "$GUIDE_CPUS_PER_TASK" ]] ||
        missing="${SLURM_CPUS_PER_TASK:-1} CPU(s) per task where the profile asks $GUIDE_CPUS_PER_TASK"
    [[ -z $GUIDE_GPU_REQUEST || (-n $gpus && $gpus != 0) ]] ||
        missing+="${missing:+ and }no GPU where the profile asks $GUIDE_GPU_REQUEST"
    [[ -z $missing ]] ||
        guide_die "job $SLURM_JOB_ID has $missing ($GUIDE_SITE_FILE): plain sbatch applies none of the site" \
                  "profile; submit with slurm_examples/submit.sh slurm_examples/${SLURM_JOB_NAME:-SCRIPT}.sbatch"
}

# The GPU request of a job that runs N tasks per node, in the site's syntax: N per node
# (a request with %d), or the site's per-task request as it is. Empty on CPU sites.
guide_gpu_option() {
    [[ -n $GUIDE_GPU_REQUEST ]] || return 0
    if [[ $GUIDE_GPU_REQUEST == *%d* ]]; then
        # shellcheck disable=SC2059  # the site profile supplies the format on purpose
        printf -- "$GUIDE_GPU_REQUEST\n" "$1"
    else
        printf -- '%s\n' "$GUIDE_GPU_REQUEST"
    fi
}

# Make python, horovodrun and torchrun the guide's. GUIDE_EXEC prefixes every command that
# must run inside the software environment (empty unless it is a container).
guide_software() {
    GUIDE_EXEC=()
    local nounset=${-//[^u]/}  # "u" where the caller runs with set -u
    case $GUIDE_SOFTWARE in
        modules)
            command -v module >/dev/null || guide_die "GUIDE_SOFTWARE=modules but this node has no 'module' command; use venv or apptainer"
            # No purge unless asked: on some systems (LUMI) it unloads the modules that make
            # the software stack visible in the first place.
            # Module and activation scripts are seldom written for `set -u` (Lmod's conda-based
            # modules read unset variables): off while they run.
            set +u
            [[ ${GUIDE_MODULE_PURGE:-no} != yes ]] || module purge
            # shellcheck disable=SC2086  # a list of module names
            module load $GUIDE_MODULES
            [[ -z $nounset ]] || set -u
            # A modules-only stack (no venv): the module brings PyTorch, the guide comes from here.
            [[ -n ${GUIDE_VENV:-} ]] || export PYTHONPATH=$GUIDE_ROOT/src${PYTHONPATH:+:$PYTHONPATH}
            ;;&
        venv | modules)
            if [[ -n ${GUIDE_VENV:-} ]]; then
                [[ -f $GUIDE_VENV/bin/activate ]] || guide_die "GUIDE_VENV=$GUIDE_VENV has no bin/activate; run scripts/setup.sh or fix the path"
                set +u
                # shellcheck source=/dev/null
                source "$GUIDE_VENV/bin/activate"
                [[ -z $nounset ]] || set -u
            fi
            ;;
        apptainer)
            [[ -f $GUIDE_CONTAINER ]] || guide_die "GUIDE_CONTAINER=$GUIDE_CONTAINER does not exist; build or copy the image first"
            guide_apptainer_net_flags
            # The checkout's guide_utils over the image's copy (installed editable from
            # /opt/guide/src): the image brings the software, the checkout the guide's code, so
            # scripts updated by a `git pull` never meet an older guide_utils in the image.
            GUIDE_EXEC=(apptainer exec ${GUIDE_APPTAINER_FLAGS[@]+"${GUIDE_APPTAINER_FLAGS[@]}"}
                        ${GUIDE_NET_FLAGS[@]+"${GUIDE_NET_FLAGS[@]}"} -B "$GUIDE_ROOT/src:$GUIDE_IMAGE_SRC:ro"
                        "$GUIDE_CONTAINER")
            # --cleanenv keeps the host's environment out of the image; what srun and the job
            # set for the training still goes in, by name (lib/apptainer_env.sh says which).
            for flag in ${GUIDE_APPTAINER_FLAGS[@]+"${GUIDE_APPTAINER_FLAGS[@]}"}; do
                if [[ $flag == --cleanenv || $flag == -e ]]; then
                    GUIDE_EXEC=("$GUIDE_ROOT/slurm_examples/lib/apptainer_env.sh" ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"})
                    break
                fi
            done
            ;;
    esac
}

# The host's libfabric and NCCL/RCCL network plugin (aws-ofi-nccl) inside the image, where the
# profile names them (GUIDE_APPTAINER_NET_LIBS: folders or files): each bound read-only at its
# own path, the folders (a file's folder) on the image's LD_LIBRARY_PATH, where NCCL looks for
# its plugin. The image has no plugin and no libfabric built for Slingshot: without them NCCL
# crosses a Slingshot network over TCP sockets (the doctor says so there). Sets GUIDE_NET_FLAGS.
GUIDE_IMAGE_SRC=/opt/guide/src  # where containers/guide.def puts guide_utils (an editable install)

guide_apptainer_net_flags() {
    GUIDE_NET_FLAGS=()
    local path folders=""
    for path in ${GUIDE_APPTAINER_NET_LIBS[@]+"${GUIDE_APPTAINER_NET_LIBS[@]}"}; do
        [[ -e $path ]] || guide_die "GUIDE_APPTAINER_NET_LIBS in $GUIDE_SITE_FILE names $path, which this node does not have"
        GUIDE_NET_FLAGS+=(-B "$path:$path:ro")
        if [[ -d $path ]]; then folders+="${folders:+:}$path"; else folders+="${folders:+:}$(dirname "$path")"; fi
    done
    [[ -z $folders ]] || GUIDE_NET_FLAGS+=(--env "LD_LIBRARY_PATH=$folders")
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
        "$GUIDE_TRAIN_PROFILE" "$GUIDE_SOFTWARE" "${GUIDE_SCRATCH:-${TMPDIR:-/tmp} (GUIDE_SCRATCH empty)}"
    printf '== dataset %s\n' "${GUIDE_DATASET_ARCHIVE:-"(none: the smoke profile's own data; the full profile needs --data)"}"
    printf '== framework %s, --dist %s, processes started by %s\n' "$GUIDE_FRAMEWORK" "$GUIDE_DIST" \
        "$(case $GUIDE_LAUNCH in tasks) echo srun ;; node) echo "a launcher per node" ;; shell) echo "a launcher in this shell" ;; esac)"
    printf '== CPUs per task %s, per srun task %s (SRUN_CPUS_PER_TASK), OMP_NUM_THREADS %s, site srun options: %s\n' \
        "${SLURM_CPUS_PER_TASK:-?}" "${SRUN_CPUS_PER_TASK:-?}" "${OMP_NUM_THREADS:-?}" "${GUIDE_SRUN_ARGS[*]:-none}"
    local quick=()
    [[ ${GUIDE_DOCTOR:-full} == full ]] || quick=(--quick)
    ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"} python -m guide_utils doctor --framework "$GUIDE_FRAMEWORK" --dist "$GUIDE_DIST" \
        --launch "$GUIDE_LAUNCH" --profile "$GUIDE_TRAIN_PROFILE" ${quick[@]+"${quick[@]}"} ||
        guide_die "guide_utils doctor: the software environment cannot run --framework $GUIDE_FRAMEWORK --dist $GUIDE_DIST (PROBLEM above)"
    # A PyTorch job on GPUs of several nodes: which network NCCL (RCCL) uses between them. A
    # site's network plugin that does not load leaves NCCL on TCP sockets, slower by an order of
    # magnitude, and nothing else says so.
    if [[ $GUIDE_FRAMEWORK == pytorch && $GUIDE_DIST != none && -n $GUIDE_GPU_REQUEST && ${SLURM_JOB_NUM_NODES:-1} -gt 1 &&
          ${GUIDE_DOCTOR:-full} == full ]]; then
        ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"} python -m guide_utils doctor --network ||
            guide_die "guide_utils doctor --network: NCCL would not use this site's network between the nodes (PROBLEM above)"
    fi
}

# Unpack the dataset archive to node-local disk, once per node (one task per node, in
# lib/stage_node.sh), and set GUIDE_DATA_ARGS to what the training command gets as --data.
# Reading thousands of small files from the parallel filesystem on every epoch is what makes
# multi-node jobs slow; one big sequential read per node is not. The copy is this job's own:
# guide-<job id> on the node's disk (GUIDE_SCRATCH; empty: $TMPDIR, else /tmp), never a
# folder another job or user left there, and removed when the job ends, however it ends.
# A scratch on a network file system, or one with less room than the archive, stops the job
# here with one line per node, instead of a training that cannot find its data later.
guide_stage_data() {
    GUIDE_DATA_ARGS=()
    [[ -n $GUIDE_DATASET_ARCHIVE ]] || return 0
    [[ -f $GUIDE_DATASET_ARCHIVE ]] ||
        guide_die "dataset archive $GUIDE_DATASET_ARCHIVE not found; fix GUIDE_DATASET_ARCHIVE in $GUIDE_SITE_FILE" \
                  "(ImageNet: python -m guide_utils prepare-imagenet; a test archive: python -m guide_utils" \
                  "pack-dataset digits FILE.tar)"
    local disk=${GUIDE_SCRATCH:-${TMPDIR:-/tmp}} size
    local folder=$disk/guide-$SLURM_JOB_ID
    size=$(numfmt --to=iec-i --suffix=B "$(stat -c %s "$GUIDE_DATASET_ARCHIVE")")
    echo "== staging $GUIDE_DATASET_ARCHIVE ($size) to $folder/$GUIDE_DATASET_NAME on each node:" \
         "each needs at least $size free in $disk"
    guide_hold_scratch "$folder"
    srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 \
        bash "$GUIDE_ROOT/slurm_examples/lib/stage_node.sh" stage "$folder" "$GUIDE_DATASET_ARCHIVE" \
        "$GUIDE_DATASET_NAME" "$GUIDE_SITE_FILE" || exit
    GUIDE_DATA_ARGS=(--data "$folder/$GUIDE_DATASET_NAME")
}

# The steps beside the training that need no GPU (the scratch holder, the warning's scan)
# run srun --gres=none without these variables: srun of Slurm 22.05 to 23.02.4 turns the GPU
# request sbatch exported (SLURM_GPUS_PER_NODE for --gpus-per-node, ...) into the step's own
# and then rejects it beside --gres=none ("Invalid Trackable RESource specification"; fixed
# in 23.02.5). GUIDE_NO_GPUS: the same as a command prefix, for the one started in the
# background (env execs srun, so $! is srun's pid).
GUIDE_GPU_VARIABLES=(SLURM_GPUS_PER_NODE SLURM_GPUS SLURM_GPUS_PER_SOCKET SLURM_GPUS_PER_TASK)
GUIDE_NO_GPUS=(env)
for _v in "${GUIDE_GPU_VARIABLES[@]}"; do GUIDE_NO_GPUS+=(-u "$_v"); done
unset _v

# Remove FOLDER on every node when the job ends: a step beside the job (--overlap) whose
# tasks wait for a signal: USR2 from this shell when it exits (done, failed, or requeued by
# guide_run_requeueable; srun passes USR2 on to its tasks), or TERM from Slurm (scancel, the
# time limit, a requeue by Slurm). It starts before anything is unpacked: a job being
# cancelled can start no step any more.
# Why a job of the guide's training programs would stop for want of data, printed (status 0),
# or nothing (status 1): the full profile (the site's GUIDE_TRAIN_PROFILE or a --profile in
# the training flags ARGS, the last one winning, as it does in the job) with no dataset
# archive in the profile and no --data in the flags; or (unless the first argument is
# --plan: a dry run, perhaps away from the cluster) an archive the profile names that is not
# there. The job would find out at its first line, after its wait in the queue.
guide_data_problem() {  # [--plan] ARGS...
    local profile=$GUIDE_TRAIN_PROFILE data="" prev="" arg here=1
    [[ ${1:-} != --plan ]] || { here=0; shift; }
    for arg in ${GUIDE_TRAIN_ARGS[@]+"${GUIDE_TRAIN_ARGS[@]}"} "$@"; do
        case $prev in --profile) profile=$arg ;; --data) data=$arg ;; esac
        case $arg in --profile=*) profile=${arg#*=} ;; --data=*) data=${arg#*=} ;; esac
        prev=$arg
    done
    if ((here)) && [[ -n $GUIDE_DATASET_ARCHIVE && ! -f $GUIDE_DATASET_ARCHIVE ]]; then
        echo "dataset archive $GUIDE_DATASET_ARCHIVE not found from $(hostname -s); fix GUIDE_DATASET_ARCHIVE in" \
             "$GUIDE_SITE_FILE (python -m guide_utils prepare-imagenet makes one), or set it empty for the smoke profile"
    elif [[ $profile == full && -z $GUIDE_DATASET_ARCHIVE && -z $data ]]; then
        echo "the full profile trains on ImageNet and this job would get no dataset: set GUIDE_DATASET_ARCHIVE" \
             "in $GUIDE_SITE_FILE (python -m guide_utils prepare-imagenet makes one), or pass -- --data DIR," \
             "or -- --data synthetic (random images: speed only), or -- --profile smoke"
    else
        return 1
    fi
}

guide_hold_scratch() {
    GUIDE_HOLD_FOLDER=$1
    # (GUIDE_SCRATCH_HOLDER: the mark by which lib/signal_node.sh never signals the holder)
    GUIDE_SCRATCH_HOLDER=$SLURM_JOB_ID "${GUIDE_NO_GPUS[@]}" srun --overlap --job-name=guide-scratch \
        --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task=1 --gres=none \
        bash "$GUIDE_ROOT/slurm_examples/lib/stage_node.sh" hold "$1" </dev/null &
    GUIDE_HOLD_SRUN=$!
    trap guide_release_scratch EXIT
    # On TERM too (scancel, the time limit): out through the EXIT trap.
    trap 'GUIDE_ENDING=TERM; exit 143' TERM
}

# Ask the holder to remove the folders and wait while it does (at exit, or before a requeue).
# A holder that was not listening yet (a job that failed at once: USR2 came before its trap)
# ends without removing anything: then a step of its own removes them, unless Slurm is
# ending the job, when no step can start (the next staging removes what a cancel left).
guide_release_scratch() {
    [[ -n ${GUIDE_HOLD_SRUN:-} ]] || return 0
    local status=0
    kill -USR2 "$GUIDE_HOLD_SRUN" 2>/dev/null || true
    wait "$GUIDE_HOLD_SRUN" 2>/dev/null || status=$?
    GUIDE_HOLD_SRUN=""
    if ((status != 0)) && [[ ${GUIDE_ENDING:-} != TERM ]]; then
        (unset "${GUIDE_GPU_VARIABLES[@]}"
         GUIDE_SCRATCH_HOLDER=$SLURM_JOB_ID srun --overlap --job-name=guide-scratch --ntasks="$SLURM_JOB_NUM_NODES" \
            --ntasks-per-node=1 --cpus-per-task=1 --gres=none bash "$GUIDE_ROOT/slurm_examples/lib/stage_node.sh" release \
            "$GUIDE_HOLD_FOLDER" </dev/null) || true
    fi
}

# The switch every training script has: DIST=horovod (the thesis's) or ddp (PyTorch's own
# DistributedDataParallel, which needs no Horovod: Horovod 0.28.1 of June 2023 is its last
# release, and many sites' PyTorch modules come without it). guide_dist DEFAULT prints it:
# DIST if set, else the script's DEFAULT, except that a site whose profile does not say that its
# software has a Horovod for its GPUs, with NCCL (GUIDE_HOROVOD=yes), gets ddp instead of a job
# that queues, then stops at the doctor (or averages its gradients through host memory).
guide_dist() {
    [[ -n ${GUIDE_SITE_FILE:-} ]] || guide_load_site
    local dist=${DIST:-$1}
    [[ -n ${DIST:-} || $dist != horovod || ${GUIDE_HOROVOD:-no} == yes ]] || dist=ddp
    [[ $dist == horovod || $dist == ddp ]] || guide_die "DIST=$dist: choose horovod or ddp"
    printf '%s\n' "$dist"
}

# Whether this job is smaller than one node (one node, fewer tasks than the site's GPUs per
# node) at a site that bills such jobs differently (GUIDE_SHARED_SBATCH): submit.sh then asks
# with those options instead of the partition and extras, and the steps take the
# GUIDE_SHARED_SRUN_ARGS (binding masks for a whole node do not fit a part of one).
guide_shared_job() {  # NODES TASKS_PER_NODE
    [[ -n ${GUIDE_SHARED_SBATCH[*]+set} && $1 == 1 && $2 -lt $GUIDE_TASKS_PER_NODE ]]
}

# CPUs and GPUs as the training processes see them, checked inside the job before it trains:
# one probe per process (run by srun like the training, or --local N for a launcher that
# starts N per node itself), judged together by the doctor. This is where a task bound to one
# CPU, a task without a GPU, or two ranks on one GPU show up (the batch shell sees none of it).
guide_check_tasks() {
    [[ -n ${SLURM_JOB_ID:-} ]] || { echo "== tasks: not in a Slurm job, not checked"; return 0; }
    local per_node=$((SLURM_NTASKS / SLURM_JOB_NUM_NODES)) probe=(python -m guide_utils task-probe)
    case $GUIDE_LAUNCH in
        tasks) srun "${GUIDE_SRUN_TASKS[@]/#--mpi=*/--mpi=none}" "${probe[@]}" ;;  # the probe needs no MPI
        node) srun "${GUIDE_SRUN_NODES[@]}" "${probe[@]}" --local "$per_node" ;;
        shell) ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"} "${probe[@]}" --local "$per_node" ;;
    esac | ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"} python -m guide_utils doctor --tasks - ||
        guide_die "guide_utils doctor --tasks: the training processes would not get the CPUs or GPUs this job asked for (PROBLEM above)"
}

# This Slurm's version as MAJOR.MINOR (srun --version: "slurm 23.11.4", "slurm-wlm 22.05.8");
# empty when there is no srun here.
guide_slurm_version() {
    local out
    out=$(srun --version 2>/dev/null) || return 0
    if [[ $out =~ ([0-9]+)\.([0-9]+) ]]; then
        printf '%d.%02d\n' "$((10#${BASH_REMATCH[1]}))" "$((10#${BASH_REMATCH[2]}))"
    fi
}

# Whether Slurm VERSION (MAJOR.MINOR; empty: unknown, taken as 22.05) is older than MAJOR.MINOR.
guide_slurm_before() {  # VERSION MAJOR.MINOR
    local a=${1:-22.05}
    ((10#${a%%.*} * 100 + 10#${a#*.} < 10#${2%%.*} * 100 + 10#${2#*.}))
}

# The variables that give srun steps the job's CPUs per task, for Slurm VERSION (MAJOR.MINOR;
# empty: unknown, taken as 22.05), CPUS per task, TASKS per node and the LAUNCH kind, one
# NAME=value a line. What srun reads differs by version (Slurm's CHANGELOG/slurm-22.05.md and
# slurm-23.11.md, and src/srun/opt.c at slurm-21-08-8-2, 22-05-8-1, 23-02-7-1, 23-11-0-1, 24-11-0-1):
#   before 22.05  srun takes --cpus-per-task from SLURM_CPUS_PER_TASK, the job's: nothing to do
#   22.05-23.02   it reads SRUN_CPUS_PER_TASK instead, so the job's value must be put there
#   23.11 on      it reads SLURM_CPUS_PER_TASK again (SRUN_CPUS_PER_TASK no longer)
# A launcher in this shell that reaches the nodes through a plain srun (mpirun: one daemon per
# node) must have each node's CPUs for all the ranks it starts there: before 23.11 that srun
# would take one task's worth (SLURM_ or SRUN_CPUS_PER_TASK), so mpirun passes it
# --cpus-per-task for the node (OMPI_MCA_plm_slurm_args, PRTE_... for Open MPI 5); from 23.11
# on, Slurm itself sets those to --external-launcher, a step made for such launchers.
guide_srun_cpu_env() {  # VERSION CPUS TASKS LAUNCH
    local version=${1:-22.05} major minor
    major=$((10#${version%%.*})) minor=$((10#${version#*.}))
    local v=$((major * 100 + minor)) name
    ((v < 2205 || v >= 2311)) || echo "SRUN_CPUS_PER_TASK=$2"
    if [[ $4 == shell ]] && ((v < 2311)); then
        for name in OMPI_MCA_plm_slurm_args PRTE_MCA_plm_slurm_args; do
            echo "$name=${!name:+${!name} }--cpus-per-task=$(($2 * $3))"
        done
    fi
}

# The environment and srun options of the job's training steps, for GUIDE_DIST and
# GUIDE_LAUNCH (see guide_setup; interactive engines use them too). After guide_software:
# GUIDE_EXEC ends each option list.
guide_task_options() {
    # The CPUs of the training steps, by what this Slurm's srun reads (guide_srun_cpu_env):
    # without it, a site that binds tasks to cores gives each training process (and its data
    # loaders) ONE CPU. Threaded libraries use what the task has, unless the profile says otherwise.
    local mpi=() nodes=${SLURM_JOB_NUM_NODES:-1} per_node=$((${SLURM_NTASKS:-1} / ${SLURM_JOB_NUM_NODES:-1})) line
    local version name
    version=$(guide_slurm_version)
    if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
        while read -r line; do
            [[ -z $line ]] || export "${line?}"
        done < <(guide_srun_cpu_env "$version" "$SLURM_CPUS_PER_TASK" "$per_node" "$GUIDE_LAUNCH")
        export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(guide_omp_threads "$SLURM_CPUS_PER_TASK")}
    fi
    if [[ $GUIDE_DIST == horovod && $GUIDE_LAUNCH == tasks ]]; then
        [[ $GUIDE_SRUN_MPI != none ]] ||
            guide_die "GUIDE_SRUN_MPI=none in $GUIDE_SITE_FILE: Horovod under srun needs srun's MPI plugin; use DIST=ddp" \
                      "(or LAUNCHER=mpirun in 03)"
        mpi=(--mpi="$GUIDE_SRUN_MPI")
    fi
    if guide_shared_job "$nodes" "$per_node"; then
        GUIDE_SRUN_ARGS=(${GUIDE_SHARED_SRUN_ARGS[@]+"${GUIDE_SHARED_SRUN_ARGS[@]}"})
    fi
    # A site that binds each task to the cores next to its GPU by a mask (LUMI's) has srun apply
    # it to srun's tasks only: the processes a launcher in this shell starts (02, 09) share the
    # job's cores, unbound. One task per GPU under srun is what binds them.
    if [[ $GUIDE_LAUNCH == shell && " ${GUIDE_SRUN_ARGS[*]:-}" == *" --cpu-bind="*mask_cpu:* ]]; then
        echo "== note: the profile's CPU masks (GUIDE_SRUN_ARGS) bind srun's tasks, and this job's processes start" \
             "in the batch shell, unbound; srun's tasks get them (03 with --nodes=1 and LAUNCHER=srun-ddp, 16 with LAUNCHER=srun)"
    fi
    GUIDE_SRUN_TASKS=(--kill-on-bad-exit=1 ${mpi[@]+"${mpi[@]}"} ${GUIDE_SRUN_ARGS[@]+"${GUIDE_SRUN_ARGS[@]}"}
                      ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"})
    # One launcher per node gets the CPUs (and, at a per-task GPU site, the GPUs) of all
    # the processes it starts; without them it would inherit a one-task share.
    # (A step may not ask for more GPUs per task than the job did, so it asks per node.)
    # In the profile's GRES (a site that shares GPUs asks --gres=shard:N): a gpu request the
    # job does not hold would be refused.
    local node_gpus=() per_task gres=gpu node_gpu_bind=()
    per_task=$(guide_gpus_per_task)
    # (the name of the entry that carries %d: "--gpus-per-node=%d --gres=nvme:200" asks for GPUs)
    [[ ! $GUIDE_GPU_REQUEST =~ --gres=([^ ]*,)?([A-Za-z_]+)(:[A-Za-z0-9_.-]+)?:%d ]] || gres=${BASH_REMATCH[2]}
    [[ -z $GUIDE_GPU_REQUEST ]] || node_gpus=(--gres="$gres:$((per_node * ${per_task:-1}))")
    # A job that asks for GPUs per task hands every step that request and, with it, a binding
    # of each task to its own GPUs: srun reads SLURM_GPUS_PER_TASK (22.05, 23.02), or
    # SLURM_TRES_PER_TASK and SLURM_TRES_BIND (23.11 on), from the environment sbatch exported,
    # and binds per_task:N when no binding is named (src/srun/libsrun/launch.c at 22.05;
    # _implicitly_bind_tres_per_task in src/common/slurm_opt.c from 23.11). The one task per node
    # must see every GPU of its node: its per-node --gres sets the step's count (a GRES per node
    # comes before one per task, gres_ctld.c), and --gpu-bind=none replaces the inherited binding
    # (arg_set_gpu_bind). (slurmstepd also drops a binding for a step of one task on a node, mgr.c;
    # the step says so itself rather than rely on that.)
    [[ -z $per_task && ${SLURM_TRES_BIND:-} != *gpu* && -z ${SLURM_GPU_BIND:-} ]] || node_gpu_bind=(--gpu-bind=none)
    # mpirun in this shell starts its daemons by a plain srun of one task per node, which inherits
    # the same per-task request and binding (one GPU a node for all its ranks): before 23.11 (from
    # then on Slurm makes it an --external-launcher step) its srun line gets the node's request too.
    if [[ $GUIDE_LAUNCH == shell && ${#node_gpus[@]} -gt 0 && ${#node_gpu_bind[@]} -gt 0 ]] &&
        guide_slurm_before "$version" 23.11; then
        for name in OMPI_MCA_plm_slurm_args PRTE_MCA_plm_slurm_args; do
            export "$name=${!name:+${!name} }${node_gpus[0]} --gpu-bind=none"
        done
    fi
    local node_bind=()
    mapfile -t node_bind < <(guide_node_cpu_bind "$per_node")
    GUIDE_SRUN_NODES=(--kill-on-bad-exit=1 --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1
                      --cpus-per-task=$((per_node * ${SLURM_CPUS_PER_TASK:-1})) ${node_gpus[@]+"${node_gpus[@]}"}
                      ${node_gpu_bind[@]+"${node_gpu_bind[@]}"} ${node_bind[@]+"${node_bind[@]}"}
                      ${GUIDE_EXEC[@]+"${GUIDE_EXEC[@]}"})
}

# OpenMP's (and PyTorch's) threads for a task of CPUS Slurm CPUs: one per physical core. Where
# Slurm counts hardware threads as CPUs (the node's CPUTot is sockets x cores x threads per core:
# Perlmutter's 128 on 64 cores), CPUS are CPUS / threads-per-core cores, and as many threads again
# would share them; where it counts cores (CPUTot = sockets x cores: LUMI's 7 are seven cores), or
# the job asked for one thread per core (--threads-per-core=1, --hint=nomultithread), a CPU is a core.
guide_omp_threads() {  # CPUS
    local out total=0 sockets=0 cores=0 threads=1
    if [[ ${SLURM_THREADS_PER_CORE:-} != 1 && ${SLURM_HINT:-} != *nomultithread* ]] &&
        out=$(scontrol show node "${SLURMD_NODENAME:-}" -o 2>/dev/null); then
        [[ ! $out =~ CPUTot=([0-9]+) ]] || total=${BASH_REMATCH[1]}
        [[ ! $out =~ \ Sockets=([0-9]+) ]] || sockets=${BASH_REMATCH[1]}
        [[ ! $out =~ CoresPerSocket=([0-9]+) ]] || cores=${BASH_REMATCH[1]}
        [[ ! $out =~ ThreadsPerCore=([0-9]+) ]] || threads=${BASH_REMATCH[1]}
    fi
    if ((threads > 1 && sockets * cores > 0 && total >= sockets * cores * threads && $1 >= threads)); then
        printf '%s\n' "$(($1 / threads))"
    else
        printf '%s\n' "$1"
    fi
}

# The GPUs per task of a job that asks for them per task, empty for one that asks per node:
# what sbatch exported (SLURM_GPUS_PER_TASK to 23.02, "1" or "a100:1"; SLURM_TRES_PER_TASK from
# 23.02, "cpu:8,gres:gpu:1" or, from 24.05, "cpu=8,gres/gpu:a100=1"), else the profile's request.
guide_gpus_per_task() {
    if [[ -n ${SLURM_GPUS_PER_TASK:-} ]]; then
        printf '%s\n' "${SLURM_GPUS_PER_TASK##*:}"
    elif [[ ${SLURM_TRES_PER_TASK:-} =~ gres[/:]gpu(:[A-Za-z0-9_.-]+)?[:=]([0-9]+) ]]; then
        printf '%s\n' "${BASH_REMATCH[2]}"
    elif [[ $GUIDE_GPU_REQUEST =~ gpus-per-task[=\ ]*([A-Za-z0-9_.-]+:)?([0-9]+) ]]; then
        printf '%s\n' "${BASH_REMATCH[2]}"
    fi
}

# The CPU binding of one launcher per node (torchrun) where the site binds each task by a
# mask (LUMI's, the cores next to each GCD): the union of the masks of the node's first N
# tasks, so that the launcher and the processes it starts keep to the cores the site meant
# for them (the site's reserved cores stay free). Nothing where the site names no masks.
guide_node_cpu_bind() {  # TASKS_PER_NODE
    local arg masks union i
    for arg in ${GUIDE_SRUN_ARGS[@]+"${GUIDE_SRUN_ARGS[@]}"}; do
        [[ $arg == --cpu-bind=*mask_cpu:* ]] || continue
        IFS=, read -ra masks <<<"${arg#*mask_cpu:}"
        union=0
        for ((i = 0; i < $1 && i < ${#masks[@]}; i++)); do union=$(guide_hex_or "$union" "${masks[i]}"); done
        printf -- '--cpu-bind=mask_cpu:0x%s\n' "$union"
    done
}

# The bitwise OR of two hexadecimal CPU masks (with or without 0x), in hexadecimal without 0x,
# digit by digit: bash's arithmetic stops at 64 bits, and a node of more than 64 CPUs (or
# hardware threads) has masks wider than that.
guide_hex_or() {  # A B
    local a=${1#0[xX]} b=${2#0[xX]} out="" i
    while ((${#a} < ${#b})); do a=0$a; done
    while ((${#b} < ${#a})); do b=0$b; done
    for ((i = 0; i < ${#a}; i++)); do
        out+=$(printf '%x' $((16#${a:i:1} | 16#${b:i:1})))
    done
    out=${out#"${out%%[!0]*}"}  # no leading zeros
    printf '%s\n' "${out:-0}"
}

# Where run records and checkpoint folders go: GUIDE_RESULTS_DIR and GUIDE_CHECKPOINT_ROOT,
# else under the profile's GUIDE_OUTPUT, else in the repository.
guide_results_dir() {
    printf '%s\n' "${GUIDE_RESULTS_DIR:-${GUIDE_OUTPUT:-$GUIDE_ROOT}/results}"
}
guide_checkpoint_root() {
    printf '%s\n' "${GUIDE_CHECKPOINT_ROOT:-${GUIDE_OUTPUT:-$GUIDE_ROOT}/checkpoints}"
}

# This job's own checkpoint folder. The jobs of one chain (chain.sh) share the chain's; the
# tasks of an array are separate runs (04-07: one batch size each), so each keeps a folder of
# its own in it: sharing one, they would prune each other's checkpoints and resume another's.
guide_checkpoint_dir() {
    if [[ -n ${GUIDE_CHAIN_CHECKPOINTS:-} ]]; then
        printf '%s\n' "$GUIDE_CHAIN_CHECKPOINTS${SLURM_ARRAY_TASK_ID:+/task-$SLURM_ARRAY_TASK_ID}"
    else
        printf '%s\n' "$(guide_checkpoint_root)/${SLURM_JOB_NAME:-job}-${SLURM_JOB_ID:-0}"
    fi
}

# Slurm's time-limit warning (--signal=B:USR1@SECONDS) comes that long before the limit, or at
# once when the limit is shorter: with a short --time (a test or debug queue) it can reach the
# batch shell during the doctor or the staging, before guide_run_requeueable listens, and bash's
# default for USR1 would end the job there with status 138 and no word. From the start of the
# set-up it is noted instead, and the launch then stops with one line (see guide_run_requeueable).
guide_note_early_warning() {
    trap 'GUIDE_EARLY_WARNING=1; echo "== USR1 during the set-up: the time limit is near"' USR1
}

# Everything a script does before its launch line: guide_setup FRAMEWORK DIST [LAUNCH], the
# framework (pytorch | tensorflow) and --dist the launch line uses, for the doctor, and how
# the training processes start: tasks (srun starts each one: the default), node (srun starts
# one launcher per node, such as torchrun) or shell (a launcher in this batch shell:
# horovodrun, torchrun on one node, mpirun). Sets for the launch line:
#   GUIDE_SRUN_TASKS  srun options, then the software prefix, for a step of one task per GPU
#   GUIDE_SRUN_NODES  the same for a step of one task per node that owns the node's GPUs
#   GUIDE_TRAIN_FLAGS the flags every launch passes to `python -m guide_utils.train`: profile,
#                     staged data, site extras, run records in results/ (where the notebooks
#                     look), and the checkpoints that let the job resume after a requeue
guide_setup() {
    (($# == 2 || $# == 3)) ||
        guide_die "guide_setup needs the job's framework and --dist (and how it launches), e.g. guide_setup pytorch ddp tasks"
    GUIDE_FRAMEWORK=$1 GUIDE_DIST=$2 GUIDE_LAUNCH=${3:-tasks}
    [[ $GUIDE_LAUNCH == tasks || $GUIDE_LAUNCH == node || $GUIDE_LAUNCH == shell ]] ||
        guide_die "guide_setup: launch '$GUIDE_LAUNCH' must be tasks, node or shell"
    guide_note_early_warning
    guide_load_site
    guide_check_request
    guide_software
    guide_task_options
    guide_banner
    guide_check_tasks
    # A script whose program reads no dataset (10's benchmark, 09's notebooks) sets
    # GUIDE_STAGE=no: a copy of ImageNet to every node would cost time and the parallel file
    # system's bandwidth for nothing.
    if [[ ${GUIDE_STAGE:-yes} == no ]]; then GUIDE_DATA_ARGS=(); else guide_stage_data; fi
    # Run records and checkpoints under the profile's GUIDE_OUTPUT (a project's scratch: the
    # repository often sits in $HOME, whose quota a few ResNet-50 checkpoints fill), else here.
    GUIDE_RESULTS_DIR=$(guide_results_dir)
    GUIDE_CHECKPOINTS=$(guide_checkpoint_dir)
    # shellcheck disable=SC2034  # used by the sbatch scripts' launch lines
    GUIDE_TRAIN_FLAGS=(--profile "$GUIDE_TRAIN_PROFILE" ${GUIDE_DATA_ARGS[@]+"${GUIDE_DATA_ARGS[@]}"}
                       ${GUIDE_TRAIN_ARGS[@]+"${GUIDE_TRAIN_ARGS[@]}"} --results-dir "$GUIDE_RESULTS_DIR" --no-progress
                       --checkpoint-dir "$GUIDE_CHECKPOINTS")
}

# The guide's own training processes: a Python interpreter whose first argument that is not
# a flag is `-m guide_utils.train` or `-m guide_utils.train_tf` (as srun, mpirun, horovodrun
# and torchrun start them: torchrun adds -u). Anchored, so that the launchers' own command
# lines, which name the module further on (`python .../torchrun ... -m guide_utils.train`,
# `python .../horovodrun ... python -m guide_utils.train`, `mpirun ...`, `srun ...`), do not
# match: torchrun and horovodrun do not trap USR1 and die of it, and the workers' checkpoint
# dies with them.
GUIDE_ENGINE_MATCH='^([^ ]*/)?python[0-9.]*( -[^ ]+)* -m guide_utils[.]train(_tf)?( |$)'

# Send a signal to this job's training processes on every node, whatever started them: srun
# and mpirun pass a USR1 on to their tasks, but torchrun and horovodrun would die of it (or
# end their workers with a grace of seconds). A step of one task per node (lib/signal_node.sh)
# finds them by their command line and by the job id in their environment: GUIDE_SIGNAL_MATCH,
# an extended regular expression matched against the command line (arguments joined by
# spaces), by default the guide's own training processes (GUIDE_ENGINE_MATCH);
# 16_your_own_script.sbatch sets it from the reader's command (guide_command_match). It never
# signals this batch shell (its pid goes along), itself or the scratch holder, and looks
# through a shell wrapper to the program it runs. --overlap lets the step run beside the
# training step. The step has a time limit of its own (1 minute, Slurm's smallest): the batch
# shell waits for it inside its USR1 trap, and a scan that does not end (one once spun for 10
# minutes) would hold the job until its time limit, unrequeued. Where no node found a process
# to signal and the training processes are the tasks of an srun (SRUN_PID, this shell's child:
# a script that execs a program its command does not name), that srun gets the signal and
# passes it on to its tasks, the programs they have become.
guide_signal_training() {  # SIGNAL [SRUN_PID]
    local out status=0 line sent=0
    out=$(unset "${GUIDE_GPU_VARIABLES[@]}"
        srun --overlap --time=1 --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
        --ntasks-per-node=1 --cpus-per-task=1 --gres=none bash "$GUIDE_ROOT/slurm_examples/lib/signal_node.sh" "$1" "$SLURM_JOB_ID" \
        "${GUIDE_SIGNAL_MATCH:-$GUIDE_ENGINE_MATCH}" "${SLURMD_NODENAME:-${HOSTNAME%%.*}}:$$") || status=$?
    [[ -z $out ]] || printf '%s\n' "$out"
    ((status == 0)) || echo "== could not signal every node (srun exit $status)" >&2
    while read -r line; do
        [[ ! $line =~ \ sent\ to\ ([0-9]+)\ training ]] || sent=$((sent + BASH_REMATCH[1]))
    done <<<"$out"
    # Nothing signalled: the srun gets it where the scan itself failed (better the training's
    # srun than nobody), or where a reader's command (GUIDE_SIGNAL_MATCH, 16's) matched nothing;
    # not where the guide's own engine did not match: it may not be listening yet.
    if ((sent == 0)) && [[ -n ${2:-} ]] && { ((status != 0)) || [[ -n ${GUIDE_SIGNAL_MATCH:-} ]]; } &&
        kill "-$1" "$2" 2>/dev/null; then
        echo "== no process was signalled; $1 sent to the training's srun, which passes it on to its tasks"
    fi
}

# Where in a training command (its words as arguments) the program to warn is, as KIND INDEX:
# the first Python interpreter (KIND python: it runs SCRIPT or -m MODULE) or shell (shell: it
# runs a script, and the warning goes to what that runs) from the left, so that a wrapper in
# front of it that execs into it is looked through (`./select_gpu python train.py`, LUMI's;
# `env A=1 python ...`, `apptainer exec IMAGE python ...`); else the last argument that is a
# program file (`./select_gpu ./train`), else the command's own program (KIND program).
guide_command_target() {
    local words=("$@") i target=0 name
    for ((i = 0; i < ${#words[@]}; i++)); do
        name=${words[i]##*/}
        if [[ $name =~ ^python[0-9.]*$ ]]; then echo "python $i"; return 0; fi
        if [[ $name =~ ^(ba|da|z|k)?sh$ ]]; then echo "shell $i"; return 0; fi
        if ((i > 0)) && [[ ${words[i]} == */* && ${words[i]} != -* && -f ${words[i]} && -x ${words[i]} ]]; then
            target=$i
        fi
    done
    echo "program $target"
}

# The GUIDE_SIGNAL_MATCH for a training command (its words as arguments): the processes that
# run its program, not the launchers around them (guide_command_target says which program).
# `python [-flags] SCRIPT.py ...` and `python [-flags] -m MODULE ...` match a Python interpreter
# whose first argument that is not a flag is that script or module (as the command gives it, or
# as torchrun passes it on: `python -u SCRIPT.py`), which torchrun's own command line
# (`python .../torchrun ... SCRIPT.py`) and mpirun's do not; `bash [-flags] SCRIPT ...` a shell
# running that script (lib/signal_node.sh then warns the program it runs); any other program
# matches by its name, also when an interpreter runs it by its #! line (`python3 ./train.py`).
guide_command_match() {
    local kind i target
    read -r kind i < <(guide_command_target "$@")
    local words=("${@:i+1}")
    i=1
    case $kind in
        python)
            while [[ ${words[i]:-} == -?* && ${words[i]} != -m ]]; do i=$((i + 1)); done
            if [[ ${words[i]:-} == -m ]]; then
                target="-m $(guide_regex_literal "${words[i + 1]:-}")"
            else
                target=$(guide_regex_literal "${words[i]:-}")
            fi
            printf '^([^ ]*/)?python[0-9.]*( -[^ ]+)* %s( |$)\n' "$target"
            ;;
        shell)
            while [[ ${words[i]:-} == -?* ]]; do i=$((i + 1)); done
            printf '^([^ ]*/)?%s( -[^ ]+)* ([^ ]*/)?%s( |$)\n' "$(guide_regex_literal "${words[0]##*/}")" \
                "$(guide_regex_literal "${words[i]##*/}")"
            ;;
        program)
            printf '^(([^ ]*/)?(python[0-9.]*|(ba|da|z|k)?sh)( -[^ ]+)* )?([^ ]*/)?%s( |$)\n' \
                "$(guide_regex_literal "${words[0]##*/}")"
            ;;
    esac
}

# A command whose program the warning could not find, refused or warned about in one line
# before it queues (submit.sh) and again at the top of the job: a launcher inside it (it would
# be warned instead of the training, or start it twice), code given as a string (`python -c`,
# `bash -c`: no script to find), and a script that execs a program its command line does not
# name (the processes then no longer match). Nothing when GUIDE_SIGNAL_MATCH is set: yours.
guide_command_check() {
    [[ -z ${GUIDE_SIGNAL_MATCH:-} ]] && (($#)) || return 0
    local word kind i file line
    for word in "$@"; do
        case ${word##*/} in
            srun | mpirun | mpiexec | orterun | prterun | torchrun | horovodrun | torch.distributed.run | torch.distributed.launch)
                guide_die "the command starts ${word##*/} itself: give the training command alone (LAUNCHER=srun," \
                          "torchrun, mpirun or horovodrun starts it), or Slurm's time-limit warning reaches ${word##*/}, not your training" ;;
        esac
    done
    read -r kind i < <(guide_command_target "$@")
    local args=("$@") j
    for ((j = 0; j <= i; j++)); do  # launchers by another name, among the wrappers before the program
        case ${args[j]##*/}:${args[j + 1]:-} in
            deepspeed:* | accelerate:launch | accelerate-launch:*)
                guide_die "the command starts ${args[j]##*/} itself, a launcher: give the training command alone" \
                          "(LAUNCHER=srun or torchrun starts it), or Slurm's time-limit warning reaches ${args[j]##*/}, not your training" ;;
            uv:run)
                guide_die "the command starts uv run, which would sync the environment in every task at once and" \
                          "stand between the warning and your training: give the command alone (the site profile's" \
                          "GUIDE_SOFTWARE, e.g. GUIDE_VENV=.venv, sets up the environment)" ;;
        esac
    done
    local words=("${@:i+1}")
    if [[ $kind != program && ${words[1]:-} == -c ]]; then
        guide_die "'${words[0]} -c CODE': the time-limit warning finds your program by its script, which a command" \
                  "string does not have; put the code in a file (python train.py, bash train.sh)"
    fi
    if [[ $kind == python ]]; then  # an interpreter flag with its value apart hides the script
        for ((j = 1; j < ${#words[@]}; j++)); do
            [[ ${words[j]} == -?* && ${words[j]} != -m ]] || break
            if [[ ${words[j]} == -[WX] ]]; then
                guide_die "'${words[j]} ${words[j + 1]:-}': give the flag and its value as one word" \
                          "(${words[j]}${words[j + 1]:-}), so that the time-limit warning finds your script after it"
            fi
        done
    fi
    file=${words[0]}
    if [[ $kind == shell ]]; then
        i=1
        while [[ ${words[i]:-} == -?* ]]; do i=$((i + 1)); done
        file=${words[i]:-}
    fi
    [[ $kind != python && -f $file ]] || return 0
    # A script that starts a launcher: the warning would reach the launcher (torchrun dies of
    # it and takes its workers along, no checkpoint), not the training processes.
    # (after `exec`, `env [-flags] [VAR=value...]` or leading VAR=value words; also as python -m)
    local lead='^[[:space:]]*(exec[[:space:]]+)?(env([[:space:]]+-[^[:space:]]+)*[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*=[^[:space:]]*[[:space:]]+)*'
    local launchers='([^[:space:]#]*/)?(srun|mpirun|mpiexec|torchrun|horovodrun|deepspeed|accelerate)([[:space:]]|$)'
    local modules='([^[:space:]#]*/)?python[0-9.]*([[:space:]]+-[^[:space:]m][^[:space:]]*)*[[:space:]]+-m[[:space:]]*(torch\.distributed\.(run|launch)|deepspeed|horovod\.runner)([[:space:]]|$)'
    line=$(grep -I -n -m 1 -E "$lead($launchers|$modules)" "$file" 2>/dev/null) &&
        guide_die "$file starts a launcher itself (line ${line%%:*}: ${line#*:}): give the training command" \
                  "alone (LAUNCHER=srun, torchrun, mpirun or horovodrun starts it), or Slurm's time-limit warning reaches the launcher, not your training"
    line=$(grep -I -n -m 1 -E '^[[:space:]]*exec[[:space:]]+[^[:space:]<>&-]' "$file" 2>/dev/null) || return 0
    echo "warning: $file execs another program (line ${line%%:*}: ${line#*:}), which the time-limit warning" \
         "finds only if the command names it (or, with LAUNCHER=srun, through srun): write it after $file" \
         "(./select_gpu python train.py ...), or set GUIDE_SIGNAL_MATCH" >&2
}

# A reader's command as torchrun takes it, one argument per NUL-terminated item: torchrun
# starts `python -u` itself, so the interpreter and its -u go; SCRIPT or -m MODULE stay; any
# other program runs with --no-python. Another interpreter flag cannot pass through torchrun:
# one line says so (the script calls this before the set-up, so that it stops at once).
guide_torchrun_args() {
    if [[ ${1##*/} != python* ]]; then
        printf '%s\0' --no-python "$@"
        return 0
    fi
    shift
    while [[ ${1:-} == -u ]]; do shift; done
    [[ ${1:-} != -?* || $1 == -m ]] ||
        guide_die "LAUNCHER=torchrun starts python itself (with -u) and cannot pass it '$1'; drop it, set it" \
                  "through the environment (PYTHONOPTIMIZE, PYTHONWARNINGS, ...), or use LAUNCHER=srun"
    printf '%s\0' "$@"
}

# A string as an extended regular expression that matches only itself.
guide_regex_literal() {
    # shellcheck disable=SC2001  # one sed for every special character at once
    sed 's/[][\.*^$+?(){}|]/\\&/g' <<<"$1"
}

# Run a launch command so that the job survives its time limit: Slurm's warning (USR1, from
# --signal=B:USR1@SECONDS) reaches only this batch shell, which passes it on to the training
# processes; they save a checkpoint and exit 75 (the launcher may report another failure);
# the job then requeues itself and its next start resumes from that checkpoint. The command
# is printed first: the job log says exactly what ran.
guide_run_requeueable() {
    local pid status usr1=0 warned=0 tasks=
    # Training started now would be warned at once, checkpoint and requeue, again and again.
    [[ -z ${GUIDE_EARLY_WARNING:-} ]] ||
        guide_die "Slurm's time-limit warning came before the training started: the job's --time leaves no time" \
                  "to train after the set-up and the warning (#SBATCH --signal); submit it with a longer --time"
    printf '== launch:'; printf ' %q' "$@"; printf '\n'
    # Listening before the start: a warning just after it still reaches the training.
    trap 'usr1=1 warned=1; echo "== USR1: time limit near, asking the training to checkpoint"; guide_signal_training USR1 $tasks' USR1
    "$@" &
    pid=$!
    # srun's tasks are the training processes (not a launcher per node, torchrun, which dies of it)
    # (16's own commands: the engine's processes always match GUIDE_ENGINE_MATCH)
    [[ ${1##*/} != srun || ${GUIDE_LAUNCH:-} != tasks ]] || tasks=$pid
    while :; do
        usr1=0 status=0
        wait "$pid" || status=$?
        ((usr1)) || break  # an interrupted wait returns early; wait again for the real status
    done
    trap - USR1
    # The launcher's own status after a warning: 138 (128 + USR1) would say the signal reached
    # the launcher rather than only the training processes.
    ((!warned)) || echo "== launch ended with status $status after the warning"
    # After a warning, any failure with a checkpoint on disk is a stop to resume from: 75 from
    # the training itself, or the status a launcher makes of it (torchrun: 1).
    if ((status == 75)) || { ((warned && status != 0)) && compgen -G "$GUIDE_CHECKPOINTS/*" >/dev/null; }; then
        echo "== checkpoint saved in $GUIDE_CHECKPOINTS; requeueing job $SLURM_JOB_ID to resume"
        guide_release_scratch  # before the requeue ends this job's steps: the next start stages afresh
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    return "$status"
}
