"""./run bench: the C++ trainer step vs PyTorch eager (Python) on the same model, batch and threads, side by side in
one run, plus MFU against the sgemm peak measured in the same run. Measures; asserts nothing about time.

Usage: /usr/bin/python3 bench/compare.py --build BUILD [--steps N] [--out FILE.json]"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Configurations: the default (configs/default.toml's model and batch) and neighbours a user would try.
CONFIGS = [
    ("default (4L w256 T256 swiglu rope, B16)", []),
    ("gelu + learned positions, untied", ["model.mlp=gelu", "model.positions=learned", "model.tie_embeddings=false"]),
    ("6L w384 h6 T256, B8", ["model.num_layers=6", "model.width=384", "model.num_heads=6", "train.batch_size=8"]),
    ("small: 2L w128 T128, B32", ["model.num_layers=2", "model.width=128", "model.context=128", "train.batch_size=32"]),
]


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    return json.loads(out[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    common = [f"train.threads={args.threads}"]
    for name, overrides in CONFIGS:
        o = overrides + common
        cpp = run([os.path.join(args.build, "bench_train"), "--steps", str(args.steps)] + o)
        py = run(["/usr/bin/python3", os.path.join(HERE, "torch_eager.py"), f"--steps={args.steps}"] + o)
        ratio = cpp["tokens_per_s"] / py["tokens_per_s"]
        py_mfu = py["tokens_per_s"] * cpp["flops_per_token"] / cpp["peak_flops"]
        rows.append({"config": name, "overrides": o, "cpp": cpp, "pytorch": py, "ratio": ratio, "pytorch_mfu": py_mfu})
        print(f"{name:44s} C++ {cpp['tokens_per_s']:8.0f} tok/s (MFU {100 * cpp['mfu']:4.1f}%) | "
              f"PyTorch eager {py['tokens_per_s']:8.0f} tok/s (MFU {100 * py_mfu:4.1f}%) | ratio {ratio:.3f}x",
              flush=True)
    print(f"sgemm peak (1024^3 fp32, {args.threads} threads): {rows[0]['cpp']['peak_flops'] / 1e9:.1f} GFLOP/s; "
          f"BLAS: {rows[0]['cpp']['blas']}; torch {rows[0]['pytorch']['torch']}")
    out = args.out or os.path.join(args.build, "bench_results.json")
    with open(out, "w") as f:
        json.dump(rows, f, indent=2)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
