// Context parallelism (docs/spec.md): power_attention and its backward over one sequence split across
// ranks, composed of the public operations and the caller's all-gather (expanse_context_parallel).
// The gathered buffer is rank-major: each rank's block holds its state from zero S [b,h,D,e], then z
// [b,h,D] where normalized, then its total log decay A [b,h], so that strided views of it are
// discumsum's X and A over the rank axis directly (and S, z, A are disjoint outputs of sequence_state).
#include <vector>

#include "context_stream.hpp"
#include "errors.hpp"
#include "expanse/expanse.h"

using namespace expanse::detail;

namespace {

void call(expanse_status st) {
  if (st != EXPANSE_OK) fail(st, "%s", expanse_last_error());
}

// Device memory on the context's device, freed at scope exit.
struct device_buffer {
  expanse_context* ctx;
  void* ptr = nullptr;
  device_buffer(expanse_context* c, size_t bytes) : ctx(c) { call(expanse_malloc(c, bytes > 0 ? bytes : 1, &ptr)); }
  ~device_buffer() { expanse_free(ctx, ptr); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

// A strided view of `base` (elements of `dtype`) starting `offset` elements in.
expanse_tensor view(void* base, int32_t dtype, const expanse_tensor& like, std::vector<int64_t> shape,
                    std::vector<int64_t> strides, int64_t offset = 0) {
  expanse_tensor t{};
  t.data = static_cast<char*>(base) + offset * int64_t(expanse_dtype_size(expanse_dtype(dtype)));
  t.dtype = dtype;
  t.device_type = like.device_type;
  t.device_id = like.device_id;
  t.ndim = int32_t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i], t.strides[i] = strides[i];
  return t;
}

// The sizes of a rank's piece and of the exchange.
struct layout_of_exchange {
  int64_t b, h, D, e;
  int32_t R, state_dtype;
  bool normalize;
  int64_t S_size() const { return b * h * D * e; }
  int64_t z_size() const { return normalize ? b * h * D : 0; }
  int64_t block() const { return S_size() + z_size() + b * h; }  // what a rank sends, in elements
  size_t element() const { return expanse_dtype_size(expanse_dtype(state_dtype)); }
  size_t bytes() const { return size_t(block()) * element(); }
};

layout_of_exchange exchange_layout(const expanse_context_parallel& cp, const expanse_tensor& k, const expanse_tensor& v,
                                   int32_t p, expanse_layout layout, bool normalize) {
  layout_of_exchange x{};
  x.b = k.shape[0], x.h = k.shape[2], x.e = v.shape[3], x.R = cp.ranks, x.normalize = normalize;
  call(expanse_expanded_dim(p, k.shape[3], layout, &x.D));
  x.state_dtype = k.dtype == EXPANSE_F64 ? EXPANSE_F64 : EXPANSE_F32;
  return x;
}

void check_cp(const expanse_context_parallel* cp, const char* fn) {
  if (!cp) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'cp' is NULL", fn);
  if (cp->ranks < 1) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'cp': ranks must be >= 1, got %d", fn, cp->ranks);
  if (cp->rank < 0 || cp->rank >= cp->ranks)
    fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'cp': rank must be in [0, %d), got %d", fn, cp->ranks, cp->rank);
  if (!cp->allgather) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'cp': allgather is NULL", fn);
}

// The states entering the pieces, Y [b, R + 1, h, D, e] (and Yz [b, R + 1, h, D]): each rank's state
// from zero and total decay (sequence_state) gathered, then discumsum over the rank axis with the
// initial state in front. `gathered` keeps the exchange for a backward.
struct entering_states {
  device_buffer gathered, S, z;
  expanse_tensor X, Xz, A;  // views of `gathered`: [b, R, h, D, e], [b, R, h, D], [b, R, h]
  expanse_tensor Y, Yz;
  entering_states(expanse_context* ctx, const layout_of_exchange& x)
      : gathered(ctx, x.bytes() * size_t(x.R)),
        S(ctx, size_t(x.b * (x.R + 1) * x.h * x.D * x.e) * x.element()),
        z(ctx, x.normalize ? size_t(x.b * (x.R + 1) * x.h * x.D) * x.element() : 0) {}
  // Rank r's entering state as [b, h, D, e] / [b, h, D] views; r = R: the sequence's final state.
  expanse_tensor S_at(const layout_of_exchange& x, int64_t r) const {
    return view(Y.data, x.state_dtype, Y, {x.b, x.h, x.D, x.e}, {(x.R + 1) * x.h * x.D * x.e, x.D * x.e, x.e, 1},
                r * x.h * x.D * x.e);
  }
  expanse_tensor z_at(const layout_of_exchange& x, int64_t r) const {
    return view(Yz.data, x.state_dtype, Yz, {x.b, x.h, x.D}, {(x.R + 1) * x.h * x.D, x.D, 1}, r * x.h * x.D);
  }
};

void exchange_states(expanse_context* ctx, const expanse_context_parallel& cp, const layout_of_exchange& x,
                     const expanse_tensor& k, const expanse_tensor& v, const expanse_tensor* log_g, int32_t p,
                     int64_t chunk_size, expanse_layout layout, const expanse_tensor* initial_S,
                     const expanse_tensor* initial_z, entering_states& st) {
  const int32_t sd = x.state_dtype;
  const int64_t Ds = x.D * x.e, zoff = x.S_size(), aoff = x.S_size() + x.z_size();
  // This rank's block, sent.
  device_buffer send(ctx, x.bytes());
  expanse_tensor S = view(send.ptr, sd, k, {x.b, x.h, x.D, x.e}, {x.h * Ds, Ds, x.e, 1});
  expanse_tensor z = view(send.ptr, sd, k, {x.b, x.h, x.D}, {x.h * x.D, x.D, 1}, zoff);
  expanse_tensor A = view(send.ptr, sd, k, {x.b, x.h}, {x.h, 1}, aoff);
  expanse_sequence_state_args ss;
  expanse_sequence_state_args_init(&ss);
  ss.k = &k, ss.v = &v, ss.log_g = log_g, ss.S = &S, ss.z = x.normalize ? &z : nullptr, ss.A = &A;
  ss.p = p, ss.chunk_size = chunk_size, ss.layout = layout;
  call(expanse_sequence_state(ctx, &ss));
  if (cp.allgather(send.ptr, st.gathered.ptr, x.bytes(), context_stream(ctx), cp.user) != 0)
    fail(EXPANSE_ERROR_INTERNAL, "context parallelism: the all-gather failed (rank %d of %d)", cp.rank, cp.ranks);
  call(expanse_synchronize(ctx));  // `send` is freed at return

  // The gathered blocks as discumsum's X and A over the rank axis, and the scans.
  const int64_t rs = x.block();  // from one rank's block to the next
  st.X = view(st.gathered.ptr, sd, k, {x.b, x.R, x.h, x.D, x.e}, {x.h * Ds, rs, Ds, x.e, 1});
  st.Xz = view(st.gathered.ptr, sd, k, {x.b, x.R, x.h, x.D}, {x.h * x.D, rs, x.D, 1}, zoff);
  st.A = view(st.gathered.ptr, sd, k, {x.b, x.R, x.h}, {x.h, rs, 1}, aoff);
  st.Y = view(st.S.ptr, sd, k, {x.b, x.R + 1, x.h, x.D, x.e}, {(x.R + 1) * x.h * Ds, x.h * Ds, Ds, x.e, 1});
  expanse_discumsum_args scan;
  expanse_discumsum_args_init(&scan);
  scan.X = &st.X, scan.A = &st.A, scan.Y_init = initial_S, scan.Y = &st.Y;
  call(expanse_discumsum(ctx, &scan));
  if (x.normalize) {
    st.Yz = view(st.z.ptr, sd, k, {x.b, x.R + 1, x.h, x.D}, {(x.R + 1) * x.h * x.D, x.h * x.D, x.D, 1});
    scan.X = &st.Xz, scan.Y_init = initial_z, scan.Y = &st.Yz;
    call(expanse_discumsum(ctx, &scan));
  }
}

// dst (contiguous [b, ...]) = src (a [b, ...] view whose trailing block per batch entry is contiguous).
void copy_per_batch(expanse_context* ctx, const expanse_tensor& dst, const expanse_tensor& src, int64_t per_batch) {
  const size_t es = expanse_dtype_size(expanse_dtype(src.dtype)), block = size_t(per_batch) * es;
  if (dst.dtype != src.dtype) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "context parallelism: the final state must be %s",
                                   expanse_dtype_name(expanse_dtype(src.dtype)));
  for (int64_t bi = 0; bi < src.shape[0]; ++bi)
    call(expanse_memcpy(ctx, static_cast<char*>(dst.data) + size_t(bi * dst.strides[0]) * es,
                        static_cast<const char*>(src.data) + size_t(bi * src.strides[0]) * es, block,
                        EXPANSE_COPY_DEVICE_TO_DEVICE));
}

// Zeros into a contiguous tensor on the device.
void zero(expanse_context* ctx, const expanse_tensor& t) {
  size_t n = expanse_dtype_size(expanse_dtype(t.dtype));
  for (int i = 0; i < t.ndim; ++i) n *= size_t(t.shape[i]);
  const std::vector<char> zeros(n, 0);
  call(expanse_memcpy(ctx, t.data, zeros.data(), n, EXPANSE_COPY_HOST_TO_DEVICE));
  call(expanse_synchronize(ctx));
}

// The tensors this file copies with flat copies must be contiguous (the operations themselves take any
// strides).
void require_contiguous(const char* fn, const char* name, const expanse_tensor* t) {
  if (!t) return;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected)
      fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument '%s' must be contiguous here (row-major strides)", fn, name);
    expected *= t->shape[i];
  }
}

int64_t chunk_for_states(expanse_context* ctx, const expanse_power_attention_args& a) {
  int64_t c = 0;
  call(expanse_resolved_chunk_size(ctx, &a, &c));
  return c > 0 ? c : 128;  // the quadratic form has no chunks; the state is summed by 128
}

}  // namespace

extern "C" {

EXPANSE_API expanse_status expanse_context_parallel_power_attention(expanse_context* ctx,
                                                                     const expanse_context_parallel* cp,
                                                                     const expanse_power_attention_args* a) {
  return guarded([&] {
    const char* fn = "context_parallel_power_attention";
    check_cp(cp, fn);
    if (!a) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'a' is NULL", fn);
    call(expanse_supports(ctx, EXPANSE_OP_POWER_ATTENTION, a, nullptr, 0));  // validates the piece
    require_contiguous(fn, "final_S", a->final_S);
    require_contiguous(fn, "final_z", a->final_z);
    const layout_of_exchange x = exchange_layout(*cp, *a->k, *a->v, a->p, a->layout, a->normalize != 0);
    entering_states st(ctx, x);
    exchange_states(ctx, *cp, x, *a->k, *a->v, a->log_g, a->p, chunk_for_states(ctx, *a), a->layout, a->initial_S,
                    a->initial_z, st);

    // This piece from its entering state (rank 0 without an initial state: from zero).
    expanse_power_attention_args piece = *a;
    const expanse_tensor S_in = st.S_at(x, cp->rank), z_in = x.normalize ? st.z_at(x, cp->rank) : expanse_tensor{};
    const bool entering = cp->rank > 0 || a->initial_S;
    piece.initial_S = entering ? &S_in : nullptr;
    piece.initial_z = entering && x.normalize ? &z_in : nullptr;
    piece.final_S = piece.final_z = nullptr;
    call(expanse_power_attention(ctx, &piece));
    if (a->final_S) copy_per_batch(ctx, *a->final_S, st.S_at(x, x.R), x.h * x.D * x.e);
    if (a->final_z) copy_per_batch(ctx, *a->final_z, st.z_at(x, x.R), x.h * x.D);
    call(expanse_synchronize(ctx));  // the buffers are freed at return
  });
}

EXPANSE_API expanse_status expanse_context_parallel_power_attention_backward(
    expanse_context* ctx, const expanse_context_parallel* cp, const expanse_power_attention_backward_args* a) {
  return guarded([&] {
    const char* fn = "context_parallel_power_attention_backward";
    check_cp(cp, fn);
    if (!a) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument 'a' is NULL", fn);
    call(expanse_supports(ctx, EXPANSE_OP_POWER_ATTENTION_BACKWARD, a, nullptr, 0));
    require_contiguous(fn, "dfinal_S", a->dfinal_S);
    require_contiguous(fn, "dfinal_z", a->dfinal_z);
    require_contiguous(fn, "dinitial_S", a->dinitial_S);
    require_contiguous(fn, "dinitial_z", a->dinitial_z);
    expanse_power_attention_args fwd;  // the forward of the piece, for the chunk size of its states
    expanse_power_attention_args_init(&fwd);
    fwd.q = a->q, fwd.k = a->k, fwd.v = a->v, fwd.log_g = a->log_g;
    // dout has o's shape and dtype, and o is absent unless normalized; only validated, never written.
    fwd.o = const_cast<expanse_tensor*>(a->dout);
    fwd.p = a->p, fwd.scale = a->scale, fwd.chunk_size = a->chunk_size, fwd.normalize = a->normalize, fwd.layout = a->layout;
    const layout_of_exchange x = exchange_layout(*cp, *a->k, *a->v, a->p, a->layout, a->normalize != 0);
    entering_states st(ctx, x);
    exchange_states(ctx, *cp, x, *a->k, *a->v, a->log_g, a->p, chunk_for_states(ctx, fwd), a->layout, a->initial_S,
                    a->initial_z, st);
    const int32_t sd = x.state_dtype;
    const int64_t Ds = x.D * x.e, R = x.R;
    const size_t es = x.element();
    const expanse_tensor S_in = st.S_at(x, cp->rank), z_in = x.normalize ? st.z_at(x, cp->rank) : expanse_tensor{};

    // 1. G_r, the cotangent of this piece's entering state: its backward from that state without the
    // final state's cotangent (its token gradients are dropped: pass 2 gives them whole). The ranks
    // gather G_r into slots 0 .. R-1 of `cot`; slot R holds dfinal (the same on every rank) or zeros.
    const int64_t slot = x.S_size() + x.z_size();  // G_S [b,h,D,e], then G_z [b,h,D]
    device_buffer send(ctx, size_t(slot) * es);
    device_buffer cot(ctx, size_t((R + 1) * slot) * es);
    {
      size_t scratch_bytes = 0;
      for (const expanse_tensor* t : {a->dq, a->dk, a->dv, a->dlog_g}) {
        if (!t) continue;
        size_t n = 8;  // bytes per element at most
        for (int i = 0; i < t->ndim; ++i) n *= size_t(t->shape[i]);
        scratch_bytes += n;
      }
      device_buffer scratch(ctx, scratch_bytes);
      size_t at = 0;
      auto scratch_like = [&](const expanse_tensor& t) {  // a contiguous tensor shaped as t, in scratch
        expanse_tensor c = t;
        c.data = static_cast<char*>(scratch.ptr) + at;
        int64_t n = 1;
        for (int i = t.ndim - 1; i >= 0; --i) c.strides[i] = n, n *= t.shape[i];
        at += size_t(n) * 8;
        return c;
      };
      expanse_tensor dq = scratch_like(*a->dq), dk = scratch_like(*a->dk), dv = scratch_like(*a->dv);
      expanse_tensor dlog_g = a->dlog_g ? scratch_like(*a->dlog_g) : expanse_tensor{};
      expanse_tensor G = view(send.ptr, sd, *a->k, {x.b, x.h, x.D, x.e}, {x.h * Ds, Ds, x.e, 1});
      expanse_tensor Gz = view(send.ptr, sd, *a->k, {x.b, x.h, x.D}, {x.h * x.D, x.D, 1}, x.S_size());
      expanse_power_attention_backward_args first = *a;
      first.initial_S = &S_in;
      first.initial_z = x.normalize ? &z_in : nullptr;
      first.dfinal_S = first.dfinal_z = nullptr;
      first.dq = &dq, first.dk = &dk, first.dv = &dv, first.dlog_g = a->dlog_g ? &dlog_g : nullptr;
      first.dinitial_S = &G;
      first.dinitial_z = x.normalize ? &Gz : nullptr;
      call(expanse_power_attention_backward(ctx, &first));
      if (cp->allgather(send.ptr, cot.ptr, size_t(slot) * es, context_stream(ctx), cp->user) != 0)
        fail(EXPANSE_ERROR_INTERNAL, "context parallelism: the all-gather failed (rank %d of %d)", cp->rank, cp->ranks);
      call(expanse_synchronize(ctx));
    }
    char* last = static_cast<char*>(cot.ptr) + size_t(R * slot) * es;
    zero(ctx, view(last, sd, *a->k, {slot}, {1}));
    if (a->dfinal_S) call(expanse_memcpy(ctx, last, a->dfinal_S->data, size_t(x.S_size()) * es, EXPANSE_COPY_DEVICE_TO_DEVICE));
    if (a->dfinal_z && x.normalize)
      call(expanse_memcpy(ctx, last + size_t(x.S_size()) * es, a->dfinal_z->data, size_t(x.z_size()) * es,
                          EXPANSE_COPY_DEVICE_TO_DEVICE));

    // 2. discumsum_backward over the ranks: dX_r is the cotangent of piece r's final state.
    device_buffer dX(ctx, size_t(R * slot) * es);  // [b, R, h, D, e], then [b, R, h, D]
    const expanse_tensor dY = view(cot.ptr, sd, *a->k, {x.b, R + 1, x.h, x.D, x.e}, {x.h * Ds, slot, Ds, x.e, 1});
    const expanse_tensor dYz = view(cot.ptr, sd, *a->k, {x.b, R + 1, x.h, x.D}, {x.h * x.D, slot, x.D, 1}, x.S_size());
    expanse_tensor dXs = view(dX.ptr, sd, *a->k, {x.b, R, x.h, x.D, x.e}, {R * x.h * Ds, x.h * Ds, Ds, x.e, 1});
    expanse_tensor dXz = view(dX.ptr, sd, *a->k, {x.b, R, x.h, x.D}, {R * x.h * x.D, x.h * x.D, x.D, 1}, R * x.S_size());
    const bool rank0 = cp->rank == 0;
    expanse_discumsum_backward_args back;
    expanse_discumsum_backward_args_init(&back);
    back.X = &st.X, back.A = &st.A, back.Y_init = a->initial_S, back.dY = &dY, back.dX = &dXs;
    back.dY_init = rank0 ? a->dinitial_S : nullptr;
    call(expanse_discumsum_backward(ctx, &back));
    if (x.normalize) {
      back.X = &st.Xz, back.Y_init = a->initial_z, back.dY = &dYz, back.dX = &dXz;
      back.dY_init = rank0 ? a->dinitial_z : nullptr;
      call(expanse_discumsum_backward(ctx, &back));
    }
    if (!rank0) {
      if (a->dinitial_S) zero(ctx, *a->dinitial_S);
      if (a->dinitial_z) zero(ctx, *a->dinitial_z);
    }

    // 3. This piece's backward from its entering state with its final state's cotangent: every path
    // from its tokens to the loss, into the caller's gradients.
    const int64_t r = cp->rank;
    const expanse_tensor dF = view(dX.ptr, sd, *a->k, {x.b, x.h, x.D, x.e}, {R * x.h * Ds, Ds, x.e, 1}, r * x.h * Ds);
    const expanse_tensor dFz =
        view(dX.ptr, sd, *a->k, {x.b, x.h, x.D}, {R * x.h * x.D, x.D, 1}, R * x.S_size() + r * x.h * x.D);
    device_buffer unused(ctx, size_t(slot) * es);  // the entering state's cotangent, again
    expanse_tensor uS = view(unused.ptr, sd, *a->k, {x.b, x.h, x.D, x.e}, {x.h * Ds, Ds, x.e, 1});
    expanse_tensor uz = view(unused.ptr, sd, *a->k, {x.b, x.h, x.D}, {x.h * x.D, x.D, 1}, x.S_size());
    expanse_power_attention_backward_args second = *a;
    const bool entering = cp->rank > 0 || a->initial_S;
    second.initial_S = entering ? &S_in : nullptr;
    second.initial_z = entering && x.normalize ? &z_in : nullptr;
    second.dinitial_S = entering ? &uS : nullptr;
    second.dinitial_z = entering && x.normalize ? &uz : nullptr;
    second.dfinal_S = &dF;
    second.dfinal_z = x.normalize ? &dFz : nullptr;
    call(expanse_power_attention_backward(ctx, &second));
    call(expanse_synchronize(ctx));
  });
}

}  // extern "C"
