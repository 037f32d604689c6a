#!/usr/bin/env bash
# Builds Tributary against the GPU machine's PyTorch 2.x LibTorch (CUDA), runs the GPU tests and the suite there and
# measures the trainer against PyTorch eager and torch.compile on the GPU. Runs ON the device machine, from the
# repository root:
#   tools/gpu/cuda_check.sh probe build gputest bench outer train test     (any subset, in order)
# CUDA_GRAPH=1 benchmarks the C++ step as one CUDA graph (train.cuda_graph).
# Needs .gpu/deps (tools/gpu/pack_deps.sh) and .gpu/testdata (a `data build-default` made here) carried along.
# Every stage has a time limit (seconds, overridable: BUILD_S, BENCH_S, TEST_S, ...), so that a lease's one call
# brings back what it measured even when a stage runs long. Logs go to $OUT (or .gpu/out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out}; mkdir -p "$OUT"
B=build-cuda
PY=$(command -v python3)
export LD_LIBRARY_PATH="$PWD/.gpu/deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
GOLDEN=$PWD/$B/golden
status=0
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    probe)
      { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        g++ --version | head -1; cmake --version | head -1; nproc
        $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
      } 2>&1 | tee "$OUT/probe.txt" ;;
    build)
      TORCH_CUDA_ARCH_LIST=9.0 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIBUTARY_WERROR=OFF \
        -DCMAKE_PREFIX_PATH="$PWD/.gpu/deps" -DTRIBUTARY_PYTHON="$PY" -DTRIBUTARY_TESTDATA_FROM="$PWD/.gpu/testdata" \
        > "$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; status=1; break; }
      grep "Tributary:" "$OUT/configure.log"
      start=$(date +%s)
      timeout "${BUILD_S:-300}" cmake --build $B -j "$(nproc)" -- -k 0 > "$OUT/build.log" 2>&1 || status=1
      echo "build: $(( $(date +%s) - start )) s, exit $status, warnings $(grep -c 'warning:' "$OUT/build.log")"
      grep -E 'error|Error' "$OUT/build.log" | grep -v '^\[' | sort | uniq | head -40
      [ -x $B/tributary_tests ] && [ -x $B/bench_train ] || break ;;
    gputest)
      # The tests that run only where CUDA is (skipped on CPU machines), with the golden values PyTorch makes here.
      timeout 120 $PY tests/reference/make_golden.py --out "$GOLDEN" > "$OUT/golden.log" 2>&1 || tail -5 "$OUT/golden.log"
      TRIBUTARY_GOLDEN_DIR=$GOLDEN TRIBUTARY_TEST_DATA=$PWD/.gpu/testdata timeout "${GPUTEST_S:-120}" \
        $B/tributary_tests --gtest_filter='Variants/Golden.*:GoldenAdamW.*:CausalAttention.*:FusedOps.*:Transformer.*:StepGraph.*:OuterOptimizer.*' \
        2>&1 | tee "$OUT/gputest.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|bf16 on|Failure|Expected|Which is|actual" \
        | head -80 ;;
    bench)
      timeout "${BENCH_S:-300}" $PY bench/compare.py --build $B --device cuda --python "$PY" \
        --repeats "${REPEATS:-3}" --steps "${STEPS:-20}" --configs "${CONFIGS:-default,100m}" \
        --precisions "${PRECISIONS:-fp32,bf16}" ${CUDA_GRAPH:+--cuda-graph} --out "$OUT/bench_${BENCH_TAG:-gpu}.json" 2>&1 \
        | tee "$OUT/bench_${BENCH_TAG:-gpu}.txt" ;;
    outer)
      # DiLoCo's outer step on the host for a model on the GPU: pinned state and asynchronous copies vs pageable.
      for shape in "--layers 14 --width 768 --heads 12 --vocab 32000" "--layers 24 --width 2048 --heads 16 --vocab 32000"; do
        timeout "${OUTER_S:-120}" $B/bench_outer --device cuda $shape --reps 5 2>&1 | tee -a "$OUT/outer.txt"
      done ;;
    train)
      # The real CLI on the GPU: one process, then 2-worker DiLoCo sharing the one GPU (tokens/s of each).
      rm -rf runs/gpu1 runs/gpu2
      common=(--set train.device=cuda --set data.dir=.gpu/testdata --set train.steps=200 --set train.eval_every=0
              --set dist.inner_steps=50)
      timeout 90 $B/tributary train configs/diloco.toml "${common[@]}" --set train.run_dir=runs/gpu1 2>&1 | tail -4
      timeout 120 $B/tributary launch --nproc 2 --master-port 0 -- train configs/diloco.toml "${common[@]}" \
        --set train.run_dir=runs/gpu2 2>&1 | tail -6
      for r in gpu1 gpu2; do
        cp runs/$r/summary.json "$OUT/${r}_summary.json" 2>/dev/null
        $PY -c "import json,sys; s=json.load(open('runs/$r/summary.json')); print('$r', {k: s.get(k) for k in ('tokens', 'tokens_per_s', 'elapsed_s', 'mfu', 'val_loss', 'world_size')})" 2>&1
      done ;;
    test)
      # The README's commands name the project's .venv, which ./run setup makes where PyPI is reachable; here, a venv
      # that sees this machine's PyTorch (offline: no pip).
      [ -x .venv/bin/python3 ] || $PY -m venv --system-site-packages --without-pip .venv
      start=$(date +%s)
      timeout "${TEST_S:-240}" ctest --test-dir $B -j "${TEST_J:-12}" --timeout 200 --output-on-failure \
        > "$OUT/test.log" 2>&1 || status=1
      echo "tests: $(( $(date +%s) - start )) s"
      grep -E "tests passed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess|Not Run|\*\*\*" "$OUT/test.log" | head -60 ;;
  esac
done
exit $status
