#!/bin/bash
# Issue 13, the cost model's compute term measured (docs/benchmarks.md §8.1): 8 workers (D_DP 2 x D_PP 4) on the
# emulated links of 8 devices of a DT-FM cluster (ids shuffled), two of them F times slower (dist.slow_workers: rank r
# is device r of the cluster file, whatever the placement). Measured step time of three placements: `tributary plan` with the paper's
# communication-only cost, `tributary plan --compute` (the devices' `tflops`: this machine's speed from
# `plan --calibrate`, a F-th of it on the slow ones) and Megatron's rank order; beside each, `plan --price --compute`.
# Run from the repository root after ./run build. Overrides: B, D, SRC, DEVICES, SEED, F (slowdown), PAIRS (slow pairs,
# ';'-separated, cluster ids), REPS.
set -e
B=${B:-./build/tributary}; D=${D:-./build/testdata}
SRC=${SRC:-../shared/reference/networks/case4-regional.json}; DEVICES=${DEVICES:-0,1,16,17,32,33,48,49}
SEED=${SEED:-7}; F=${F:-4}; PAIRS=${PAIRS:-"0,1;2,5;3,6"}; REPS=${REPS:-1}
W=$(mktemp -d)
python3 tools/cluster_subset.py "$SRC" "$DEVICES" "$SEED" $W/links.json
cat > $W/train.toml <<TOML
[model]
num_layers = 8
width = 128
num_heads = 4
context = 64
tie_embeddings = false
[train]
batch_size = 8
threads = 1
steps = 15
log_every = 5
eval_every = 0
eval_batches = 1
checkpoint_every = 0
[optim]
warmup_steps = 2
[data]
dir = "$D"
[dist]
algorithm = "ddp"
[parallel]
pipeline_stages = 4
TOML
X=$($B plan $W/links.json --config $W/train.toml --calibrate | sed -n 's/^calibrated on this machine: \([0-9.]*\) TFLOP.*/\1/p')
echo "calibrated: $X TFLOP/s per device (slow devices: $X / $F)"
step_time() {  # seconds per step over steps 5..15, from rank 0's metrics
  python3 -c "import json; r=[json.loads(l) for l in open('$W/run/metrics.jsonl') if 'tokens_per_s' in l]; print('%.3f' % ((r[-1]['elapsed_s'] - r[0]['elapsed_s']) / (r[-1]['step'] - r[0]['step'])))"
}
echo '{"d_dp": 2, "d_pp": 4, "pipelines": [[0, 2, 4, 6], [1, 3, 5, 7]]}' > $W/megatron.json  # rank order
IFS=';' read -ra pairs <<< "$PAIRS"
for pair in "${pairs[@]}"; do
  python3 - $W $X $F $pair <<'PY'
import json, sys
w, x, f, slow = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), [int(d) for d in sys.argv[4].split(",")]
c = json.load(open(f"{w}/links.json"))
c["devices"] = [{"tflops": x / f if d in slow else x} for d in range(len(c["latency_ms"]))]
json.dump(c, open(f"{w}/cluster.json", "w"))
PY
  $B plan $W/cluster.json --config $W/train.toml --seed 1 --out $W/comm.json --overwrite > /dev/null
  $B plan $W/cluster.json --config $W/train.toml --seed 1 --compute --out $W/compute.json --overwrite > /dev/null
  echo "slow devices $pair:"
  $B plan $W/cluster.json --config $W/train.toml --compute --price $W/comm.json --price $W/compute.json \
    --price $W/megatron.json | sed "s|$W/||"
  for n in comm compute megatron; do
    ranks=$(echo "$pair" | sed "s/\([0-9]*\)/\1:$F/g")  # rank r emulates device r of the cluster file
    for rep in $(seq $REPS); do
      $B launch --nproc 8 -- train $W/train.toml --overwrite --set train.run_dir=$W/run --set parallel.placement=$W/$n.json \
        --set dist.wan=$W/cluster.json --set dist.slow_workers=$ranks >/dev/null 2>&1 || { echo "$n: run failed"; continue; }
      echo "  $n (slow ranks $ranks) rep$rep step_s $(step_time)"
    done
  done
done
