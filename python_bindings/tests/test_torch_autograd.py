"""expanse.power_attention under PyTorch autograd and torch.compile, on the CPU (the reference
backend; skipped without PyTorch): gradcheck in f64, the gradients equal power_attention_backward's,
no graph break and compiled gradients equal to eager ones, and expanse.torch.PowerAttention trains,
with the loss curve of the same layer written in plain PyTorch."""

import copy

import numpy as np
import pytest

import expanse

torch = pytest.importorskip("torch", reason="skipped: PyTorch is not installed")
import expanse.torch  # noqa: E402  (needs torch)
import plain_torch  # noqa: E402


def _inputs(gen, b=1, t=13, hq=4, h=2, d=4, e=3, dtype=torch.float64):
    q, k, v = (torch.randn(b, t, n, w, dtype=dtype, generator=gen) for n, w in ((hq, d), (h, d), (h, e)))
    log_g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, dtype=torch.float64, generator=gen) + 2)
    return q, k, v, log_g


@pytest.mark.parametrize("chunk_size", [0, 4, None])
def test_gradcheck(chunk_size):
    gen = torch.Generator().manual_seed(1)
    q, k, v, log_g = _inputs(gen)
    D = expanse.expanded_dim(4, p=2)
    S0 = torch.randn(1, 2, D, 3, dtype=torch.float64, generator=gen)
    z0 = torch.rand(1, 2, D, dtype=torch.float64, generator=gen) + 1
    args = [x.requires_grad_() for x in (q, k, v, log_g, S0, z0)]

    def f(q, k, v, log_g, S0, z0):
        o, (S, z) = expanse.power_attention(q, k, v, log_g, chunk_size=chunk_size, initial_state=(S0, z0),
                                            output_final_state=True)
        return o, S, z

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-6)
    f3 = lambda q, k, v: expanse.power_attention(q, k, v, p=3, normalize=False, chunk_size=chunk_size)  # noqa: E731
    assert torch.autograd.gradcheck(f3, args[:3])


def test_autograd_equals_power_attention_backward():
    gen = torch.Generator().manual_seed(2)
    q, k, v, log_g = (x.float().requires_grad_() for x in _inputs(gen, t=40, d=8, e=8))
    o = expanse.power_attention(q, k, v, log_g, chunk_size=16)
    do = torch.randn(o.shape, generator=gen)
    o.backward(do)
    ref = expanse.power_attention_backward(*(x.detach().numpy() for x in (q, k, v, log_g)), do.numpy(),
                                           chunk_size=16, o=o.detach().numpy())
    for x, g in zip((q, k, v, log_g), ref):
        assert np.array_equal(x.grad.numpy(), g)


def test_compile_has_no_graph_break():
    layer = expanse.torch.PowerAttention(32, n_heads=4, n_kv_heads=2, head_dim=8)
    x = torch.randn(2, 30, 32)
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_compiled_layer_gradients_equal_eager():
    """torch.compile through AOTAutograd (forward and backward graphs from the fake implementations and
    the registered autograd formula) gives the eager gradients."""
    torch.manual_seed(5)
    layer = expanse.torch.PowerAttention(32, n_heads=4, n_kv_heads=2, head_dim=8, chunk_size=8)
    x = torch.randn(2, 30, 32)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    grads = []
    for model in (layer, compiled):
        layer.zero_grad()
        model(x).square().sum().backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for eager, traced in zip(*grads):
        torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-6)


def test_power_attention_layer_trains():
    """A few steps of a copy task: the loss goes down, through every parameter."""
    torch.manual_seed(3)
    layer = expanse.torch.PowerAttention(16, n_heads=2, head_dim=8)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    x = torch.randn(4, 24, 16)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = (layer(x) - x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


def test_core_operations_gradcheck():
    """update_state, discumsum, query_state and chunk_attention are differentiable (f64, reference)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v, log_g = (x.requires_grad_() for x in _inputs(gen, t=9, d=3, e=2))
    assert torch.autograd.gradcheck(lambda k, v, g: expanse.update_state(k, v, g, chunk_size=4), (k, v, log_g))
    X = torch.randn(1, 3, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    A = (-torch.rand(1, 3, 2, dtype=torch.float64, generator=gen)).requires_grad_()
    Y0 = torch.randn(1, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(expanse.discumsum, (X, A, Y0))
    S, z = (x.detach() for x in expanse.update_state(k, v, log_g, chunk_size=4))
    y, l, rowmax = (x.detach() for x in expanse.chunk_attention(q, k, v, log_g, chunk_size=4))
    S, z, y, l = (x.requires_grad_() for x in (S, z + 1, y, l))
    assert torch.autograd.gradcheck(
        lambda q, S, z, g, y, l: expanse.query_state(q, S, z, g, intra=(y, l, rowmax), chunk_size=4),
        (q, S, z, log_g, y, l))
    # rowmax is a stabilizer without a gradient: the gradients are those of y and l at a fixed rowmax,
    # i.e. of y exp(rowmax - rowmax_0) and l exp(rowmax - rowmax_0), which do not depend on it.
    def fixed_rowmax(q, k, v, g):
        y2, l2, m2 = expanse.chunk_attention(q, k, v, g, chunk_size=4)
        f = torch.exp(m2 - rowmax)
        return y2 * f[..., None], l2 * f

    assert torch.autograd.gradcheck(fixed_rowmax, (q, k, v, log_g))


def test_core_operations_compose_to_power_attention():
    """The chunked algorithm written with the core operations in PyTorch gives power_attention's
    gradients (autograd through the four operators)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, log_g = (x.requires_grad_() for x in _inputs(gen, t=20, d=4, e=3))
    c, n = 8, 3

    def composed(q, k, v, log_g):
        S, z = expanse.update_state(k, v, log_g, chunk_size=c)
        A = torch.stack([log_g[:, m * c:(m + 1) * c].sum(1) for m in range(n)], 1)
        S_in, z_in = expanse.discumsum(S, A)[:, :n], expanse.discumsum(z, A)[:, :n]
        y, l, rowmax = expanse.chunk_attention(q, k, v, log_g, chunk_size=c)
        return expanse.query_state(q, S_in, z_in, log_g, intra=(y, l, rowmax), chunk_size=c)

    do = torch.randn(1, 20, 4, 3, dtype=torch.float64, generator=gen)
    mine = torch.autograd.grad((composed(q, k, v, log_g) * do).sum(), (q, k, v, log_g))
    ref = torch.autograd.grad((expanse.power_attention(q, k, v, log_g, chunk_size=c) * do).sum(), (q, k, v, log_g))
    for a, b in zip(mine, ref):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_layer_trains_like_plain_pytorch(monkeypatch, dtype):
    """expanse.torch.PowerAttention (chunked, grouped heads, gated) and the same layer with the attention
    written in plain PyTorch, from the same weights on the same data: matching loss curves over 200 Adam
    steps, and the loss falls. In f64 the gradients agree to about 1e-15 and Adam amplifies that to 3e-7
    over the 200 steps; from f32's 1e-7 the same growth gives a few percent (3% measured), so the f32
    curves are compared at 5e-2."""
    torch.manual_seed(4)
    layer = expanse.torch.PowerAttention(32, n_heads=4, n_kv_heads=2, head_dim=8, chunk_size=16, dtype=dtype)
    plain = copy.deepcopy(layer)
    x = torch.randn(2, 40, 32, dtype=dtype)
    ours = plain_torch.train(layer, x, 200)
    with monkeypatch.context() as m:
        m.setattr(expanse.torch._ops, "power_attention", plain_torch.power_attention)
        theirs = plain_torch.train(plain, x, 200)
    assert ours[-1] < 0.2 * ours[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5 if dtype == torch.float64 else 5e-2)
