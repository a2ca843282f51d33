#!/usr/bin/env python3
"""`expanse run` against an independent numpy f64 implementation of docs/spec.md, malformed inputs,
inputs that are no regular files, the opt-in finite check, the dtypes of states, and what `check`
prints on stderr and `info` says about the default backend.

Usage: cli_run_test.py PATH/TO/expanse. Fresh random inputs each run (the seed is printed)."""
import json
import math
import os
import pty
import subprocess
import sys
import tempfile

import numpy as np

EXE = sys.argv[1]
SEED = int(os.environ.get("EXPANSE_TEST_SEED", np.random.SeedSequence().entropy % 2**31))
rng = np.random.default_rng(SEED)
failures = []


TIMEOUT = 120  # seconds; a command that blocks (on a FIFO, say) fails instead of hanging the test


def call(cmd, env=None, **kwargs):
    """Runs cmd; a hang is recorded as a failure and reported as exit status None."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                              env=None if env is None else dict(os.environ, **env), **kwargs)
    except subprocess.TimeoutExpired:
        failures.append(f"hung for {TIMEOUT} s: {' '.join(cmd)}")
        return subprocess.CompletedProcess(cmd, None, "", "")


def run(op, inputs, *flags, expect_ok=True, env=None, setup=None):
    """`expanse run op` on inputs (arrays, or raw bytes of a file); setup(input_dir) may add more."""
    with tempfile.TemporaryDirectory() as tmp:
        ind, outd = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        os.makedirs(ind)
        for name, arr in inputs.items():
            if isinstance(arr, bytes):
                open(os.path.join(ind, name + ".npy"), "wb").write(arr)
            else:
                np.save(os.path.join(ind, name + ".npy"), arr)
        if setup:
            setup(ind)
        cmd = [EXE, "run", op, "--inputs", ind, "--outputs", outd, *map(str, flags)]
        p = call(cmd, env)
        if p.returncode is None:
            return None, p
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
    """Quadratic form of docs/spec.md with the initial-state terms, written with plain numpy."""
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
        (1, 33, 2, 2, 8, 5, 2, None, True, False),
        (1, 21, 2, 1, 4, 3, 2, 0, True, True),
        (1, 19, 2, 2, 4, 5, 2, "auto", True, False),
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
        ins["initial_S"] = S0
        if normalize:
            ins["initial_z"] = z0
    ref = power_attention(q, k, v, log_g, p, scale, normalize, S0, z0 if normalize else None)
    flags = ["--p", p, "--normalize", int(normalize), "--layout", "tensor"]
    if chunk is not None:  # None: the default, auto (the library picks the form)
        flags += ["--chunk_size", chunk]
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
    ("p > 4", good, ["--p", "7"], "p must be"),
    ("negative chunk", good, ["--chunk", "-2"], "--chunk"),
]
with_nan = q.copy()
with_nan[0, 3, 1, 2] = np.nan


def make_fifo(name):
    return lambda ind: os.mkfifo(os.path.join(ind, name + ".npy"))


def make_loop(name):
    def setup(ind):
        os.symlink("loop_b", os.path.join(ind, "loop_a"))
        os.symlink("loop_a", os.path.join(ind, "loop_b"))
        os.symlink("loop_a", os.path.join(ind, name + ".npy"))
    return setup


# (what, inputs, flags, text the error must hold (any case), setup of the input folder)
malformed = [m + (None,) for m in malformed] + [
    ("a FIFO as an input file (would block open())", {"k": k, "v": v}, [], "q.npy is not a regular file (a FIFO)",
     make_fifo("q")),
    ("an optional input a FIFO", good, [], "log_g.npy is not a regular file", make_fifo("log_g")),
    ("a symbolic link loop as an input file", {"k": k, "v": v}, [], "too many levels of symbolic links",
     make_loop("q")),
    ("NaN in q with --check-finite", dict(good, q=with_nan), ["--check-finite"], "argument 'q'", None),
]
for what, ins, flags, mention, setup in malformed:
    _, proc = run("power_attention", ins, *flags, expect_ok=False, setup=setup)
    ok = proc.returncode in (1, 2) and mention.lower() in proc.stderr.lower() and "error" in proc.stderr
    print(f"{'ok' if ok else 'FAIL':4} malformed: {what}: exit {proc.returncode}: {proc.stderr.strip()[:150]}")
    if not ok:
        failures.append(f"malformed input '{what}': exit {proc.returncode}, stderr {proc.stderr!r}")


def expect(what, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL':4} {what}{': ' + detail if detail and not ok else ''}")
    if not ok:
        failures.append(f"{what}: {detail}")


# ---- the finite check is opt-in: without it a NaN input runs and gives NaN outputs
outs, _ = run("power_attention", dict(good, q=with_nan))
expect("NaN in q without --check-finite runs", outs is not None and np.isnan(outs["o"]).any())
outs, _ = run("power_attention", good, "--check-finite")
expect("finite inputs pass --check-finite", outs is not None and np.isfinite(outs["o"]).all())

# ---- states in f32 for f16/f32 inputs and in f64 for f64 inputs, on every backend
for dtype, want in ((np.float16, np.float32), (np.float32, np.float32), (np.float64, np.float64)):
    ins = {name: a.astype(dtype) for name, a in good.items()}
    outs, _ = run("power_attention", ins, "--final-state")
    expect(f"power_attention --final-state with {np.dtype(dtype).name} inputs writes {np.dtype(want).name} S, z",
           outs is not None and outs["final_S"].dtype == want and outs["final_z"].dtype == want,
           "" if outs is None else f"final_S {outs['final_S'].dtype}, final_z {outs['final_z'].dtype}, o {outs['o'].dtype}")
    outs, _ = run("update_state", {"k": ins["k"], "v": ins["v"]}, "--chunk", 4)
    expect(f"update_state with {np.dtype(dtype).name} inputs writes {np.dtype(want).name} S",
           outs is not None and outs["S"].dtype == want)

# ---- a FIFO named like a plugin on the search path: the reference runs, nothing is opened
with tempfile.TemporaryDirectory() as plugin_dir:
    os.mkfifo(os.path.join(plugin_dir, "libexpanse-fifo.so"))
    env = {"EXPANSE_BACKEND_PATH": plugin_dir}
    outs, _ = run("power_attention", good, "--backend", "reference", env=env)
    expect("run --backend reference with a FIFO plugin on EXPANSE_BACKEND_PATH", outs is not None)
    p = call([EXE, "info"], env)
    expect("info lists the FIFO plugin as not a regular file",
           p.returncode == 0 and "fifo: not available: not a regular file" in p.stdout, p.stdout[-300:])

# ---- the command line: help, exit statuses, errors that name the option, bench's JSON lines
for args, status, stream, text in [
        ([], 2, "stderr", "usage: expanse COMMAND"),
        (["--help"], 0, "stdout", "usage: expanse COMMAND"),
        (["--version"], 0, "stdout", "expanse "),
        (["nosuch"], 2, "stderr", "unknown command 'nosuch'"),
        (["help", "check"], 0, "stdout", "--chunk_size,--chunk"),
        (["run", "--help"], 0, "stdout", "power_attention"),
        (["run", "power_attention", "--help"], 0, "stdout", "--chunk_size,--chunk auto|C"),
        (["run", "nosuch"], 2, "stderr", "unknown operation 'nosuch'"),
        (["run", "power_attention", "--nosuch"], 2, "stderr", "--nosuch"),
        (["run", "power_attention", "--p", "2", "--p", "3"], 2, "stderr", "--p"),
        (["check", "power_attention", "--chunk_size", "abc"], 2, "stderr", "--chunk_size"),
        (["check", "power_attention", "--t", "-1"], 2, "stderr", "--t"),
        (["bench", "power_attention", "--ts", "8,0"], 2, "stderr", "--ts")]:
    p = call([EXE, *args])
    out = p.stdout if stream == "stdout" else p.stderr
    expect(f"expanse {' '.join(args)}: exit {status}, '{text}' on {stream}", p.returncode == status and text in out,
           f"exit {p.returncode}, stdout {p.stdout[:200]!r}, stderr {p.stderr[:200]!r}")
p = call([EXE, "bench", "power_attention", "--backend", "reference", "--ts", "8,16", "--d", "4", "--e", "4",
          "--warmup", "0", "--reps", "1"])
lines = [json.loads(line) for line in p.stdout.splitlines()] if p.returncode == 0 else []
expect("bench prints one JSON object per length with the keys bench/scripts read",
       [r["t"] for r in lines] == [8, 16] and all(r["op"] == "power_attention" and r["chunk_auto"] == 1 and
                                                  r["median_ms"] > 0 and r["flop"] > 0 and "tflops" in r and
                                                  r["config"].startswith("power_attention --b 1") for r in lines),
       p.stdout + p.stderr)

# ---- info says when the default backend cannot be used
p = call([EXE, "info"], {"EXPANSE_BACKEND": "nosuch"})
expect("info with EXPANSE_BACKEND=nosuch says the default backend is missing",
       p.returncode == 0 and "NOT USABLE: missing" in p.stdout and "nosuch" in p.stderr, p.stdout[:300])

# ---- check shows the case it runs on stderr only when stderr is a terminal
check_cmd = [EXE, "check", "power_attention", "--t", "9", "--backend", "reference"]
p = call(check_cmd)
expect("check prints nothing on stderr when it is no terminal", p.returncode == 0 and p.stderr == "", repr(p.stderr))
leader, follower = pty.openpty()
try:
    proc = subprocess.run(check_cmd, stdout=subprocess.PIPE, stderr=follower, timeout=TIMEOUT)
    os.close(follower)
    follower = None
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other side is closed: all read
            break
        if not chunk:
            break
        shown += chunk
    expect("check shows progress on a terminal's stderr", proc.returncode == 0 and b"[1/1] power_attention" in shown,
           f"exit {proc.returncode}; stdout {proc.stdout[-400:]!r}; stderr {shown[-600:]!r}")
finally:
    if follower is not None:
        os.close(follower)
    os.close(leader)

print(f"seed {SEED}")
if failures:
    print("\n".join(failures))
    print(f"0 passed, {len(failures)} failed")
    sys.exit(1)
print("all cli checks passed")
