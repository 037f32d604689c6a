"""Proves that the Gloo which runs is the wheel's own. PyTorch's wheel links Gloo into libtorch_cpu but ships no Gloo
headers; the build compiles c10d's ProcessGroupGloo.hpp against Debian's libgloo-dev headers instead (CMakeLists.txt).
That is safe only while those headers contribute names and nothing else. This check reads the symbol tables:

1. no object of ours defines a symbol in namespace gloo:: (no inline Gloo function, vtable or type info compiled from
   the stand-in headers, whose layout could differ from the wheel's Gloo);
2. every gloo:: symbol an object of ours references is defined by the wheel's libtorch_cpu (so the linker binds it to
   the wheel's Gloo, not to a libgloo of Debian's).

Usage: python3 tools/check_gloo_abi.py --objects BUILD/CMakeFiles/tributary.dir --libtorch .../torch/lib/libtorch_cpu.so
Exits 1 naming each offending object and symbol; prints what it checked otherwise."""
import argparse
import os
import subprocess
import sys


def symbols(path, *flags):
    out = subprocess.run(["nm", "-C", *flags, path], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 2) if not line.startswith(" ") else ["", *line.split(None, 1)]
        if len(parts) == 3:
            rows.append((parts[1], parts[2]))
    return rows


def is_gloo(name):
    return name.startswith("gloo::") or name.startswith("vtable for gloo::") or name.startswith("typeinfo for gloo::") \
        or name.startswith("typeinfo name for gloo::")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", required=True, help="a directory searched for *.o")
    ap.add_argument("--libtorch", required=True)
    args = ap.parse_args()
    objects = [os.path.join(d, f) for d, _, fs in os.walk(args.objects) for f in fs if f.endswith(".o")]
    if not objects:
        sys.exit(f"check_gloo_abi: no object files under {args.objects}: build first")
    provided = {name for kind, name in symbols(args.libtorch, "-D", "--defined-only") if is_gloo(name)}
    problems, referenced = [], 0
    for obj in sorted(objects):
        for kind, name in symbols(obj):
            if not is_gloo(name):
                continue
            if kind == "U":
                referenced += 1
                if name not in provided:
                    problems.append(f"{obj}: references {name}, which {args.libtorch} does not define")
            else:
                problems.append(f"{obj}: defines {name} ({kind}), compiled from the stand-in Gloo headers")
    for p in problems:
        print(p)
    if problems:
        print(f"check_gloo_abi: {len(problems)} problem(s): code of ours depends on the layout of Debian's Gloo headers, "
              "which may differ from the Gloo inside the wheel; name Gloo's types only through pointers, in "
              "comm/group.cpp")
        sys.exit(1)
    print(f"check_gloo_abi: {len(objects)} objects define no gloo:: symbol; {referenced} gloo:: references, all "
          f"defined by {os.path.basename(args.libtorch)} ({len(provided)} gloo:: symbols exported)")


if __name__ == "__main__":
    main()
