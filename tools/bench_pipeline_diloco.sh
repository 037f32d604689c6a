#!/bin/bash
# Benchmark 3 of issue 13 (docs/benchmarks.md §9): pipeline + DiLoCo per stage vs pipeline + data parallel on the
# same emulated world-wide links. 8 workers (D_DP 2 x D_PP 4) as in §8, on the plan's placement (and, with
# PLACEMENTS="plan megatron", on Megatron's order too). Data parallel trains STEPS steps; its final validation loss
# is the target. DiLoCo per stage (H inner steps, the same schedule) trains DL_STEPS steps; the time to the target is
# the training seconds (train_s: steps only, no evaluation or checkpoint) at its first evaluation at or below the
# target. Bytes per token: what pipeline 0's stages sent (activations, activation gradients, replica sync), times
# D_DP, over the tokens of the run.
# DILOCO_PLAN=1: DiLoCo runs on its own plan instead (`plan --sync-every H`: the replicas' exchange priced at 1/H per
# iteration, so the pipelines stay on good links and the replicas take the slow ones); data parallel keeps its plan.
# ACT: parallel.activation_compression of both runs (fp32, or e.g. int8; the DiLoCo plan prices its bytes).
# Time = `elapsed_s - eval_s` of the evaluation record (wall clock in the loop less the evaluations' forward passes).
# Run from the repository root after ./run build. Overrides: B, D, SRC, DEVICES, SEED, STEPS, DL_STEPS, H,
# EVAL_EVERY, COMPRESSION (DiLoCo's codec), PLACEMENTS, REPS, DILOCO_PLAN, ACT, WARMUP_DDP (DiLoCo's data-parallel
# warm-up steps, dist.warmup_ddp_steps).
set -e
B=${B:-./build/tributary}; D=${D:-./build/testdata}
SRC=${SRC:-../shared/reference/networks/case5-worldwide.json}; DEVICES=${DEVICES:-0,1,8,9,24,25,48,49}
SEED=${SEED:-7}; STEPS=${STEPS:-60}; DL_STEPS=${DL_STEPS:-$STEPS}; H=${H:-10}; EVAL_EVERY=${EVAL_EVERY:-5}
COMPRESSION=${COMPRESSION:-fp32}; PLACEMENTS=${PLACEMENTS:-plan}; REPS=${REPS:-1}; DILOCO_PLAN=${DILOCO_PLAN:-0}
ACT=${ACT:-fp32}; WARMUP_DDP=${WARMUP_DDP:-0}
W=$(mktemp -d)
source tools/bench_small_setup.sh  # $W/cluster.json, $W/workload.json
$B plan $W/cluster.json $W/workload.json --out $W/plan.json --overwrite --seed 1 | grep -E "^plan"
if [ "$DILOCO_PLAN" = 1 ]; then
  python3 - "$W/workload.json" "$ACT" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))
w["bytes_per_activation"] = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}[sys.argv[2]]
json.dump(w, open(sys.argv[1].replace(".json", "-act.json"), "w"))
PY
  $B plan $W/cluster.json $W/workload-act.json --sync-every $H --out $W/plan-diloco.json --overwrite --seed 1 | grep -E "^plan"
fi
python3 -c "import json; json.dump({'d_dp': 2, 'd_pp': 4, 'pipelines': [[j * 2 + i for j in range(4)] for i in range(2)]}, open('$W/megatron.json', 'w'))"
T="train --overwrite --set model.num_layers=8 --set model.width=128 --set model.num_heads=4 --set model.context=64
   --set model.tie_embeddings=false --set train.batch_size=8 --set optim.warmup_steps=5 --set train.eval_batches=8
   --set train.threads=1 --set data.dir=$D --set train.log_every=5 --set train.checkpoint_every=0
   --set train.eval_every=$EVAL_EVERY --set parallel.pipeline_stages=4 --set parallel.micro_batches=1
   --set dist.wan=$W/cluster.json --set parallel.activation_compression=$ACT"
report() {  # name: final val loss, train_s, seconds per step, bytes per token; the target's time if given
  python3 - "$W/run" "$1" "${2:-}" <<'PY'
import json, sys
run, name, target = sys.argv[1], sys.argv[2], sys.argv[3]
evals = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if "val_loss" in l]
s = json.load(open(f"{run}/summary.json"))
sent = sum(st["activation_bytes"] + st["gradient_bytes"] + st["sync_bytes"] for st in s["stages"]) * 2
sync = sum(st["sync_bytes"] for st in s["stages"]) * 2
clock = lambda e: e["elapsed_s"] - e["eval_s"]
line = (f"{name}: steps {s['steps']} final val_loss {evals[-1]['val_loss']:.4f} time {clock(evals[-1]):.1f} s "
        f"(train_s {evals[-1]['train_s']:.1f}) s/step {clock(evals[-1]) / s['steps']:.3f} "
        f"bytes/token {sent / s['tokens']:.0f} "
        f"(sync {sync / s['tokens']:.0f})")
if target:
    hit = [e for e in evals if e["val_loss"] <= float(target)]
    line += (f" | reaches {float(target):.4f} at step {hit[0]['step']} after {clock(hit[0]):.1f} s" if hit
             else f" | never reaches {float(target):.4f} (best {min(e['val_loss'] for e in evals):.4f})")
print(line)
PY
}
for p in $PLACEMENTS; do
  for rep in $(seq $REPS); do
    $B launch --nproc 8 -- $T --set train.run_dir=$W/run --set parallel.placement=$W/$p.json --set train.steps=$STEPS \
      --set dist.algorithm=ddp >$W/ddp.log 2>&1 || { echo "$p ddp: run failed (see $W/ddp.log)"; exit 1; }
    report "$p ddp rep$rep"
    target=$(python3 -c "import json; print([json.loads(l) for l in open('$W/run/metrics.jsonl') if 'val_loss' in l][-1]['val_loss'])")
    dl_placement=$p; [ "$DILOCO_PLAN" = 1 ] && dl_placement=plan-diloco
    $B launch --nproc 8 -- $T --set train.run_dir=$W/run --set parallel.placement=$W/$dl_placement.json \
      --set train.steps=$DL_STEPS --set dist.algorithm=diloco --set dist.inner_steps=$H \
      --set dist.compression=$COMPRESSION --set dist.warmup_ddp_steps=$WARMUP_DDP >$W/diloco.log 2>&1 || { echo "$p diloco: run failed (see $W/diloco.log)"; exit 1; }
    report "$dl_placement diloco H=$H $COMPRESSION warm-up $WARMUP_DDP rep$rep" "$target"
  done
done
