#!/usr/bin/env python3
"""Activations on the wire across slow links (issue 63, measurement 1): a 4-stage pipeline x 2 replicas (8 processes,
DiLoCo per stage: H = 10, int8 pseudo-gradients, so that the stages' replica exchange is not what a step waits for)
with every link emulated at --wan (default 100 Mbit/s, 50 ms), trained for --steps with each
parallel.activation_compression of --codecs from the same start and data; per codec the seconds per training step
(train_s / steps: the loop's time without evaluations) and the final validation loss, medians and spread over
--repeats, and the ratios against fp32.

  python3 bench/pipeline_activations.py --build build [--steps 300] [--repeats 3] [--codecs fp32,int8,hadamard4,hadamard2]

AQ-SGD (aq4, aq2) pays off when examples come back: a fine-tune of several epochs from a checkpoint of the same model
(--init-from, --data a small dataset, --lr, --warmup), e.g. docs/benchmarks.md §47.

The model: 4 blocks of width 128, one per stage, context 256, 16 sequences per step in one micro-batch: one
activation message is 16 x 256 x 128 fp32 = 2 MB, 168 ms at 100 Mbit/s (a quarter of it with int8, a seventh with
hadamard4); a step sends 3 activations forward and 3 gradients back, one after the other."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run(args, codec, rep, work):
    run_dir = os.path.join(work, f"{codec}-{rep}")
    cmd = [os.path.join(args.build, "tributary"), "launch", "--nproc", "8", "--master-port", "0", "--", "train",
           "--overwrite", "--set", "model.num_layers=4", "--set", "model.num_levels=4", "--set", "model.width=128",
           "--set", "model.context=256", "--set", "train.batch_size=16", "--set", "dist.algorithm=diloco",
           "--set", "dist.inner_steps=10", "--set", "dist.compression=int8", "--set", "dist.warmup_ddp_steps=0", "--set", f"train.steps={args.steps}",
           "--set", f"optim.warmup_steps={args.warmup}", "--set", f"optim.lr={args.lr}", "--set", "train.eval_batches=16",
           "--set", f"train.eval_every={args.steps}", "--set", "train.log_every=50", "--set", "train.threads=1",
           "--set", "train.checkpoint_every=0", "--set", f"data.dir={args.data}", "--set", f"train.run_dir={run_dir}",
           "--set", "parallel.pipeline_stages=4", "--set", "parallel.micro_batches=1", "--set", f"dist.wan={args.wan}",
           "--set", f"parallel.activation_compression={codec}", "--set", "train.seed=1234"]
    if args.init_from:
        cmd += ["--set", f"train.init_from={args.init_from}"]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{codec} run {rep} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    evals = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl")) if '"val_loss"' in line]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    last = evals[-1]
    sent = sum(s["activation_bytes"] + s["gradient_bytes"] for s in summary["stages"])
    return {"s_per_step": last["train_s"] / summary["steps"], "val_loss": last["val_loss"],
            "pipeline_bytes_per_step": sent / summary["steps"], "wall_s": time.time() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default="data/default")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--wan", default="100Mbit,50ms")
    ap.add_argument("--codecs", default="fp32,int8,hadamard4,hadamard2")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--init-from", default="", help="a checkpoint of the same model to fine-tune (AQ-SGD's setting)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="trib_pipeline_activations_")
    results = {c: [] for c in args.codecs.split(",")}
    for rep in range(args.repeats):  # interleaved, so that the machine's drift touches every codec alike
        for codec in results:
            r = run(args, codec, rep, work)
            results[codec].append(r)
            print(json.dumps({"codec": codec, "repeat": rep, **{k: round(v, 4) for k, v in r.items()}}), flush=True)
    base_step = statistics.median(r["s_per_step"] for r in results["fp32"]) if "fp32" in results else None
    base_loss = statistics.median(r["val_loss"] for r in results["fp32"]) if "fp32" in results else None
    for codec, rs in results.items():
        step = [r["s_per_step"] for r in rs]
        loss = [r["val_loss"] for r in rs]
        line = {"codec": codec, "s_per_step": round(statistics.median(step), 3),
                "s_per_step_spread": [round(min(step), 3), round(max(step), 3)],
                "val_loss": round(statistics.median(loss), 4), "val_loss_spread": [round(min(loss), 4), round(max(loss), 4)],
                "pipeline_mb_per_step": round(rs[0]["pipeline_bytes_per_step"] / 1e6, 3)}
        if base_step:
            line["speedup_vs_fp32"] = round(base_step / statistics.median(step), 2)
            line["loss_vs_fp32_percent"] = round(100 * (statistics.median(loss) / base_loss - 1), 2)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
