"""Chaos run of issue 15 (docs/benchmarks.md): fault-tolerant DiLoCo through `tributary launch`, with random workers
(rank 0 included) killed (SIGKILL) or frozen (SIGSTOP) at random times; launch restarts them (--max-restarts) and
they heal from a peer. A frozen worker is reaped (SIGKILL) once the survivors dropped it, as an operator or a cloud
would reap a hung machine, and is then restarted too. Also runs the same configuration without faults, and reports
each fault from the launch log:
  detected   injection -> the survivors' watcher says "worker W has sent no heartbeat" (dist.heartbeat_timeout_s),
             or, for a kill, "worker W exited (its launch reported the death)" (launch tells the store at once)
  stall      at the next outer step, the first "round ... failed" line -> "dropped out ... go on as epoch": the time
             the survivors wait before redoing the round without W (until then they train on)
  trains     the restart -> "worker W healed from the lead at step S" (DiLoCo: the lead sent it its state between
             two steps; from here on it trains, and its pseudo-gradient counts in the round it joins)
  counted    the restart -> "worker W joined at step S": it is a member, its update averaged in that round (DiLoCo:
             the end of the round it was healed in; data parallel: the step after its admission)
  steps lost the victim's inner steps since its last outer step (lost with its memory)
With --algorithm ddp the same for fault-tolerant data parallel: every step is a round, so "stall" is the redone
step's wait and no step is lost (the survivors complete the step of a death); "steps lost" is then 0 by
construction and the victim's in-flight batch is what is lost.
With --machines 2 the four workers run as two machines of two workers each, in network namespaces joined by a veth
pair (root and `ip netns` needed; refused otherwise), each machine with its own `tributary launch` (node 0's hosts
the store), and a third kind of fault joins the draw: machine 1's link is cut (`ip link set ... down`) for --cut-s
seconds. Its workers fall silent (no reset reaches anyone), the others drop them at the heartbeat deadline; when the
link is back they find they were declared dead, exit, and their launch restarts them to heal (rank 0's machine is
never cut: its launch hosts the store).
Measures; asserts nothing. Needs only the Python standard library (and `ip` for --machines 2).

Usage: python3 bench/chaos.py --build build [--algorithm diloco|ddp] [--steps 600] [--faults 20] [--seed 1]
       [--heartbeat 5] [--inner-steps 50] [--machines 1|2] [--cut-s 8] [--kinds kill,freeze,cut] [--clean-too]
       [--out chaos.json]
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from netns import TwoMachines
from procs import children, rank_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This run's own directory (a fixed one let two chaos runs, or a user's files, collide): made in main().
WORK = None
LAUNCHES = []  # every launch started, stopped on any exit of this script (its workers die with it)


def stop_launches():
    """Every launch still running gets SIGTERM, then SIGKILL (their workers die with them: launch's parent-death
    signal); each runs in a session of its own, so a Ctrl-C here does not reach them by itself."""
    running = [p for p in LAUNCHES if p.poll() is None]
    for p in running:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + 15
    for p in running:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass


def progress(run, label, every=10):
    """A line every `every` seconds (a log shows the run is alive, not only a terminal)."""
    def loop():
        while all(p.poll() is None for p in run.procs):
            time.sleep(every)
            if all(p.poll() is None for p in run.procs):
                print(f"chaos: {label} run at {run.now():.0f} s, step {run.last_step()}", file=sys.stderr, flush=True)
    threading.Thread(target=loop, daemon=True).start()


def Machines():
    """Two machines on this one: namespaces A (10.79.0.1, node 0) and B (10.79.0.2, node 1) joined by a veth pair."""
    return TwoMachines(("tribchaosa", "tribchaosb", "tcva", "tcvb"), "10.79.0")


class Run:
    """One launch per machine, their output lines timestamped as they arrive."""

    def __init__(self, cli, run_dir, args, faults, machines=None):
        train = ["train", os.path.join(ROOT, "configs/diloco.toml"), "--overwrite",
                 f"--set=train.run_dir={run_dir}", f"--set=train.steps={args.steps}", "--set=train.log_every=1",
                 f"--set=train.eval_every={args.steps}", f"--set=dist.inner_steps={args.inner_steps}",
                 f"--set=optim.warmup_steps={min(40, max(1, args.steps // 10))}",  # the config's 40, or a tenth
                 "--set=dist.fault_tolerant=true", f"--set=dist.heartbeat_timeout_s={args.heartbeat}",
                 "--set=dist.collective_timeout_s=600", f"--set=dist.algorithm={args.algorithm}",
                 # fp32 by default: the chaos numbers of docs/benchmarks.md §11 were measured so
                 f"--set=dist.compression={args.compression}"]
        common = ["--grace", "10", "--max-restarts", "1000", "--max-failures", "3"]
        if machines is None:
            cmds = [[cli, "launch", "--nproc", "4", "--master-port", "0", *common, "--", *train]]
        else:
            cmds = [machines.prefix(n) + [cli, "launch", "--nproc", "2", "--nnodes", "2", "--node-rank", str(n),
                                          "--master-addr", "10.79.0.1", "--master-port", "29733", *common, "--",
                                          *train] for n in (1, 0)]
        self.start = time.monotonic()
        self.started_at = time.time()  # a summary.json older than this is an earlier run's
        self.lines = []  # (t, line)
        # errors="replace": a worker killed mid-line can leave half a UTF-8 character, which would end the reader
        # thread (and every line after it) with a UnicodeDecodeError.
        self.procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       errors="replace", cwd=ROOT, start_new_session=True) for c in cmds]
        LAUNCHES.extend(self.procs)
        self.proc = self.procs[-1]  # node 0's launch: the run's outcome
        self.readers = [threading.Thread(target=self._read, args=(p,), daemon=True) for p in self.procs]
        for r in self.readers:
            r.start()
        self.faults = faults
        self.run_dir = run_dir
        self.machines = machines

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append((time.monotonic() - self.start, line.rstrip("\n")))

    def wait(self):
        for p in self.procs:
            p.wait()
        for r in self.readers:
            r.join(timeout=10)

    def now(self):
        return time.monotonic() - self.start

    def workers(self):
        return [p for proc in self.procs for p in children(proc.pid) if rank_of(p) is not None]

    def last_step(self):
        for _, line in reversed(self.lines):
            m = re.search(r"step +(\d+)/", line)
            if m:
                return int(m.group(1))
        return 0


def inject(run, args, rng):
    """Spreads the faults over the middle of the run (none in its first or last 10% of steps, when the workers
    start and write the final checkpoint)."""
    last = 0.0
    injected = 0
    while injected < args.faults and run.proc.poll() is None:
        step = run.last_step()
        if step < 0.1 * args.steps:
            time.sleep(0.5)
            continue
        if step > 0.9 * args.steps:
            break
        # one fault per `every` seconds on average, at least heartbeat + 3 s apart
        if run.now() - last < args.heartbeat + 3 or rng.random() > 0.5 / args.every:
            time.sleep(0.5)
            continue
        workers = run.workers()
        if len(workers) < 4:  # a restart still starting: wait for the full world
            time.sleep(0.5)
            continue
        pid = rng.choice(workers)
        kind = rng.choice(args.kinds)
        if kind == "cut":  # machine 1 (ranks 2 and 3) loses its link for --cut-s seconds
            fault = {"t": run.now(), "rank": 2, "pid": None, "kind": "cut", "step": run.last_step()}
            run.machines.cut(up=False)
            run.faults.append(fault)
            injected += 1
            time.sleep(args.cut_s)
            run.machines.cut(up=True)
            last = run.now()
            continue
        fault = {"t": run.now(), "rank": rank_of(pid), "pid": pid, "kind": kind, "step": run.last_step()}
        os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        run.faults.append(fault)
        injected += 1
        last = run.now()
        if kind == "freeze":  # reaped once dropped (detection is by its silent heartbeat)
            time.sleep(args.heartbeat + 3)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def first_after(lines, t, pattern, group=None):
    rx = re.compile(pattern)
    for when, line in lines:
        if when >= t:
            m = rx.search(line)
            if m:
                return when, (m.group(group) if group else line)
    return None, None


def analyse(run, args):
    rows = []
    for f in run.faults:
        w = f["rank"]
        detected, _ = first_after(run.lines, f["t"],
                                  rf"worker {w} (has sent no heartbeat|exited \(its launch reported the death\))")
        failed, _ = first_after(run.lines, f["t"], r"round x\d+ of epoch \d+ failed")
        resumed, _ = first_after(run.lines, f["t"], rf"worker\(s\) [0-9, ]*\b{w}\b[0-9, ]* dropped out")
        restarted, _ = first_after(run.lines, f["t"], rf"launch: rank {w} .*restarting it")
        healed, at = first_after(run.lines, f["t"], rf"worker {w} joined at step (\d+)", 1)
        # trains: healed mid-round, or (warm-up, data parallel, a round boundary) admitted, whichever came first
        trains, _ = first_after(run.lines, f["t"], rf"worker {w} (healed from the lead|joined) at step")
        rows.append({**f,
                     "detected_after_s": None if detected is None else round(detected - f["t"], 2),
                     "round_stall_s": None if None in (failed, resumed) else round(resumed - failed, 2),
                     "trains_after_restart_s": None if None in (restarted, trains) else round(trains - restarted, 2),
                     "healed_after_restart_s": None if None in (restarted, healed) else round(healed - restarted, 2),
                     "joined_at_step": None if at is None else int(at),
                     "steps_lost": 0 if args.algorithm == "ddp" else f["step"] % args.inner_steps})
    return rows


def summary_of(run_dir, lines=(), inner_steps=1, since=0.0):
    """summary.json (None unless written after `since`: a run that failed has none of its own), plus the committed tokens: per round, the members that contributed x the steps it covers x
    the tokens of one worker's step (a dead worker's steps since its last outer step are not counted), less, for a
    replacement healed mid-round, the steps of that round before its heal (it forked the lead there)."""
    try:
        path = os.path.join(run_dir, "summary.json")
        if os.path.getmtime(path) < since:
            return None
        s = json.load(open(path))
        cfg = {"batch": 4, "context": 256}
        committed = 0
        last = 0  # the step of the previous round: a warm-up round covers one step, a DiLoCo round H
        for line in open(os.path.join(run_dir, "metrics.jsonl")):
            j = json.loads(line)
            if "outer_step" in j:
                committed += j["world_size"] * (j["step"] - last) * cfg["batch"] * cfg["context"]
                last = j["step"]
        for _, line in lines:
            m = re.search(r"worker \d+ healed from the lead at step (\d+)", line)
            if m:
                committed -= (int(m.group(1)) % inner_steps) * cfg["batch"] * cfg["context"]
        s["committed_tokens"] = committed
        s["committed_tokens_per_s"] = committed / s["elapsed_s"]
        return s
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--algorithm", choices=["diloco", "ddp"], default="diloco")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--every", type=float, default=25, help="mean seconds between faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--heartbeat", type=float, default=5)
    ap.add_argument("--compression", default="fp32", help="dist.compression (the shipped DiLoCo config's is int8)")
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--machines", type=int, choices=[1, 2], default=1,
                    help="2: two machines in network namespaces, and link cuts among the faults")
    ap.add_argument("--cut-s", type=float, default=8, help="how long a cut link stays down")
    ap.add_argument("--kinds", default="", help="faults to draw from, comma-separated (default kill,freeze, and cut "
                                                "with --machines 2)")
    ap.add_argument("--clean-too", action="store_true", help="also run without faults, for the ratios")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    args.kinds = args.kinds.split(",") if args.kinds else ["kill", "freeze"] + (["cut"] if args.machines == 2 else [])
    if "cut" in args.kinds and args.machines != 2:
        sys.exit("--kinds cut needs --machines 2 (a link to cut)")
    cli = os.path.join(ROOT, args.build, "tributary")
    if not os.path.exists(os.path.join(ROOT, "data/default/dataset.json")):
        sys.exit("data/default is missing: run `./run demo` (or tributary data build-default) first")
    report = {"args": vars(args)}
    rng = random.Random(args.seed)
    tag = ("" if args.algorithm == "diloco" else "_" + args.algorithm) + ("_2m" if args.machines == 2 else "")
    machines = Machines() if args.machines == 2 else None
    try:
        chaos = Run(cli, os.path.join(WORK, f"faults{tag}"), args, [], machines)
        progress(chaos, "faults")
        inject(chaos, args, rng)
        chaos.wait()
    finally:
        if machines:
            machines.cut(up=True)
    report["chaos"] = {"exit": chaos.proc.returncode, "wall_s": round(chaos.now(), 1),
                       "summary": summary_of(chaos.run_dir, chaos.lines, args.inner_steps,
                                                     chaos.started_at),
                       "faults": analyse(chaos, args)}
    with open(os.path.join(WORK, f"faults{tag}.log"), "w") as log:
        log.writelines(f"{t:9.2f} {line}\n" for t, line in chaos.lines)
    try:
        if args.clean_too:
            clean = Run(cli, os.path.join(WORK, f"clean{tag}"), args, [], machines)
            progress(clean, "clean")
            clean.wait()
            report["clean"] = {"exit": clean.proc.returncode, "wall_s": round(clean.now(), 1),
                               "summary": summary_of(clean.run_dir, since=clean.started_at)}
            with open(os.path.join(WORK, f"clean{tag}.log"), "w") as log:
                log.writelines(f"{t:9.2f} {line}\n" for t, line in clean.lines)
    finally:
        if machines:
            machines.down()
    text = json.dumps(report, indent=1)
    failed = False
    for name in ("chaos", "clean"):
        r = report.get(name)
        if r and (r["exit"] != 0 or r["summary"] is None):
            failed = True
            log_name = ("faults" if name == "chaos" else "clean") + tag
            print(f"THE {name.upper()} RUN FAILED: launch exit {r['exit']}, "
                  f"{'no summary.json of its own' if r['summary'] is None else 'a summary'}; "
                  f"its log: {os.path.join(WORK, log_name)}.log", file=sys.stderr)
    if args.out:
        open(args.out, "w").write(text)
    print(text)
    print("\n| # | t (s) | rank | fault | at step | detected after (s) | round stall (s) | "
          "trains after restart (s) | counted after restart (s) | joined at step | steps lost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(report["chaos"]["faults"], 1):
        print(f"| {i} | {r['t']:.0f} | {r['rank']} | {r['kind']} | {r['step']} | {r['detected_after_s']} | "
              f"{r['round_stall_s']} | {r['trains_after_restart_s']} | {r['healed_after_restart_s']} | "
              f"{r['joined_at_step']} | {r['steps_lost']} |")
    return 1 if failed else 0


if __name__ == "__main__":
    WORK = tempfile.mkdtemp(prefix="tributary_chaos_")
    print(f"chaos: runs and logs in {WORK}", file=sys.stderr, flush=True)
    # SIGINT (even where a shell started this in the background with it ignored) and SIGTERM as Ctrl-C: either way the
    # finally below stops the launches.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        sys.exit(main())
    finally:
        stop_launches()
