"""Asynchronous DiLoCo against synchronous DiLoCo (issue 61, docs/benchmarks.md): 4 replicas of the shipped DiLoCo
config's model (configs/diloco.toml, with the settings it shipped when §40 and §46 were measured: H = 10, int8
updates; plain averaging for short runs) on the built-in corpus, one
`tributary launch --nproc 4` on this machine, the links between the replicas emulated (dist.wan, default 100 Mbit/s
and 100 ms). Both runs train the same tokens: synchronous DiLoCo train.steps x 4 replicas x batch; the asynchronous
run ends when its merges have taken in as many (the fast replicas take more steps, a slow one fewer). Scenarios:
  slow     replica 1 runs 3x slower (dist.slow_workers=1:3) in both runs: the training time at which the asynchronous
           run's lead first evaluates at or below synchronous DiLoCo's final validation loss, against synchronous
           DiLoCo's time to that loss (target: >= 1.3x sooner)
  equal    every replica at the same speed: the final validation losses (target: within 2%)
  kill     asynchronous, a replica (1 or 2, in turn) SIGKILLed every --kill-every seconds and restarted by launch
           (--max-restarts): goodput = tokens merged per second against the fault-free asynchronous run of `equal`
           (target: >= 95%), final loss (target: within 2%)
  merger   asynchronous, the process holding the merging term SIGKILLed twice (at a third and two thirds of the
           fault-free run's time) and restarted: the run completes; the largest rise between two consecutive
           evaluations of the lead (target: none above 5%)
Time is each evaluation's `elapsed_s - eval_s` (wall-clock seconds of the run's loop, the lead's evaluations left
out). Measures; asserts nothing. The testbed's 4 processes share 2 cores: a replica slowed by a sleep leaves its core
to the others, which flatters the asynchronous run's fast replicas against separate machines (said in the record).

Usage: python3 bench/async_diloco.py --build build [--steps 200] [--eval-every 20] [--repeats 1] [--seed 1234]
       [--only slow,equal,kill,merger] [--wan 100Mbit,100ms] [--set dist.inner_steps=30]
       [--async-set dist.round_seconds=6] [--kill-every 60] [--out async.json]
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def evals(run_dir):
    out = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        r = json.loads(line)
        if r.get("val_loss") is not None:
            out.append((r["step"], r["elapsed_s"] - r.get("eval_s", 0), r["val_loss"]))
    return out


def merges(run_dir):
    path = os.path.join(run_dir, "merges.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def worker_pids(launch_pid):
    """rank -> pid of the launch's worker processes (their RANK from /proc)."""
    out = {}
    for pid in subprocess.run(["pgrep", "-P", str(launch_pid)], capture_output=True, text=True).stdout.split():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = int(pid)
    return out


def run(args, name, algorithm, sets, killer=None, launch_extra=()):
    run_dir = os.path.join(args.work, name)
    sets = sets + args.set
    if algorithm == "async_diloco":
        sets = sets + args.async_set
    sets = [f"train.run_dir={run_dir}", f"train.steps={args.steps}", f"train.seed={args.seed_now}",
            f"train.eval_every={args.eval_every}", "train.log_every=25", "train.checkpoint_every=0",
            f"optim.warmup_steps={max(1, args.steps // 10)}", f"dist.algorithm={algorithm}",
            "dist.warmup_ddp_steps=0", f"dist.wan={args.wan}", "dist.heartbeat_timeout_s=5", "dist.inner_steps=10",
            "dist.compression=int8"] + sets
    cmd = [args.cli, "launch", "--nproc", "4", "--master-port", "0", *launch_extra, "--", "train",
           os.path.join(ROOT, "configs/diloco.toml"), "--overwrite"] + [f"--set={s}" for s in sets]
    log = open(os.path.join(args.work, name + ".log"), "w")
    start = time.time()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    stop = threading.Event()
    kills = []
    if killer:
        t = threading.Thread(target=killer, args=(p.pid, run_dir, stop, kills, start))
        t.start()
    code = p.wait()
    wall = time.time() - start
    stop.set()
    if code:
        print(f"{name}: launch exited {code}; see {args.work}/{name}.log", flush=True)
        return None
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    m = merges(run_dir)
    return {"name": name, "evals": evals(run_dir), "val_loss": summary["val_loss"], "wall_s": wall, "kills": kills,
            # the lead's steps trained from its own model between posting an update and adopting its merge
            "overlap_steps": summary.get("async", {}).get("steps_from_post_to_merged_version"),
            "merged_tokens": m[-1]["tokens"] if m else None, "merges": len(m),
            "mergers": sorted({x["merger"] for x in m}), "train_s": evals(run_dir)[-1][1]}


def kill_every(seconds):
    def killer(launch_pid, run_dir, stop, kills, start):
        turn = 0
        while not stop.wait(seconds):
            rank = 1 + turn % 2
            turn += 1
            pid = worker_pids(launch_pid).get(rank)
            if pid:
                os.kill(pid, signal.SIGKILL)
                kills.append((round(time.time() - start, 1), rank))
    return killer


def kill_merger(at_s):
    def killer(launch_pid, run_dir, stop, kills, start):
        for t in at_s:
            if stop.wait(max(0.0, start + t - time.time())):
                return
            m = merges(run_dir)
            rank = m[-1]["merger"] if m else 3
            pid = worker_pids(launch_pid).get(rank)
            if pid:
                os.kill(pid, signal.SIGKILL)
                kills.append((round(time.time() - start, 1), rank))
    return killer


def time_to(evs, target):
    for step, t, loss in evs:
        if loss <= target:
            return t, step
    return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="slow,equal,kill,merger")
    ap.add_argument("--wan", default="100Mbit,100ms")
    ap.add_argument("--kill-every", type=float, default=60)
    ap.add_argument("--slow-async-steps", type=int, default=0, help="slow: the asynchronous run's train.steps")
    ap.add_argument("--set", action="append", default=[], help="a config key=value for both runs (e.g. "
                    "dist.inner_steps=30); after the scenario's own")
    ap.add_argument("--async-set", action="append", default=[],
                    help="KEY=VALUE for the asynchronous runs only, e.g. dist.round_seconds=6 (time-paced rounds)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.cli = os.path.join(ROOT, args.build, "tributary")
    args.work = tempfile.mkdtemp(prefix="async_bench_")
    only = args.only.split(",")
    results = []
    for rep in range(args.repeats):
        args.seed_now = args.seed + rep
        row = {"repeat": rep}
        if "slow" in only:
            s = run(args, f"slow-sync-{rep}", "diloco", ["dist.slow_workers=1:3"])
            # the asynchronous run may train more tokens than synchronous DiLoCo's to reach its final loss
            a = run(args, f"slow-async-{rep}", "async_diloco",
                    ["dist.slow_workers=1:3", f"train.steps={args.slow_async_steps or 2 * args.steps}"])
            if s and a:
                target, t_sync = s["val_loss"], s["train_s"]
                t_async, step = time_to(a["evals"], target)
                row["slow"] = {"sync": s, "async": a, "target": target, "sync_s": t_sync, "async_s": t_async,
                               "async_step": step, "speedup": t_sync / t_async if t_async else None}
                print(f"[{rep}] slow: sync {target:.4f} in {t_sync:.0f} s; async reaches it at "
                      f"{'%.0f s (step %d)' % (t_async, step) if t_async else 'never'}, ends {a['val_loss']:.4f} in "
                      f"{a['train_s']:.0f} s; speed-up {row['slow']['speedup']}", flush=True)
        if not any(k in only for k in ("equal", "kill", "merger")):
            results.append(row)
            continue
        s = run(args, f"equal-sync-{rep}", "diloco", []) if "equal" in only else None
        a = run(args, f"equal-async-{rep}", "async_diloco", [])
        if not a:
            results.append(row)
            continue
        row["equal"] = {"sync": s, "async": a}
        if s:
            print(f"[{rep}] equal: sync {s['val_loss']:.4f} ({s['train_s']:.0f} s), async {a['val_loss']:.4f} "
                  f"({a['train_s']:.0f} s, {a['merged_tokens']} tokens merged): "
                  f"{100 * (a['val_loss'] / s['val_loss'] - 1):+.2f}%", flush=True)
        base_goodput = a["merged_tokens"] / a["wall_s"]
        if "merger" in only:
            at = [a["wall_s"] / 3, 2 * a["wall_s"] / 3]
            g = run(args, f"merger-{rep}", "async_diloco", [], kill_merger(at),
                    ["--max-restarts", "4", "--max-failures", "3"])
            if g:
                losses = [e[2] for e in g["evals"]]
                jump = max([(y - x) / x for x, y in zip(losses, losses[1:])] + [0.0])
                row["merger"] = {"run": g, "largest_rise": jump,
                                 "loss_vs_fault_free": g["val_loss"] / a["val_loss"] - 1}
                print(f"[{rep}] merger killed at {g['kills']}: mergers {g['mergers']}, {g['merges']} merges; largest "
                      f"rise between evaluations {100 * jump:+.2f}%; loss {g['val_loss']:.4f} "
                      f"({100 * row['merger']['loss_vs_fault_free']:+.2f}% of fault-free)", flush=True)
        if "kill" in only:
            k = run(args, f"kill-{rep}", "async_diloco", [], kill_every(args.kill_every),
                    ["--max-restarts", "20", "--max-failures", "3"])
            if k:
                goodput = k["merged_tokens"] / k["wall_s"]
                row["kill"] = {"run": k, "goodput_ratio": goodput / base_goodput,
                               "loss_vs_fault_free": k["val_loss"] / a["val_loss"] - 1}
                print(f"[{rep}] kill every {args.kill_every:.0f} s: kills {k['kills']}; goodput "
                      f"{100 * goodput / base_goodput:.1f}% of fault-free; loss {k['val_loss']:.4f} "
                      f"({100 * row['kill']['loss_vs_fault_free']:+.2f}%)", flush=True)
        results.append(row)
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)
    summarize(results)
    print(f"work directory: {args.work}")


def summarize(results):
    """Median [min-max] of each measured number over the repeats."""
    def pick(path):
        out = []
        for row in results:
            v = row
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            if isinstance(v, (int, float)):
                out.append(v)
        return out

    def ratio(row):
        e = row.get("equal") or {}
        return 100 * (e["async"]["val_loss"] / e["sync"]["val_loss"] - 1) if e.get("sync") else None

    lines = [("slow: speed-up to sync's final loss (x)", pick(["slow", "speedup"])),
             ("slow: sync's time to its final loss (s)", pick(["slow", "sync_s"])),
             ("slow: async's time to it (s)", pick(["slow", "async_s"])),
             ("equal: async vs sync val loss (%)", [x for x in map(ratio, results) if x is not None]),
             ("equal: async steps from post to merged version", pick(["equal", "async", "overlap_steps"])),
             ("kill: goodput vs fault-free (%)", [100 * x for x in pick(["kill", "goodput_ratio"])]),
             ("kill: loss vs fault-free (%)", [100 * x for x in pick(["kill", "loss_vs_fault_free"])]),
             ("merger: largest rise between evaluations (%)", [100 * x for x in pick(["merger", "largest_rise"])]),
             ("merger: loss vs fault-free (%)", [100 * x for x in pick(["merger", "loss_vs_fault_free"])])]
    for name, xs in lines:
        if xs:
            print(f"{name}: median {statistics.median(xs):.3f} [{min(xs):.3f} - {max(xs):.3f}] over {len(xs)}",
                  flush=True)


if __name__ == "__main__":
    main()
