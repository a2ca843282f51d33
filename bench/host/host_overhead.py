"""The host's time per call of the Python package: power_attention_step on a tiny problem (a
decoding step, whose device work is microseconds), on numpy arrays (the reference) or, with
--torch, on CUDA tensors of PyTorch. One JSON line per measurement.

    python3 bench/host/host_overhead.py [--backend NAME] [--torch] [--calls N]
"""
import argparse
import json
import time

import numpy as np

import expanse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default=None)
    ap.add_argument("--torch", action="store_true", help="CUDA tensors of PyTorch (the cuda backend)")
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    b, h, d, e = 1, 1, 16, 16
    D = d * (d + 1) // 2
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((b, h, d), (b, h, d), (b, h, e), (b, h))]
    S, z = np.zeros((b, h, D, e), np.float32), np.zeros((b, h, D), np.float32)
    sync = lambda: None  # noqa: E731
    if args.torch:
        import torch
        arrays = [torch.from_numpy(a).cuda() for a in arrays]
        S, z = torch.from_numpy(S).cuda(), torch.from_numpy(z).cuda()
        sync = torch.cuda.synchronize
    q, k, v, log_g = arrays
    log_g = -abs(log_g)  # decays below 1
    step = lambda: expanse.power_attention_step(q, k, v, log_g, state=(S, z), backend=args.backend)  # noqa: E731
    for _ in range(args.calls // 10 + 1):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.calls):
        step()
    sync()
    us = (time.perf_counter() - start) / args.calls * 1e6
    print(json.dumps({"backend": args.backend or ("cuda" if args.torch else "reference"),
                      "what": "python power_attention_step b=1 h=1 d=16 e=16 p=2 f32", "us_per_call": round(us, 3)}))


if __name__ == "__main__":
    main()
