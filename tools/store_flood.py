#!/usr/bin/env python3
"""A stranger's connection flood against a run's store (issue 66, item 11): from several source addresses
(127.0.0.2, 127.0.0.3, ... on this machine's loopback, or the addresses given), open as many connections as the store
takes, introduce each with c10d's VALIDATE (so the store keeps it until its deadline for the run's proof), and open a
new one for every one the store closes. Without the run's secret none of them is ever served; what the flood tests is
whether the run's own workers still connect, and whether their heartbeats still arrive in time.

    python3 tools/store_flood.py --port 29517 --seconds 60 [--addresses 8] [--per-address 512]

Prints one line every 5 s (connects so far, connections held) and a summary line at the end. For measurement only:
run it against your own run.
"""
import argparse
import errno
import resource
import selectors
import socket
import struct
import threading
import time

VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)  # c10d's first request: VALIDATE with the protocol's magic


def flood_from(source, args, stop, stats, lock):
    sel = selectors.DefaultSelector()
    held = set()
    while not stop.is_set():
        while len(held) < args.per_address and not stop.is_set():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((source, 0))
                s.settimeout(2)
                s.connect((args.host, args.port))
                s.sendall(VALIDATE)
                s.setblocking(False)
            except OSError as e:
                s.close()
                with lock:
                    stats["failed"] += 1
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    time.sleep(0.1)
                break  # refused or full: try again after the next turn
            sel.register(s, selectors.EVENT_READ)
            held.add(s)
            with lock:
                stats["connects"] += 1
        for key, _ in sel.select(timeout=0.05):  # closed by the store (or an answer, which a stranger never gets)
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                held.discard(s)
                s.close()
                with lock:
                    stats["closed_by_store"] += 1
        with lock:
            stats["held"][source] = len(held)
    for s in list(held):
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--addresses", type=int, default=8, help="source addresses 127.0.0.2 ... (loopback)")
    ap.add_argument("--source", action="append", default=[], help="a source address to use (instead of loopback's)")
    ap.add_argument("--per-address", type=int, default=512)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sources = args.source or [f"127.0.0.{2 + i}" for i in range(args.addresses)]
    stop = threading.Event()
    lock = threading.Lock()
    stats = {"connects": 0, "failed": 0, "closed_by_store": 0, "held": {}}
    threads = [threading.Thread(target=flood_from, args=(src, args, stop, stats, lock), daemon=True) for src in sources]
    for t in threads:
        t.start()
    start = time.time()
    next_line = 5
    while time.time() - start < args.seconds:
        time.sleep(0.2)
        if time.time() - start >= next_line:
            with lock:
                print(f"flood: {time.time() - start:.0f} s, {stats['connects']} connects, "
                      f"{sum(stats['held'].values())} held, {stats['closed_by_store']} closed by the store, "
                      f"{stats['failed']} refused", flush=True)
            next_line += 5
    stop.set()
    for t in threads:
        t.join(timeout=5)
    with lock:
        print(f"flood done: {stats['connects']} connects from {len(sources)} addresses in {args.seconds:.0f} s "
              f"({stats['connects'] / args.seconds:.0f}/s), {stats['closed_by_store']} closed by the store, "
              f"{stats['failed']} refused", flush=True)


if __name__ == "__main__":
    main()
