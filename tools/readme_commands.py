#!/usr/bin/env python3
"""The README test of ./run test: runs every command of the README's command blocks, top to bottom and as written, in
a scratch directory, and fails naming the first one that exits non-zero; then those of the walk-through pages (PAGES).

Runs are shortened, not rewritten: the scratch directory's configs/ are the repository's with fewer steps (and a
shorter warm-up, DiLoCo round and evaluation, a narrower model with a shorter context), so `train configs/default.toml ...` runs the README's words on them.
Three kinds of command are changed, each printed as it runs:
  - the built-in corpus is built smaller (--mb-per-domain), so that `eval` over its whole validation split is quick;
  - benchmarks get fewer steps (chaos.py, islands.py), and islands.py is skipped where network namespaces are not
    permitted (it needs root);
  - `store --port P`, a server that never exits, runs on a free port for two seconds and must still be running.
The README's own inputs that a newcomer brings (my_texts/, c4.jsonl) are made from the golden corpus.
Commands that ./run itself is (demo, test, format) are listed as not run.

  readme_commands.py --build BUILD [--work DIR] [--keep]
"""
import argparse, json, os, re, shutil, socket, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The README, then the doc pages that walk a user through commands (each runs after the README, in the same scratch).
PAGES = ["README.md", "docs/open-models.md"]

NOT_RUN = {  # command prefix -> why the README test does not run it
    "./run demo": "./run demo is its own entry point (CI runs ./run test; the demo trains for minutes)",
    "./run test": "the suite this test belongs to",
    "./run format": "rewrites the repository's sources",
}

# (pattern, replacement, why): applied to a command before it runs.
SHORTEN = [
    (r"--stop-after-step \d+", "--stop-after-step 4", "stops half-way through the shortened run"),
    (r"(data build-default --out \S+)", r"\1 --mb-per-domain 0.3 --val-permille 50",
     "a smaller corpus: eval covers its whole validation split"),
    (r"(bench/chaos\.py .*)--steps 600", r"\1--steps 16 --inner-steps 4 --faults 1 --every 2 --heartbeat 3",
     "a shorter chaos run"),
    (r"(bench/islands\.py .*)$", r"\1 --steps 20 --inner-steps 5 --eval-every 10 --only islands",
     "a shorter benchmark, islands only"),
]

# config key -> shortened value (only keys a file already has are changed)
SHORT_CONFIG = {
    "steps": "8", "warmup_steps": "2", "inner_steps": "4", "eval_every": "4", "eval_batches": "2",
    "checkpoint_every": "4", "log_every": "2", "eval_every_rounds": "0", "batch_size": "4",
    "width": "64", "context": "64",
}


def commands(readme):
    """The README's commands in order: fenced blocks, continuation lines joined, comments and blank lines dropped."""
    out, block, pending = [], False, ""
    for raw in open(readme, encoding="utf-8").read().splitlines():
        if raw.startswith("```"):
            block = not block
            continue
        if not block:
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            out.append(re.sub(r"\s+#\s.*$", "", line))  # the README's comments, after two spaces or more
    return out


def shorten_configs(src, dst):
    shutil.copytree(src, dst)
    for dirpath, _, files in os.walk(dst):
        for f in files:
            if not f.endswith(".toml"):
                continue
            path = os.path.join(dirpath, f)
            text = open(path, encoding="utf-8").read()
            for key, value in SHORT_CONFIG.items():
                text = re.sub(rf"(?m)^({key}\s*=\s*)[^#\n]*?(\s*(#.*)?)$", rf"\g<1>{value}\2", text)
            open(path, "w", encoding="utf-8").write(text)


def newcomer_inputs(work):
    """my_texts/ (a directory of text files, one sub-directory per domain) and c4.jsonl (JSONL with "text")."""
    corpus = os.path.join(ROOT, "tests", "golden", "corpus")
    shutil.copytree(corpus, os.path.join(work, "my_texts"))
    with open(os.path.join(work, "c4.jsonl"), "w", encoding="utf-8") as out:
        for dirpath, _, files in sorted(os.walk(corpus)):
            for f in sorted(files):
                text = open(os.path.join(dirpath, f), encoding="utf-8", errors="replace").read()
                for para in text.split("\n\n"):
                    if para.strip():
                        out.write(json.dumps({"text": para.strip()}) + "\n")


def netns_permitted():
    name = f"trib_readme_probe_{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(prelude, cmd, env, work, log):
    """`store --port P`: it serves until stopped, so it passes if it is still up after two seconds."""
    cmd = re.sub(r"--port \d+", f"--port {free_port()}", cmd)
    print(f"    (a server: on a free port, stopped after 2 s) {cmd}", flush=True)
    p = subprocess.Popen(["bash", "-c", "; ".join(prelude + ["exec " + cmd])], cwd=work, env=env, stdout=log,
                         stderr=subprocess.STDOUT)
    time.sleep(2)
    alive = p.poll() is None
    p.terminate()
    p.wait(timeout=10)
    return 0 if alive else (p.returncode or 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="the build directory (holds tributary)")
    ap.add_argument("--work", default="", help="scratch directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--timeout", type=float, default=240, help="seconds one command may take")
    args = ap.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="trib_readme_")
    os.makedirs(work, exist_ok=True)
    os.symlink(os.path.abspath(args.build), os.path.join(work, "build"))
    for d in ("bench", "tools", "tests"):
        os.symlink(os.path.join(ROOT, d), os.path.join(work, d))
    shorten_configs(os.path.join(ROOT, "configs"), os.path.join(work, "configs"))
    newcomer_inputs(work)
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # python3: the project's
    namespaces = netns_permitted()

    prelude, ran, started = [], 0, time.time()
    cmds = [c for page in PAGES for c in commands(os.path.join(ROOT, page))]
    for i, cmd in enumerate(cmds, 1):
        if re.fullmatch(r"[A-Z_]+=\S+", cmd):  # B=./build/tributary: every later command sees it
            prelude.append(cmd)
            continue
        skip = next((why for prefix, why in NOT_RUN.items() if cmd.startswith(prefix)), None)
        if skip is None and "bench/islands.py" in cmd and not namespaces:
            skip = "needs network namespaces (root), not permitted here"
        if skip:
            print(f"[{i}/{len(cmds)}] not run: {cmd}\n    ({skip})", flush=True)
            continue
        for pattern, repl, why in SHORTEN:
            new = re.sub(pattern, repl, cmd)
            if new != cmd:
                print(f"    ({why})", flush=True)
                cmd = new
        print(f"[{i}/{len(cmds)}] {cmd}", flush=True)
        log_path = os.path.join(work, f"cmd-{i:02d}.log")
        t0 = time.time()
        with open(log_path, "w") as log:
            if re.search(r"\bstore --port\b", cmd):
                rc = run_server(prelude, cmd, env, work, log)
            else:
                try:
                    rc = subprocess.run(["bash", "-c", "set -euo pipefail; " + "; ".join(prelude + [cmd])], cwd=work,
                                        env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = f"timed out after {args.timeout:.0f} s"
        print(f"    exit {rc} in {time.time() - t0:.1f} s", flush=True)
        if rc != 0:
            tail = open(log_path, encoding="utf-8", errors="replace").read().splitlines()[-30:]
            print("README or doc command failed as written (" + ", ".join(PAGES) + "):\n  " + cmd + "\nits output ends:\n  " +
                  "\n  ".join(tail))
            print(f"scratch directory kept: {work}")
            return 1
        ran += 1
    print(f"{ran} README commands ran as written in {time.time() - started:.0f} s")
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0



if __name__ == "__main__":
    sys.exit(main())
