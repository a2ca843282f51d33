"""The layer's attention written in plain PyTorch, and the training loop the layer tests share (the
CPU tests in test_torch_autograd.py, the GPU ones in test_torch_cuda.py)."""

import contextlib

import torch


def power_attention(q, k, v, log_g=None, *, p=2, normalize=True, **unused):
    """docs/spec.md's power attention in plain PyTorch (the quadratic form, in f32, or f64 for f64 inputs):
    the layer's oracle."""
    b, t, hq, d = q.shape
    group = hq // k.shape[2]
    f = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = q.to(f) * d ** -0.5, k.to(f).repeat_interleave(group, 2), v.to(f).repeat_interleave(group, 2)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    a = torch.einsum("bihd,bjhd->bhij", qf, kf) ** p
    if log_g is not None:
        G = log_g.to(f).cumsum(1).repeat_interleave(group, 2).transpose(1, 2)  # [b, hq, t]
        a = a * torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")))
    a = a.masked_fill(~causal, 0)
    o = torch.einsum("bhij,bjhe->bihe", a, vf)
    if normalize:
        o = o / a.sum(-1).transpose(1, 2)[..., None]
    return o.to(q.dtype)


def train(layer, x, steps, autocast=None):
    """Adam on a toy task (predict the previous token); the loss of every step. autocast: a dtype to
    run the model under torch.autocast with (mixed precision), or None."""
    opt = torch.optim.Adam(layer.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        mixed = torch.autocast(x.device.type, dtype=autocast) if autocast else contextlib.nullcontext()
        with mixed:
            y = layer(x)
        loss = (y.to(x.dtype) - x.roll(1, dims=1)).square().mean()  # predict the previous token
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
