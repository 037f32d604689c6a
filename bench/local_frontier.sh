#!/bin/bash
# Benchmark 3 of issue 14 (docs/benchmarks.md §10): the local-parallelism paper's figure in small. For a sweep of batch
# sizes, global backprop and local parallelism (K = 2 and 4, chunked, private-block heads) train a 4-block model for
# the same number of steps; every evaluation gives a point of
#   validation loss vs total compute (FLOPs = flops per token, auxiliary heads included, x tokens seen), and
#   validation loss vs idealised parallel time (FLOPs one device computes if the work splits perfectly):
#     global backprop on 1 device: all of it; data parallel on B/B0 devices: 1/(B/B0) of it (B0 the smallest batch:
#     the same run, only the time axis differs); local parallelism on K devices (one chunk each, no bubble): 1/K.
# Writes $OUT.png (two panels, gnuplot) and $OUT.tsv. Run from the repository root after ./run build.
# Overrides: B, D, STEPS, BATCHES, EVAL_EVERY, THREADS, OUT; PLOT_ONLY=1 redraws $OUT.png from an existing $OUT.tsv.
set -e
B=${B:-./build/tributary}; D=${D:-./build/testdata}; STEPS=${STEPS:-240}; BATCHES=${BATCHES:-"4 8 16"}
EVAL_EVERY=${EVAL_EVERY:-40}; THREADS=${THREADS:-2}; OUT=${OUT:-docs/img/local_frontier}
W=$(mktemp -d)
mkdir -p "$(dirname "$OUT")"
if [ -z "${PLOT_ONLY:-}" ]; then
echo -e "method\tbatch\tdevices\tstep\tflops\tideal_flops\tval_loss" > "$OUT.tsv"
B0=$(echo $BATCHES | tr ' ' '\n' | sort -n | head -1)
for batch in $BATCHES; do
  for k in 0 2 4; do
    run=$W/b$batch-k$k
    $B train --overwrite --set model.num_layers=4 --set model.num_levels=1 --set model.width=128 \
      --set model.num_heads=4 --set model.context=64 --set train.batch_size=$batch --set train.steps=$STEPS \
      --set optim.warmup_steps=20 --set optim.lr=3e-3 --set train.eval_every=$EVAL_EVERY --set train.eval_batches=16 \
      --set train.threads=$THREADS --set train.checkpoint_every=0 --set train.log_every=1000 --set data.dir=$D \
      --set train.run_dir=$run --set local.chunks=$k --set local.aux_head=blocks > $W/log 2>&1 ||
      { echo "batch $batch K=$k failed:"; tail -5 $W/log; exit 1; }
    python3 - "$run" "$batch" "$k" "$B0" >> "$OUT.tsv" <<'PY'
import json, sys
run, batch, k, b0 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = json.load(open(f"{run}/summary.json"))
fpt = s["mfu"] * s["peak_flops"] * s["world_size"] / s["tokens_per_s"]  # training FLOPs per token, heads included
for l in open(f"{run}/metrics.jsonl"):
    e = json.loads(l)
    if "val_loss" not in e:
        continue
    flops = fpt * e["tokens"]
    if k == 0:
        print(f"global\t{batch}\t1\t{e['step']}\t{flops:.4g}\t{flops:.4g}\t{e['val_loss']:.4f}")
        print(f"data-parallel\t{batch}\t{batch // b0}\t{e['step']}\t{flops:.4g}\t{flops / (batch // b0):.4g}\t{e['val_loss']:.4f}")
    else:
        print(f"local-K{k}\t{batch}\t{k}\t{e['step']}\t{flops:.4g}\t{flops / k:.4g}\t{e['val_loss']:.4f}")
PY
  done
done
fi
# gnuplot: colour = method, point = batch; the left panel leaves out data parallel (the same points as global)
python3 - "$OUT.tsv" "$W" "$OUT.png" "$STEPS" > "$W/plot.gp" <<'PY'
import sys
tsv, work, png, steps = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(tsv)][1:]
colour = {"global": "#000000", "data-parallel": "#1b9e77", "local-K2": "#377eb8", "local-K4": "#e41a1c"}
point = {}
blocks = []
for r in rows:
    if (r[0], r[1]) not in blocks:
        blocks.append((r[0], r[1]))
for b in sorted({int(r[1]) for r in rows}):
    point[str(b)] = [7, 5, 9, 11, 13][len(point) % 5]
for i, (m, b) in enumerate(blocks):
    with open(f"{work}/{i}.dat", "w") as out:
        for r in rows:
            if (r[0], r[1]) == (m, b):
                out.write(f"{r[4]} {r[5]} {r[6]}\n")
def plot(column, skip_dp):
    parts = [f'"{work}/{i}.dat" using {column}:3 with linespoints lc rgb "{colour[m]}" pt {point[b]} title "{m} B={b}"'
             for i, (m, b) in enumerate(blocks) if not (skip_dp and m == "data-parallel")]
    return "plot " + ", \\\n  ".join(parts)
print(f"""set terminal pngcairo size 1400,560 noenhanced
set output "{png}"
set multiplot layout 1,2 title "Local parallelism in small: 4 blocks, width 128, context 64, {steps} steps per run"
set key top right font ",8"; set logscale x; set grid
set xlabel "total training compute (FLOPs)"; set ylabel "validation loss"
{plot(1, True)}
set xlabel "idealised parallel time (FLOPs per device)"
{plot(2, False)}
unset multiplot""")
PY
gnuplot "$W/plot.gp"
rm -rf "$W"
echo "wrote $OUT.png and $OUT.tsv"
