#!/bin/bash
# Benchmark 2b of issue 14 (docs/benchmarks.md §10.2): time to a fixed validation loss on slow links. 4 pipeline
# stages (one process each, 1 thread) on emulated links (default 100 Mbit/s, 100 ms one way): global backprop (the
# pipeline's 1F1B with warm-up margin WARMUP, its fastest schedule there) against local parallelism (K = 4, chunked,
# linear and 1-block heads), same model, data, batch and micro-batches, evaluated every EVAL_EVERY steps. Time =
# `elapsed_s - eval_s` of each evaluation record: wall-clock seconds since the loop began, less the evaluations'
# forward passes; consolidating the stages onto rank 0 before each evaluation stays in (for local stages it is also
# where rank 0 waits for the last stage to finish the step, so rank 0's `train_s` alone would flatter them; it is
# printed beside). Prints every evaluation, then for each of global backprop's evaluated losses the seconds each run
# needed to reach it.
# Run from the repository root after ./run build. Overrides: B, DATA, WAN, GLOBAL_STEPS, LOCAL_STEPS, EVAL_EVERY, M,
# WARMUP, WARMUP_STEPS, RUNS.
set -e
B=${B:-./build/tributary}; DATA=${DATA:-data/default}; WAN=${WAN:-100Mbit,100ms}; M=${M:-4}; WARMUP=${WARMUP:-2}
GLOBAL_STEPS=${GLOBAL_STEPS:-240}; LOCAL_STEPS=${LOCAL_STEPS:-480}; EVAL_EVERY=${EVAL_EVERY:-40}
[ -f "$DATA/dataset.json" ] || $B data build-default --out "$DATA"
W=$(mktemp -d)
T="train --overwrite --set model.num_layers=8 --set model.width=128 --set model.num_heads=4 --set model.context=64
   --set train.batch_size=16 --set optim.lr=3e-3 --set optim.warmup_steps=${WARMUP_STEPS:-20} --set train.eval_every=$EVAL_EVERY
   --set train.eval_batches=16 --set train.threads=1 --set data.dir=$DATA --set train.log_every=40
   --set train.checkpoint_every=0 --set dist.algorithm=ddp --set parallel.pipeline_stages=4
   --set parallel.micro_batches=$M --set model.tie_embeddings=false --set dist.wan=$WAN"
declare -A RUN=(
  [global-1f1b]="--set parallel.schedule=1f1b --set parallel.warmup_margin=$WARMUP --set train.steps=$GLOBAL_STEPS"
  [local-linear]="--set local.chunks=4 --set train.steps=$LOCAL_STEPS"
  [local-blocks]="--set local.chunks=4 --set local.aux_head=blocks --set train.steps=$LOCAL_STEPS"
)
ORDER=${RUNS:-"global-1f1b local-linear local-blocks"}
for name in $ORDER; do
  $B launch --nproc 4 -- $T --set train.run_dir=$W/$name ${RUN[$name]} >$W/$name.log 2>&1 ||
    { echo "$name failed:"; tail -5 $W/$name.log; exit 1; }
done
python3 - "$W" $ORDER <<'PY'
import json, sys
w, names = sys.argv[1], sys.argv[2:]
evals = {}
for n in names:
    rows = [json.loads(l) for l in open(f"{w}/{n}/metrics.jsonl")]
    evals[n] = [(r["step"], r["elapsed_s"] - r["eval_s"], r["val_loss"], r["train_s"]) for r in rows
                if r.get("val_loss") is not None]
    for step, t, loss, train_s in evals[n]:
        print(f"{n}\tstep {step}\ttime {t:.1f} s\ttrain_s {train_s:.1f}\tval {loss:.4f}")
ref = names[0]
print("\ntarget (= " + ref + " at step)\t" + "\t".join(names))
def reach(n, target):
    for step, t, loss, _ in evals[n]:
        if loss <= target: return f"{t:.1f} s (step {step})"
    return "not reached"
for step, t, loss, _ in evals[ref]:
    print(f"{loss:.4f} ({step})\t" + "\t".join(reach(n, loss) for n in names))
PY
rm -rf "$W"
