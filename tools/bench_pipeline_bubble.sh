#!/bin/bash
# Benchmark 1 of issue 13 (docs/benchmarks.md §7). Run from the repository root after ./run build; B and D override
# the binary and the dataset.
# Benchmark 1 of issue 13: pipeline step time vs the ideal bubble, on this 2-core machine (2 stages, 1 thread each),
# and each stage's peak resident memory (summary.json stages[].peak_rss_mb). REPS, MS (micro-batch counts) and
# SINGLE=0 (skip the single-process peer) narrow it.
B=${B:-./build/tributary}; D=${D:-./build/testdata}; W=$(mktemp -d)
REPS=${REPS:-3}; MS=${MS:-"1 2 4 8 16"}; SINGLE=${SINGLE:-1}
T="train --overwrite --set model.num_layers=8 --set model.width=256 --set model.context=256 --set optim.warmup_steps=2 --set train.eval_every=0 --set train.eval_batches=1 --set train.threads=1 --set data.dir=$D --set train.steps=12 --set train.log_every=100 --set train.batch_size=16 --set dist.algorithm=ddp --set train.checkpoint_every=0"
for rep in $(seq $REPS); do
  if [ "$SINGLE" = 1 ]; then
    $B $T --set train.run_dir=$W/single >/dev/null 2>&1
    echo "single rep$rep $(python3 -c "import json; s=json.load(open('$W/single/summary.json')); print(s['tokens_per_s'])")"
  fi
  for sched in gpipe 1f1b; do for m in $MS; do
    $B launch --nproc 2 -- $T --set train.run_dir=$W/pp --set parallel.pipeline_stages=2 --set parallel.micro_batches=$m --set parallel.schedule=$sched >/dev/null 2>&1
    echo "$sched m=$m rep$rep $(python3 -c "import json; s=json.load(open('$W/pp/summary.json')); print(s['tokens_per_s'], ' '.join('%.3f' % st['bubble'] for st in s['stages']), 'peak MB', ' '.join('%.0f' % st['peak_rss_mb'] for st in s['stages']))")"
  done; done
done
