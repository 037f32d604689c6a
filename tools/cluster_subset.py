#!/usr/bin/env python3
"""Writes a cluster file (full-matrix format, sched/cluster.h) of some devices of another one, ids shuffled.

usage: cluster_subset.py SOURCE.json DEVICES SEED OUT.json   (DEVICES: comma-separated indices into SOURCE)
Real clusters do not number devices by location: the shuffle makes rank order (Megatron) an arbitrary placement,
as in the DT-FM paper's experiments. SEED < 0 keeps the given order.
"""
import json
import random
import sys

src, devices, seed, out = sys.argv[1], [int(d) for d in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
c = json.load(open(src))
if seed >= 0:
    random.Random(seed).shuffle(devices)
pick = lambda m: [[m[a][b] for b in devices] for a in devices]
json.dump({"name": f"{c.get('name', src)}[{','.join(map(str, devices))}]",
           "latency_ms": pick(c["latency_ms"]), "bandwidth_gbps": pick(c["bandwidth_gbps"]),
           "device_regions": [c["device_regions"][d] for d in devices]}, open(out, "w"), indent=1)
