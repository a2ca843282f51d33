#!/usr/bin/env python3
"""Prints `expanse bench` JSON lines (stdin) as a short table: op, layout, t, chunk, ms, TFLOP/s."""
import json
import sys

for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    layout = r["config"].split("--layout ")[1].split()[0] if "--layout " in r["config"] else "?"
    print(f'{r["op"]:22s} {layout:9s} t={r["t"]:6d} c={r["chunk"]:5d} {r["median_ms"]:9.3f} ms {r["tflops"]:7.1f} TFLOP/s')
