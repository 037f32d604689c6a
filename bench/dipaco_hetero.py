"""Issue 16, benchmark 3: heterogeneous workers over emulated links. 4 workers, one 3x slower than the others, every
link emulated at 100 Mbit/s and 100 ms (dist.wan); wall-clock to a fixed routed validation loss for DiPaCo 4x4
(path-local) vs DiLoCo of a path-size dense model with the same workers, from the same pre-trained dense model.
Measures; asserts nothing.

On this 2-core machine 4 busy workers would share 2 cores, and a worker idle in a collective would lend its core to
the others, blurring "3x slower". So every worker sleeps after each inner step (dist.slow_workers: F - 1 times the
step's measured compute): F = 2 for the fast ones and 6 for the slow one, so that at most ~2 cores' worth of compute
runs at once and the slow worker stays 3x slower.

Both runs are scored alike: units of context + 1 validation tokens, loss on the tokens after the first 32
(DiPaCo: routed, each round by the leader, dipaco.eval_every_rounds; DiLoCo: `eval --prefix 32` of each outer step's
checkpoint). Time excludes the evaluations. Target: the loss DiLoCo reaches at its last outer step; the time each run
takes to reach it (linear between the two measurements around it).

Usage: .venv/bin/python3 bench/dipaco_hetero.py --build build [--steps 200] [--tau 50] [--out FILE]"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLOW = "0:2,1:2,2:2,3:6"
WAN = "100Mbit,100ms"


def sh(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def time_to(curve, target):
    """First time the (time, loss) curve reaches target, linear between points; None if never."""
    for (t0, l0), (t1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return t0 + (t1 - t0) * (l0 - target) / (l0 - l1) if l0 > target else t0
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tau", type=int, default=50)
    ap.add_argument("--units", type=int, default=512)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cli = os.path.join(os.path.abspath(a.build), "tributary")
    runs = os.path.join(ROOT, "runs", "bench-dipaco")
    dense = os.path.join(runs, "dense-pre")
    routes = os.path.join(runs, "routes-kmeans-4x4")
    for need in (dense, routes):
        if not os.path.exists(need):
            sys.exit(f"{need} is missing: run bench/dipaco_bytes.py (or bench/dipaco.py --grid 4x4) first")
    common = [f"--set=train.steps={a.steps}", f"--set=dist.inner_steps={a.tau}", f"--set=dist.slow_workers={SLOW}",
              f"--set=dist.wan={WAN}"]

    # DiPaCo 4x4, path-local, routed validation after every round.
    dp = os.path.join(runs, "hetero-dipaco-4x4")
    sh([cli, "launch", "--nproc", "4", "--master-port", "0", "--", "train", "configs/dipaco.toml", "--overwrite",
        f"--set=train.run_dir={dp}", f"--set=dipaco.routes={routes}", "--set=dipaco.modules=4x4",
        f"--set=dipaco.init_from={dense}", "--set=dipaco.path_local=true", "--set=dipaco.eval_every_rounds=1",
        f"--set=dipaco.eval_units={a.units}"] + common)
    dipaco_curve = []
    for j in lines(os.path.join(dp, "metrics.jsonl")):
        if "val_loss" in j:
            dipaco_curve.append((j["elapsed_s"] - j["eval_s"], j["val_loss"]))
    s = json.load(open(os.path.join(dp, "summary.json")))
    last_eval = max([j.get("eval_s", 0) for j in lines(os.path.join(dp, "metrics.jsonl"))] + [0])
    dipaco_curve.append((s["elapsed_s"] - last_eval, s["val_loss"]))

    # DiLoCo of the path-size dense model, a checkpoint every outer step.
    dl = os.path.join(runs, "hetero-diloco")
    sh([cli, "launch", "--nproc", "4", "--master-port", "0", "--", "train", "configs/dipaco_dense.toml", "--overwrite",
        f"--set=train.run_dir={dl}", f"--set=train.init_from={dense}", "--set=dist.algorithm=diloco",
        f"--set=train.checkpoint_every={a.tau}", "--set=train.keep_checkpoints=1000", "--set=train.eval_every=0",
        "--set=train.log_every=1"] + common)
    elapsed = {}
    for j in lines(os.path.join(dl, "metrics.jsonl")):
        if "elapsed_s" in j and "step" in j:
            elapsed[j["step"]] = j["elapsed_s"]
    diloco_curve = []
    for step in range(a.tau, a.steps + 1, a.tau):
        ckpt = os.path.join(dl, "checkpoints", f"step-{step:08d}")
        text = sh([cli, "eval", ckpt, "--data", "data/default", "--prefix", "32", "--units", str(a.units)])
        line = [l for l in text.splitlines() if "after the 32-token prefix" in l][-1]
        diloco_curve.append((elapsed[step], float(line.split("loss ")[1].split(" ")[0])))

    target = diloco_curve[-1][1]
    t_dl, t_dp = time_to(diloco_curve, target), time_to(dipaco_curve, target)
    result = {"steps": a.steps, "tau": a.tau, "slow_workers": SLOW, "wan": WAN, "units": a.units,
              "dipaco_curve": dipaco_curve, "diloco_curve": diloco_curve, "target_loss": target,
              "diloco_time_to_target_s": t_dl, "dipaco_time_to_target_s": t_dp,
              "speedup": (t_dl / t_dp) if t_dp else None}
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
