"""An independent float64 implementation of docs/spec.md in plain numpy, written from the definitions
(loops and einsums, no code shared with the library): the oracle of the Python tests."""

import itertools
import math
from collections import Counter

import numpy as np


def _multinomial(indices):
    """p! / prod(hist_k!) of a multi-index."""
    value = math.factorial(len(indices))
    for count in Counter(indices).values():
        value //= math.factorial(count)
    return value


def _outer(a, b):
    """Row-major tensor product over the last axis: [..., m] x [..., n] -> [..., m*n]."""
    return (a[..., :, None] * b[..., None, :]).reshape(*a.shape[:-1], -1)


def phi(x, p, layout="sympow"):
    """The feature map of docs/spec.md: x [..., d] -> [..., D] with <phi(a), phi(b)> = (a . b)^p."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    if layout == "tensor":
        out = x
        for _ in range(p - 1):
            out = _outer(out, x)
        return out
    if layout == "sympow":
        cols = []
        for idx in itertools.combinations_with_replacement(range(d), p):
            col = np.full(x.shape[:-1], math.sqrt(_multinomial(idx)))
            for i in idx:
                col = col * x[..., i]
            cols.append(col)
        return np.stack(cols, axis=-1)
    if layout.startswith("tiled:"):
        dt = int(layout[6:])
        blocks = []
        for tiles in itertools.combinations_with_replacement(range(d // dt), p):
            block = x[..., tiles[0] * dt:(tiles[0] + 1) * dt]
            for a in tiles[1:]:
                block = _outer(block, x[..., a * dt:(a + 1) * dt])
            blocks.append(math.sqrt(_multinomial(tiles)) * block)
        return np.concatenate(blocks, axis=-1)
    raise ValueError(layout)


def _gates(log_g, shape):
    return np.zeros(shape) if log_g is None else np.asarray(log_g, dtype=np.float64)


def _divide(num, den):
    """num / den, 0 where den == 0 (SPEC: o_i = 0 where the denominator is exactly 0)."""
    safe = np.where(den == 0, 1.0, den)
    return np.where((den == 0)[..., None], 0.0, num / safe[..., None])


def power_attention(q, k, v, log_g=None, p=2, scale=None, normalize=True, S0=None, z0=None, layout="sympow"):
    """Quadratic form with the initial-state terms: o [b, t, hq, e]."""
    b, t, hq, d = q.shape
    h, e = k.shape[2], v.shape[3]
    r = hq // h
    scale = 1 / math.sqrt(d) if scale is None else scale
    G = np.cumsum(_gates(log_g, (b, t, h)), axis=1)
    causal = np.tril(np.ones((t, t), dtype=bool))
    o = np.zeros((b, t, hq, e))
    for bi in range(b):
        for i in range(hq):
            j = i // r
            Gj = G[bi, :, j]
            decay = np.exp(np.where(causal, Gj[:, None] - Gj[None, :], -np.inf))
            A = (scale * q[bi, :, i] @ k[bi, :, j].T) ** p * decay
            num, den = A @ v[bi, :, j], A.sum(axis=1)
            if S0 is not None:
                f = phi(scale * q[bi, :, i], p, layout)
                num = num + (f @ S0[bi, j]) * np.exp(Gj)[:, None]
                if z0 is not None:
                    den = den + (f @ z0[bi, j]) * np.exp(Gj)
            o[bi, :, i] = _divide(num, den) if normalize else num
    return o


def final_state(k, v, log_g=None, p=2, layout="sympow", S0=None, z0=None):
    """The recurrent form's (S_t, z_t) after the last token: S [b, h, D, e], z [b, h, D]."""
    b, t, h, _ = k.shape
    G = np.cumsum(_gates(log_g, (b, t, h)), axis=1)
    fk = phi(k, p, layout)
    w = np.exp(G[:, -1:, :] - G)
    S = np.einsum("bth,bthD,bthe->bhDe", w, fk, v)
    z = np.einsum("bth,bthD->bhD", w, fk)
    if S0 is not None:
        S = S + np.exp(G[:, -1])[..., None, None] * S0
        if z0 is not None:
            z = z + np.exp(G[:, -1])[..., None] * z0
    return S, z


def _chunks(t, c):
    return [slice(m * c, min(t, (m + 1) * c)) for m in range(-(-t // c))]


def update_state(k, v, log_g=None, p=2, c=16, layout="sympow"):
    """S [b, n, h, D, e], z [b, n, h, D]: S_m = sum_j exp(A_m - Gc_j) phi(k_j) v_j^T."""
    b, t, h, _ = k.shape
    g = _gates(log_g, (b, t, h))
    S, z = [], []
    for sl in _chunks(t, c):
        Gc = np.cumsum(g[:, sl], axis=1)
        w = np.exp(Gc[:, -1:] - Gc)
        fk = phi(k[:, sl], p, layout)
        S.append(np.einsum("bth,bthD,bthe->bhDe", w, fk, v[:, sl]))
        z.append(np.einsum("bth,bthD->bhD", w, fk))
    return np.stack(S, axis=1), np.stack(z, axis=1)


def discumsum(X, A, Y_init=None):
    """Y [b, n+1, h, ...]: Y_0 = Y_init (or 0), Y_{m+1} = exp(A_m) Y_m + X_m."""
    b, n, h = X.shape[:3]
    tail = X.shape[3:]
    Y = np.zeros((b, n + 1, h) + tail)
    if Y_init is not None:
        Y[:, 0] = Y_init
    for m in range(n):
        Y[:, m + 1] = np.exp(A[:, m]).reshape((b, h) + (1,) * len(tail)) * Y[:, m] + X[:, m]
    return Y


def query_state(q, S, z=None, log_g=None, p=2, scale=None, c=16, normalize=True, layout="sympow", intra=None):
    """o [b, t, hq, e]: phi(scale q_i)^T S_m exp(Gc_i) (+ intra), over (... z ... + intra) when normalized."""
    b, t, hq, d = q.shape
    h, e = S.shape[2], S.shape[4]
    r = hq // h
    scale = 1 / math.sqrt(d) if scale is None else scale
    g = _gates(log_g, (b, t, h))
    o = np.zeros((b, t, hq, e))
    for m, sl in enumerate(_chunks(t, c)):
        Gc = np.cumsum(g[:, sl], axis=1)
        f = phi(scale * q[:, sl], p, layout)
        for i in range(hq):
            j = i // r
            decay = np.exp(Gc[:, :, j])
            num = np.einsum("blD,bDe->ble", f[:, :, i], S[:, m, j]) * decay[..., None]
            den = np.einsum("blD,bD->bl", f[:, :, i], z[:, m, j]) * decay if z is not None else np.zeros(decay.shape)
            if intra is not None:
                y, l, rowmax = intra
                scale_i = np.exp(rowmax[:, sl, i])
                num = num + y[:, sl, i] * scale_i[..., None]
                den = den + l[:, sl, i] * scale_i
            o[:, sl, i] = _divide(num, den) if normalize else num
    return o


def chunk_attention(q, k, v, log_g=None, p=2, scale=None, c=None):
    """(y, l, rowmax): intra-chunk causal power attention in log space (docs/spec.md step 4)."""
    b, t, hq, d = q.shape
    h, e = k.shape[2], v.shape[3]
    r = hq // h
    scale = 1 / math.sqrt(d) if scale is None else scale
    c = t if not c else c
    g = _gates(log_g, (b, t, h))
    y, l, rowmax = np.zeros((b, t, hq, e)), np.zeros((b, t, hq)), np.zeros((b, t, hq))
    for sl in _chunks(t, c):
        Gc = np.cumsum(g[:, sl], axis=1)
        L = Gc.shape[1]
        causal = np.tril(np.ones((L, L), dtype=bool))
        for bi in range(b):
            for i in range(hq):
                j = i // r
                dots = scale * q[bi, sl, i] @ k[bi, sl, j].T
                with np.errstate(divide="ignore"):
                    s = p * np.log(np.abs(dots)) + Gc[bi, :, j][:, None] - Gc[bi, :, j][None, :]
                s = np.where(causal & (dots != 0), s, -np.inf)
                mx = s.max(axis=1)
                mx = np.where(np.isfinite(mx), mx, 0.0)
                W = np.sign(dots) ** p * np.exp(s - mx[:, None])
                y[bi, sl, i] = W @ v[bi, sl, j]
                l[bi, sl, i] = W.sum(axis=1)
                rowmax[bi, sl, i] = mx
    return y, l, rowmax


def step(q, k, v, log_g, S, z, p=2, scale=None, normalize=True, layout="sympow"):
    """One decoding step on [b, heads, dim] tensors: the new (S, z) and o [b, hq, e]."""
    b, hq, d = q.shape
    h = k.shape[1]
    r = hq // h
    scale = 1 / math.sqrt(d) if scale is None else scale
    decay = np.exp(log_g) if log_g is not None else np.ones((b, h))
    fk = phi(k, p, layout)
    S = decay[..., None, None] * S + np.einsum("bhD,bhe->bhDe", fk, v)
    z = decay[..., None] * z + fk if z is not None else None
    fq = phi(scale * q, p, layout)
    o = np.zeros((b, hq, v.shape[2]))
    for i in range(hq):
        num = np.einsum("bD,bDe->be", fq[:, i], S[:, i // r])
        o[:, i] = _divide(num, np.einsum("bD,bD->b", fq[:, i], z[:, i // r])) if normalize else num
    return o, S, z


def rel_error(got, ref):
    """||got - ref||_F / ||ref||_F (absolute when ref is 0)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(got - ref)
    return diff / norm if norm > 0 else diff
