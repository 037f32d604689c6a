"""./run bench: the C++ trainer step vs PyTorch eager (Python) on the same model, batch and threads, side by side in
one run, plus MFU against the matmul peak measured in the same run. Measures; asserts nothing about time.

Usage: python3 bench/compare.py --build BUILD [--steps N] [--repeats R] [--device cuda] [--no-compile] [--python PY]
       [--configs default,100m] [--precisions fp32,bf16] [--cuda-graph] [--out FILE.json]
--repeats runs each pair R times (C++, eager and torch.compile alternating) and reports the median ratio and its
spread. torch.compile (inductor; on the CPU it generates C++ with the machine's g++) is timed beside eager unless
--no-compile. --python names the interpreter whose PyTorch the build links (./run bench passes it). --precisions runs each
config in each precision (train.precision; bf16 = the forward pass under autocast on every side), its MFU against
the matmul peak of that precision. --cuda-graph runs the C++ step as one CUDA graph (train.cuda_graph)."""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))

# Configurations: the default (configs/default.toml's model and batch) and neighbours a user would try; "100m" is a
# ~100M-parameter model (14 layers, width 768) for GPUs.
CONFIGS = {
    "default": ("default (4L w256 T256 swiglu rope, B16)", []),
    "gelu": ("gelu + learned positions, untied", ["model.mlp=gelu", "model.positions=learned",
                                                   "model.tie_embeddings=false"]),
    "6l": ("6L w384 h6 T256, B8", ["model.num_layers=6", "model.width=384", "model.num_heads=6",
                                   "train.batch_size=8"]),
    "small": ("small: 2L w128 T128, B32", ["model.num_layers=2", "model.width=128", "model.context=128",
                                           "train.batch_size=32"]),
    "100m": ("100M: 14L w768 h12 T512, B16", ["model.num_layers=14", "model.width=768", "model.num_heads=12",
                                              "model.context=512", "train.batch_size=16"]),
    "1b": ("1B: 24L w2048 h16 T512, B8", ["model.num_layers=24", "model.width=2048", "model.num_heads=16",
                                          "model.context=512", "train.batch_size=8"]),
}
CPU_DEFAULT = "default,gelu,6l,small"


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:  # one failed run (out of memory, say) costs its row, not the whole table
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values):
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def print_markdown(rows):
    """The table as docs/benchmarks.md keeps it: medians, [min-max] of the paired ratios, MFU of the C++ median."""
    med = statistics.median
    print("\n| config | C++ tok/s | eager tok/s | compile tok/s | C++ / eager | C++ / compile | C++ MFU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cpp = med(c["tokens_per_s"] for c in r["cpp"])
        mfu = cpp * r["cpp"][0]["flops_per_token"] / r["peak_flops"]
        comp = f"{med(c['tokens_per_s'] for c in r['compile']):,.0f}" if r["compile"] else "-"
        cratio = spread(r["compile_ratios"]) if r.get("compile_ratios") else "-"
        print(f"| {r['config']} | {cpp:,.0f} | {med(p['tokens_per_s'] for p in r['pytorch']):,.0f} | {comp} | "
              f"{spread(r['ratios'])} | {cratio} | {100 * mfu:.1f}% |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--compile", action="store_true", default=True, help=argparse.SUPPRESS)  # the old spelling
    ap.add_argument("--python", default="python3")
    ap.add_argument("--configs", default=None, help=f"comma-separated keys of {list(CONFIGS)}")
    ap.add_argument("--precisions", default="fp32")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    keys = (args.configs or (CPU_DEFAULT if args.device == "cpu" else "default,100m")).split(",")
    rows = []
    out = args.out or os.path.join(args.build, "bench_results.json")
    common = [f"train.threads={args.threads}", f"train.device={args.device}"]
    for key, precision in [(k, p) for k in keys for p in args.precisions.split(",")]:
        name, overrides = CONFIGS[key]
        name = f"{name} {precision}{' graph' if args.cuda_graph else ''}"
        o = overrides + common + [f"train.precision={precision}"]
        cpps, pys, comps = [], [], []
        try:
            for _ in range(args.repeats):
                graph = ["train.cuda_graph=true"] if args.cuda_graph else []
                cpps.append(run([os.path.join(args.build, "bench_train"), "--steps", str(args.steps)] + o + graph))
                pys.append(run([args.python, os.path.join(HERE, "torch_eager.py"), f"--steps={args.steps}"] + o))
                if args.compile:
                    comps.append(run([args.python, os.path.join(HERE, "torch_eager.py"), f"--steps={args.steps}",
                                      "--compile=1"] + o))
        except RuntimeError as e:
            print(f"{name}: not measured: {e}", flush=True)
            continue
        cpp = cpps[len(cpps) // 2]
        fpt, peak = cpp["flops_per_token"], max(c["peak_flops"] for c in cpps)
        ratios = [c["tokens_per_s"] / p["tokens_per_s"] for c, p in zip(cpps, pys)]
        row = {"config": name, "precision": precision, "overrides": o, "cpp": cpps, "pytorch": pys, "compile": comps,
               "ratios": ratios, "peak_flops": peak}
        line = (f"{name:36s} C++ {statistics.median(c['tokens_per_s'] for c in cpps):9.0f} tok/s "
                f"(MFU {100 * statistics.median(c['tokens_per_s'] for c in cpps) * fpt / peak:4.1f}%) | "
                f"eager {statistics.median(p['tokens_per_s'] for p in pys):9.0f} "
                f"(MFU {100 * statistics.median(p['tokens_per_s'] for p in pys) * fpt / peak:4.1f}%) | "
                f"C++/eager {spread(ratios)}")
        if comps:
            cratios = [c["tokens_per_s"] / p["tokens_per_s"] for c, p in zip(cpps, comps)]
            row["compile_ratios"] = cratios
            line += (f" | compile {statistics.median(p['tokens_per_s'] for p in comps):9.0f} "
                     f"| C++/compile {spread(cratios)}")
        rows.append(row)
        print(line, flush=True)
        with open(out, "w") as f:  # after every row: a run cut short keeps what it measured
            json.dump(rows, f, indent=2)
    if not rows:
        return 1
    print_markdown(rows)
    for row in rows:
        print(f"matmul peak for {row['config']}: {row['peak_flops'] / 1e9:.1f} GFLOP/s")
    print(f"{args.device}, {args.threads} threads; "
          f"BLAS: {rows[0]['cpp'][0]['blas']}; torch {rows[0]['pytorch'][0]['torch']}; "
          f"{args.repeats} paired run(s) per config, median [min-max]")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
