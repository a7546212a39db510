#!/usr/bin/env bash
# One node's part of the dataset staging (guide_stage_data in lib/guide.sh). srun runs it as
# one task per node; it is never sourced.
#
#   stage_node.sh stage FOLDER ARCHIVE NAME SITE_FILE   unpack ARCHIVE into FOLDER/NAME
#   stage_node.sh hold FOLDER                           remove FOLDER when the job ends
#   stage_node.sh release FOLDER                        remove FOLDER now (a holder that missed USR2)
#
# FOLDER is this job's own, guide-<job id> on the node's local disk (GUIDE_SCRATCH). A
# problem is one line on stderr, "error: staging on node N: what; the fix", and exit 2.
set -uo pipefail
node=${SLURMD_NODENAME:-$(hostname)}
# File systems served over the network (names as df and stat -f print them): a "scratch"
# there would have every node read the dataset from the same servers again, which is what
# staging exists to avoid. tmpfs is fine: memory is node-local (it counts against the job's).
network='^(nfs.*|lustre|gpfs|beegfs|fhgfs|cifs|smb.*|ceph|fuse\.ceph.*|glusterfs|fuse\.glusterfs|panfs|afs|9p|v9fs|pvfs2|orangefs|wekafs|dvs|quobyte|fuse\.quobyte|fuse\.sshfs)$'

refuse() {  # one line: what is wrong, the fix
    echo "error: staging on node $node: $1; $2" >&2
    exit 2
}

fail() {  # one line: what failed, its first error line, the fix
    local first=""
    read -r first <<<"$2" || true
    refuse "$1 failed ($first)" "$3"
}

human() {
    numfmt --to=iec-i --suffix=B "$1"
}

# The file system that holds PATH, or would: that of its nearest existing parent.
filesystem() {
    local path=$1
    until [[ -e $path ]]; do path=$(dirname -- "$path"); done
    df --output=fstype -- "$path" 2>/dev/null | tail -n 1 || stat -f -c %T -- "$path"
}

# The memory limit of this process's cgroup in bytes, the smallest on its path (Slurm sets the
# job's on the job's cgroup, above the step's and the task's): cgroup v2's memory.max, v1's
# memory.limit_in_bytes. Empty where there is none or none can be read. GUIDE_CGROUP_ROOT: where
# the cgroup file system is mounted (/sys/fs/cgroup).
memory_limit() {
    local base=${GUIDE_CGROUP_ROOT:-/sys/fs/cgroup} line root dir file value limit=""
    while IFS= read -r line; do
        case $line in
            0::*) root=$base dir=${line#0::} file=memory.max ;;
            *:memory:*) root=$base/memory dir=${line#*:memory:} file=memory.limit_in_bytes ;;
            *) continue ;;
        esac
        while :; do
            if [[ -r $root$dir/$file ]] && read -r value <"$root$dir/$file" && [[ $value =~ ^[0-9]+$ ]]; then
                [[ -n $limit ]] && ((limit <= value)) || limit=$value
            fi
            [[ -n $dir && $dir != / ]] || break
            dir=${dir%/*}
        done
    done </proc/self/cgroup
    printf '%s\n' "$limit"
}

stage() {
    local folder=$1 archive=$2 name=$3 site=$4 disk=${1%/*} tmp="" err fstype need free old limit
    local fix="free space in $disk or set GUIDE_SCRATCH in $site to a larger node-local disk"
    fstype=$(filesystem "$disk")
    [[ ! $fstype =~ $network ]] ||
        refuse "GUIDE_SCRATCH=$disk is on $fstype, a network file system, not this node's own disk" \
               "set GUIDE_SCRATCH in $site to the node-local disk your centre's user guide names (\$TMPDIR, \$LOCAL_SCRATCH), or to empty for \$TMPDIR"
    err=$(mkdir -p -- "$disk" 2>&1) || fail "creating GUIDE_SCRATCH=$disk" "$err" "$fix"
    # Readable by you alone: the dataset's licence is yours, not every user's of the node.
    if ! err=$(mkdir -m 700 -- "$folder" 2>&1) && [[ ! -d $folder ]]; then
        fail "creating $folder" "$err" "$fix"
    fi
    # Another user's folder of this name is never taken for this job's copy.
    [[ -O $folder ]] ||
        refuse "$folder exists and belongs to $(stat -c %U -- "$folder"), not to you" \
               "remove it, or set GUIDE_SCRATCH in $site to a disk folder of yours"
    # What earlier jobs of yours left here when a cancel cut their clean-up short (see hold).
    for old in "$disk"/.guide-*.removing; do
        [[ ! -d $old || ! -O $old ]] || rm -rf -- "$old"
    done
    if [[ -d $folder/$name ]]; then  # only this job writes here: an earlier start, or a node on the same disk
        echo "== staging on node $node: $folder/$name is complete already (this job's own copy)"
        return 0
    fi
    need=$(stat -c %s -- "$archive")
    free=$(df -B1 --output=avail -- "$folder" | tail -n 1)
    ((free >= need)) ||
        refuse "$disk has $(human "$free") free, and unpacking $archive takes at least its size, $(human "$need")" "$fix"
    # A disk in memory (/tmp on many Cray nodes) holds the copy in the job's memory: a copy larger
    # than the job's limit gets tar killed for memory, which would read as a full disk.
    if [[ $fstype == tmpfs || $fstype == ramfs ]]; then
        limit=$(memory_limit)
        [[ -z $limit ]] || ((need < limit)) ||
            refuse "$disk is in memory ($fstype) and counts against this job's memory limit, $(human "$limit"), which the copy of $archive ($(human "$need")) would exceed" \
                   "ask for more memory (--mem or --mem-per-gpu in $site's GUIDE_SBATCH_EXTRA or GUIDE_SHARED_SBATCH), or set GUIDE_SCRATCH in $site to a node-local disk"
    fi
    err=$(mktemp -d "$folder/.staging.XXXXXX" 2>&1) || fail "creating a folder in $folder" "$err" "$fix"
    tmp=$err
    # Unpacked into a temporary folder, then renamed: FOLDER/NAME exists only when complete.
    if ! err=$(tar -xf "$archive" -C "$tmp" 2>&1); then
        rm -rf -- "$tmp"
        fail "unpacking $archive ($(human "$need")) to $folder" "$err" "$fix"
    fi
    if [[ ! -d $tmp/$name ]]; then
        rm -rf -- "$tmp"
        refuse "$archive has no top-level folder $name" "fix GUIDE_DATASET_NAME in $site (tar -tf ARCHIVE | head shows it)"
    fi
    if ! err=$(mv -T -- "$tmp/$name" "$folder/$name" 2>&1); then
        # Another task sharing this disk renamed its complete copy first: use that one.
        [[ -d $folder/$name ]] || { rm -rf -- "$tmp"; fail "moving the unpacked $name into $folder" "$err" "$fix"; }
    fi
    rm -rf -- "$tmp"
}

# Remove FOLDER if it is this user's, saying why. On a cancel, srun answers its own TERM with
# a SIGKILL of its tasks, so a large copy may be half removed: it is first renamed (one system
# call) to .guide-<job id>.removing, which the next staging of yours on this disk removes; it
# is never taken for a copy.
remove() {
    local folder=$1 why=$2
    echo "== node $node: removing the job's staged copy $folder ($why)"
    if [[ -d $folder && -O $folder ]]; then
        local removing=${folder%/*}/.${folder##*/}.removing
        mv -T -- "$folder" "$removing" 2>/dev/null && rm -rf -- "$removing"
        rm -rf -- "$folder"  # when another node on this disk renamed it first: nothing
    fi
}

# Wait beside the job until its batch shell sends USR2 (it exits: done, failed, or requeued
# by the script) or Slurm sends TERM (scancel, the time limit, a requeue); then remove FOLDER.
# A step started now can do this on every node: once a job is being cancelled, Slurm starts
# no new step.
hold() {
    local folder=$1
    release() {
        trap '' USR2 TERM INT HUP  # once: a cancel sends TERM, then the exiting shell USR2
        # Every child: a signal between `sleep &` and reading $! would miss a saved pid, and a
        # left sleep keeps the job's output open.
        # shellcheck disable=SC2046  # process ids, one word each
        kill $(jobs -p) 2>/dev/null
        if [[ $1 == USR2 ]]; then
            remove "$folder" "the batch script is done with it"
        else
            remove "$folder" "SIG$1 from Slurm: the job ends"
        fi
        exit 0
    }
    # USR2: the batch shell is done with it; TERM/INT/HUP: Slurm ends the job (or the step).
    local sig
    for sig in USR2 TERM INT HUP; do
        # shellcheck disable=SC2064  # the signal's name, fixed now
        trap "release $sig" "$sig"
    done
    while :; do
        sleep 60 &
        wait || true  # returns at once when a signal arrives; the trap then runs
    done
}

case ${1:-} in
    stage) (($# == 5)) || refuse "stage_node.sh stage needs FOLDER ARCHIVE NAME SITE_FILE" "see lib/guide.sh"
           stage "${@:2}" ;;
    hold) (($# == 2)) || refuse "stage_node.sh hold needs FOLDER" "see lib/guide.sh"
          hold "$2" ;;
    release) (($# == 2)) || refuse "stage_node.sh release needs FOLDER" "see lib/guide.sh"
             remove "$2" "the batch script is done with it; its holder had not started" ;;
    *) refuse "stage_node.sh: unknown mode '${1:-}'" "use stage, hold or release (see lib/guide.sh)" ;;
esac
