#!/usr/bin/env python3
"""Four corpora of this machine's own text that the built-in corpus (Bible, fortunes, man pages, C headers, Python)
does not hold, for checking settings on text they were not tuned on (issue 63, measurement 3):

  info       the GNU info manuals (decompressed, cut into 60 kB documents) and Perl's .pod pages
  perl       the Perl modules' source (.pm under /usr/share/perl and /usr/share/perl5)
  changelogs Debian's and upstream changelogs under /usr/share/doc (decompressed, each at most 400 kB, one copy of
             each text)
  copyright  the packages' copyright files under /usr/share/doc (licence texts; one copy of each text)

Each is written as a directory of text files and built with the byte tokenizer (`tributary data build`) into
OUT/<name>. Deterministic for a given machine (files sorted by path).

  python3 bench/other_corpora.py --build build --out runs/corpora [--only info,perl,changelogs,copyright]"""
import argparse
import glob
import gzip
import hashlib
import os
import shutil
import subprocess


def read(path):
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    return data.replace(b"\0", b"")


def info_docs():
    manuals = {}
    for p in sorted(glob.glob("/usr/share/info/*.info*")):
        name = os.path.basename(p).split(".info")[0]
        manuals.setdefault(name, []).append(p)
    for name, parts in sorted(manuals.items()):
        text = b"".join(read(p) for p in sorted(parts))
        for i in range(0, len(text), 60_000):
            yield f"{name}-{i // 60_000:03d}.txt", text[i:i + 60_000]
    for p in sorted(glob.glob("/usr/share/perl*/**/*.pod", recursive=True)):
        yield "pod-" + p.strip("/").replace("/", "_"), read(p)


def perl_docs():
    for p in sorted(glob.glob("/usr/share/perl*/**/*.pm", recursive=True)):
        yield p.strip("/").replace("/", "_") + ".txt", read(p)


def changelog_docs():
    seen = set()
    for p in sorted(glob.glob("/usr/share/doc/*/changelog*.gz")):
        if os.path.islink(p):
            continue
        text = read(p)
        digest = hashlib.sha256(text).digest()
        if len(text) > 400_000 or digest in seen:
            continue
        seen.add(digest)
        yield p.strip("/").replace("/", "_")[:-3] + ".txt", text


def copyright_docs():
    seen = set()
    for p in sorted(glob.glob("/usr/share/doc/*/copyright")):
        text = read(p)
        digest = hashlib.sha256(text).digest()
        if os.path.islink(p) or digest in seen:
            continue
        seen.add(digest)
        yield p.strip("/").replace("/", "_") + ".txt", text


CORPORA = {"info": info_docs, "perl": perl_docs, "changelogs": changelog_docs, "copyright": copyright_docs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="runs/corpora")
    ap.add_argument("--only", default=",".join(CORPORA))
    args = ap.parse_args()
    for name in args.only.split(","):
        src = os.path.join(args.out, name + "-text")
        shutil.rmtree(src, ignore_errors=True)
        os.makedirs(src)
        files = size = 0
        for fname, text in CORPORA[name]():
            if text.strip():
                open(os.path.join(src, fname), "wb").write(text)
                files, size = files + 1, size + len(text)
        subprocess.run([os.path.join(args.build, "tributary"), "data", "build", src, "--out",
                        os.path.join(args.out, name), "--overwrite"], check=True, stdout=subprocess.DEVNULL)
        print(f"{name}: {files} documents, {size / 1e6:.1f} MB -> {os.path.join(args.out, name)}", flush=True)


if __name__ == "__main__":
    main()
