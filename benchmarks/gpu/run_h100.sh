#!/bin/bash
# How to run: from the repository root on one GPU (an H100 for the issue-39 targets), with $OUT
# an empty directory that comes back:  OUT=/some/dir bash benchmarks/gpu/run_h100.sh
# It needs Python with torch, torchvision, numpy, pandas and tqdm (no Horovod, no TensorFlow,
# no python-hostlist: outside a Slurm job nothing it runs imports them), sets PYTHONPATH=src and
# GUIDE_ROOT itself, and finishes within about 7 minutes: every command has its own `timeout`,
# cut further to what is left of the script's budget (GUIDE_GPU_CHECK_BUDGET seconds, 410), and
# a command that would get under 20 s is skipped and said so. It writes at most 4 files to $OUT:
# log.txt (every command and its output), results.jsonl (the JSON line each benchmark prints),
# env.txt (GPU, driver, versions, CPUs) and records.tar.gz (the engine's run records and the
# tuning walk's record). GUIDE_GPU_CHECK_SMOKE=1 runs the same commands at a tiny scale on any
# machine (a CPU: tiny models on 16 px images; minutes) to check the script itself; $OUT then
# defaults to a new temporary directory.
# What it measures (ResNet-50, 224 px, batch 128 unless said; issue 39's targets: the engine
# >= 0.97 of the hand loop over the same input and >= 0.90 of the resident batch):
#   A  bf16 + channels_last: engine vs hand loop over the same loader (uint8 normalised on the
#      device, loader workers auto), plus the resident-batch reference;
#   B  bf16 + channels_last: engine on a resident batch vs the hand-written resident loop;
#   C  fp32: engine vs hand loop over the loader, plus the fp32 resident reference;
#   D  the engine's per-step host cost (benchmarks/step_overhead.py) on this device;
#   E  bf16 + channels_last with float32 batches from the loader (what uint8 input buys);
#   F  the step-wise tuning walk on this device (ResNet-18, short).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" GUIDE_ROOT="$PWD"
SMOKE=${GUIDE_GPU_CHECK_SMOKE:-0}
OUT=${OUT:-}
if [ -z "$OUT" ]; then
  [ "$SMOKE" = 1 ] || { echo "set OUT to the directory for the results" >&2; exit 2; }
  OUT=$(mktemp -d /tmp/gpu-check.XXXXXX)
fi
mkdir -p "$OUT" && REC=$(mktemp -d /tmp/gpu-check-records.XXXXXX) || exit 2
LOG=$OUT/log.txt RES=$OUT/results.jsonl
BUDGET=${GUIDE_GPU_CHECK_BUDGET:-410}
START=$SECONDS
PY=${PYTHON:-python3}

if [ "$SMOKE" = 1 ]; then   # the same commands, tiny: a check of the script, not a measurement
  # one thread and one loader worker: a shared 2-core machine is swamped by more
  export OMP_NUM_THREADS=1
  NET="--model linear --image-size 16 --per-worker-batch 16 --loader-workers 1"
  LONG="--steps 12 --warmup 4"; SHORT="--steps 10 --warmup 4"; OVERHEAD="--steps 60 --warmup 10 --repeats 1"
  WALK="--model small_resnet --image-size 16 --per-worker-batch 8 --steps 6 --skip torch.compile"
  REPEATS=1
else
  NET="--model resnet50 --image-size 224 --per-worker-batch 128 --loader-workers auto"
  LONG="--steps 60 --warmup 15"; SHORT="--steps 40 --warmup 10"; OVERHEAD="--steps 2000 --warmup 200 --repeats 5"
  WALK="--model resnet18 --image-size 224 --per-worker-batch 128 --steps 30"
  REPEATS=2
fi

# step NAME SECONDS COMMAND...: run it under `timeout`, within what is left of the budget
step() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - (SECONDS - START) - 10))
  [ "$left" -lt "$limit" ] && limit=$left
  echo "" >>"$LOG"; echo "=== $name ($(date -u +%T), limit ${limit}s): $*" >>"$LOG"
  if [ "$limit" -lt 20 ]; then echo "SKIPPED: ${left}s of the budget left" >>"$LOG"; return; fi
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$REC/out.txt" 2>&1
  local rc=$?
  cat "$REC/out.txt" >>"$LOG"
  grep '^{"benchmark"' "$REC/out.txt" | sed "s/^{/{\"step\": \"$name\", /" >>"$RES"
  echo "rc=$rc ($((SECONDS - t0)) s)" >>"$LOG"
  echo "$name: rc=$rc in $((SECONDS - t0)) s"
}

# what every command below imports, checked once: one line naming what is missing
missing=$($PY -c "import importlib.util as u; print(' '.join(m for m in ('torch', 'torchvision', 'numpy', 'pandas',
'tqdm') if u.find_spec(m) is None))" 2>&1) || missing="python ($PY does not start)"
if [ -n "$missing" ]; then
  echo "run_h100.sh: missing: $missing (install them, or put them on PYTHONPATH)" >&2
  exit 2
fi

{ echo "date: $(date -u +%FT%TZ)"; echo "smoke: $SMOKE"; echo "commit: $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  $PY -c "import os, torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision',
torchvision.__version__); print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None);
print('cpus', os.cpu_count(), 'affinity', len(os.sched_getaffinity(0)))" 2>&1
  df -h /dev/shm | tail -1; } >"$OUT/env.txt"
cat "$OUT/env.txt" >>"$LOG"

T=benchmarks/throughput.py
step A-bf16-loader-uint8 150 $PY $T $NET $LONG --amp bf16 --channels-last --repeats $REPEATS \
  --resident-reference --min-resident-ratio 0.90 --records "$REC/A"
step B-bf16-resident 90 $PY $T $NET $LONG --amp bf16 --channels-last --repeats $REPEATS \
  --data synthetic-resident --records "$REC/B"
step C-fp32-loader-uint8 120 $PY $T $NET $SHORT --repeats $REPEATS --resident-reference --records "$REC/C"
step D-step-overhead 90 $PY benchmarks/step_overhead.py $OVERHEAD
step E-bf16-loader-float32 60 $PY $T $NET $SHORT --amp bf16 --channels-last --repeats 1 --input-dtype float32 \
  --records "$REC/E"
step F-stepwise-walk 200 $PY benchmarks/stepwise_tuning.py --walk device --repeats 1 $WALK \
  --record "$REC/stepwise_device.jsonl"

rm -f "$REC/out.txt"
tar -czf "$OUT/records.tar.gz" -C "$REC" . && rm -rf "$REC"
echo "" >>"$LOG"; echo "=== end ($(date -u +%T), $((SECONDS - START)) s)" >>"$LOG"
echo "done in $((SECONDS - START)) s; results in $OUT (log.txt, results.jsonl, env.txt, records.tar.gz)"
