#!/bin/bash
# Benchmark 1 of issue 14 (docs/benchmarks.md §10): global backprop vs local parallelism in one process at equal
# steps, on the default model (configs/default.toml, 4 blocks) and on an 8-block model of the same width: the final
# validation loss of the model's head (the auxiliary heads are not evaluated) and the gap to global backprop.
# Run from the repository root after ./run build. Overrides: B, STEPS, THREADS, OUT (results TSV), RUNS (subset of
# run names), LAYERS (4 and/or 8).
set -e
B=${B:-./build/tributary}; STEPS=${STEPS:-300}; THREADS=${THREADS:-1}; LAYERS=${LAYERS:-"4 8"}
OUT=${OUT:-bench_local_quality.tsv}
[ -f data/default/dataset.json ] || $B data build-default --out data/default
W=$(mktemp -d)
declare -A RUN=(
  [global]=""
  [k2-chunked-linear]="local.chunks=2 local.aux_head=linear"
  [k2-chunked-blocks]="local.chunks=2 local.aux_head=blocks"
  [k2-overlap-linear]="local.chunks=2 local.mode=overlapping local.aux_head=linear"
  [k2-overlap-blocks]="local.chunks=2 local.mode=overlapping local.aux_head=blocks"
  [k4-chunked-linear]="local.chunks=4 local.aux_head=linear"
  [k4-chunked-blocks]="local.chunks=4 local.aux_head=blocks"
  [k4-overlap-blocks]="local.chunks=4 local.mode=overlapping local.aux_head=blocks"
  [greedy-blocks]="local.mode=greedy local.aux_head=blocks"
)
ORDER=${RUNS:-"global k2-chunked-linear k2-chunked-blocks k2-overlap-linear k2-overlap-blocks k4-chunked-linear k4-chunked-blocks k4-overlap-blocks greedy-blocks"}
echo -e "layers\trun\tval_loss\tgap_pct\ttokens_per_s\tmfu" > "$OUT"
for L in $LAYERS; do
  base=""
  for name in $ORDER; do
    sets="${RUN[$name]}"
    case "$name" in  # K must divide the blocks and leave room for the overlap; greedy is one chunk per block
      k4-overlap-*) [ "$L" -ge 8 ] || continue ;;
      greedy-*) sets="$sets local.chunks=$L" ;;
    esac
    args=""
    for s in $sets; do args="$args --set $s"; done
    $B train configs/default.toml --overwrite --set model.num_layers=$L --set model.num_levels=1 \
      --set train.steps=$STEPS --set train.threads=$THREADS --set train.eval_every=0 --set train.eval_batches=32 \
      --set train.checkpoint_every=0 --set train.log_every=50 --set train.run_dir=$W/$L-$name $args > $W/$L-$name.log
    row=$(python3 - "$W/$L-$name/summary.json" "$base" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
base = float(sys.argv[2]) if sys.argv[2] else s["val_loss"]
print(f'{s["val_loss"]:.4f}\t{100 * (s["val_loss"] / base - 1):+.2f}\t{s["tokens_per_s"]:.0f}\t{100 * s["mfu"]:.1f}')
PY
)
    [ "$name" = global ] && base=$(echo "$row" | cut -f1)
    echo -e "$L\t$name\t$row" | tee -a "$OUT"
  done
done
rm -rf "$W"
