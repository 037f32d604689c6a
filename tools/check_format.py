#!/usr/bin/env python3
"""The format check of ./run test: every C++ source git tracks is as the one .clang-format writes it, by the pinned
clang-format that ./run setup puts into .venv (another version formats differently, so none other is used). Exit 77
(a skip) without it; 1, naming the files, when one differs: `./run format` rewrites them."""
import os, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = os.path.join(root, ".venv", "bin", "clang-format")
if not os.access(binary, os.X_OK):
    print(f"skipped: {binary} is missing (./run setup installs it)")
    sys.exit(77)
files = [f for f in subprocess.run(["git", "-C", root, "ls-files", "*.h", "*.cpp"], capture_output=True, text=True,
                                   check=True).stdout.split()]
bad = []
for i in range(0, len(files), 64):
    batch = files[i:i + 64]
    r = subprocess.run([binary, "--dry-run", "--Werror", *batch], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        bad += sorted({line.split(":", 1)[0] for line in r.stderr.splitlines() if ": error:" in line})
if bad:
    print("not formatted as .clang-format says (run ./run format):\n  " + "\n  ".join(bad))
    sys.exit(1)
print(f"{len(files)} files formatted as .clang-format says")
