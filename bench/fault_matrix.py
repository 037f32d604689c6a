"""Fault matrix of issue 46 (docs/benchmarks.md): one fault per trial, every combination of
  signal  KILL, TERM, INT, STOP (a frozen process; thawed and reaped at the trial's end)
  target  worker (rank 1), lead (rank 0), launch
  moment  formation (0.3 s after launch starts: before or during the rendezvous), first_round (the first outer step
          is in metrics.jsonl), mid (step >= half the run), checkpoint (the periodic checkpoint's directory or its
          staging directory appears)
on a fault-tolerant DiLoCo run through `tributary launch --max-failures 1` (tiny model, periodic checkpoints). Each
trial ends as one of
  completed     launch exits 0 and summary.json has every step
  resumable     the run stopped (any status) with a checkpoint, and `--resume` without a fault completes the run
  stopped       the run stopped with a clear error and left no checkpoint (nothing trained worth keeping yet)
  lost          it stopped with no checkpoint after a checkpoint was due, or the resume failed
  hang          launch did not exit within --timeout
With --islands: fault-tolerant islands instead, two launches (--nnodes 2, --restart-island) of two workers each, one
island per launch (parallel.islands = machines); targets worker (rank 1: island 0's second rank), lead (rank 0:
island 0's first, which leads the run), island1 (rank 3: the other island's second) and launch (node 1's; node 0's
hosts the store). Measures; asserts nothing. Needs only the Python standard library.

Usage: python3 bench/fault_matrix.py --build build [--world 2] [--signals KILL,TERM,INT,STOP]
       [--targets worker,lead,launch] [--moments formation,first_round,mid,checkpoint] [--timeout 90] [--out m.json]
       [--max-restarts 0]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from procs import alive, children, rank_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 80


def worker_pid(launch_pid, rank):
    for pid in children(launch_pid):
        if rank_of(pid) == rank:
            return pid
    return None


def metrics_step(run_dir):
    step, outer = 0, False
    try:
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            step = max(step, int(j.get("step", 0)))
            outer = outer or "outer_step" in j
    except OSError:
        pass
    return step, outer


def checkpoint_started(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(root) and any(True for _ in os.scandir(root))


def command(cli, run_dir, port, resume=False, node=None):
    launch = ["--nproc", str(ARGS.world), "--max-failures", "1"]
    if node is not None:  # --islands: one launch per island
        launch = ["--nproc", "2", "--nnodes", "2", "--node-rank", str(node), "--restart-island"]
    extra = ["--set", "parallel.islands=machines", "--set", "dist.slow_workers=0:4,1:4,2:4,3:4"] if node is not None else []
    return [cli, "launch"] + launch + ["--master-port", str(port), "--grace", "3",
            "--max-restarts", str(ARGS.max_restarts), "--", "train", os.path.join(ROOT, "configs", "diloco.toml"),
            "--resume" if resume else "--overwrite",
            "--set", "model.num_layers=2", "--set", "model.width=64", "--set", "model.context=64",
            "--set", f"train.steps={STEPS}", "--set", "optim.warmup_steps=4", "--set", "dist.inner_steps=10",
            "--set", "dist.warmup_ddp_steps=0", "--set", "dist.fault_tolerant=true",
            "--set", "dist.heartbeat_timeout_s=4", "--set", "dist.store_timeout_s=30",
            "--set", "dist.collective_timeout_s=60", "--set", "train.checkpoint_every=20",
            "--set", "train.eval_every=0", "--set", "train.eval_batches=2", "--set", "train.log_every=5",
            "--set", "train.threads=1", "--set", "dist.slow_workers=0:4,1:4",
            "--set", f"data.dir={ARGS.data}", "--set", f"train.run_dir={run_dir}"] + extra


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finished(run_dir):
    try:
        s = json.load(open(os.path.join(run_dir, "summary.json")))
        return s.get("steps") == STEPS and not s.get("stopped_early", False)
    except (OSError, ValueError):
        return False


def has_checkpoint(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(root) and any(os.path.exists(os.path.join(root, d, "manifest.json"))
                                       for d in os.listdir(root) if "." not in d)


def reap(proc):
    try:
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    subprocess.run(["pkill", "-9", "-f", proc.args[-1]], capture_output=True)  # the trial's run_dir names them


class Launches:
    """One launch, or --islands: one per island (node 0's hosts the store); wait/poll/kill as one."""

    def __init__(self, run_dir, log, resume=False):
        port = free_port()
        nodes = [0, 1] if ARGS.islands else [None]
        self.procs = [subprocess.Popen(command(ARGS.cli, run_dir, port, resume, node), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True) for node in nodes]
        self.pid = self.procs[-1].pid  # the launch a "launch" fault hits (node 1's with --islands)
        self.args = self.procs[0].args

    def poll(self):
        codes = [p.poll() for p in self.procs]
        return None if None in codes else max(codes, key=abs)

    def wait(self, timeout):
        end = time.time() + timeout
        codes = [p.wait(timeout=max(0.1, end - time.time())) for p in self.procs]
        return max(codes, key=abs)

    def worker(self, rank):
        return worker_pid(self.procs[rank // 2].pid if ARGS.islands else self.pid, rank)


def target_rank(target):
    return {"lead": 0, "worker": 1, "island1": 3}[target]


def trial(sig, target, moment):
    run_dir = os.path.join(ARGS.work, f"{sig}-{target}-{moment}")
    shutil.rmtree(run_dir, ignore_errors=True)
    log = open(run_dir + ".log", "w")
    start = time.time()
    proc = Launches(run_dir, log)
    due = {"formation": lambda: time.time() - start >= 0.3,
           "first_round": lambda: metrics_step(run_dir)[1],
           "mid": lambda: metrics_step(run_dir)[0] >= STEPS // 2,
           "checkpoint": lambda: checkpoint_started(run_dir)}[moment]
    hit = None
    while proc.poll() is None and time.time() - start < ARGS.timeout:
        if due():
            pid = proc.pid if target == "launch" else proc.worker(target_rank(target))
            if pid:
                os.kill(pid, getattr(signal, "SIG" + sig))
                hit = round(time.time() - start, 2)
                break
        time.sleep(0.02)
    if hit is not None and sig == "STOP" and target == "launch":
        # A frozen launch cannot exit: the outcome is whether its workers end at the store's deadline. Then thaw it.
        kids = children(proc.pid)
        while time.time() - start < ARGS.timeout and any(alive(k) for k in kids):
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGCONT)
    try:
        rc = proc.wait(timeout=max(1, ARGS.timeout - (time.time() - start)))
    except subprocess.TimeoutExpired:
        rc = None
    for p in proc.procs:
        reap(p)
    log.close()
    if hit is None and rc == 0:
        return {"outcome": "completed (the fault came too late)", "rc": rc, "at_s": hit}
    if rc is None:
        return {"outcome": "hang", "rc": rc, "at_s": hit}
    if rc == 0 and finished(run_dir):
        return {"outcome": "completed", "rc": rc, "at_s": hit}
    if ARGS.islands and target == "launch" and sig == "KILL" and finished(run_dir):
        # The killed launch's island died with it; the other island completed the run.
        return {"outcome": "completed", "rc": rc, "at_s": hit, "note": "without the killed launch's island"}
    if not has_checkpoint(run_dir):
        return {"outcome": "stopped" if moment in ("formation", "first_round") else "lost", "rc": rc, "at_s": hit}
    with open(run_dir + ".resume.log", "w") as rlog:
        resumed = Launches(run_dir, rlog, resume=True)
        try:
            resume_rc = resumed.wait(ARGS.timeout)
        except subprocess.TimeoutExpired:
            resume_rc = None
        for p in resumed.procs:
            reap(p)
    ok = resume_rc == 0 and finished(run_dir)
    return {"outcome": "resumable" if ok else "lost", "rc": rc, "resume_rc": resume_rc, "at_s": hit}


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--signals", default="KILL,TERM,INT,STOP")
    p.add_argument("--targets", default="worker,lead,launch")
    p.add_argument("--moments", default="formation,first_round,mid,checkpoint")
    p.add_argument("--timeout", type=float, default=90)
    p.add_argument("--out", default="")
    p.add_argument("--max-restarts", type=int, default=0, help="launch --max-restarts (0: the protocol of §21)")
    p.add_argument("--islands", action="store_true", help="fault-tolerant islands: two launches of two workers")
    ARGS = p.parse_args()
    ARGS.cli = os.path.abspath(os.path.join(ARGS.build, "tributary"))
    ARGS.data = os.path.abspath(os.path.join(ARGS.build, "testdata"))
    ARGS.work = "/tmp/tributary_fault_matrix"
    os.makedirs(ARGS.work, exist_ok=True)
    if not os.path.exists(os.path.join(ARGS.data, "dataset.json")):
        sys.exit(f"no dataset at {ARGS.data}: run ./run test (it builds build/testdata) or the suite's data step")
    rows = []
    for sig in ARGS.signals.split(","):
        for target in ARGS.targets.split(","):
            for moment in ARGS.moments.split(","):
                r = trial(sig, target, moment)
                r.update(signal=sig, target=target, moment=moment)
                rows.append(r)
                print(f"{sig:5s} {target:7s} {moment:12s} -> {r['outcome']:10s} (rc {r['rc']}, at {r['at_s']} s)",
                      flush=True)
    counts = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if ARGS.out:
        json.dump(rows, open(ARGS.out, "w"), indent=1)


if __name__ == "__main__":
    main()
