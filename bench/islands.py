"""Islands benchmark (issue 42, docs/benchmarks.md): two sites of two workers each, as two network namespaces joined by
a veth pair whose both ends are rate-limited with `tc ... tbf` (the slow link between the sites; inside a site the
workers talk over the namespace's loopback). One `tributary launch` per site (node 0's hosts the store). Three ways to
train the same model on the same 4 x batch per step:
  dp        flat data parallel over the 4 workers: every step's gradients cross the slow link
  diloco    flat DiLoCo over the 4 workers (each a replica): every H steps a pseudo-gradient crosses it
  islands   parallel.islands = machines: data parallel inside a site, DiLoCo across the sites, the outer exchange
            sharded over the site's two workers
Reports each run's final validation loss, wall-clock training time (train_s: evaluations left out), the bytes its
rank 0 sent, and the training time at which it first reached flat data parallel's final validation loss (at the
evaluations, every --eval-every steps). Measures; asserts nothing. Needs root and `ip netns` / `tc`.

With --sweep 1,2,4: islands only, of 1, 2 and 4 workers per site (2 sites), reporting per island size what rank 0
holds of the AdamW moments and of DiLoCo's outer state (ZeRO-1, the sharded outer state: the start-up line "rank 0
holds ..."), the bytes it sent across per outer step, and the median time it was blocked in an outer step.

Fault-tolerant islands (--only islands,ft,ft-kill): `ft` is islands with dist.fault_tolerant (the islands are the
quorum's members, their ranks 0 exchange the whole model; launch --restart-island), no fault; `ft-kill` the same with
site B's second worker (rank 3) SIGKILLed at step --kill-step: site B's island drops out, its launch starts it again,
and it rejoins from site A's island over the slow link. Reported besides: the step at which it rejoined.

With --unlike: islands of unlike size and speed on this machine (no namespaces): 2 + 1 ranks, the lone rank 2x
slower (dist.slow_workers), lockstep (every island one optimizer step per tick, the fast island waits at each outer
step) against time-paced (parallel.island_steps = 2,1: the fast island takes two per tick) and measured pacing
(parallel.island_steps = auto: the ranks time their step at start-up); each run's training time
to the lockstep run's final validation loss.

Usage: python3 bench/islands.py --build build [--steps 300] [--seed 1234] [--rate 100mbit] [--inner-steps 25] [--repeats 1]
       [--only dp,diloco,islands] [--sweep 1,2,4] [--unlike] [--out islands.json]
"""
import re
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from netns import TwoMachines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def Sites(rate):
    """Namespaces A (10.78.0.1, node 0) and B (10.78.0.2, node 1) joined by a veth pair limited to `rate`."""
    return TwoMachines(("tribisla", "tribislb", "tiva", "tivb"), "10.78.0", rate)


def run(sites, cli, kind, args, run_dir, port, per_site=2):
    sets = [f"train.run_dir={run_dir}", f"train.steps={args.steps}", "train.batch_size=4", f"train.seed={args.seed}",
            f"train.eval_every={args.eval_every}", "train.log_every=25", "train.checkpoint_every=0",
            f"optim.warmup_steps={max(1, args.steps // 10)}", "dist.collective_timeout_s=600",
            "dist.store_timeout_s=600"]
    if kind == "dp":  # data parallel as its users run it: fp32 gradients (the shipped config's int8 is DiLoCo's)
        sets += ["dist.algorithm=ddp", "dist.compression=fp32"]
    else:  # the same outer settings for both DiLoCo runs; no data-parallel warm-up across the slow link
        sets += [f"dist.inner_steps={args.inner_steps}", "dist.warmup_ddp_steps=0"]
    if kind in ("islands", "ft", "ft-kill"):
        sets.append("parallel.islands=machines")
    launch_extra, fault = [], {}
    if kind in ("ft", "ft-kill"):
        sets += ["dist.fault_tolerant=true", "dist.heartbeat_timeout_s=10"]
        launch_extra = ["--max-restarts", "2", "--restart-island"]
    if kind == "ft-kill":
        fault = {"TRIBUTARY_FAIL_RANK": "3", "TRIBUTARY_FAIL_STEP": str(args.kill_step or args.steps // 3)}
    train = ["train", os.path.join(ROOT, "configs/diloco.toml"), "--overwrite"] + [f"--set={s}" for s in sets]
    procs = []
    for node in (1, 0):
        cmd = sites.prefix(node) + [cli, "launch", "--nproc", str(per_site), "--nnodes", "2", "--node-rank", str(node),
                                    "--master-addr", "10.78.0.1", "--master-port", str(port)] + launch_extra + \
            ["--"] + train
        log = open(os.path.join(args.work, f"{kind}-node{node}.log"), "w")
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **fault)
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    start = time.time()
    codes = [p.wait() for p in procs]
    wall = time.time() - start
    if any(codes):
        sys.exit(f"{kind}: launch exited {codes}; see {args.work}/{kind}-node*.log")
    evals, outer = [], []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "val_loss" in m:
                evals.append((m["step"], m["train_s"], m["val_loss"]))
            if "outer_step" in m:
                outer.append((m["bytes_sent"], m["comm_s"]))
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    held = re.search(r"rank 0 holds ([0-9.]+) MB of AdamW moments \(the whole: ([0-9.]+) MB\) and ([0-9.]+) MB of "
                     r"DiLoCo outer state", open(os.path.join(args.work, f"{kind}-node0.log")).read())
    joined = re.search(r"island 1 joined at step (\d+)", open(os.path.join(args.work, f"{kind}-node1.log")).read())
    return {"wall_s": wall, "evals": evals, "joined_at": int(joined.group(1)) if joined else None, "val_loss": summary["val_loss"], "bytes_sent": summary["bytes_sent"],
            "bytes_inside_island": summary.get("bytes_inside_island", 0), "train_s": evals[-1][1], "outer": outer,
            "held": [float(x) for x in held.groups()] if held else None}


def reached(evals, target):
    for step, train_s, loss in evals:
        if loss <= target:
            return train_s, step
    return None, None


def unlike(cli, args):
    results = {}
    kinds = (("lockstep", []), ("paced", ["parallel.island_steps=2,1"]), ("measured", ["parallel.island_steps=auto"]))
    for kind, extra in (k for k in kinds if k[0] in args.kinds.split(",")):
        runs = []
        for rep in range(args.repeats):
            run_dir = os.path.join(args.work, f"unlike-{kind}-{rep}")
            sets = [f"train.run_dir={run_dir}", f"train.steps={args.steps}", "train.batch_size=4", f"train.seed={args.seed}",
                    f"train.eval_every={args.eval_every}", "train.log_every=25", "train.checkpoint_every=0",
                    f"optim.warmup_steps={max(1, args.steps // 10)}", f"dist.inner_steps={args.inner_steps}",
                    "dist.warmup_ddp_steps=0", "parallel.islands=2,1", "dist.slow_workers=2:2"] + extra
            cmd = [cli, "launch", "--nproc", "3", "--master-port", "0", "--", "train",
                   os.path.join(ROOT, "configs/diloco.toml"), "--overwrite"] + [f"--set={x}" for x in sets]
            with open(os.path.join(args.work, f"unlike-{kind}.log"), "w") as log:
                if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE")).returncode:
                    sys.exit(f"{kind}: launch failed; see {args.work}/unlike-{kind}.log")
            evals = [(m["step"], m["train_s"], m["val_loss"]) for m in map(json.loads, open(os.path.join(
                run_dir, "metrics.jsonl"))) if "val_loss" in m]
            paced = re.search(r"parallel.island_steps = '([0-9,]+)' to replay",
                              open(os.path.join(args.work, f"unlike-{kind}.log")).read())
            runs.append({"evals": evals, "val_loss": evals[-1][2], "train_s": evals[-1][1],
                         "measured_steps": paced.group(1) if paced else None})
            print(f"[{kind} #{rep}] val loss {evals[-1][2]:.4f} | train {evals[-1][1]:.0f} s"
                  + (f" | measured pace {paced.group(1)}" if paced else ""), flush=True)
        results[kind] = runs
    target = statistics.median(r["val_loss"] for r in results["lockstep"])
    print(f"\nislands 2+1 ranks, rank 2 2x slower, {args.steps} ticks, H = {args.inner_steps}; target: lockstep's "
          f"final val loss {target:.4f}")
    base = None
    for kind, runs in results.items():
        times = [reached(r["evals"], target)[0] for r in runs]
        hit = [t for t in times if t is not None]
        t = statistics.median(hit) if len(hit) == len(times) else None
        base = base or t
        print(f"{kind:9} val loss {statistics.median(r['val_loss'] for r in runs):.4f} | to target "
              f"{('%.0f s' % t) if t else 'not reached'} | {('%.2fx sooner' % (base / t)) if t and base else ''}")
    if args.out:
        json.dump({"args": vars(args), "unlike": results}, open(args.out, "w"), indent=1)


def sweep(sites, cli, args):
    print(f"{'island':>6} {'AdamW MB':>9} {'of':>6} {'outer MB':>9} {'MB/outer step':>14} {'outer step s':>13}")
    rows = []
    for i, n in enumerate(int(x) for x in args.sweep.split(",")):
        r = run(sites, cli, "islands", args, os.path.join(args.work, f"sweep-{n}"), 29800 + i, per_site=n)
        sent = [b for b, _ in r["outer"]]
        blocked = [c for _, c in r["outer"]]
        adam, whole, outer = r["held"]
        print(f"{n:>6} {adam:9.2f} {whole:6.2f} {outer:9.2f} {statistics.median(sent) / 1e6:14.2f} "
              f"{statistics.median(blocked):13.2f} (spread {min(blocked):.2f}-{max(blocked):.2f})", flush=True)
        rows.append({"island_size": n, **r})
    if args.out:
        json.dump({"args": vars(args), "sweep": rows}, open(args.out, "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234, help="train.seed (the shipped config's)")
    ap.add_argument("--inner-steps", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", default="dp,diloco,islands", help="of dp,diloco,islands,ft,ft-kill")
    ap.add_argument("--kill-step", type=int, default=0, help="ft-kill: the step rank 3 dies at (default steps / 3)")
    ap.add_argument("--sweep", default="")
    ap.add_argument("--unlike", action="store_true")
    ap.add_argument("--kinds", default="lockstep,paced,measured", help="--unlike: which pacings to run")
    ap.add_argument("--work", default="/tmp/trib_islands_bench")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    cli = os.path.abspath(os.path.join(args.build, "tributary"))
    os.makedirs(args.work, exist_ok=True)
    kinds = args.only.split(",")
    if args.unlike:
        return unlike(cli, args)
    sites = Sites(args.rate)
    if args.sweep:
        try:
            return sweep(sites, cli, args)
        finally:
            sites.down()
    results = {k: [] for k in kinds}
    try:
        for rep in range(args.repeats):
            for i, kind in enumerate(kinds):
                r = run(sites, cli, kind, args, os.path.join(args.work, f"{kind}-{rep}"), 29700 + 10 * rep + i)
                results[kind].append(r)
                print(f"[{kind} #{rep}] val loss {r['val_loss']:.4f} | train {r['train_s']:.0f} s (wall {r['wall_s']:.0f}"
                      f" s) | rank 0 sent {r['bytes_sent'] / 1e6:.0f} MB across, "
                      f"{r['bytes_inside_island'] / 1e6:.0f} MB inside"
                      + (f" | site B's island rejoined at step {r['joined_at']}" if r["joined_at"] else ""), flush=True)
    finally:
        sites.down()
    print(f"\n{args.steps} steps, 2 sites x 2 workers, link {args.rate}, H = {args.inner_steps} for DiLoCo and islands")
    target = statistics.median(r["val_loss"] for r in results["dp"]) if "dp" in results else None
    print(f"{'run':8} {'val loss':>9} {'train s':>8} {'MB sent':>8} {'to DP loss':>11} {'sooner':>7} {'vs DP':>7}")
    dp_time = statistics.median(r["train_s"] for r in results["dp"]) if "dp" in results else None
    for kind in kinds:
        rs = results[kind]
        loss = statistics.median(r["val_loss"] for r in rs)
        t = statistics.median(r["train_s"] for r in rs)
        mb = statistics.median(r["bytes_sent"] for r in rs) / 1e6
        times = [reached(r["evals"], target)[0] for r in rs] if target else [None]
        hit = [x for x in times if x is not None]
        to = statistics.median(hit) if len(hit) == len(times) else None
        sooner = f"{dp_time / to:.2f}x" if to and dp_time else "-"
        gap = f"{100 * (loss - target) / target:+.2f}%" if target else "-"
        spread = f" (spread {min(r['val_loss'] for r in rs):.4f}-{max(r['val_loss'] for r in rs):.4f})" if len(rs) > 1 else ""
        print(f"{kind:8} {loss:9.4f} {t:8.0f} {mb:8.0f} {('%.0f s' % to) if to else 'not':>11} {sooner:>7} {gap:>7}"
              f"{spread}")
    if args.out:
        json.dump({"args": vars(args), "results": results}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
