#!/usr/bin/env bash
# One node's part of passing Slurm's time-limit warning on (guide_signal_training in
# lib/guide.sh). srun runs it as one task per node; it is never sourced.
#
#   signal_node.sh SIGNAL JOB_ID MATCH NODE:PID
#
# Sends SIGNAL to this job's training processes on this node: those whose command line
# (arguments joined by spaces) matches the extended regular expression MATCH and whose
# environment has SLURM_JOB_ID=JOB_ID. A matched shell (`bash train.sh`: a wrapper that runs
# your program as its child) is not signalled, bash would die of it: its nearest descendants
# that are not shells are, your program, but not the stream filters of its pipelines (`python
# train.py | tee log`: tee would die of the signal, and your program of the broken pipe before
# it saved). Never signalled, whatever MATCH says: this scan (its
# pid), the batch shell (PID, on node NODE: the one that asked) and the job's scratch holder
# (lib/stage_node.sh hold, whose step carries GUIDE_SCRATCH_HOLDER in its environment). Prints
# how many it signalled: none means that MATCH does not fit the training command.
#
# It starts no program per process: on a loaded node with hundreds of processes, a `tr | grep`
# for each took longer than the warning leaves (the training ended unwarned), where bash's own
# `read` and `[[ =~ ]]` take well under a second.
sig=$1 job=$2 match=$3 node=${SLURMD_NODENAME:-${HOSTNAME%%.*}}
skip=" $$ "
[[ ${4%%:*} != "$node" ]] || skip+="${4#*:} "
shell='^(ba|da|z|k)?sh$'
filter='^(tee|cat|grep|egrep|fgrep|sed|awk|gawk|mawk|logger|less|more|head|tail|ts)$'

# A process's command line as words, in `words`. A read that fails leaves w as it was: w is
# emptied after each word, so that a process that ends while it is read (every later read
# fails: ESRCH) ends its loop instead of adding its last word forever (a scan once spun 10
# minutes on one core that way). (2>/dev/null first: it also silences a process gone or not ours.)
cmdline() {
    words=() w=
    while IFS= read -r -d "" w; do words+=("$w"); w=; done 2>/dev/null <"$1/cmdline"
    [[ -z $w ]] || words+=("$w")  # a last word without its NUL
}

# Whether process folder $1 belongs to this job and is not the scratch holder.
ours() {
    local w="" mine=0 env=()
    while IFS= read -r -d "" w; do env+=("$w"); w=; done 2>/dev/null <"$1/environ"
    for w in ${env[@]+"${env[@]}"}; do
        case $w in
            "SLURM_JOB_ID=$job") mine=1 ;;
            GUIDE_SCRATCH_HOLDER=*) return 1 ;;
        esac
    done
    ((mine))
}

targets=() shells=()
for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ $skip != *" $pid "* ]] || continue
    cmdline "$d"
    [[ ${words[*]:-} =~ $match ]] || continue
    ours "$d" || continue
    if [[ ${words[0]##*/} =~ $shell ]]; then shells+=("$pid"); else targets+=("$pid"); fi
done

# Below each matched shell, the first processes that are not shells (a shell it starts in turn,
# `bash inner.sh`, is looked through): children found by the parent in /proc/PID/stat, after the
# command name in parentheses, which may itself hold spaces and parentheses.
if ((${#shells[@]})); then
    declare -A kids=() first=()
    for d in /proc/[0-9]*; do
        line=
        read -r line 2>/dev/null <"$d/stat" || continue
        read -r _ ppid _ <<<"${line##*) }"
        [[ $ppid =~ ^[0-9]+$ ]] || continue
        kids[$ppid]+="${d#/proc/} "
        cmdline "$d"
        first[${d#/proc/}]=${words[0]:-}
    done
    queue=(${shells[@]+"${shells[@]}"})
    while ((${#queue[@]})); do
        for child in ${kids[${queue[0]}]:-}; do
            [[ $skip != *" $child "* ]] || continue
            if [[ ${first[$child]##*/} =~ $shell ]]; then
                queue+=("$child")
            elif [[ ! ${first[$child]##*/} =~ $filter ]]; then
                targets+=("$child")
            fi
        done
        queue=("${queue[@]:1}")
    done
fi

n=0
declare -A sent=()
for pid in ${targets[@]+"${targets[@]}"}; do
    [[ -z ${sent[$pid]:-} ]] || continue
    sent[$pid]=1
    kill "-$sig" "$pid" 2>/dev/null && n=$((n + 1))
done
echo "== $node: $sig sent to $n training process(es)"
exit 0
