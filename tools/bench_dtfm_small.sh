#!/bin/bash
# Benchmark 2 of issue 13 (docs/benchmarks.md §8): DT-FM in small, measured. 8 workers (D_DP 2 x D_PP 4) on the
# emulated links of 8 devices of a DT-FM cluster (ids shuffled): measured step time of `tributary plan`'s placement,
# of Megatron's rank order and of random placements, each beside the cost model's price for it (`plan --price`).
# Run from the repository root after ./run build. Overrides: B (binary), D (dataset), SRC (cluster JSON), DEVICES,
# SEED (id shuffle), RANDOM_N, REPS, M (micro-batches), SCHEDULE.
set -e
B=${B:-./build/tributary}; D=${D:-./build/testdata}
SRC=${SRC:-../shared/reference/networks/case5-worldwide.json}; DEVICES=${DEVICES:-0,1,8,9,24,25,48,49}
SEED=${SEED:-7}; RANDOM_N=${RANDOM_N:-10}; REPS=${REPS:-3}; M=${M:-1}; SCHEDULE=${SCHEDULE:-gpipe}
W=$(mktemp -d)
source tools/bench_small_setup.sh  # $W/cluster.json, $W/workload.json
T="train --overwrite --set model.num_layers=8 --set model.width=128 --set model.num_heads=4 --set model.context=64
   --set model.tie_embeddings=false --set train.batch_size=8 --set optim.warmup_steps=2 --set train.eval_every=0
   --set train.eval_batches=1 --set train.threads=1 --set data.dir=$D --set train.steps=9 --set train.log_every=3
   --set dist.algorithm=ddp --set train.checkpoint_every=0 --set parallel.pipeline_stages=4
   --set parallel.micro_batches=$M --set parallel.schedule=$SCHEDULE"
$B plan $W/cluster.json $W/workload.json --out $W/plan.json --overwrite --seed 1 | grep -E "^plan|stage|pipeline "
python3 - $W $RANDOM_N <<'PY'
import json, random, sys
w, n = sys.argv[1], int(sys.argv[2])
def write(name, pipelines):
    json.dump({"d_dp": 2, "d_pp": 4, "pipelines": pipelines}, open(f"{w}/{name}.json", "w"))
write("megatron", [[j * 2 + i for j in range(4)] for i in range(2)])
rng = random.Random(11)
for k in range(n):
    ranks = list(range(8)); rng.shuffle(ranks)
    write(f"random{k}", [ranks[0:4], ranks[4:8]])
PY
names="plan megatron $(seq -f 'random%g' 0 $((RANDOM_N - 1)))"
$B plan $W/cluster.json $W/workload.json $(for n in $names; do echo --price $W/$n.json; done) | sed "s|$W/||"
step_time() {  # seconds per step over steps 4..9 (after start-up), from rank 0's metrics
  python3 -c "import json; r=[json.loads(l) for l in open('$W/run/metrics.jsonl') if 'tokens_per_s' in l]; print('%.3f' % ((r[-1]['elapsed_s'] - r[0]['elapsed_s']) / (r[-1]['step'] - r[0]['step'])))"
}
for rep in $(seq $REPS); do  # the same 8 processes without emulated links: compute and loopback alone
  $B launch --nproc 8 -- $T --set train.run_dir=$W/run >/dev/null 2>&1 && echo "no-wan rep$rep step_s $(step_time)"
done
for n in $names; do
  reps=$REPS; [[ $n == random* ]] && reps=1
  for rep in $(seq $reps); do
    $B launch --nproc 8 -- $T --set train.run_dir=$W/run --set parallel.placement=$W/$n.json \
      --set dist.wan=$W/cluster.json >/dev/null 2>&1 || { echo "$n: run failed (see $W/run)"; continue; }
    echo "$n rep$rep step_s $(step_time)"
  done
done
