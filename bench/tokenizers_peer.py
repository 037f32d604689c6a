#!/usr/bin/env python3
"""Our tokenizer.json reader (src/tributary/data/bpe_tokenizer.h) against Hugging Face's `tokenizers` (Rust) on real
text: ids compared document by document, and the time each takes to encode the same documents on one thread.

  python3 bench/tokenizers_peer.py --build build [--mb 12] [--vocab 32000] [--families gpt2,llama3,qwen2] [--repeats 3]

The text is the built-in corpus's sources (the King James Bible, manual pages, the Python standard library, fortunes),
--mb megabytes in all as JSONL documents. Each family's tokenizer is trained by `tokenizers` on the first quarter
(tests/reference/hf_bpe_peer.py train); both sides then encode every document. Prints one JSON line per family
(documents, bytes, tokens, differing documents, seconds per side as median and spread of --repeats, the ratio)."""
import argparse
import glob
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "tests", "reference", "hf_bpe_peer.py")


def corpus(limit):
    """Documents of real text, about `limit` bytes: a quarter from each source."""
    share = limit // 4
    docs = []

    def take(texts):
        got = 0
        for t in texts:
            if got >= share:
                break
            t = t.strip()
            if t:
                docs.append(t)
                got += len(t.encode())

    bible = subprocess.run(["/usr/bin/bible", "Gen1:1-Rev22:21"], capture_output=True, text=True).stdout
    take(bible.split("\n\n"))

    def manpages():
        for f in sorted(glob.glob("/usr/share/man/man[1-8]/*.gz")):
            try:
                yield gzip.open(f).read().decode("utf-8", "replace")
            except OSError:
                continue
    take(manpages())
    stdlib = sorted(glob.glob(f"/usr/lib/python3.{sys.version_info.minor}/**/*.py", recursive=True)) or \
        sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
    take(open(f, encoding="utf-8", errors="replace").read() for f in stdlib)
    fortunes = sorted(f for f in glob.glob("/usr/share/games/fortunes/*") if "." not in os.path.basename(f))
    take(part for f in fortunes for part in open(f, encoding="utf-8", errors="replace").read().split("\n%\n"))
    return docs


def timed(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, RAYON_NUM_THREADS="1"))
    if out.returncode != 0:
        raise SystemExit(" ".join(cmd) + " failed:\n" + out.stdout + out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--mb", type=float, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--families", default="gpt2,llama3,qwen2")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="trib_tokenizers_peer_")
    docs = corpus(int(args.mb * (1 << 20)))
    with open(os.path.join(work, "docs.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    with open(os.path.join(work, "train.jsonl"), "w") as f:
        for d in docs[::4]:
            f.write(json.dumps({"text": d}) + "\n")
    subprocess.run([sys.executable, PEER, "train", "--corpus", os.path.join(work, "train.jsonl"), "--out", work,
                    "--vocab", str(args.vocab), "--families", args.families], check=True, capture_output=True)
    ours_bin = os.path.join(args.build, "bench_tokenizer")
    for family in args.families.split(","):
        tok = os.path.join(work, family, "tokenizer.json")
        theirs_s, ours_s = [], []
        for _ in range(args.repeats):
            theirs = timed([sys.executable, PEER, "encode", "--tokenizer", tok, "--corpus",
                            os.path.join(work, "docs.jsonl"), "--out", os.path.join(work, family + ".theirs")])
            ours = timed([ours_bin, tok, os.path.join(work, "docs.jsonl"), os.path.join(work, family + ".ours")])
            theirs_s.append(theirs["seconds"])
            ours_s.append(ours["seconds"])
        ids = {side: open(os.path.join(work, f"{family}.{side}"), "rb").read() for side in ("ours", "theirs")}
        lens = {side: open(os.path.join(work, f"{family}.{side}.lens"), "rb").read() for side in ("ours", "theirs")}
        differing = 0
        if ids["ours"] != ids["theirs"] or lens["ours"] != lens["theirs"]:
            at = {"ours": 0, "theirs": 0}
            for d in range(len(docs)):
                parts = {}
                for side in ("ours", "theirs"):
                    n = int.from_bytes(lens[side][4 * d:4 * d + 4], "little")
                    parts[side] = ids[side][4 * at[side]:4 * (at[side] + n)]
                    at[side] += n
                differing += parts["ours"] != parts["theirs"]
        print(json.dumps({"family": family, "vocab": args.vocab, "documents": ours["documents"],
                          "mb": round(ours["bytes"] / (1 << 20), 2), "tokens": ours["tokens"],
                          "differing_documents": differing,
                          "ours_s": round(statistics.median(ours_s), 3), "ours_spread": [round(min(ours_s), 3),
                                                                                          round(max(ours_s), 3)],
                          "tokenizers_s": round(statistics.median(theirs_s), 3),
                          "tokenizers_spread": [round(min(theirs_s), 3), round(max(theirs_s), 3)],
                          "ours_over_tokenizers": round(statistics.median(ours_s) / statistics.median(theirs_s), 2)}),
              flush=True)


if __name__ == "__main__":
    main()
