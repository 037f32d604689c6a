"""Distributed benchmarks of issue 3 (docs/benchmarks.md): real processes through `tributary launch`, c10d Gloo on
loopback, the built-in corpus. Measures; asserts nothing.

  quality        4 workers, default model, same tokens per worker: single worker vs data parallel vs DiLoCo (H=50)
  communication  bytes sent per worker per training token: DP vs DiLoCo fp32 / int8 / fp4 (+ their val loss)
  wan            emulated 10 Mbit/s, 100 ms links, small model: time for DiLoCo to reach DP's final val loss
  pretrained     the DiLoCo paper's protocol: data parallel pre-trains --pretrain-steps (or --init-from an existing
                 run), then single worker, data parallel and DiLoCo each continue --steps from that model

Usage: .venv/bin/python3 bench/distributed.py --build build [--steps 300] [--only quality,communication,wan]
       .venv/bin/python3 bench/distributed.py --build build --only pretrained [--init-from RUN] --diloco-lr 2.5e-4
           --outer-lr 1.0 --outer-momentum 0   (the settings of docs/benchmarks.md 4.1)"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cli, run_dir, nproc, overrides, config="configs/diloco.toml"):
    cmd = [cli]
    if nproc > 1:
        cmd += ["launch", "--nproc", str(nproc), "--master-port", "0", "--"]
    cmd += ["train", os.path.join(ROOT, config), "--overwrite", f"--set=train.run_dir={run_dir}"]
    cmd += [f"--set={o}" for o in overrides]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    evals = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if "val_loss" in l]
    return summary, evals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--only", default="quality,communication,wan")
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch-size", type=int, default=4, help="sequences per worker per step (quality, communication)")
    ap.add_argument("--diloco-lr", default=None, help="inner AdamW lr of the DiLoCo replicas (default: the config's)")
    ap.add_argument("--streaming-workers", type=int, default=2)
    ap.add_argument("--streaming-steps", type=int, default=400)
    ap.add_argument("--compute-nice", type=int, default=0, help="streaming: dist.compute_nice of both runs")
    ap.add_argument("--skip", default="", help="quality: runs to leave out, e.g. single,ddp")
    ap.add_argument("--pretrain-steps", type=int, default=1500, help="pretrained: data-parallel steps before the fork")
    ap.add_argument("--init-from", default=None, help="pretrained: an existing run to fork from instead")
    ap.add_argument("--ddp-lr", default="2.5e-4", help="pretrained: peak lr of the data-parallel continuation")
    ap.add_argument("--single-lr", default="2.5e-4", help="pretrained: peak lr of the single-worker continuation")
    ap.add_argument("--outer-lr", default=None, help="DiLoCo outer lr (default: the config's)")
    ap.add_argument("--outer-momentum", default=None, help="DiLoCo outer Nesterov momentum (default: the config's)")
    a = ap.parse_args()
    cli = os.path.join(os.path.abspath(a.build), "tributary")
    runs = os.path.join(ROOT, "runs", "bench")
    results = {}
    common = [f"train.steps={a.steps}", f"train.batch_size={a.batch_size}", "train.eval_every=0", "train.log_every=50"]
    diloco_opts = [f"optim.lr={a.diloco_lr}"] if a.diloco_lr else []
    diloco_opts += [f"dist.outer_lr={a.outer_lr}"] if a.outer_lr else []
    diloco_opts += [f"dist.outer_momentum={a.outer_momentum}"] if a.outer_momentum else []
    tag = f"_b{a.batch_size}" if a.batch_size != 4 else ""
    skip = a.skip.split(",")
    only = a.only.split(",")
    if "codecs" in only:  # DiLoCo int8 / fp4 only (e.g. after a change to the quantised ring)
        for codec in ["int8", "fp4"]:
            s, _ = run(cli, f"{runs}/diloco_{codec}", 4, common + ["dist.inner_steps=50", f"dist.compression={codec}"])
            print(f"DiLoCo x4 H=50 {codec}: val loss {s['val_loss']:.4f}, {s['bytes_sent'] / 1e6:.2f} MB sent per worker, "
                  f"{s['bytes_sent'] / (s['tokens'] / s['world_size']):.3f} bytes/token", flush=True)
            results[f"diloco_{codec}"] = s
    if "quality" in only or "communication" in only:
        rows = {}
        if "single" not in skip:
            rows["single worker"] = run(cli, f"{runs}/single{tag}", 1, common)
        if "ddp" not in skip:
            rows["data parallel x4"] = run(cli, f"{runs}/ddp{tag}", 4, common + ["dist.algorithm=ddp"])
        for codec in ["fp32", "int8", "fp4"] if "communication" in only else ["fp32"]:
            rows[f"DiLoCo x4 H=50 {codec}"] = run(cli, f"{runs}/diloco_{codec}{tag}", 4, common + diloco_opts +
                                                  ["dist.inner_steps=50", f"dist.compression={codec}"])
        print(f"{'run':28s} {'val loss':>9s} {'bits/byte':>9s} {'MB sent/worker':>15s} {'bytes/token':>12s} {'time s':>7s}")
        for name, (s, _) in rows.items():
            tokens_per_worker = s["tokens"] / s["world_size"]
            print(f"{name:28s} {s['val_loss']:9.4f} {s['val_bpb']:9.4f} {s['bytes_sent'] / 1e6:15.2f} "
                  f"{s['bytes_sent'] / tokens_per_worker:12.3f} {s['elapsed_s']:7.0f}", flush=True)
        results["quality"] = {k: v[0] for k, v in rows.items()}
    if "wan" in only:
        small = ["model.num_layers=2", "model.width=64", "model.context=64", "train.batch_size=8",
                 "train.eval_every=10", "train.eval_batches=8", "train.log_every=10", "dist.wan=10Mbit,100ms",
                 "optim.warmup_steps=10"]
        ddp, ddp_evals = run(cli, f"{runs}/wan_ddp", 4, small + ["train.steps=100", "dist.algorithm=ddp"])
        dil, dil_evals = run(cli, f"{runs}/wan_diloco", 4, small + ["train.steps=300", "dist.inner_steps=50"])
        target = ddp["val_loss"]
        reached = next((e for e in dil_evals if e["val_loss"] <= target), None)
        print(f"wan: DP 100 steps val {target:.4f} in {ddp['elapsed_s']:.1f} s, {100 * ddp['comm_s'] / ddp['elapsed_s']:.0f}% "
              f"communicating; DiLoCo reaches it at step {reached['step'] if reached else None} after "
              f"{reached['elapsed_s'] if reached else float('nan'):.1f} s "
              f"({ddp['elapsed_s'] / reached['elapsed_s'] if reached else float('nan'):.1f}x sooner); DiLoCo final val "
              f"{dil['val_loss']:.4f} after {dil['elapsed_s']:.1f} s", flush=True)
        results["wan"] = {"ddp": ddp, "diloco": dil, "target": target, "reached": reached}
    if "pretrained" in only:
        # Both continue from the same weights with a fresh AdamW, warm-up and cosine schedule (train.init_from);
        # each at its own tuned peak lr (docs/benchmarks.md 4.1 has the sweeps).
        base = os.path.abspath(a.init_from) if a.init_from else None
        if base is None:
            base = f"{runs}/pretrain{a.pretrain_steps}"
            run(cli, base, 4, [f"train.steps={a.pretrain_steps}", f"train.batch_size={a.batch_size}",
                               "train.eval_every=0", "train.log_every=50", "dist.algorithm=ddp"])
        cont = common + [f"train.init_from={base}"]
        rows = {"pre-trained start": (json.load(open(os.path.join(base, "summary.json"))), None)}
        if "single" not in skip:
            rows["single worker"] = run(cli, f"{runs}/pt_single", 1, cont + [f"optim.lr={a.single_lr}"])
        rows["data parallel x4"] = run(cli, f"{runs}/pt_ddp", 4, cont + [f"optim.lr={a.ddp_lr}", "dist.algorithm=ddp"])
        rows["DiLoCo x4 H=50"] = run(cli, f"{runs}/pt_diloco", 4, cont + diloco_opts + ["dist.inner_steps=50"])
        dp = rows["data parallel x4"][0]["val_loss"]
        for name, (s, _) in rows.items():
            print(f"{name:20s} val loss {s['val_loss']:.4f} ({100 * (s['val_loss'] / dp - 1):+.1f}% vs data parallel)",
                  flush=True)
        results["pretrained"] = {k: v[0] for k, v in rows.items()}
    if "streaming" in only:
        # The default model over 100 Mbit/s, 10 ms links: an fp32 outer exchange models at ~1.1 s (2 workers).
        # Streaming halves each exchange and overlap hides it behind 10 inner steps (~3 s of compute). Two workers,
        # so that each has a core of its own: with more workers than cores the communication thread gets no CPU
        # while the others train and nothing can be hidden (docs/benchmarks.md 4.3). "Steady state" leaves out the
        # last sync: finish() must land every fragment before the final model exists, with no compute left to
        # hide it behind.
        steps, n = a.streaming_steps, a.streaming_workers
        base = [f"train.steps={steps}", "train.eval_every=0", "train.log_every=50", "dist.wan=100Mbit,10ms",
                "dist.inner_steps=50", "optim.warmup_steps=20", f"dist.compute_nice={a.compute_nice}"]
        plain, _ = run(cli, f"{runs}/wan_plain", n, base)
        stream, _ = run(cli, f"{runs}/wan_streaming", n, base + ["dist.fragments=2", "dist.overlap_steps=10"])

        def blocked_before_end(run_dir):
            rounds = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"outer_step"' in l]
            return sum(r["comm_s"] for r in rounds if r["step"] < steps), len(rounds)

        p_steady, p_rounds = blocked_before_end(f"{runs}/wan_plain")
        s_steady, s_rounds = blocked_before_end(f"{runs}/wan_streaming")
        print(f"streaming ({n} workers, compute_nice {a.compute_nice}, {steps} steps): DiLoCo blocked {plain['comm_s']:.2f} s of {plain['elapsed_s']:.1f} s "
              f"(val {plain['val_loss']:.4f}, {p_rounds} exchanges); 2 fragments + overlap 10 blocked "
              f"{stream['comm_s']:.2f} s of {stream['elapsed_s']:.1f} s (val {stream['val_loss']:.4f}, {s_rounds} "
              f"exchanges). Hidden: {100 * (1 - stream['comm_s'] / plain['comm_s']):.0f}% in all, "
              f"{100 * (1 - s_steady / p_steady):.0f}% before the final sync ({s_steady:.2f} s vs {p_steady:.2f} s)",
              flush=True)
        results["streaming"] = {"plain": plain, "streaming": stream, "steady_blocked_s": [p_steady, s_steady]}
    out = a.out or os.path.join(runs, "results.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    json.dump(results, open(out, "w"), indent=2)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
