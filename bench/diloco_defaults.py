#!/usr/bin/env python3
"""DiLoCo's shipped defaults against data parallel (issue 44): runs named variants of configs/diloco.toml with 4
local workers on the built-in corpus, from scratch, and appends one JSON line per (variant, steps, seed) to --out:
the validation loss, what rank 0 sent, the outer steps and the wall time. A line already in --out is not run again,
so an interrupted sweep continues where it stopped.

  python3 bench/diloco_defaults.py --steps 300 --seeds 1234 --variants ddp,shipped --out runs/d44/results.jsonl

A variant is a name from VARIANTS below or NAME=KEY:VALUE;KEY:VALUE (extra --set pairs over the shipped config).
"""
import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {
    "shipped": [],
    "ddp": ["dist.algorithm=ddp", "dist.compression=fp32"],  # the shipped config's int8 would quantise gradients
    # the paper's settings: H = 50, outer Nesterov 0.7 / 0.9, fp32
    "paper": ["dist.inner_steps=50", "dist.compression=fp32", "dist.warmup_ddp_steps=0", "dist.outer_momentum=0.9",
              "dist.outer_lr=0.7"],
    # the config shipped before issue 44: H = 50, fp32, a data-parallel warm-up of a third (fewer than 20 outer
    # steps), outer 0.7 / 0.5
    "warmup": ["dist.inner_steps=50", "dist.compression=fp32", "dist.warmup_ddp_steps=-1", "dist.outer_momentum=0.5",
               "dist.outer_lr=0.7"],
}


def parse_variant(v):
    if "=" in v and v.split("=", 1)[0] not in VARIANTS:
        name, sets = v.split("=", 1)
        return name, [s.replace(":", "=", 1) for s in sets.split(";") if s]
    return v, VARIANTS[v]


def done(out):
    seen = set()
    if os.path.exists(out):
        for line in open(out):
            r = json.loads(line)
            seen.add((r["variant"], r["steps"], r["seed"]))
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--config", default="configs/diloco.toml")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", default="1234")
    ap.add_argument("--variants", default="ddp,shipped")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--out", default="runs/d44/results.jsonl")
    ap.add_argument("--data", default="", help="data.dir to train on instead of the config's")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    seen = done(a.out)
    for seed in [int(s) for s in a.seeds.split(",")]:
        for v in a.variants.split(","):
            name, sets = parse_variant(v)
            if (name, a.steps, seed) in seen:
                continue
            run_dir = os.path.join(os.path.dirname(a.out), f"{name}-{a.steps}-{seed}")
            cmd = [f"{a.build}/tributary", "launch", "--nproc", str(a.workers), "--master-port", "0", "--", "train",
                   a.config, "--overwrite", "--set", f"train.run_dir={run_dir}", "--set", f"train.steps={a.steps}",
                   "--set", "train.eval_every=0", "--set", f"train.seed={seed}"]
            if a.data:
                cmd += ["--set", f"data.dir={a.data}"]
            for s in sets:
                cmd += ["--set", s]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{name} seed {seed}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-4000:]}", file=sys.stderr)
                continue
            s = json.load(open(os.path.join(run_dir, "summary.json")))
            notes = [l for l in (p.stdout + p.stderr).splitlines() if "settings from the run" in l]
            r = {"variant": name, "sets": sets, "steps": a.steps, "seed": seed, "data": a.data,
                 "val_loss": s["val_loss"], "bytes_sent": s["bytes_sent"], "outer_steps": s.get("outer_steps"),
                 "wall_s": round(time.time() - t0, 1), "auto": notes[-1].split("] ")[-1] if notes else ""}
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
