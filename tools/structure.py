#!/usr/bin/env python3
"""The project's structure report (issue 11): include edges that point up the layer graph, c10d used outside comm/,
the longest files under src/ and the longest functions (universal-ctags). Exit status 1 when an upward edge or a c10d
use outside comm/ exists. Layers (docs/architecture.md):
    cli -> {interop, plan, route} -> runtime -> {config, artifacts, perf} -> {parallel, optim, routing}
    -> {model, comm, data} -> core;
    runtime -> launch -> core;   sched -> core;   report -> core
Run from anywhere: python3 tools/structure.py [--top N]"""
import os, re, shutil, subprocess, sys
from pathlib import Path

ALLOWED = {"core": set(), "data": {"core"}, "model": {"core"}, "comm": {"core"}, "sched": {"core"},
           "optim": {"core", "data", "model", "comm"}, "routing": {"core", "data", "model"},
           "parallel": {"core", "data", "model", "comm", "optim"},
           "launch": {"core"}, "report": {"core"},
           # the run's configuration: its keys, their checks, and the layout they imply
           "config": {"core", "model", "optim", "parallel", "sched", "launch"},
           # what a run leaves on disk and how it is read back: checkpoints, a model loaded from one, DiPaCo's modules
           # and routes
           "artifacts": {"core", "data", "model", "routing", "config"},
           # what this machine can do: its sgemm peak, BLAS and threads; a model's FLOPs per token
           "perf": {"core", "model", "config"},
           "runtime": {"core", "data", "model", "comm", "sched", "optim", "parallel", "routing", "launch", "config",
                       "artifacts", "perf"}}
# Above the run: what reads or writes a run's files for another tool (Hugging Face), plans a run, or builds DiPaCo's
# routes from a trained model.
for above in ("interop", "plan", "route"):
    ALLOWED[above] = ALLOWED["runtime"] | {"runtime"}
ALLOWED["cli"] = set(ALLOWED) | {"cli"}


def layer_of(path):
    parts = path.split("/")
    if parts[:2] == ["src", "cli"]:
        return "cli"
    if len(parts) > 2 and parts[:2] == ["src", "tributary"] and parts[2] in ALLOWED:
        return parts[2]
    return None


def class_sizes():
    """Per class or struct declared in a header: its public methods (declarations and inline definitions, constructors
    included) and its data members, from universal-ctags."""
    headers = [str(p) for p in Path("src").rglob("*.h")]
    out = subprocess.run(["ctags", "--fields=+naZK", "--kinds-c++=+pm", "-o", "-", *headers],
                         capture_output=True, text=True).stdout
    counts, where = {}, {}
    for line in out.splitlines():
        cols = line.split("\t")
        fields = dict(c.split(":", 1) for c in cols[3:] if ":" in c)
        kind = cols[3] if len(cols) > 3 else ""
        if kind in ("class", "struct"):
            scope = fields.get("scope", "").split(":", 1)[-1]
            name = f"{scope}::{cols[0]}" if scope else cols[0]
            where[name] = f"{cols[1]}:{fields.get('line', '?')}"
            continue
        scope = fields.get("scope", "")
        if not (scope.startswith("class:") or scope.startswith("struct:")):
            continue
        owner = scope.split(":", 1)[1]
        c = counts.setdefault(owner, [0, 0])
        if kind == "member":
            c[1] += 1
        elif kind in ("prototype", "function") and fields.get("access", "public") == "public":
            c[0] += 1
    return [((m, d), name, where.get(name, "?")) for name, (m, d) in counts.items() if name in where]


def size_reason(where):
    """The reason a class's header gives for its size: a "Size:" line in the comment right above the class."""
    path, _, line = where.rpartition(":")
    if not line.isdigit() or not os.path.exists(path):
        return ""
    lines = open(path, errors="replace").read().splitlines()
    i, block = int(line) - 2, []
    while i >= 0 and lines[i].lstrip().startswith("//"):
        block.insert(0, lines[i].lstrip()[2:].strip())
        i -= 1
    text = " ".join(block)
    return text[text.index("Size:") + 5:].strip() if "Size:" in text else ""


def folder_shares(files):
    """Lines per top folder of src/ (src/cli, src/tributary/<layer>), largest first, with its share of all."""
    lines = {}
    for f in files:
        parts = f.split("/")
        key = "/".join(parts[:2] if parts[1] == "cli" else parts[:3])
        lines[key] = lines.get(key, 0) + open(f, errors="replace").read().count("\n")
    total = sum(lines.values())
    return [(n, n / total, k) for k, n in sorted(lines.items(), key=lambda kv: -kv[1])], total


def interfaces():
    """Classes that declare virtual methods, with how many (a seam's width): from the headers, by a plain scan."""
    found = []
    for path in sorted(Path("src").rglob("*.h")):
        text = open(path, errors="replace").read()
        for m in re.finditer(r"^(?:class|struct) (\w+)[^;{]*\{", text, re.M):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            body = text[m.end():i]
            n = len(re.findall(r"^\s*virtual\s+(?!~)", body, re.M))
            if n:
                found.append((n, m.group(1), str(path)))
    return sorted(found, reverse=True)


def main():
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 8
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = [f for f in subprocess.run(["git", "ls-files", "src"], capture_output=True, text=True).stdout.split()
             if f.endswith((".h", ".cpp"))]
    upward, c10d, sizes = [], [], []
    for f in files:
        text = open(f, errors="replace").read()
        sizes.append((text.count("\n"), f))
        layer = layer_of(f)
        for inc in sorted(set(re.findall(r'#include\s+"tributary/([a-z_]+)/', text))):
            if layer and inc != layer and inc in ALLOWED and inc not in ALLOWED[layer]:
                upward.append(f"{f} -> {inc}/")
        if layer != "comm" and re.search(r"\bc10d::|#include\s+<(torch/csrc/distributed|c10d)", text):
            c10d.append(f)
    print("upward include edges:", "none" if not upward else "")
    for e in upward:
        print("  " + e)
    print("c10d outside comm/:", "none" if not c10d else "")
    for f in c10d:
        print("  " + f)
    shares, total = folder_shares(files)
    print(f"lines per folder ({total} in all; runtime/ aim: under ~25%):")
    for n, share, k in shares:
        print(f"  {n:6d}  {share:5.1%}  {k}")
    print("interfaces (virtual methods; aim: ~12 at most):")
    for n, name, path in interfaces()[:top]:
        print(f"  {n:3d}  {name} ({path})")
    print(f"longest files (lines; limit ~400):")
    for n, f in sorted(sizes, reverse=True)[:top]:
        print(f"  {n:5d}  {f}")
    if shutil.which("ctags"):
        out = subprocess.run(["ctags", "--fields=+ne", "--kinds-c++=f", "-o", "-", "-R", "src"],
                             capture_output=True, text=True).stdout
        funcs = []
        for line in out.splitlines():
            m = re.search(r"^(\S+)\t(\S+)\t.*\tline:(\d+).*\tend:(\d+)", line)
            if m and not m.group(1).startswith("__anon"):
                funcs.append((int(m.group(4)) - int(m.group(3)) + 1, f"{m.group(2)}:{m.group(3)} {m.group(1)}"))
        print("longest functions (lines; limit ~80):")
        for n, f in sorted(funcs, reverse=True)[:top]:
            print(f"  {n:5d}  {f}")
        classes = class_sizes()
        print("largest classes (public methods, data members; limit ~15 / ~20 unless the header says why):")
        for (methods, members), name, where in sorted(classes, key=lambda c: -max(c[0][0] / 15, c[0][1] / 20))[:top]:
            print(f"  {methods:3d} public methods {members:3d} members  {name} ({where})")
            if methods > 15 or members > 20:
                reason = size_reason(where)
                print(f"        why: {reason[:110]}" if reason else "        why: (no reason in its header)")
    else:
        print("longest functions: install universal-ctags (./run setup does) to list them")
    return 1 if upward or c10d else 0


if __name__ == "__main__":
    sys.exit(main())
