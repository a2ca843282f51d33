#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz from readable descriptions (the files are committed; run
this after changing a description or fuzz_abi.cpp's input format, then commit the files).

    tests/fuzz/make_corpus.py     # rewrites corpus/fuzz_abi/seed-* and known-*, corpus/fuzz_npy/*, pending/

corpus/fuzz_abi/seed-*: one valid problem per operation, for the fuzzer to start from.
corpus/fuzz_abi/known-*: inputs that crashed the library (or were reported to) once; every build
replays them (ctest: fuzz_abi_corpus), so they stay fixed. Inputs that libFuzzer found are kept
under their libFuzzer names (crash-*, minimized) next to these; see README.md.
The input format is documented at the top of fuzz_abi.cpp."""
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
F16, BF16, F32, F64 = 0, 1, 2, 3
(SYMPOW, UPDATE, DISCUMSUM, QUERY, CHUNK, ATTENTION, STEP, BACKWARD, UPDATE_BACKWARD, DISCUMSUM_BACKWARD,
 QUERY_BACKWARD, CHUNK_BACKWARD) = range(12)
UNKNOWN_OP = 15  # any op code from EXPANSE_OP_COUNT (12) on
# Tensor arguments per op, in the order of expanse_op_tensor_args (core/src/op_table.cpp).
SLOTS = {
    SYMPOW: ["x", "out"],
    UPDATE: ["k", "v", "log_g", "S", "z"],
    DISCUMSUM: ["X", "A", "Y_init", "Y"],
    QUERY: ["q", "S", "z", "log_g", "y", "l", "rowmax", "o"],
    CHUNK: ["q", "k", "v", "log_g", "y", "l", "rowmax"],
    ATTENTION: ["q", "k", "v", "log_g", "initial_S", "initial_z", "o", "final_S", "final_z"],
    STEP: ["q", "k", "v", "log_g", "S", "z", "o"],
    BACKWARD: ["q", "k", "v", "log_g", "initial_S", "initial_z", "o", "dout", "dfinal_S", "dfinal_z", "dq", "dk",
               "dv", "dlog_g", "dinitial_S", "dinitial_z"],
    UPDATE_BACKWARD: ["k", "v", "log_g", "dS", "dz", "dk", "dv", "dlog_g"],
    DISCUMSUM_BACKWARD: ["X", "A", "Y_init", "dY", "dX", "dA", "dY_init"],
    QUERY_BACKWARD: ["q", "S", "z", "log_g", "y", "l", "rowmax", "o", "dout", "dq", "dS", "dz", "dlog_g", "dy", "dl"],
    CHUNK_BACKWARD: ["q", "k", "v", "log_g", "rowmax", "dy", "dl", "dq", "dk", "dv", "dlog_g"],
    UNKNOWN_OP: [],
}
# fill codes
ZEROS, UNIFORM, DECAYS, LARGE, ALL_SPECIAL = range(5)
# special value codes
NONE, NEG_INF, POS_INF, NAN, HUGE, NEG_HUGE, RAW, ZERO = range(8)


def INT(v):
    if 0 <= v < 0xE0:
        return bytes([v])
    if v == INT64_MAX:
        return b"\xe1"
    if v == INT64_MIN:
        return b"\xe2"
    if v == -1:
        return b"\xe3"
    return b"\xe0" + struct.pack("<q", v)


def FLOAT(x):
    if x == 0.0:
        return b"\x00"
    if math.isnan(x):
        return b"\x02"
    if x == math.inf:
        return b"\x03"
    if x == -math.inf:
        return b"\x04"
    return b"\x01" + struct.pack("<d", x)


def T(shape, dtype=F32, strides=None, data_null=False, alias=None, device_type=1, device_id=0, ndim=None,
      offset=0, fill=UNIFORM, special=NONE, special_value=0.0, special_index=0):
    """One tensor argument; alias = the slot name whose buffer it shares."""
    return dict(shape=shape, dtype=dtype, strides=strides, data_null=data_null, alias=alias,
                device_type=device_type, device_id=device_id, ndim=len(shape) if ndim is None else ndim,
                offset=offset, fill=fill, special=special, special_value=special_value,
                special_index=special_index)


def case(op, p=2, chunk_size=0, scale=0.0, normalize=0, layout_kind=0, d_tile=0, args_null=False,
         query_first=True, check_finite=False, **tensors):
    names = SLOTS.get(op, [])  # an unknown op has none
    unknown = set(tensors) - set(names)
    assert not unknown, f"op {op} has no tensor arguments {unknown}"
    assert 0 <= p < 2**31 or p == -1
    out = bytes([op, (1 if args_null else 0) | (2 if query_first else 0) | (4 if check_finite else 0)])
    out += INT(p) + INT(chunk_size) + FLOAT(scale) + INT(normalize) + INT(layout_kind) + INT(d_tile)
    for i, name in enumerate(names):
        t = tensors.get(name)
        if t is None:
            out += bytes([0])
            continue
        if t["alias"] is not None:
            out += bytes([3, names.index(t["alias"])])
        else:
            out += bytes([2 if t["data_null"] else 1])
        out += INT(t["dtype"]) + INT(t["device_type"] - 1) + INT(t["device_id"]) + INT(t["ndim"])
        out += bytes([0 if t["strides"] is None else 1])
        for s in t["shape"]:
            out += INT(s)
        if t["strides"] is not None:
            for s in t["strides"]:
                out += INT(s)
        out += bytes([t["offset"], t["fill"], t["special"]])
        if t["special"] == RAW:
            out += FLOAT(t["special_value"])
        out += INT(t["special_index"])
    return out


# Shapes of the valid problems: b=1, t=8, hq=4, h=2, d=4, e=3, chunks of 4 (n=2), p=2 -> D=10.
b, t, hq, h, d, e, c, n, D = 1, 8, 4, 2, 4, 3, 4, 2, 10


PARAMS = ("p", "chunk_size", "scale", "normalize", "layout_kind", "d_tile", "args_null", "query_first",
          "check_finite")


def variant(op, params, tensors, over):
    """case(op) from default params and tensors, with `over` replacing either (None drops a tensor)."""
    params, tensors = dict(params), dict(tensors)
    for key, value in over.items():
        (params if key in PARAMS else tensors)[key] = value
    return case(op, **params, **tensors)


def attention(**over):
    """A valid chunked, gated, normalized power_attention with initial and final states."""
    return variant(ATTENTION, dict(p=2, chunk_size=c, normalize=1),
                   dict(q=T([b, t, hq, d]), k=T([b, t, h, d]), v=T([b, t, h, e]), log_g=T([b, t, h], fill=DECAYS),
                        initial_S=T([b, h, D, e]), initial_z=T([b, h, D], fill=LARGE), o=T([b, t, hq, e]),
                        final_S=T([b, h, D, e]), final_z=T([b, h, D])), over)


def chunk_attention(**over):
    return variant(CHUNK, dict(p=2, chunk_size=c),
                   dict(q=T([b, t, hq, d]), k=T([b, t, h, d]), v=T([b, t, h, e]), log_g=T([b, t, h], fill=DECAYS),
                        y=T([b, t, hq, e]), l=T([b, t, hq]), rowmax=T([b, t, hq])), over)


def update_state(**over):
    return variant(UPDATE, dict(p=2, chunk_size=c),
                   dict(k=T([b, t, h, d]), v=T([b, t, h, e]), log_g=T([b, t, h], fill=DECAYS), S=T([b, n, h, D, e]),
                        z=T([b, n, h, D])), over)


def step(**over):
    return variant(STEP, dict(p=2, normalize=1),
                   dict(q=T([b, hq, d]), k=T([b, h, d]), v=T([b, h, e]), log_g=T([b, h], fill=DECAYS),
                        S=T([b, h, D, e]), z=T([b, h, D], fill=LARGE), o=T([b, hq, e])), over)


def backward(**over):
    """A valid chunked, gated, normalized power_attention_backward with every optional tensor."""
    return variant(BACKWARD, dict(p=2, chunk_size=c, normalize=1),
                   dict(q=T([b, t, hq, d]), k=T([b, t, h, d]), v=T([b, t, h, e]), log_g=T([b, t, h], fill=DECAYS),
                        initial_S=T([b, h, D, e]), initial_z=T([b, h, D], fill=LARGE), o=T([b, t, hq, e]),
                        dout=T([b, t, hq, e]), dfinal_S=T([b, h, D, e]), dfinal_z=T([b, h, D]), dq=T([b, t, hq, d]),
                        dk=T([b, t, h, d]), dv=T([b, t, h, e]), dlog_g=T([b, t, h]), dinitial_S=T([b, h, D, e]),
                        dinitial_z=T([b, h, D])), over)


SEEDS = {
    "seed-sympow_expand": case(SYMPOW, p=2, x=T([3, d]), out=T([3, D])),
    "seed-sympow_expand-f16-tiled": case(SYMPOW, p=2, layout_kind=1, d_tile=2, x=T([2, 5, d], dtype=F16),
                                         out=T([2, 5, 12], dtype=F16)),
    "seed-sympow_expand-bf16-p3-f64-out": case(SYMPOW, p=3, x=T([4, d], dtype=BF16), out=T([4, 20], dtype=F64)),
    "seed-update_state": update_state(),
    "seed-discumsum": case(DISCUMSUM, X=T([b, 3, h, 5]), A=T([b, 3, h], fill=DECAYS), Y_init=T([b, h, 5]),
                           Y=T([b, 4, h, 5])),
    "seed-query_state": case(QUERY, p=2, chunk_size=c, normalize=1, q=T([b, t, hq, d]), S=T([b, n, h, D, e]),
                             z=T([b, n, h, D], fill=LARGE), log_g=T([b, t, h], fill=DECAYS), y=T([b, t, hq, e]),
                             l=T([b, t, hq], fill=LARGE), rowmax=T([b, t, hq]), o=T([b, t, hq, e])),
    "seed-chunk_attention": chunk_attention(),
    "seed-power_attention": attention(),
    "seed-power_attention-quadratic-f64": case(
        ATTENTION, p=4, chunk_size=0, normalize=1, q=T([b, t, hq, d], dtype=F64), k=T([b, t, h, d], dtype=F64),
        v=T([b, t, h, e], dtype=F64), o=T([b, t, hq, e], dtype=F64)),
    "seed-power_attention-strided": attention(
        q=T([b, t, hq, d], strides=[0, 2 * hq * d, 2 * d, 1]), o=T([b, t, hq, e], strides=[0, hq * e, 1, hq])),
    "seed-power_attention_step": step(),
    "seed-power_attention_backward": backward(),
    "seed-update_state_backward": case(UPDATE_BACKWARD, p=2, chunk_size=c, k=T([b, t, h, d]), v=T([b, t, h, e]),
                                       log_g=T([b, t, h], fill=DECAYS), dS=T([b, n, h, D, e]), dz=T([b, n, h, D]),
                                       dk=T([b, t, h, d]), dv=T([b, t, h, e]), dlog_g=T([b, t, h])),
    "seed-discumsum_backward": case(DISCUMSUM_BACKWARD, X=T([b, 3, h, 5]), A=T([b, 3, h], fill=DECAYS),
                                    Y_init=T([b, h, 5]), dY=T([b, 4, h, 5]), dX=T([b, 3, h, 5]), dA=T([b, 3, h]),
                                    dY_init=T([b, h, 5])),
    "seed-query_state_backward": case(QUERY_BACKWARD, p=2, chunk_size=c, normalize=1, q=T([b, t, hq, d]),
                                      S=T([b, n, h, D, e]), z=T([b, n, h, D], fill=LARGE), log_g=T([b, t, h], fill=DECAYS),
                                      y=T([b, t, hq, e]), l=T([b, t, hq], fill=LARGE), rowmax=T([b, t, hq]),
                                      o=T([b, t, hq, e]), dout=T([b, t, hq, e]), dq=T([b, t, hq, d]),
                                      dS=T([b, n, h, D, e]), dz=T([b, n, h, D]), dlog_g=T([b, t, h]),
                                      dy=T([b, t, hq, e]), dl=T([b, t, hq])),
    "seed-chunk_attention_backward": case(CHUNK_BACKWARD, p=2, chunk_size=c, q=T([b, t, hq, d]), k=T([b, t, h, d]),
                                          v=T([b, t, h, e]), log_g=T([b, t, h], fill=DECAYS), rowmax=T([b, t, hq]),
                                          dy=T([b, t, hq, e]), dl=T([b, t, hq]), dq=T([b, t, hq, d]),
                                          dk=T([b, t, h, d]), dv=T([b, t, h, e]), dlog_g=T([b, t, h])),
    "seed-power_attention_backward-quadratic-bare": backward(chunk_size=0, normalize=0, log_g=None, initial_S=None,
                                                             initial_z=None, o=None, dfinal_S=None, dfinal_z=None,
                                                             dlog_g=None, dinitial_S=None, dinitial_z=None),
    "seed-power_attention_step-rank4": step(q=T([b, 1, hq, d]), k=T([b, 1, h, d]), v=T([b, 1, h, e]),
                                            log_g=T([b, 1, h], fill=DECAYS), o=T([b, 1, hq, e])),
    # Several tokens at once (speculative decoding).
    "seed-power_attention_step-tokens": step(q=T([b, 3, hq, d]), k=T([b, 3, h, d]), v=T([b, 3, h, e]),
                                             log_g=T([b, 3, h], fill=DECAYS), o=T([b, 3, hq, e])),
    "seed-power_attention_step-no-tokens": step(q=T([b, 0, hq, d]), k=T([b, 0, h, d]), v=T([b, 0, h, e]),
                                                log_g=T([b, 0, h], fill=DECAYS), o=T([b, 0, hq, e])),
}

# Defects reported in the C ABI (they crashed or misbehaved once); each must now be handled.
KNOWN = {
    # A NULL required tensor.
    "known-power_attention-k-null": attention(k=None),
    "known-power_attention-k-null-quadratic": attention(k=None, chunk_size=0, initial_S=None, initial_z=None),
    "known-power_attention-k-null-no-states": attention(k=None, initial_S=None, initial_z=None, final_S=None,
                                                        final_z=None),
    "known-power_attention-k-null-quadratic-no-states": attention(k=None, chunk_size=0, initial_S=None,
                                                                  initial_z=None, final_S=None, final_z=None),
    "known-chunk_attention-k-null": chunk_attention(k=None),
    "known-update_state-S-null": update_state(S=None),
    "known-update_state-S-null-z-too": update_state(S=None, z=None),
    # v = NULL while every output has e = 0 (no tensor says what e is).
    "known-power_attention-v-null-e0": attention(v=None, o=T([b, t, hq, 0]), initial_S=T([b, h, D, 0]),
                                                 final_S=T([b, h, D, 0])),
    "known-power_attention-v-null-e0-no-states": attention(v=None, o=T([b, t, hq, 0]), initial_S=None,
                                                           initial_z=None, final_S=None, final_z=None),
    "known-chunk_attention-v-null-e0": chunk_attention(v=None, y=T([b, t, hq, 0])),
    "known-update_state-v-null-e0": update_state(v=None, S=T([b, n, h, D, 0])),
    "known-power_attention_step-v-null-e0": step(v=None, S=T([b, h, D, 0]), o=T([b, hq, 0])),
    # chunk_size near INT64_MAX: (t + c - 1) / c overflowed.
    "known-power_attention-chunk-int64-max": attention(chunk_size=INT64_MAX),
    "known-power_attention-chunk-int64-max-minus-1": attention(chunk_size=INT64_MAX - 1),
    "known-power_attention-chunk-int64-max-no-states": attention(chunk_size=INT64_MAX - 2, initial_S=None,
                                                                 initial_z=None, final_S=None, final_z=None),
    "known-update_state-chunk-int64-max": update_state(chunk_size=INT64_MAX, S=T([b, 1, h, D, e]),
                                                       z=T([b, 1, h, D])),
    "known-chunk_attention-chunk-int64-max": case(CHUNK, p=2, chunk_size=INT64_MAX, q=T([b, t, hq, d]),
                                                  k=T([b, t, h, d]), v=T([b, t, h, e]), y=T([b, t, hq, e]),
                                                  l=T([b, t, hq]), rowmax=T([b, t, hq])),
    # A zero-element input with a huge dimension: x [0, INT64_MAX].
    "known-sympow_expand-zero-rows-d-int64-max": case(SYMPOW, p=2, x=T([0, INT64_MAX]), out=T([0, 0])),
    "known-sympow_expand-zero-rows-d-int64-max-p1": case(SYMPOW, p=1, x=T([0, INT64_MAX]), out=T([0, INT64_MAX])),
    "known-sympow_expand-zero-rows-d-int64-max-strides-1-0-p2": case(
        SYMPOW, p=2, x=T([0, INT64_MAX], strides=[1, 0]), out=T([0, 1], strides=[1, 1])),
    "known-sympow_expand-zero-rows-d-int64-max-tensor-p1": case(
        SYMPOW, p=1, layout_kind=2, x=T([0, INT64_MAX], strides=[0, 0], data_null=True),
        out=T([0, INT64_MAX], strides=[0, 0], data_null=True)),
    # Found by fuzz_abi: d + p - 1 overflowed at d = INT64_MAX, p = 1 (core multisets_checked, then
    # the reference's expanded_dim); the zero-element strides [0, 0] pass the size checks.
    "known-sympow_expand-zero-rows-d-int64-max-strides-0": case(
        SYMPOW, p=1, x=T([0, INT64_MAX], strides=[0, 0]), out=T([0, INT64_MAX], strides=[0, 0])),
    "known-sympow_expand-zero-rows-d-int64-max-null": case(SYMPOW, p=2, x=T([0, INT64_MAX], data_null=True),
                                                           out=T([0, 1], data_null=True)),
    # S and z of a decoding step in one buffer (overlapping in-place outputs).
    "known-power_attention_step-S-z-overlap": step(z=T([b, h, D], alias="S")),
    "known-power_attention_step-S-z-overlap-offset": step(z=T([b, h, D], alias="S", offset=16)),
    "known-power_attention-final-S-z-overlap": attention(final_z=T([b, h, D], alias="final_S")),
    "known-power_attention-o-overlaps-q": attention(o=T([b, t, hq, e], alias="q")),
    # Invalid enum values.
    "known-power_attention-dtype-17": attention(q=T([b, t, hq, d], dtype=17)),
    "known-power_attention-o-dtype-17": attention(o=T([b, t, hq, e], dtype=17)),
    "known-sympow_expand-layout-kind-9": case(SYMPOW, p=2, layout_kind=9, x=T([3, d]), out=T([3, D])),
    "known-power_attention-layout-kind-9": attention(layout_kind=9),
    "known-power_attention-k-device-garbage": attention(k=T([b, t, h, d], device_type=0x5EADBEEF)),
    "known-power_attention_step-S-device-negative": step(S=T([b, h, D, e], device_type=-7)),
    "known-unknown-op": case(UNKNOWN_OP),
    "known-unknown-op-12": case(12),
    "known-unknown-op-null-args": case(UNKNOWN_OP, args_null=True),
    "known-power_attention-args-null": attention(args_null=True),
    "known-power_attention_backward-dq-overlaps-dk": backward(dk=T([b, t, h, d], alias="dq")),
    "known-power_attention_backward-dlog_g-without-log_g": backward(log_g=None),
    "known-power_attention_backward-log_g-neg-inf": backward(log_g=T([b, t, h], fill=DECAYS, special=NEG_INF,
                                                                      special_index=5)),
    # log_g = -inf: a reset of the state at that token.
    "known-power_attention-log_g-neg-inf": attention(log_g=T([b, t, h], fill=DECAYS, special=NEG_INF,
                                                             special_index=5)),
    "known-power_attention-log_g-neg-inf-quadratic": attention(
        chunk_size=0, initial_S=None, initial_z=None, log_g=T([b, t, h], fill=DECAYS, special=NEG_INF, special_index=9)),
    "known-power_attention-log_g-all-neg-inf": attention(log_g=T([b, t, h], fill=ALL_SPECIAL, special=NEG_INF)),
    "known-power_attention-log_g-neg-inf-first": attention(log_g=T([b, t, h], fill=DECAYS, special=NEG_INF,
                                                                   special_index=0)),
    "known-chunk_attention-log_g-neg-inf": chunk_attention(log_g=T([b, t, h], fill=DECAYS, special=NEG_INF,
                                                                   special_index=3)),
    "known-update_state-log_g-neg-inf": update_state(log_g=T([b, t, h], fill=DECAYS, special=NEG_INF,
                                                             special_index=6)),
    "known-discumsum-A-neg-inf": case(DISCUMSUM, X=T([b, 3, h, 5]), A=T([b, 3, h], fill=DECAYS, special=NEG_INF,
                                                                        special_index=2),
                                      Y_init=T([b, h, 5]), Y=T([b, 4, h, 5])),
    "known-power_attention-log_g-neg-inf-check-finite": attention(
        check_finite=True, log_g=T([b, t, h], fill=DECAYS, special=NEG_INF, special_index=4)),
    "known-power_attention-q-nan-check-finite": attention(check_finite=True, q=T([b, t, hq, d], special=NAN,
                                                                                 special_index=7)),
    "known-power_attention-q-nan": attention(q=T([b, t, hq, d], special=NAN, special_index=7)),
    "known-power_attention-v-huge-f16": attention(q=T([b, t, hq, d], dtype=F16), k=T([b, t, h, d], dtype=F16),
                                                  v=T([b, t, h, e], dtype=F16, fill=LARGE),
                                                  o=T([b, t, hq, e], dtype=F16)),
    "known-power_attention_step-log_g-neg-inf": step(log_g=T([b, h], fill=DECAYS, special=NEG_INF)),
    "known-query_state-log_g-neg-inf": case(QUERY, p=2, chunk_size=c, normalize=1, q=T([b, t, hq, d]),
                                            S=T([b, n, h, D, e]), z=T([b, n, h, D], fill=LARGE),
                                            log_g=T([b, t, h], fill=DECAYS, special=NEG_INF, special_index=1),
                                            o=T([b, t, hq, e])),
}


# Crashes found and not fixed yet (tests/fuzz/FINDINGS.md): written to pending/fuzz_abi/, which no test
# replays. Once fixed, move the entry to KNOWN (and delete its file under pending/).
PENDING = {}


def npy(descr, shape, payload=b"", version=1, fortran=False, header=None, pad=True):
    if header is None:
        shape_text = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape_text)
    pre = 10 if version == 1 else 12
    if pad:
        header += " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    hb = header.encode("latin-1")
    size = struct.pack("<H", len(hb)) if version == 1 else struct.pack("<I", len(hb))
    return b"\x93NUMPY" + bytes([version, 0]) + size + hb + payload


NPY = {
    "f4-2x3": npy("<f4", [2, 3], struct.pack("<6f", *range(6))),
    "f8-scalar": npy("<f8", [], struct.pack("<d", 2.5)),
    "f2-4": npy("<f2", [4], struct.pack("<4e", 1.0, -2.0, 65504.0, 6e-8)),
    "f4-big-endian": npy(">f4", [3], struct.pack(">3f", 1.0, float("nan"), float("inf"))),
    "f8-empty-0x3": npy("<f8", [0, 3]),
    "f4-v2": npy("<f4", [2], struct.pack("<2f", 1, 2), version=2),
    "f4-v3": npy("<f4", [1, 1, 1, 1, 1, 1, 1, 2], struct.pack("<2f", 1, 2), version=3),
    "f8-huge-values": npy("<f8", [3], struct.pack("<3d", 1e300, -1e300, 5e-324)),
    "bad-fortran": npy("<f4", [2, 2], struct.pack("<4f", 1, 2, 3, 4), fortran=True),
    "bad-truncated": npy("<f4", [10], struct.pack("<2f", 1, 2)),
    "bad-trailing-bytes": npy("<f4", [1], struct.pack("<2f", 1, 2)),
    "bad-descr-i4": npy("<i4", [1], struct.pack("<i", 1)),
    "bad-descr-bfloat16": npy("<V2", [1], b"\x00\x00"),
    "bad-structured": npy(None, None, header="{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }"),
    "bad-rank-9": npy("<f4", [1] * 9, struct.pack("<f", 1)),
    "bad-shape-overflow": npy("<f8", [2**62, 4]),
    "bad-shape-int64-max": npy("<f4", [2**63 - 1]),
    "bad-shape-too-large": npy("<f4", [10**30]),
    "bad-negative-dim": npy(None, None, header="{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"),
    "bad-header-len-past-end": b"\x93NUMPY\x01\x00\xff\xff{",
    "bad-header-v2-len-huge": b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}",
    "bad-version": npy("<f4", [1], struct.pack("<f", 1), version=4),
    "bad-unterminated-string": npy(None, None, header="{'descr': '<f4"),
    "bad-duplicate-key": npy(None, None, header="{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (), }"),
    "bad-magic": b"\x93NUMPX\x01\x00\x00\x00",
    "bad-short": b"\x93NUM",
    "header-only-text": b"{'descr': '<f8', 'fortran_order': False, 'shape': (3L, 4L), }",
}


def write(folder, entries):
    os.makedirs(folder, exist_ok=True)
    for name, data in entries.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    print(f"{len(entries)} files in {os.path.relpath(folder)}")


if __name__ == "__main__":
    write(os.path.join(HERE, "corpus", "fuzz_abi"), {**SEEDS, **KNOWN})
    write(os.path.join(HERE, "corpus", "fuzz_npy"), NPY)
    if PENDING:
        write(os.path.join(HERE, "pending", "fuzz_abi"), PENDING)
    sys.exit(0)
