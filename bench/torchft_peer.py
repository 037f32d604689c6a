#!/usr/bin/env python3
"""torchft as a measured peer (issue 66, item 20): our DiLoCo and torchft 0.2.0's `torchft.local_sgd.DiLoCo` side by
side, on one start and one data order, so that the loss comparison needs no seeds to separate noise.

  python3 bench/torchft_peer.py --steps 200 --repeats 3            # + --kill-at 20: a replica killed and restarted

What is shared: the start (one of our checkpoints, exported to Hugging Face Llama and loaded by torchft's replicas as
a transformers LlamaForCausalLM), the windows each replica reads (`tributary data batches`, the trainer's own loader
with the run's seed, rank and world), the validation windows, and the recipe: N replicas x batch B x context T, AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices), the config's warm-up + cosine schedule, gradient clipping
at the config's norm, H inner steps, outer SGD with Nesterov momentum, fp32 pseudo-gradients. Both final models are
evaluated by the same code here (transformers, on the shared validation windows), so the loss difference is the
trainers' and nothing else's. The two sides run one after the other (their order alternates by repeat), each with
cores / replicas intra-op threads per process, as our launch gives its workers. Ours runs fault tolerant
(dist.fault_tolerant), as torchft always is (a quorum every round).

Per side: final validation loss, wall seconds, CPU seconds per step (user + system of every process, getrusage of
the children), bytes per replica (ours: measured, summary.json; torchft: its ring all-reduce of the fp32 model,
2 (N - 1) / N models per round, computed). With --kill-at S: replica 1 is SIGKILLed S seconds into the run and
started again at once. Two times from the kill: `heal_s`, to the restarted replica training from the run's current
state (ours: launch's "worker 1 healed from the lead" line; torchft: its first step after a quorum healed it from a
peer — the steps it trains before that, from the start model, are lost), and `back_s`, to the end of the first round
it contributes to (ours: the line saying the healed worker joined at that round; torchft: its first commit after the
heal).

Needs torchft in the project's .venv: installed there (pip install torchft==0.2.0) on first use, with a line saying
so. Results: one JSON line per (repeat, side) in --out, then a table of medians and ranges.
"""
import argparse
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python3")
TORCHFT = "torchft==0.2.0"


def ensure_torch_python():
    """Re-run under the project's .venv (which holds torch) when this interpreter has no torch, and put torchft
    there when it is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if not os.path.exists(VENV_PY):
            sys.exit(f"no torch here and no {VENV_PY}: run ./run setup first")
        os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])
    try:
        import torchft  # noqa: F401
    except ImportError:
        print(f"[torchft_peer] installing {TORCHFT} into {sys.prefix} (the peer this benchmark runs)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", TORCHFT], check=True)


# ---------------------------------------------------------------------------------------------------------- recipe


def lr_at(step, peak, warmup, total, min_ratio):
    """optim/schedule.cpp's CosineSchedule, step from 0."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    decay = max(1, total - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / decay))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def load_hf(path):
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
    return model


def window_loss(model, windows):
    import torch

    x = torch.from_numpy(windows[:, :-1]).long()
    y = torch.from_numpy(windows[:, 1:]).long()
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def evaluate(path, val):
    import torch

    model = load_hf(path)
    model.eval()
    with torch.no_grad():
        losses = [window_loss(model, val[b]).item() for b in range(val.shape[0])]
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------------------------- torchft replica


def worker(a):
    """One torchft replica group of one process: DiLoCo over its own windows, a JSON line per step to --log."""
    from datetime import timedelta

    import numpy as np
    import torch
    from torch.distributed import TCPStore
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    torch.set_num_threads(a.threads)
    r = json.loads(a.recipe)
    batches = np.fromfile(a.batches, dtype="<i4").reshape(a.steps, r["batch"], r["context"] + 1)
    model = load_hf(a.start)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    inner = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=r["lr"], betas=(0.9, 0.95), eps=1e-8)
    outer = torch.optim.SGD(model.parameters(), lr=r["outer_lr"], momentum=r["outer_momentum"],
                            nesterov=r["outer_momentum"] > 0)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    state = {}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        state["healed"] = sd["step"]

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict(), "step": state.get("step", 0)}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=60)), load_state_dict=load_state_dict,
                      state_dict=state_dict, min_replica_size=a.min_replicas, use_async_quorum=False,
                      timeout=timedelta(seconds=60), quorum_timeout=timedelta(seconds=120),
                      connect_timeout=timedelta(seconds=30), rank=0, world_size=1, store_addr="127.0.0.1",
                      store_port=store.port, lighthouse_addr=a.lighthouse, replica_id=f"replica_{a.replica}")
    log = open(a.log, "a")
    with DiLoCo(manager, [model], inner, outer, sync_every=r["inner_steps"], backup_device=torch.device("cpu"),
                pin_memory=False) as _:
        # A restarted replica heals from a peer at its first quorum and continues at the step it was given.
        while state.get("step", 0) < a.steps:
            step = state.get("step", 0)
            for g in inner.param_groups:
                g["lr"] = lr_at(step, r["lr"], r["warmup"], a.steps, r["min_lr_ratio"])
            loss = window_loss(model, batches[step])
            inner.zero_grad()
            loss.backward()
            if r["grad_clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
            before = manager.current_step()
            inner.step()  # DiLoCo's hook: every inner_steps steps, the outer round (quorum, all-reduce, commit)
            healed = state.pop("healed", None)  # healed in this step's quorum: the peers' count
            state["step"] = (step if healed is None else healed) + 1
            line = {"step": state["step"], "loss": loss.item(), "t": time.time(), "outer": manager.current_step()}
            if healed is not None:
                line["healed"] = True
            if manager.current_step() != before:
                line["participants"] = manager.num_participants()
            log.write(json.dumps(line) + "\n")
            log.flush()
    model.save_pretrained(os.path.join(a.final, f"replica{a.replica}"), safe_serialization=True)
    manager.shutdown(wait=False)


# -------------------------------------------------------------------------------------------------------- sides


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p


def cpu_of_children():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def ours(a, work, start, recipe, rep):
    run_dir = os.path.join(work, f"ours-{rep}")
    cmd = [a.tributary, "launch", "--nproc", str(a.replicas), "--master-port", "0"]
    if a.kill_at:
        cmd += ["--max-failures", "2", "--max-restarts", "2"]
    cmd += ["--", "train", a.config, "--overwrite", "--init-from", start,
            "--set", f"train.run_dir={run_dir}", "--set", f"train.steps={a.steps}", "--set", "train.eval_every=0",
            "--set", "train.checkpoint_every=0", "--set", f"train.seed={recipe['seed']}",
            "--set", "dist.algorithm=diloco", "--set", "dist.compression=fp32", "--set", "dist.fault_tolerant=true", "--set", "dist.warmup_ddp_steps=0",
            "--set", f"optim.warmup_steps={recipe['warmup']}",
            "--set", f"dist.outer_lr={recipe['outer_lr']}", "--set", f"dist.outer_momentum={recipe['outer_momentum']}"]
    cpu0, t0 = cpu_of_children(), time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []  # (time seen, line): the heal is read from the launch's own lines
    reader = threading.Thread(target=lambda: [lines.append((time.time(), l)) for l in p.stdout], daemon=True)
    reader.start()
    killed_at = None
    try:
        if a.kill_at:
            killed_at = kill_our_replica(p.pid, t0 + a.kill_at)
        p.wait(timeout=a.timeout)
        reader.join()
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    wall, cpu = time.time() - t0, cpu_of_children() - cpu0
    with open(os.path.join(work, f"ours-{rep}.log"), "w") as f:
        f.writelines(f"{t - t0:9.3f} {l}" for t, l in lines)
    if p.returncode != 0:
        sys.exit(f"our run failed ({p.returncode}):\n{''.join(l for _, l in lines[-60:])}")
    final = os.path.join(work, f"ours-{rep}-hf")
    shutil.rmtree(final, ignore_errors=True)
    run([a.tributary, "export", run_dir, "--out", final])
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    result = {"side": "tributary", "wall_s": wall, "cpu_s_per_step": cpu / a.steps / a.replicas,
              "bytes_per_replica": summary["bytes_sent"], "final": final}
    if killed_at:
        result.update(our_heal(lines, killed_at))
    return result


def kill_our_replica(launch_pid, when):
    """SIGKILL rank 1 of our launch at `when`; launch starts it again (--max-restarts)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import procs

    time.sleep(max(0.0, when - time.time()))
    for pid in procs.children(launch_pid):
        if procs.rank_of(pid) == 1:
            t = time.time()
            os.kill(pid, signal.SIGKILL)
            return t
    sys.exit("kill: launch has no rank 1 to kill")


def start_lighthouse(a, work, rep):
    """torchft's Rust lighthouse in a process of its own (its log in a file, its CPU counted with the peer's)."""
    min_replicas = a.min_replicas if a.kill_at else a.replicas
    code = ("import sys, time\nfrom torchft._torchft import LighthouseServer\n"
            f"l = LighthouseServer(bind='[::]:0', min_replicas={min_replicas}, "
            f"join_timeout_ms={a.join_timeout_ms})\n"
            "print(l.address(), flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(os.path.join(work, f"torchft-{rep}-lighthouse.log"), "w"), text=True)
    return p, p.stdout.readline().strip()


def torchft_side(a, work, start, batches, recipe, rep):
    lighthouse, address = start_lighthouse(a, work, rep)
    final = os.path.join(work, f"torchft-{rep}-hf")
    shutil.rmtree(final, ignore_errors=True)
    logs = [os.path.join(work, f"torchft-{rep}-replica{r}.jsonl") for r in range(a.replicas)]
    for f in logs:
        if os.path.exists(f):
            os.remove(f)

    def start_replica(r):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--replica", str(r),
               "--lighthouse", address, "--start", start, "--batches", batches[r], "--log", logs[r],
               "--final", final, "--steps", str(a.steps), "--threads", str(a.threads),
               "--min-replicas", str(a.min_replicas if a.kill_at else a.replicas), "--recipe", json.dumps(recipe)]
        return subprocess.Popen(cmd, stdout=open(logs[r] + ".out", "a"), stderr=subprocess.STDOUT,
                                start_new_session=True)

    cpu0, t0 = cpu_of_children(), time.time()
    procs = [start_replica(r) for r in range(a.replicas)]
    killed_at, first_done = None, None
    try:
        if a.kill_at:
            time.sleep(max(0.0, t0 + a.kill_at - time.time()))
            killed_at = time.time()
            procs[1].kill()
            procs[1].wait()
            procs[1] = start_replica(1)
        # torchft has no end of the run: a replica left out of the last quorums waits for peers that are gone, so
        # the others get a minute once the first one is through, and whoever is still waiting then is stopped.
        deadline = t0 + a.timeout
        while all(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.2)
        first_done = time.time()
        tail = min(deadline, time.time() + 60)
        while any(p.poll() is None for p in procs) and time.time() < tail:
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        lighthouse.stdin.close()  # it stops when its stdin closes
        lighthouse.wait()
    wall, cpu = (first_done or time.time()) - t0, cpu_of_children() - cpu0
    finished = [r for r in range(a.replicas) if os.path.exists(os.path.join(final, f"replica{r}", "config.json"))]
    if not finished:
        sys.exit(f"no torchft replica finished: see {logs[0]}.out\n" + open(logs[0] + ".out").read()[-3000:])
    n_params = sum(p.numel() for p in load_hf(start).parameters())  # the tied embedding once
    rounds = a.steps // recipe["inner_steps"]
    result = {"side": "torchft", "wall_s": wall, "cpu_s_per_step": cpu / a.steps / a.replicas,
              "bytes_per_replica": int(rounds * 4 * n_params * 2 * (a.replicas - 1) / a.replicas),
              "final": os.path.join(final, f"replica{finished[0]}"), "replicas_finished": len(finished)}
    if killed_at:
        result.update(torchft_heal(logs[1], killed_at))
    return result


def our_heal(lines, killed_at):
    """heal_s and back_s of our rank 1 from the launch's (time, line) pairs."""
    out = {"heal_s": None, "back_s": None}
    for t, line in lines:
        if t <= killed_at:
            continue
        if out["heal_s"] is None and re.search(r"worker 1 (healed from the lead|joined) at step", line):
            out["heal_s"] = t - killed_at
        elif out["heal_s"] is not None and re.search(r"joined at step \d+ .*go on as epoch", line):
            out["back_s"] = t - killed_at
            break
    return out


def torchft_heal(log, killed_at):
    """heal_s and back_s of torchft's restarted replica 1 from its step lines: healed where its step count jumps to its
    peers' (its quorum loaded their state), back at its first commit after that."""
    out = {"heal_s": None, "back_s": None}
    prev = None
    for line in open(log):
        row = json.loads(line)
        if row["t"] > killed_at and prev is not None and prev["t"] > killed_at:
            if out["heal_s"] is None and (row.get("healed") or row["step"] != prev["step"] + 1):
                out["heal_s"] = row["t"] - killed_at
            elif out["heal_s"] is not None and "participants" in row:
                out["back_s"] = row["t"] - killed_at
                break
        prev = row
    return out


# ---------------------------------------------------------------------------------------------------------- main


def recipe_of(a):
    import tomllib

    cfg = tomllib.load(open(a.config, "rb"))
    o, t, m, d = cfg.get("optim", {}), cfg.get("train", {}), cfg.get("model", {}), cfg.get("dist", {})
    return {"batch": t.get("batch_size", 16), "context": m.get("context", 256), "seed": a.seed,
            "lr": o.get("lr", 2e-3),
            "warmup": a.warmup if a.warmup >= 0 else min(o.get("warmup_steps", 50), a.steps // 5), "min_lr_ratio": o.get("min_lr_ratio", 0.1),
            "weight_decay": o.get("weight_decay", 0.1), "grad_clip": o.get("grad_clip", 1.0),
            "inner_steps": d.get("inner_steps", 10), "outer_lr": a.outer_lr, "outer_momentum": a.outer_momentum,
            "data": cfg.get("data", {}).get("dir", "data/default")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "diloco.toml"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234, help="train.seed: the data order both sides read")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--warmup", type=int, default=-1, help="optim.warmup_steps (default: the config's, at most a "
                    "fifth of the steps)")
    ap.add_argument("--val-batches", type=int, default=128)
    ap.add_argument("--kill-at", type=float, default=0, help="SIGKILL replica 1 this many seconds in, restart it")
    ap.add_argument("--min-replicas", type=int, default=2, help="torchft's quorum with --kill-at")
    ap.add_argument("--join-timeout-ms", type=int, default=10000,
                    help="torchft's lighthouse waits this long for a heartbeating replica to join a quorum")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a side may run")
    ap.add_argument("--work", default="", help="a directory for the runs (default: a new one under runs/)")
    ap.add_argument("--out", default="", help="JSON lines (default: results.jsonl in the work directory)")
    # one torchft replica (started by this script)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--replica", "--threads"):
        ap.add_argument(flag, type=int, default=0, help=argparse.SUPPRESS)
    for flag in ("--lighthouse", "--start", "--batches", "--log", "--final", "--recipe"):
        ap.add_argument(flag, default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    import numpy as np

    a.tributary = os.path.join(a.build, "tributary")
    a.threads = max(1, (os.cpu_count() or 1) // a.replicas)
    os.makedirs(os.path.join(ROOT, "runs"), exist_ok=True)
    work = a.work or tempfile.mkdtemp(prefix="torchft-peer-", dir=os.path.join(ROOT, "runs"))
    os.makedirs(work, exist_ok=True)
    out = a.out or os.path.join(work, "results.jsonl")
    recipe = recipe_of(a)
    print(f"[torchft_peer] work directory {work}; {a.replicas} replicas x {a.steps} steps, "
          f"{a.threads} thread(s) each", flush=True)

    # the start: one step of our trainer (a checkpoint both load), exported to Hugging Face Llama
    start_dir, start_hf = os.path.join(work, "start"), os.path.join(work, "start-hf")
    if not os.path.exists(os.path.join(start_hf, "model.safetensors")):
        run([a.tributary, "train", a.config, "--overwrite", "--set", f"train.run_dir={start_dir}",
             "--set", "train.steps=1", "--set", "optim.warmup_steps=0", "--set", "train.eval_every=0",
             "--set", f"train.seed={a.seed}"])
        shutil.rmtree(start_hf, ignore_errors=True)
        run([a.tributary, "export", start_dir, "--out", start_hf])
    # the data order: each replica's windows as our loader yields them, and the validation windows
    batches = []
    for r in range(a.replicas):
        f = os.path.join(work, f"train-{r}-of-{a.replicas}.bin")
        run([a.tributary, "data", "batches", recipe["data"], "--split", "train", "--batch-size", str(recipe["batch"]),
             "--context", str(recipe["context"]), "--seed", str(a.seed), "--rank", str(r), "--world",
             str(a.replicas), "--count", str(a.steps), "--out", f])
        batches.append(f)
    val_file = os.path.join(work, "val.bin")
    run([a.tributary, "data", "batches", recipe["data"], "--split", "val", "--batch-size", str(recipe["batch"]),
         "--context", str(recipe["context"]), "--count", str(a.val_batches), "--out", val_file])
    val = np.fromfile(val_file, dtype="<i4").reshape(a.val_batches, recipe["batch"], recipe["context"] + 1)
    start_loss = evaluate(start_hf, val)
    print(f"[torchft_peer] start: validation loss {start_loss:.4f} on {a.val_batches} batches", flush=True)

    rows = []
    for rep in range(a.repeats):
        sides = [("tributary", ours), ("torchft", torchft_side)]
        if rep % 2:
            sides.reverse()
        for name, side in sides:
            if name == "tributary":
                r = side(a, work, start_dir, recipe, rep)
            else:
                r = side(a, work, start_hf, batches, recipe, rep)
            r["val_loss"] = evaluate(r["final"], val)
            r.update({"repeat": rep, "steps": a.steps, "replicas": a.replicas, "kill_at": a.kill_at,
                      "start_val_loss": start_loss})
            rows.append(r)
            with open(out, "a") as f:
                f.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)
    table(rows)


def table(rows):
    def med(side, key):
        v = [r[key] for r in rows if r["side"] == side and r.get(key) is not None]
        return (statistics.median(v), min(v), max(v)) if v else None

    print(f"{'':24}{'tributary':>28}{'torchft':>28}")
    for key in ("val_loss", "wall_s", "cpu_s_per_step", "bytes_per_replica", "heal_s", "back_s"):  # bytes in MB
        cells = []
        for side in ("tributary", "torchft"):
            m = med(side, key)
            scale = 1e6 if key.startswith("bytes") else 1
            cells.append("-" if m is None else f"{m[0] / scale:.4g} [{m[1] / scale:.4g}, {m[2] / scale:.4g}]")
        print(f"{key:24}{cells[0]:>28}{cells[1]:>28}")
    diffs = []
    for rep in sorted({r["repeat"] for r in rows}):
        pair = {r["side"]: r["val_loss"] for r in rows if r["repeat"] == rep}
        if len(pair) == 2:
            diffs.append(pair["tributary"] - pair["torchft"])
    if diffs:
        print(f"ours minus torchft, validation loss, per repeat: {', '.join(f'{d:+.4f}' for d in diffs)}")


if __name__ == "__main__":
    ensure_torch_python()
    main()
