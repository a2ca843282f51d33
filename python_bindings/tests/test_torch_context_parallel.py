"""expanse.torch.context_parallel_power_attention (skipped without PyTorch): ranks are processes,
each with its piece of one sequence; their outputs and gradients (and the final state's) equal one
expanse.power_attention call over the whole sequence. On the CPU: gloo, the reference backend,
float64, within 1e-12. On a machine with 2 or more CUDA devices, also: NCCL, one GPU per rank, the
cuda backend, float32, within 1e-5 of one call on GPU 0 (docs/spec.md's f32 tolerance)."""

import os

import pytest

torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import expanse  # noqa: E402
import expanse.torch  # noqa: E402

# (bounds of the pieces, options): uneven pieces, one of a single token; grouped heads, gates with
# resets, an initial state and the final state; ungated, unnormalized p = 1.
CASES = [
    ([0, 13, 14, 40], dict(p=2, normalize=True, gated=True, resets=True, initial=True, chunk_size=8)),
    ([0, 29, 40], dict(p=1, normalize=False, gated=False, resets=False, initial=False, chunk_size=None)),
]


def _problem(opts, seed):
    """The whole sequence's inputs, cotangents of o and of the final state (the same on every rank)."""
    gen = torch.Generator().manual_seed(seed)
    b, t, hq, h, d, e = 2, 40, 4, 2, 6, 5
    f = torch.float64
    q, k, v = (torch.randn(b, t, n, w, dtype=f, generator=gen) for n, w in ((hq, d), (h, d), (h, e)))
    log_g = None
    if opts["gated"]:
        log_g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, dtype=f, generator=gen) + 1)
        if opts["resets"]:
            log_g[torch.rand(b, t, h, generator=gen) < 0.15] = float("-inf")
    D = expanse.expanded_dim(d, p=opts["p"])
    initial = None
    if opts["initial"]:
        initial = (torch.randn(b, h, D, e, dtype=f, generator=gen), torch.rand(b, h, D, dtype=f, generator=gen) + 1)
    do = torch.randn(b, t, hq, e, dtype=f, generator=gen)
    dS = torch.randn(b, h, D, e, dtype=f, generator=gen)
    dz = torch.randn(b, h, D, dtype=f, generator=gen) if opts["normalize"] else None
    return q, k, v, log_g, initial, do, dS, dz


def _loss(o, do, final, dS, dz):
    S, z = final
    loss = (o * do).sum() + (S * dS).sum()
    return loss + (z * dz).sum() if z is not None else loss


# Where the ranks run: (process group backend, expanse backend, tolerance), and the tensors' device and dtype.
WHERE = {"cpu": ("gloo", "reference", 1e-12), "cuda": ("nccl", None, 1e-5)}


def _on(where, rank, x):
    """x (float64 on the CPU) as the ranks of `where` take it."""
    if x is None or where == "cpu":
        return x
    return x.float().to(f"cuda:{rank}")


def _leaves(q, k, v, log_g, initial):
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    lg = log_g.clone().requires_grad_() if log_g is not None else None
    init = tuple(x.clone().requires_grad_() for x in initial) if initial is not None else None
    return xs, lg, init


def _rank(rank, world, init_file, out_dir, case, seed, where, exchange):
    group_backend, backend, _ = WHERE[where]
    if where == "cuda":
        torch.cuda.set_device(rank)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group(group_backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        bounds, opts = CASES[case]
        problem = _problem(opts, seed)
        q, k, v, log_g, do, dS, dz = (_on(where, rank, x) for x in problem[:4] + problem[5:])
        initial = None if problem[4] is None else tuple(_on(where, rank, x) for x in problem[4])
        first, last = bounds[rank], bounds[rank + 1]
        piece = lambda x: x[:, first:last].clone()  # noqa: E731
        (qr, kr, vr), lg, init = _leaves(piece(q), piece(k), piece(v), piece(log_g) if log_g is not None else None,
                                         initial)
        o, final = expanse.torch.context_parallel_power_attention(
            qr, kr, vr, lg, p=opts["p"], normalize=opts["normalize"], chunk_size=opts["chunk_size"],
            initial_state=init, output_final_state=True, backend=backend, exchange=exchange)
        # The final state's cotangent enters on the last rank only (it is the same state on every rank).
        last_rank = rank == world - 1
        loss = _loss(o, piece(do), final, dS if last_rank else torch.zeros_like(dS),
                     (dz if last_rank else torch.zeros_like(dz)) if dz is not None else None)
        loss.backward()
        result = {"o": o.detach(), "final": tuple(x.detach() if x is not None else None for x in final),
                  "dq": qr.grad, "dk": kr.grad, "dv": vr.grad, "dlog_g": lg.grad if lg is not None else None,
                  "dinit": tuple(x.grad for x in init) if init is not None else None}
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))  # loaded onto the CPU
        # No rank tears its connections down while another may still use them (gloo aborted a rank
        # that did, once in a CI run: "terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _rel(a, b):
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float((a - b).norm())


def _check_against_one_call(tmp_path, case, where, exchange):
    bounds, opts = CASES[case]
    world, seed = len(bounds) - 1, 17 + case
    _, backend, tol = WHERE[where]
    mp.spawn(_rank, args=(world, str(tmp_path / "init"), str(tmp_path), case, seed, where, exchange), nprocs=world,
             join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(world)]

    problem = _problem(opts, seed)
    q, k, v, log_g, do, dS, dz = (_on(where, 0, x) for x in problem[:4] + problem[5:])
    initial = None if problem[4] is None else tuple(_on(where, 0, x) for x in problem[4])
    (wq, wk, wv), wlg, winit = _leaves(q, k, v, log_g, initial)
    o, final = expanse.power_attention(wq, wk, wv, wlg, p=opts["p"], normalize=opts["normalize"],
                                       chunk_size=opts["chunk_size"], initial_state=winit, output_final_state=True,
                                       backend=backend)
    _loss(o, do, final, dS, dz).backward()
    cpu = lambda x: x.detach().cpu()  # noqa: E731

    cat = lambda name: torch.cat([r[name] for r in ranks], dim=1)  # noqa: E731
    assert _rel(cat("o"), cpu(o)) <= tol
    for r in ranks:  # every rank returns the sequence's final state
        assert _rel(r["final"][0], cpu(final[0])) <= tol
        if opts["normalize"]:
            assert _rel(r["final"][1], cpu(final[1])) <= tol
    for name, ref in (("dq", wq.grad), ("dk", wk.grad), ("dv", wv.grad)):
        assert _rel(cat(name), cpu(ref)) <= tol, name
    if wlg is not None:
        assert _rel(cat("dlog_g"), cpu(wlg.grad)) <= tol
    if winit is not None:  # rank 0's initial state gets the whole gradient, the others' none
        for got, ref in zip(ranks[0]["dinit"], (x.grad for x in winit)):
            assert _rel(got, cpu(ref)) <= tol
        for r in ranks[1:]:
            assert all(g is None or float(g.abs().max()) == 0 for g in r["dinit"])


@pytest.mark.parametrize("exchange", expanse.torch.EXCHANGES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_context_parallel_equals_one_call(tmp_path, case, exchange):
    _check_against_one_call(tmp_path, case, "cpu", exchange)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                    or not dist.is_nccl_available(), reason="skipped: needs 2 CUDA devices and NCCL")
@pytest.mark.parametrize("exchange", expanse.torch.EXCHANGES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_context_parallel_on_gpus_equals_one_gpu(tmp_path, case, exchange):
    ranks = len(CASES[case][0]) - 1
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"skipped: this case takes {ranks} CUDA devices, {torch.cuda.device_count()} visible")
    _check_against_one_call(tmp_path, case, "cuda", exchange)


def test_needs_an_initialized_process_group():
    q, k, v, log_g, *_ = _problem(CASES[0][1], 1)
    with pytest.raises(expanse.InvalidArgumentError, match="init_process_group"):
        expanse.torch.context_parallel_power_attention(q, k, v, log_g, backend="reference")


def test_refuses_an_unknown_exchange(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        q, k, v, log_g, *_ = _problem(CASES[0][1], 1)
        with pytest.raises(expanse.InvalidArgumentError, match="argument 'exchange' must be one of allgather, ring"):
            expanse.torch.context_parallel_power_attention(q, k, v, log_g, backend="reference", exchange="tree")
    finally:
        dist.destroy_process_group()
