#!/usr/bin/env python3
"""The slow-link frontier end to end (issue 63, measurement 4): 8 devices of a cluster of unlike links (every pair's
bandwidth and latency emulated from the cluster file, `dist.wan=<file>`), a pipeline of 4 stages x 2 replicas.

  baseline  Megatron's rank order, fp32 activations, data parallel (a per-step all-reduce of fp32 gradients)
  plan      `tributary plan`'s placement for that same run (DT-FM's placement alone; the peer of §8)
  ours      `tributary plan --sync-every H` for DiLoCo per stage with int8 pseudo-gradients and 4-bit activations
            (hadamard4), the plan pricing those bytes; DiLoCo per stage, H inner steps, after 20 data-parallel
            warm-up steps (--ours names more such runs: another activation codec, another warm-up)

The baseline trains --steps steps and its final validation loss is the target; `plan` trains the same steps (data
parallel on another placement: the same losses); `ours` (and every --ours run) trains --max-steps steps, evaluated every --eval-every, and
its time is that of the first evaluation at or below the target. Time = the loop's wall clock at that
evaluation less the evaluations' own time (`elapsed_s - eval_s` of the evaluation record). The ratio reported is
baseline time / time to the same loss; losses are deterministic for a seed, so --repeats measure the time's spread.

  python3 bench/slow_link_e2e.py --build build [--cluster FILE --devices 0,1,...] [--repeats 3]

The model is §8's (docs/benchmarks.md): 8 blocks of width 128 (two a stage), context 64, 8 sequences a step per
pipeline, untied embeddings, GPipe with one micro-batch, 1 thread per process (8 processes)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BYTES_PER_ACTIVATION = {"fp32": 4, "int8": 1, "hadamard4": 0.5 + 4 / 64, "hadamard2": 0.25 + 4 / 64}
NUM_PARAMETERS = 1771904  # the model below, untied, byte vocabulary (bench_small_setup.sh)


def tributary(args, *argv, log=None):
    cmd = [os.path.join(args.build, "tributary"), *argv]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout + out.stderr)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout


def plan(args, work, name, act_bytes, param_bytes, sync_every):
    workload = os.path.join(work, f"workload-{name}.json")
    json.dump({"name": name, "num_layers": 8, "width": 128, "seq_len": 64, "global_batch": 16,
               "num_parameters": NUM_PARAMETERS, "bytes_per_parameter": param_bytes,
               "bytes_per_activation": act_bytes, "d_dp": 2, "d_pp": 4, "sync_every": sync_every},
              open(workload, "w"))
    out = os.path.join(work, f"{name}.json")
    text = tributary(args, "plan", os.path.join(work, "cluster.json"), workload, "--out", out, "--overwrite",
                     "--seed", "1")
    price = [l for l in text.splitlines() if l.startswith("plan")]
    return out, (price[0] if price else text.strip().splitlines()[-1])


def train(args, work, name, placement, steps, eval_every, extra):
    run_dir = os.path.join(work, name)
    cmd = ["launch", "--nproc", "8", "--master-port", "0", "--", "train", "--overwrite",
           "--set", "model.num_layers=8", "--set", "model.width=128", "--set", "model.num_heads=4",
           "--set", "model.context=64", "--set", "model.tie_embeddings=false", "--set", "train.batch_size=8",
           "--set", "optim.warmup_steps=5", "--set", "train.eval_batches=8", "--set", "train.threads=1",
           "--set", f"data.dir={args.data}", "--set", "train.log_every=10", "--set", "train.checkpoint_every=0",
           "--set", f"train.eval_every={eval_every}", "--set", "parallel.pipeline_stages=4",
           "--set", "parallel.micro_batches=1", "--set", f"dist.wan={os.path.join(work, 'cluster.json')}",
           "--set", f"parallel.placement={placement}", "--set", f"train.steps={steps}",
           "--set", f"train.run_dir={run_dir}", "--set", f"train.seed={args.seed}", *extra]
    tributary(args, *cmd, log=run_dir + ".log")
    evals = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"val_loss"' in l]
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    sent = sum(s["activation_bytes"] + s["gradient_bytes"] + s["sync_bytes"] for s in summary["stages"]) * 2
    return evals, sent / summary["tokens"]


def clock(e):
    return e["elapsed_s"] - e["eval_s"]


def to_target(evals, target):
    hit = [e for e in evals if e["val_loss"] <= target + 1e-9]
    return (hit[0]["step"], clock(hit[0])) if hit else (None, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "default"))
    ap.add_argument("--cluster", default=os.path.join(ROOT, "..", "shared", "reference", "networks",
                                                      "case5-worldwide.json"))
    ap.add_argument("--devices", default="0,1,8,9,24,25,48,49", help="8 indices into --cluster's devices")
    ap.add_argument("--shuffle", type=int, default=7, help="relabel the devices (seed; -1 keeps their order)")
    ap.add_argument("--bandwidth-scale", type=float, default=1.0,
                    help="multiply every link's bandwidth (0.1: case5's 0.36-2 Gbit/s become 36-200 Mbit/s)")
    ap.add_argument("--steps", type=int, default=100, help="the baseline's steps; its final loss is the target")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--ours", default="ours=hadamard4:20",
                    help="NAME=ACT:WARMUP,...: DiLoCo-per-stage runs, each with its activation codec (fp32, int8, "
                         "hadamard4, hadamard2) and data-parallel warm-up steps, each on its own plan")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-plan", action="store_true", help="leave out the plan-alone run")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="trib_slow_link_e2e_")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "cluster_subset.py"), args.cluster, args.devices,
                    str(args.shuffle), os.path.join(work, "cluster.json")], check=True)
    if args.bandwidth_scale != 1.0:
        cluster = json.load(open(os.path.join(work, "cluster.json")))
        cluster["bandwidth_gbps"] = [[b * args.bandwidth_scale for b in row] for row in cluster["bandwidth_gbps"]]
        cluster["name"] += f" bandwidth x{args.bandwidth_scale:g}"
        json.dump(cluster, open(os.path.join(work, "cluster.json"), "w"), indent=1)
    megatron = os.path.join(work, "megatron.json")
    json.dump({"d_dp": 2, "d_pp": 4, "pipelines": [[j * 2 + i for j in range(4)] for i in range(2)]},
              open(megatron, "w"))
    dp_plan, dp_price = plan(args, work, "plan-ddp", 4, 4, 1)
    h = args.inner_steps
    ours = {}
    for spec in args.ours.split(","):
        name, rest = spec.split("=")
        act, warmup = rest.split(":")
        ours[name] = (act, int(warmup)) + plan(args, work, f"plan-{name}", BYTES_PER_ACTIVATION[act], 1, h)
    our_price = {name: o[3] for name, o in ours.items()}
    print(json.dumps({"work": work, "cluster": f"{args.cluster}[{args.devices}] shuffled {args.shuffle}"
                      f" bandwidth x{args.bandwidth_scale:g}",
                      "plan_ddp": dp_price, "plan_ours": our_price}), flush=True)
    rows = {"baseline": [], "plan": [], **{name: [] for name in ours}}
    for rep in range(args.repeats):
        evals, bpt = train(args, work, f"baseline-{rep}", megatron, args.steps, args.steps,
                           ["--set", "dist.algorithm=ddp", "--set", "parallel.activation_compression=fp32"])
        target, base_s = evals[-1]["val_loss"], clock(evals[-1])
        rows["baseline"].append({"step": args.steps, "s": base_s, "loss": target, "bytes_per_token": bpt})
        print(json.dumps({"run": "baseline", "repeat": rep, **rows["baseline"][-1]}), flush=True)
        runs = [(name, placement, ["--set", "dist.algorithm=diloco", "--set", f"dist.inner_steps={h}",
                                   "--set", "dist.compression=int8", "--set", f"dist.warmup_ddp_steps={warmup}",
                                   "--set", f"parallel.activation_compression={act}"])
                for name, (act, warmup, placement, _) in ours.items()]
        if not args.skip_plan:
            runs.insert(0, ("plan", dp_plan, ["--set", "dist.algorithm=ddp",
                                              "--set", "parallel.activation_compression=fp32"]))
        for name, placement, extra in runs:
            steps, every = (args.steps, args.steps) if name == "plan" else (args.max_steps, args.eval_every)
            evals, bpt = train(args, work, f"{name}-{rep}", placement, steps, every, extra)
            step, s = to_target(evals, target)
            row = {"step": step, "s": s, "best": min(e["val_loss"] for e in evals),
                   "s_per_step": clock(evals[-1]) / evals[-1]["step"], "bytes_per_token": bpt,
                   "speedup": base_s / s if s else None}
            rows[name].append(row)
            print(json.dumps({"run": name, "repeat": rep, "target": target, **row}), flush=True)
    for name, rs in rows.items():
        if not rs:
            continue
        times = [r["s"] for r in rs if r["s"] is not None]
        line = {"run": name, "reached": f"{len(times)}/{len(rs)}"}
        if times:
            line.update({"s_median": round(statistics.median(times), 1), "s_spread": [round(min(times), 1),
                                                                                       round(max(times), 1)]})
        ups = [r["speedup"] for r in rs if r.get("speedup")]
        if ups:
            line.update({"speedup_median": round(statistics.median(ups), 2),
                         "speedup_spread": [round(min(ups), 2), round(max(ups), 2)]})
        line["bytes_per_token"] = round(rs[0]["bytes_per_token"])
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
