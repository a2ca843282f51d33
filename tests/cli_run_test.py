#!/usr/bin/env python3
"""`expanse run` against an independent numpy f64 implementation of SPEC.md, and malformed inputs.

Usage: cli_run_test.py PATH/TO/expanse. Fresh random inputs each run (the seed is printed)."""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

EXE = sys.argv[1]
SEED = int(os.environ.get("EXPANSE_TEST_SEED", np.random.SeedSequence().entropy % 2**31))
rng = np.random.default_rng(SEED)
failures = []


def run(op, inputs, *flags, expect_ok=True):
    with tempfile.TemporaryDirectory() as tmp:
        ind, outd = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        os.makedirs(ind)
        for name, arr in inputs.items():
            if isinstance(arr, bytes):
                open(os.path.join(ind, name + ".npy"), "wb").write(arr)
            else:
                np.save(os.path.join(ind, name + ".npy"), arr)
        cmd = [EXE, "run", op, "--inputs", ind, "--outputs", outd, *map(str, flags)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode < 0:
            failures.append(f"crash (signal {-p.returncode}): {' '.join(cmd)}\n{p.stderr}")
            return None, p
        if expect_ok and p.returncode != 0:
            failures.append(f"unexpected failure: {' '.join(cmd)}\n{p.stderr}")
            return None, p
        outs = {}
        if p.returncode == 0:
            for f in os.listdir(outd):
                outs[f[:-4]] = np.load(os.path.join(outd, f))
        return outs, p


def power_attention(q, k, v, log_g, p, scale, normalize, S0=None, z0=None):
    """Quadratic form of SPEC.md with the initial-state terms, written with plain numpy."""
    b, t, hq, d = q.shape
    h = k.shape[2]
    r = hq // h
    G = np.cumsum(log_g, axis=1) if log_g is not None else np.zeros((b, t, h))
    o = np.zeros((b, t, hq, v.shape[3]))
    causal = np.tril(np.ones((t, t)))
    for bi in range(b):
        for i in range(hq):
            j = i // r
            s = (scale * q[bi, :, i] @ k[bi, :, j].T) ** p
            A = s * np.exp(np.minimum(G[bi, :, j][:, None] - G[bi, :, j][None, :], 0)) * causal
            num = A @ v[bi, :, j]
            den = A.sum(1)
            if S0 is not None:
                # phi(q)^T S0 via the tensor layout: phi(x) = x (x) x ... (p times), D = d^p
                phi = scale * q[bi, :, i]
                feat = phi
                for _ in range(p - 1):
                    feat = np.einsum("ta,tb->tab", feat, phi).reshape(t, -1)
                num += (feat @ S0[bi, j]) * np.exp(G[bi, :, j])[:, None]
                if z0 is not None:
                    den += (feat @ z0[bi, j]) * np.exp(G[bi, :, j])
            o[bi, :, i] = num / den[:, None] if normalize else num
    return o


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def check(name, got, ref, tol=1e-10):
    e = rel(got, ref)
    status = "ok" if e <= tol else "FAIL"
    print(f"{status:4} {name}: rel. error {e:.2e}")
    if e > tol:
        failures.append(f"{name}: rel. error {e:.3e} > {tol}")


# ---- agreement with the independent implementation (several shapes, gating, p, GQA, ragged chunks, S0)
for case, (b, t, hq, h, d, e, p, chunk, gated, init) in enumerate([
        (1, 33, 2, 2, 8, 5, 2, 0, True, False),
        (2, 50, 4, 2, 6, 7, 2, 16, True, True),
        (1, 41, 3, 1, 4, 3, 4, 8, False, False),
        (2, 29, 2, 1, 5, 4, 1, 7, True, True),
        (1, 64, 4, 4, 8, 8, 3, 20, True, False),
        (1, 17, 2, 2, 4, 6, 4, 5, True, True)]):
    q = rng.standard_normal((b, t, hq, d))
    k = rng.standard_normal((b, t, h, d))
    v = rng.standard_normal((b, t, h, e))
    log_g = -np.log1p(np.exp(-rng.standard_normal((b, t, h)) - 1)) if gated else None
    normalize = p % 2 == 0
    scale = 1 / math.sqrt(d)
    ins = {"q": q, "k": k, "v": v}
    if gated:
        ins["log_g"] = log_g
    S0 = z0 = None
    if init:  # tensor layout: D = d^p; a state from a few random tokens keeps the denominator positive
        kk = rng.standard_normal((b, h, 6, d))
        feats = kk
        for _ in range(p - 1):
            feats = np.einsum("bhta,bhtc->bhtac", feats, kk).reshape(b, h, 6, -1)
        S0 = np.einsum("bhtD,bhte->bhDe", feats, rng.standard_normal((b, h, 6, e)))
        z0 = feats.sum(2)
        ins["S0"] = S0
        if normalize:
            ins["z0"] = z0
    ref = power_attention(q, k, v, log_g, p, scale, normalize, S0, z0 if normalize else None)
    flags = ["--p", p, "--normalize", int(normalize), "--layout", "tensor"]
    if chunk:
        flags += ["--chunk", chunk]
    outs, _ = run("power_attention", ins, *flags)
    if outs is not None:
        check(f"power_attention case {case} (b={b} t={t} hq={hq} h={h} p={p} chunk={chunk} gated={gated} S0={init})",
              outs["o"], ref)

# sympow_expand: <phi(x), phi(y)> = (x.y)^p
x = rng.standard_normal((2, 6))
for p in range(1, 7):
    for layout in ["sympow", "tensor", "tiled:3"]:
        outs, _ = run("sympow_expand", {"x": x}, "--p", p, "--layout", layout)
        if outs is not None:
            # exact to rounding relative to the magnitude of the summed terms, (sum |x_i y_i|)^p
            err = abs(outs["out"][0] @ outs["out"][1] - (x[0] @ x[1]) ** p) / (np.abs(x[0] * x[1]).sum() ** p)
            print(f"{'ok' if err <= 1e-13 else 'FAIL':4} sympow_expand p={p} {layout}: error {err:.2e}")
            if err > 1e-13:
                failures.append(f"sympow_expand p={p} {layout}: error {err:.3e}")

# ---- malformed inputs: a clear error and exit status 1 or 2, never a crash
q = rng.standard_normal((1, 10, 4, 8))
k = rng.standard_normal((1, 10, 2, 8))
v = rng.standard_normal((1, 10, 2, 3))
good = {"q": q, "k": k, "v": v}
truncated = open(os.devnull, "rb").read()
with tempfile.TemporaryDirectory() as tmp:
    np.save(os.path.join(tmp, "a.npy"), k)
    whole = open(os.path.join(tmp, "a.npy"), "rb").read()
malformed = [
    ("wrong rank", dict(good, q=q[0]), [], "rank"),
    ("mismatched shapes", dict(good, k=k[:, :9]), [], "'k'"),
    ("hq % h != 0", dict(good, k=rng.standard_normal((1, 10, 3, 8)), v=rng.standard_normal((1, 10, 3, 3))), [], "hq % h"),
    ("bad dtype", dict(good, q=q.astype(np.int32)), [], "q"),
    ("d % d_tile != 0", good, ["--layout", "tiled:3"], "d_tile"),
    ("missing file", {"q": q, "k": k}, [], "v"),
    ("truncated .npy", dict(good, k=whole[: len(whole) - 40]), [], "truncated"),
    ("not an .npy", dict(good, k=b"hello"), [], "k"),
    ("odd p normalized", good, ["--p", "3"], "even p"),
    ("bad option", good, ["--p", "two"], "--p"),
]
for what, ins, flags, mention in malformed:
    _, proc = run("power_attention", ins, *flags, expect_ok=False)
    ok = proc.returncode in (1, 2) and mention in proc.stderr and "error" in proc.stderr
    print(f"{'ok' if ok else 'FAIL':4} malformed: {what}: exit {proc.returncode}: {proc.stderr.strip()[:150]}")
    if not ok:
        failures.append(f"malformed input '{what}': exit {proc.returncode}, stderr {proc.stderr!r}")

print(f"seed {SEED}")
if failures:
    print("\n".join(failures))
    print(f"0 passed, {len(failures)} failed")
    sys.exit(1)
print("all cli checks passed")
