#!/usr/bin/env python3
"""A stranger floods the run's store (`tributary store`) with idle connections; can the run's own client still get in?

Three strangers: silent connections from the client's own address (loopback), connections that send c10d's first
message (VALIDATE) and then idle, from the same address, and the same from another address (a network namespace
joined by a veth pair; skipped where namespaces are not permitted). Prints, per case, how many connections the
stranger opened, the store host's memory, and how long c10d's own client (PyTorch's TCPStore) took to be served.
--secret also runs our server with a run secret, where the run's client proves it (comm/sealed_store.h: the HMAC of
the server's nonce) and the stranger cannot. docs/benchmarks.md §23.
Usage: python3 bench/store_flood.py --build build [--connections 6000] [--c10d-too] [--secret]
"""
import argparse, datetime, os, resource, secrets, socket, struct, subprocess, sys, time

MAGIC = struct.pack("<I", 0x3C85F7CE)


def rss_mb(pid):
    return int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0]) // 1024


LEGIT = """
import datetime, hashlib, hmac, sys, time
import torch.distributed as dist
start = time.time()
store = dist.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=float(sys.argv[2])))
if len(sys.argv) > 3:  # the run's key: prove it before anything else
    nonce = store.get('/tributary/auth/challenge')
    store.set('/tributary/auth/proof',
              hmac.new(bytes.fromhex(sys.argv[3]), b'tributary store proof v1:' + nonce, hashlib.sha256).digest())
store.set('k', 'v')
assert store.get('k') == b'v'
print(time.time() - start)
"""


def legit_client(port, timeout_s, key_hex=None):
    # In its own process with a hard limit: c10d's client ignored its own timeout against a flooded c10d server.
    start = time.time()
    try:
        r = subprocess.run([sys.executable, "-c", LEGIT, str(port), str(timeout_s)] + ([key_hex] if key_hex else []),
                           capture_output=True, text=True, timeout=timeout_s + 15)
        if r.returncode == 0:
            return f"served after {float(r.stdout.split()[-1]):.2f} s"
        return f"NOT served: failed after {time.time() - start:.1f} s"
    except subprocess.TimeoutExpired:
        return f"NOT served: still waiting after {time.time() - start:.1f} s (its timeout: {timeout_s:.0f} s)"


FLOOD = """
import socket, struct, sys, time, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
host, port, n, introduce = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1'
held = []
for i in range(n):
    try:
        s = socket.create_connection((host, port), timeout=2)
        if introduce: s.sendall(bytes([0]) + struct.pack('<I', 0x3C85F7CE))
        held.append(s)
    except Exception:
        break
print(len(held), flush=True)
time.sleep(600)
"""


C10D_HOST = """
import datetime, resource, sys, time
import torch.distributed as dist
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
store = dist.TCPStore('0.0.0.0', int(sys.argv[1]), is_master=True, use_libuv=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=60))
time.sleep(600)
"""


def case(args, server, name, introduce, netns):
    port = 29700 + abs(hash(server + name)) % 200
    ours = server.startswith("tributary")
    host_cmd = ([os.path.join(args.build, "tributary"), "store", "--port", str(port)] if ours
                else [sys.executable, "-c", C10D_HOST, str(port)])
    key_hex = secrets.token_hex(32) if server == "tributary+secret" else None
    env = dict(os.environ, TRIBUTARY_RUN_SECRET=key_hex) if key_hex else None
    store = subprocess.Popen(host_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(200):  # until the host listens (a Python host imports torch first)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(6)  # the probe above is a silent connection: let the host close it
    host = "10.99.0.1" if netns else "127.0.0.1"
    cmd = ([] if not netns else ["ip", "netns", "exec", "tribflood"]) + [
        sys.executable, "-c", FLOOD, host, str(port), str(args.connections), "1" if introduce else "0"]
    flood = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    opened = flood.stdout.readline().strip()
    outcome = legit_client(port, args.client_timeout, key_hex)
    print(f"{server:<16} {name:<49} stranger opened {opened:>5}; store host {rss_mb(store.pid)} MB, alive: "
          f"{store.poll() is None}; the run's client: {outcome}", flush=True)
    flood.kill()
    store.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--connections", type=int, default=6000)
    ap.add_argument("--client-timeout", type=float, default=20)
    ap.add_argument("--c10d-too", action="store_true", help="also flood c10d's own server (PyTorch's TCPStore host)")
    ap.add_argument("--secret", action="store_true", help="also our server with a run secret")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
    servers = ["tributary"] + (["tributary+secret"] if args.secret else []) + (["c10d"] if args.c10d_too else [])
    for server in servers:
        case(args, server, "silent, from the client's address", False, False)
        case(args, server, "introduced (VALIDATE), from the client's address", True, False)
    ok = subprocess.run("ip netns add tribflood && ip link add tribf0 type veth peer name tribf1 && "
                        "ip link set tribf1 netns tribflood && ip addr add 10.99.0.1/24 dev tribf0 && "
                        "ip link set tribf0 up && ip netns exec tribflood ip addr add 10.99.0.2/24 dev tribf1 && "
                        "ip netns exec tribflood ip link set tribf1 up", shell=True,
                        stderr=subprocess.DEVNULL).returncode == 0
    try:
        for server in servers if ok else []:
            case(args, server, "introduced (VALIDATE), from another address", True, True)
        if not ok:
            print("another address: skipped (network namespaces not permitted)")
    finally:
        subprocess.run("ip netns del tribflood; ip link del tribf0", shell=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
