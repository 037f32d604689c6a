"""Issue 16, benchmark 1: bytes per worker per round, path-local DiPaCo (dipaco.path_local) vs the owners' ring, and
DiLoCo of one path's size and of the total size (fp32 ring all-reduce: 2 (N-1)/N x 4 B x parameters). Measures;
asserts nothing. Reuses bench/dipaco.py's pre-trained dense model and k-means routes when they exist.

Modes: ring (the owners' ring), holder (path-local, path state kept by its worker and served on request: the
default), store (path-local, every task's path state put into the run's store).

Usage: .venv/bin/python3 bench/dipaco_bytes.py --build build [--grids 2x2,4x4] [--nproc 4] [--modes ring,holder,store]
       [--out FILE]"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def round_lines(run_dir, nproc, round_no):
    """Each rank's metrics line of outer step `round_no`."""
    out = []
    for r in range(nproc):
        name = "metrics.jsonl" if r == 0 else f"metrics-rank{r}.jsonl"
        for line in open(os.path.join(run_dir, name)):
            j = json.loads(line)
            if j.get("outer_step") == round_no:
                out.append(j)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--grids", default="2x2,4x4")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--modes", default="ring,holder,store")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cli = os.path.join(os.path.abspath(a.build), "tributary")
    runs = os.path.join(ROOT, "runs", "bench-dipaco")
    os.makedirs(runs, exist_ok=True)
    if not os.path.exists(os.path.join(ROOT, "data/default/dataset.json")):
        sh([cli, "data", "build-default", "--out", os.path.join(ROOT, "data/default")])
    dense = os.path.join(runs, "dense-pre")
    if not os.path.exists(os.path.join(dense, "summary.json")):
        sh([cli, "train", "configs/dipaco_dense.toml", "--overwrite", "--set=train.steps=200",
            f"--set=train.run_dir={dense}"])
    results = {}
    for grid in a.grids.split(","):
        routes = os.path.join(runs, f"routes-kmeans-{grid}")
        if not os.path.exists(os.path.join(routes, "route.json")):
            sh([cli, "route", "--model", dense, "--data", "data/default", "--modules", grid, "--method", "kmeans",
                "--overwrite", "--out", routes])
        row = {}
        for mode in a.modes.split(","):
            run_dir = os.path.join(runs, f"bytes-{mode}-{grid}")
            local = ["--set=dipaco.path_local=false"] if mode == "ring" else ["--set=dipaco.path_local=true", f"--set=dipaco.path_state={mode}"]
            sh([cli, "launch", "--nproc", str(a.nproc), "--master-port", "0", "--", "train", "configs/dipaco.toml",
                "--overwrite", f"--set=train.run_dir={run_dir}", f"--set=dipaco.routes={routes}",
                f"--set=dipaco.modules={grid}", f"--set=dipaco.init_from={dense}", "--set=train.steps=20",
                "--set=dist.inner_steps=10", "--set=optim.warmup_steps=2", "--set=dipaco.eval_units=64"] + local)
            lines = round_lines(run_dir, a.nproc, 2)  # round 2: round 1 also carries the owners' first publish
            keys = ["bytes_sent", "bytes_recv"] + (["bytes_up", "bytes_published", "bytes_fetched", "bytes_state_put",
                                                    "bytes_state_got"] if local else [])
            row[mode] = {k: [j[k] for j in lines] for k in keys}
            row[mode]["tasks"] = [j["tasks"] for j in lines]
        results[grid] = row
        print(grid, json.dumps(row), flush=True)
    print(json.dumps(results, indent=2))
    if a.out:
        open(a.out, "w").write(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
