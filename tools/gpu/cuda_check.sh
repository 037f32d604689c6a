#!/usr/bin/env bash
# Builds Tributary against the GPU machine's PyTorch 2.x LibTorch (CUDA), runs the test suite there and measures the
# trainer against PyTorch eager and torch.compile on the GPU. Runs ON the device machine, from the repository root:
#   tools/gpu/cuda_check.sh probe build test bench train     (any subset, in order)
# Needs .gpu/deps (tools/gpu/pack_deps.sh) and .gpu/testdata (a `data build-default` made here) carried along.
# Logs go to $OUT (or .gpu/out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out}; mkdir -p "$OUT"
B=build-cuda
PY=$(command -v python3)
TORCH_PREFIX=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')  # for the probe; CMake finds it itself
export LD_LIBRARY_PATH="$PWD/.gpu/deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
status=0
for stage in "$@"; do
  echo "=== $stage"
  case $stage in
    probe)
      { nvidia-smi; g++ --version | head -1; cmake --version | head -1; ninja --version; nvcc --version | tail -2
        command -v pkg-config ccache || true
        $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi",
                torch.compiled_with_cxx11_abi(), torch.cuda.get_device_name(0))'
        ls "$(dirname "$TORCH_PREFIX")/../include" | tr '\n' ' '; echo; } 2>&1 | tee "$OUT/probe.txt" ;;
    build)
      TORCH_CUDA_ARCH_LIST=9.0 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIBUTARY_WERROR=OFF \
        -DCMAKE_PREFIX_PATH="$PWD/.gpu/deps" -DTRIBUTARY_PYTHON="$PY" -DTRIBUTARY_TESTDATA_FROM="$PWD/.gpu/testdata" > "$OUT/configure.log" 2>&1 \
        || { tail -40 "$OUT/configure.log"; status=1; break; }
      grep "Tributary:" "$OUT/configure.log"
      start=$(date +%s)
      cmake --build $B -j "$(nproc)" -- -k 0 > "$OUT/build.log" 2>&1 || status=1
      echo "build: $(( $(date +%s) - start )) s, exit $status, warnings $(grep -c 'warning:' "$OUT/build.log")"
      grep -E 'error|Error' "$OUT/build.log" | grep -v '^\[' | sort | uniq | head -60
      [ $status = 0 ] || break ;;
    test)
      start=$(date +%s)
      ctest --test-dir $B -j 8 --timeout 400 --output-on-failure > "$OUT/test.log" 2>&1 || status=1
      echo "tests: $(( $(date +%s) - start )) s"
      grep -E "tests passed|Failed|\*\*\*|Not Run" "$OUT/test.log" | head -40 ;;
    bench)
      $PY bench/compare.py --build $B --device cuda --python "$PY" --repeats "${REPEATS:-3}" \
        --steps "${STEPS:-20}" --configs "${CONFIGS:-default,100m}" --out "$OUT/bench_gpu.json" 2>&1 \
        | tee "$OUT/bench.txt" ;;
    train)
      # The real CLI on the GPU: a short single-process run and a 2-worker DiLoCo run with CUDA tensors.
      rm -rf runs/gpu1 runs/gpu2
      $B/tributary train configs/default.toml --set train.device=cuda --set data.dir=.gpu/testdata \
        --set train.steps=100 --set train.eval_every=50 --set train.run_dir=runs/gpu1 2>&1 | tail -6
      $B/tributary launch --nproc 2 --master-port 0 -- train configs/diloco.toml --set train.device=cuda \
        --set data.dir=.gpu/testdata --set train.steps=60 --set dist.inner_steps=20 --set train.eval_every=0 \
        --set train.run_dir=runs/gpu2 2>&1 | tail -8
      cp runs/gpu1/metrics.jsonl "$OUT/gpu1_metrics.jsonl" 2>/dev/null
      cp runs/gpu2/summary.json "$OUT/gpu2_summary.json" 2>/dev/null ;;
  esac
done
exit $status
