"""DiPaCo benchmarks of issue 5 (docs/benchmarks.md). Measures; asserts nothing.

Pipeline (all on the built-in corpus, every model evaluated on the validation units' tokens after their first 32):
  1. pre-train the dense path-size model (configs/dipaco_dense.toml, PRE steps): routing features and DiPaCo's init;
  2. route with k-means / product k-means (2x2, or the grid given) and train DiPaCo (STEPS inner steps per path);
  3. discriminative routing from the product run, and DiPaCo again on its shards;
  4. baselines with the same number of steps: the path-size dense model continued from the same init for STEPS
     steps, and a dense model with as many parameters as the whole DiPaCo trained from scratch for PRE + STEPS.

Usage: .venv/bin/python3 bench/dipaco.py --build build [--grid 2x2] [--steps 300] [--pre 200] [--nproc 2]
       [--only dense,kmeans,product,discriminative] [--path-local]"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd):
    t = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr, time.time() - t


def prefix_eval(cli, run_dir):
    text, _ = sh([cli, "eval", run_dir, "--data", os.path.join(ROOT, "data/default"), "--prefix", "32"])
    line = [l for l in text.splitlines() if "after the 32-token prefix" in l][-1]
    return float(line.split("loss ")[1].split(" ")[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--grid", default="2x2")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pre", type=int, default=200)
    ap.add_argument("--tau", type=int, default=50)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--only", default="dense,kmeans,product,discriminative")
    ap.add_argument("--rescale", default=None, help="dipaco.norm_rescale (default: the config's)")
    ap.add_argument("--tag", default="", help="suffix of the DiPaCo run directories")
    ap.add_argument("--path-local", action="store_true", help="dipaco.path_local = true (issue 16)")
    ap.add_argument("--set", action="append", default=[], help="more KEY=VALUE overrides of the DiPaCo runs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cli = os.path.join(os.path.abspath(a.build), "tributary")
    runs = os.path.join(ROOT, "runs", "bench-dipaco")
    os.makedirs(runs, exist_ok=True)
    only = a.only.split(",")
    k = [int(x) for x in a.grid.split("x")]
    results = {"grid": a.grid, "steps": a.steps, "pre": a.pre, "tau": a.tau, "nproc": a.nproc, "rescale": a.rescale}
    if not os.path.exists(os.path.join(ROOT, "data/default/dataset.json")):
        sh([cli, "data", "build-default", "--out", os.path.join(ROOT, "data/default")])
    dense = os.path.join(runs, "dense-pre")
    if not os.path.exists(os.path.join(dense, "summary.json")):
        sh([cli, "train", "configs/dipaco_dense.toml", "--overwrite", f"--set=train.steps={a.pre}",
            f"--set=train.run_dir={dense}"])

    def dipaco(name, routes):
        run_dir = os.path.join(runs, f"{name}-{a.grid}{a.tag}")
        cmd = [cli, "launch", "--nproc", str(a.nproc), "--master-port", "0", "--", "train", "configs/dipaco.toml",
               "--overwrite", f"--set=train.run_dir={run_dir}", f"--set=dipaco.routes={routes}",
               f"--set=dipaco.modules={a.grid}", f"--set=dipaco.init_from={dense}", f"--set=train.steps={a.steps}",
               f"--set=dist.inner_steps={a.tau}"]
        if a.rescale:
            cmd.append(f"--set=dipaco.norm_rescale={a.rescale}")
        cmd.append(f"--set=dipaco.path_local={'true' if a.path_local else 'false'}")  # the config's is true
        cmd += [f"--set={kv}" for kv in a.set]
        _, secs = sh(cmd)
        s = json.load(open(os.path.join(run_dir, "summary.json")))
        report = json.load(open(os.path.join(routes, "report.json")))
        rounds = max(1, s["rounds"])
        return {"val_loss": s["val_loss"], "ppl": s["val_ppl"], "val_loss_early": s["val_loss_early_stopped"],
                "ppl_early": s["val_ppl_early_stopped"], "purity_train": report["purity_train"],
                "purity_val": report["purity_val"], "shard_units": [p["train_units"] for p in report["paths"]],
                "bytes_sent_per_round_rank0": s["bytes_sent"] / rounds, "wall_s": secs, "run": run_dir}

    for method in ("kmeans", "product"):
        if method not in only:
            continue
        routes = os.path.join(runs, f"routes-{method}-{a.grid}")
        sh([cli, "route", "--model", dense, "--data", "data/default", "--modules", a.grid, "--method", method,
            "--overwrite", "--out", routes])
        results[method] = dipaco(method, routes)
        print(method, json.dumps(results[method]), flush=True)
    if "discriminative" in only:
        routes = os.path.join(runs, f"routes-discriminative-{a.grid}")
        sh([cli, "route", "--discriminative", os.path.join(runs, f"product-{a.grid}"), "--overwrite", "--out", routes])
        results["discriminative"] = dipaco("discriminative", routes)
        print("discriminative", json.dumps(results["discriminative"]), flush=True)
    if "dense" in only:
        small = os.path.join(runs, "dense-path-size")
        _, secs = sh([cli, "train", "configs/dipaco_dense.toml", "--overwrite", f"--set=train.steps={a.steps}",
                      f"--set=train.init_from={dense}", f"--set=train.run_dir={small}"])
        loss = prefix_eval(cli, small)
        results["dense_path_size"] = {"val_loss": loss, "ppl": math.exp(loss), "wall_s": secs}
        # As many parameters as the whole DiPaCo: the stem once plus every module's blocks.
        blocks = sum(k) * 2  # 2 blocks per module (4 layers in 2 levels)
        big = os.path.join(runs, f"dense-{a.grid}-size")
        _, secs = sh([cli, "train", "configs/dipaco_dense.toml", "--overwrite", f"--set=train.steps={a.pre + a.steps}",
                      f"--set=model.num_layers={blocks}", f"--set=model.num_levels={len(k)}",
                      f"--set=train.run_dir={big}"])
        loss = prefix_eval(cli, big)
        params = json.load(open(os.path.join(big, "summary.json")))["num_parameters"]
        results["dense_total_size"] = {"val_loss": loss, "ppl": math.exp(loss), "layers": blocks,
                                       "parameters": params, "wall_s": secs,
                                       # DiLoCo on this model: one fp32 ring all-reduce per outer step
                                       "diloco_bytes_sent_per_round": 2 * (a.nproc - 1) / a.nproc * 4 * params}
        print("dense", json.dumps(results["dense_path_size"]), json.dumps(results["dense_total_size"]), flush=True)
    text = json.dumps(results, indent=2)
    print(text)
    if a.out:
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
