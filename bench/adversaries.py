"""Peers that may lie (issue 62, docs/benchmarks.md): 5 replicas of the DiLoCo config (configs/diloco.toml as
shipped when §41-§53 were measured: H = 10, int8 updates, plain averaging) on the built-in corpus, one
`tributary launch --nproc 5` on this machine, one of them (rank 4) an adversary (`train --adversary 4:KIND`, optim/adversary.h): sign_flip, scaled (x100), noise
(Gaussian of the update's norm), zeros (a free rider), replay (again what it sent two exchanges before), stale
(its own honest update of two exchanges before, never sent), copy (another
participant's last update), poison (trained on windows shuffled token by token). Each kind runs twice:
  undefended  dist.aggregate = mean on the ring, no norm test, no scorer (today's default)
  defended    --defence's keys (default: trimmed_mean, norm test x10, evicted after 3 exchanges below cosine 0.2)
against the 4 honest replicas alone (same per-replica batch: the honest replicas' data shards differ from the 5-replica
runs'). Reported per run: the final validation loss and its gap to the honest 4; the exchange at which the adversary
was first refused and when it was evicted (rank 0's log lines); any honest replica refused or
evicted (false evictions); and the communication seconds per exchange of the honest 5 with the mean on the ring
against the defended rule (the robust exchange's cost). Runs are deterministic (no fault tolerance): a repeat gives
the same losses, so one run per cell. Measures; asserts nothing.

Usage: python3 bench/adversaries.py --build build [--steps 200] [--only sign_flip,...] [--out adversaries.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ["sign_flip", "scaled", "noise", "zeros", "replay", "stale", "copy", "poison"]
DEFENCE = ["dist.aggregate=trimmed_mean", "dist.reject_norm_factor=10", "dist.evict_after=3", "dist.min_score=0.2"]


SEED = []  # --seed: train.seed=N for every run (the honest 4's and the adversaries' alike)


def run(build, work, name, nproc, steps, sets, adversary=None):
    run_dir = os.path.join(work, name)
    sets = SEED + list(sets)
    cmd = [os.path.join(build, "tributary"), "launch", "--nproc", str(nproc), "--", "train",
           os.path.join(ROOT, "configs", "diloco.toml"), "--overwrite",
           "--set", f"train.steps={steps}", "--set", f"train.run_dir={run_dir}", "--set", "train.eval_every=0",
           "--set", f"data.dir={os.path.join(ROOT, 'data', 'default')}", "--set", "dist.inner_steps=10",
           "--set", "dist.compression=int8"]
    for s in sets:
        cmd += ["--set", s]
    if adversary:
        cmd += ["--adversary", adversary]
    start = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    wall = time.time() - start
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        raise SystemExit(f"{name}: exit {p.returncode}")
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    exchanges = [l for l in lines if "outer_step" in l]
    first_refused = evicted = None
    honest_refused = 0
    log = p.stdout + p.stderr
    for line in log.splitlines():  # rank 0 names every refusal: "rank R's update refused in exchange N (...)"
        if "'s update refused in exchange" not in line:
            continue
        rank = line.split("'s update refused")[0].split()[-1]
        at = int(line.split("refused in exchange")[1].split()[0])
        if adversary and rank == "4":
            first_refused = at if first_refused is None else min(first_refused, at)
        else:
            honest_refused += 1
    for line in log.splitlines():
        if "evicted in exchange" in line and evicted is None:
            evicted = int(line.split("evicted in exchange")[1].split(":")[0])
    honest_evictions = sum(1 for line in log.splitlines()
                           if "evicted in exchange" in line and (not adversary or "rank 4 " not in line))
    comm = [l["comm_s"] for l in exchanges]
    rounds = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(exchanges, exchanges[1:])]
    lowest_honest = min((v for l in exchanges for pid, v in l.get("scores", {}).items()
                         if pid != "4" or not adversary), default=None)
    rec = {"name": name, "val_loss": summary["val_loss"], "wall_s": wall, "first_refused": first_refused,
           "lowest_honest_score": lowest_honest,
           "evicted": evicted, "honest_refused": honest_refused, "honest_evictions": honest_evictions,
           "exchanges": len(exchanges), "comm_s_median": statistics.median(comm) if comm else None,
           "round_s_median": statistics.median(rounds) if rounds else None,
           "bytes_sent": summary.get("bytes_sent")}
    print(json.dumps(rec), flush=True)
    return rec


def cost(build, work, steps, repeats, defence, out_path):
    """What the robust exchange and the scorers add to a round: communication seconds per exchange (the median over a
    run's exchanges) and wall seconds per round, each variant's median over the repeats, against the ring's mean."""
    variants = {"ring_mean": [], "agreement": defence, "loss": defence + ["dist.score=loss"]}
    runs = {v: [] for v in variants}
    for r in range(repeats):
        for v, sets in variants.items():
            runs[v].append(run(build, work, f"cost_{v}_{r}", 5, steps, sets))
            json.dump(runs, open(out_path, "w"), indent=1)
    ring = statistics.median(x["comm_s_median"] for x in runs["ring_mean"])
    for v, rs in runs.items():
        comm = [x["comm_s_median"] for x in rs]
        rounds = [x["round_s_median"] for x in rs]
        extra = [100 * (c - ring) / w for c, w in zip(comm, rounds)]
        print(f"{v:10s} comm/exchange median {statistics.median(comm):.3f}s [{min(comm):.3f}-{max(comm):.3f}] "
              f"round {statistics.median(rounds):.2f}s; over the ring's {ring:.3f}s: "
              f"{statistics.median(extra):+.1f}% of a round [{min(extra):+.1f}, {max(extra):+.1f}]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", default=",".join(KINDS))
    ap.add_argument("--defence", default=",".join(DEFENCE))
    ap.add_argument("--out", default="adversaries.json")
    ap.add_argument("--defended-only", action="store_true", help="skip the undefended runs and the honest 4")
    ap.add_argument("--no-undefended", action="store_true",
                    help="only the honest 4 and the defended adversaries (repeats over seeds)")
    ap.add_argument("--seed", type=int, default=None, help="train.seed for every run (default: the config's)")
    ap.add_argument("--cost-repeats", type=int, default=0,
                    help="only the cost: the honest five N times each with the ring's mean, --defence (agreement "
                         "scores) and --defence with dist.score=loss, interleaved; medians of the seconds per exchange")
    a = ap.parse_args()
    if a.seed is not None:
        SEED.append(f"train.seed={a.seed}")
    build = os.path.abspath(a.build)
    defence = a.defence.split(",")
    work = tempfile.mkdtemp(prefix="adversaries-")
    if a.cost_repeats:
        return cost(build, work, a.steps, a.cost_repeats, defence, a.out)
    out = {"steps": a.steps, "defence": defence, "runs": []}
    # The cost pair first, on a quiet machine: the honest five, ring mean against the defended rule.
    if not a.defended_only and not a.no_undefended:
        out["runs"].append(run(build, work, "honest5_mean", 5, a.steps, []))
    if not a.no_undefended:
        out["runs"].append(run(build, work, "honest5_defended", 5, a.steps, defence))
    if not a.defended_only:
        out["runs"].append(run(build, work, "honest4", 4, a.steps, []))
    for kind in [k for k in a.only.split(",") if k]:
        if not a.defended_only and not a.no_undefended:
            out["runs"].append(run(build, work, f"{kind}_undefended", 5, a.steps, [], f"4:{kind}"))
        out["runs"].append(run(build, work, f"{kind}_defended", 5, a.steps, defence, f"4:{kind}"))
        json.dump(out, open(a.out, "w"), indent=1)
    json.dump(out, open(a.out, "w"), indent=1)
    base = next((r for r in out["runs"] if r["name"] == "honest4"), out["runs"][0])["val_loss"]
    print(f"\nbaseline ({'honest 4 alone' if not a.defended_only else 'honest 5 defended'}): val loss {base:.4f}")
    for r in out["runs"]:
        print(f"{r['name']:24s} val {r['val_loss']:.4f} ({100 * (r['val_loss'] / base - 1):+.1f}%) "
              f"refused@{r['first_refused']} evicted@{r['evicted']} honest refused {r['honest_refused']} "
              f"honest evicted {r['honest_evictions']} lowest honest score {r['lowest_honest_score']} "
              f"comm/exchange {r['comm_s_median']:.3f}s wall {r['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
