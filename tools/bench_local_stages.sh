#!/bin/bash
# Benchmark 2 of issue 14 (docs/benchmarks.md §10): 4 pipeline stages (one process each, 1 thread) on emulated links
# (WAN, default 100 Mbit/s and 100 ms one way, and on plain loopback): tokens/s of local parallelism (chunked, linear
# heads: activations forward only) vs the pipeline's GPipe and 1F1B (d = 0 and d = WARMUP) on the same stages, model
# and micro-batches (untied embeddings: no first-last gradient sum). tokens/s is summary.json's (training steps
# only). REPS repetitions, interleaved.
# Run from the repository root after ./run build. Overrides: B, D, WAN, STEPS, M (micro-batches), WARMUP, REPS.
set -e
B=${B:-./build/tributary}; D=${D:-./build/testdata}; WAN=${WAN:-100Mbit,100ms}; STEPS=${STEPS:-12}; M=${M:-4}
WARMUP=${WARMUP:-2}; REPS=${REPS:-3}
W=$(mktemp -d)
T="train --overwrite --set model.num_layers=8 --set model.width=128 --set model.num_heads=4 --set model.context=64
   --set train.batch_size=16 --set optim.warmup_steps=2 --set train.eval_every=0 --set train.eval_batches=1
   --set train.threads=1 --set data.dir=$D --set train.steps=$STEPS --set train.log_every=100
   --set train.checkpoint_every=0 --set dist.algorithm=ddp --set parallel.pipeline_stages=4
   --set parallel.micro_batches=$M --set model.tie_embeddings=false"
declare -A RUN=(
  [gpipe]="--set parallel.schedule=gpipe"
  [1f1b-d0]="--set parallel.schedule=1f1b"
  [1f1b-d$WARMUP]="--set parallel.schedule=1f1b --set parallel.warmup_margin=$WARMUP"
  [local]="--set local.chunks=4"
)
for link in "$WAN" loopback; do
  wan=""; [ "$link" = loopback ] || wan="--set dist.wan=$link"
  for rep in $(seq $REPS); do
    for name in gpipe 1f1b-d0 1f1b-d$WARMUP local; do
      $B launch --nproc 4 -- $T --set train.run_dir=$W/run $wan ${RUN[$name]} >$W/log 2>&1 ||
        { echo "$name failed:"; tail -5 $W/log; exit 1; }
      python3 - "$W/run/summary.json" "$link" "$name" "$rep" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}\t{sys.argv[3]}\trep{sys.argv[4]}\t{s['tokens_per_s']:.0f} tok/s\tbubble "
      + " ".join(f"{st['bubble']:.2f}" for st in s["stages"])
      + f"\tgrad bytes/step {sum(st['gradient_bytes'] for st in s['stages']) / s['steps']:.0f}")
PY
    done
  done
done
rm -rf "$W"
