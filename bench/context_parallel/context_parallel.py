"""Context parallelism's time per step (docs/spec.md "Context parallelism"): each rank of a
torch.distributed group holds --t-per-rank tokens of one sequence and runs
expanse.torch.context_parallel_power_attention, forward alone (no autograd) and forward+backward.
Against it, each rank runs expanse.power_attention on its own tokens alone, without the exchange:
the weak-scaling baseline (the same tokens per GPU); with --strong, rank 0 also runs the whole
sequence alone (the strong-scaling baseline, where it fits in one GPU). Times are the medians over
--reps of CUDA events (perf_counter on the CPU), of the slowest rank. Rank 0 prints one JSON line.

    torchrun --nproc-per-node=2 bench/context_parallel/context_parallel.py --t-per-rank 1048576
    torchrun --nproc-per-node=2 bench/context_parallel/context_parallel.py --t-per-rank 1048576 --exchange ring
    python3 -m torch.distributed.run --nproc-per-node=2 bench/context_parallel/context_parallel.py \\
        --on cpu --backend reference --t-per-rank 200 --kv-heads 2 --head-dim 8 --dtype f32 --reps 2

NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0) unless the environment sets it.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import expanse
import expanse.torch

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def timed(fn, reps, warmup, cuda):
    """Median milliseconds of fn() over reps runs after warmup runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def every_rank(ms, device):
    """Every rank's value, in rank order."""
    t = torch.tensor([ms], dtype=torch.float64, device=device)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return [round(float(x.item()), 3) for x in parts]


def slowest(ms, device):
    """The largest of every rank's value (a step lasts as long as its slowest rank)."""
    t = torch.tensor([ms], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--t-per-rank", type=int, default=1 << 20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64, help="d = e")
    ap.add_argument("--degree", type=int, default=2, help="p")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--on", choices=["cuda", "cpu"], default="cuda", help="the tensors' device")
    ap.add_argument("--backend", default=None, help="expanse backend (default: the tensors' device decides)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--exchange", choices=expanse.torch.EXCHANGES, default="allgather", help="how the states pass")
    ap.add_argument("--strong", action="store_true", help="also time the whole sequence on rank 0 alone")
    ap.add_argument("--profile", action="store_true",
                    help="print to stderr the GPU time per kernel, CP and alone: rank 0's of one forward+backward "
                         "step, the last rank's of one forward")
    args = ap.parse_args()

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    cuda = args.on == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda" if cuda else "cpu")
    b, t, h, d, dtype = args.batch, args.t_per_rank, args.kv_heads, args.head_dim, DTYPES[args.dtype]

    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    def inputs(tokens):  # noqa: E306
        q, k, v = (torch.randn(b, tokens, h, d, device=device, dtype=dtype, generator=gen) for _ in range(3))
        log_g = F.logsigmoid(torch.randn(b, tokens, h, device=device, generator=gen) + 4)
        return q, k, v, log_g
    q, k, v, log_g = inputs(t)
    do = torch.randn_like(q)
    opts = dict(p=args.degree, chunk_size=args.chunk_size, backend=args.backend)

    def cp_forward():
        with torch.no_grad():
            expanse.torch.context_parallel_power_attention(q, k, v, log_g, exchange=args.exchange, **opts)

    leaves = [x.detach().requires_grad_() for x in (q, k, v, log_g)]
    def cp_step():  # noqa: E306
        expanse.torch.context_parallel_power_attention(*leaves, exchange=args.exchange, **opts).backward(do)

    def alone_forward():
        with torch.no_grad():
            expanse.power_attention(q, k, v, log_g, **opts)

    def alone_step():
        expanse.power_attention(*leaves, **opts).backward(do)

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = {"ranks": ranks, "t_per_rank": t, "t_total": t * ranks, "b": b, "h": h, "d": d, "p": args.degree,
              "dtype": args.dtype, "chunk_size": args.chunk_size, "exchange": args.exchange,
              "device": torch.cuda.get_device_name() if cuda else "cpu", "version": expanse.__version__,
              "date": time.strftime("%Y-%m-%d", time.gmtime())}
    cp_fwd = timed(cp_forward, args.reps, args.warmup, cuda)
    result["cp_fwd_ms"], result["cp_fwd_ms_by_rank"] = slowest(cp_fwd, device), every_rank(cp_fwd, device)
    result["cp_fwdbwd_ms"] = slowest(timed(cp_step, args.reps, args.warmup, cuda), device)
    if cuda:
        result["cp_peak_bytes"] = int(slowest(torch.cuda.max_memory_allocated(), device))
    dist.barrier()
    result["alone_fwd_ms"] = slowest(timed(alone_forward, args.reps, args.warmup, cuda), device)
    result["alone_fwdbwd_ms"] = slowest(timed(alone_step, args.reps, args.warmup, cuda), device)
    result["weak_efficiency_fwd"] = result["alone_fwd_ms"] / result["cp_fwd_ms"]
    result["weak_efficiency_fwdbwd"] = result["alone_fwdbwd_ms"] / result["cp_fwdbwd_ms"]
    # What each rank sends per pass (forward and backward alike): a state, normalizer and total
    # decay, f32; it receives that from every rank (all-gather) or from one (ring).
    D = expanse.expanded_dim(d, p=args.degree)
    result["bytes_sent_per_rank"] = b * h * (D * d + D + 1) * 4
    result["bytes_received_per_rank"] = result["bytes_sent_per_rank"] * (ranks if args.exchange == "allgather" else 1)
    if args.profile and cuda:
        for name, step in (("context parallel", cp_step), ("alone", alone_step)):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            if rank == 0:
                print(f"--- {name}: one forward+backward step, GPU time by kernel", file=sys.stderr)
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), file=sys.stderr)
        for name, step in (("context parallel", cp_forward), ("alone", alone_forward)):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            if rank == ranks - 1:
                print(f"--- {name}: one forward on the last rank, GPU time by kernel", file=sys.stderr)
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30), file=sys.stderr)
    if args.strong and rank == 0:
        del leaves[:]
        q, k, v, log_g = inputs(t * ranks)
        do = torch.randn_like(q)
        leaves = [x.detach().requires_grad_() for x in (q, k, v, log_g)]
        whole_fwd = timed(alone_forward, args.reps, args.warmup, cuda)
        whole_step = timed(alone_step, args.reps, args.warmup, cuda)
        result.update(whole_fwd_ms=whole_fwd, whole_fwdbwd_ms=whole_step,
                      strong_efficiency_fwd=whole_fwd / (ranks * result["cp_fwd_ms"]),
                      strong_efficiency_fwdbwd=whole_step / (ranks * result["cp_fwdbwd_ms"]))
    dist.barrier()
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
