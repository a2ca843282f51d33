// Context parallelism (docs/spec.md): power_attention and its backward over one sequence split across
// ranks, composed of the public operations and the caller's all-gather (expanse_context_parallel).
// The gathered buffer is rank-major: each rank's block holds its state from zero S [b,h,D,e], then z
// [b,h,D] where normalized, then its total log decay A [b,h], so that strided views of it are
// discumsum's X and A over the rank axis directly (and S, z, A are disjoint outputs of sequence_state).
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "context_stream.hpp"
#include "errors.hpp"
#include "expanse/expanse.h"

using namespace expanse::detail;

namespace {

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

// The exchange carries z only where it is normalized: an unnormalized call's z states (which do not
// change its outputs) are refused rather than left wrong.
void refuse_z_unnormalized(const char* fn, int32_t normalize,
                           std::initializer_list<std::pair<const expanse_tensor*, const char*>> zs) {
  if (normalize == 1) return;
  for (const auto& [t, name] : zs)
    if (t) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "%s: argument '%s' needs normalize=1 here (the ranks exchange z only then)",
                fn, name);
}

// The backward's exchange (expanse_power_attention_backward_exchange's callback): every rank's
// entering-state cotangent without its final state's, L_s, gathered; then this piece's final-state
// cotangent dF_r = dY_{r+1} by the reverse recursion over the ranks after it,
//   dY_R = the sequence's dfinal (or zero),   dY_s = L_s + exp(A_s) dY_{s+1},
// on the host in the state dtype's precision (R states of D x e per head: small next to a piece).
struct cotangent_exchange {
  expanse_context* ctx;
  const expanse_context_parallel* cp;
  const layout_of_exchange* x;
  const entering_states* st;
  const expanse_power_attention_backward_args* a;
  void *send, *cot, *dF;
  std::string failure;  // an exception's message (it cannot cross the callback)
};

int32_t exchange_cotangents(void* stream, void* user) {
  cotangent_exchange& e = *static_cast<cotangent_exchange*>(user);
  try {
    const layout_of_exchange& x = *e.x;
    const int64_t slot = x.S_size() + x.z_size(), R = x.R, r = e.cp->rank;
    const size_t es = x.element(), slot_bytes = size_t(slot) * es;
    if (e.cp->allgather(e.send, e.cot, slot_bytes, stream, e.cp->user) != 0)
      fail(EXPANSE_ERROR_INTERNAL, "context parallelism: the all-gather failed (rank %d of %d)", e.cp->rank, e.cp->ranks);
    std::vector<unsigned char> cot(size_t(R) * slot_bytes), G(slot_bytes, 0), A(size_t(R * x.b * x.h) * es);
    call(expanse_memcpy(e.ctx, cot.data(), e.cot, cot.size(), EXPANSE_COPY_DEVICE_TO_HOST));
    const int64_t block = x.block(), aoff = x.S_size() + x.z_size();
    for (int64_t s = 0; s < R; ++s)  // rank s's total decays [b, h], after its S and z in its block
      call(expanse_memcpy(e.ctx, A.data() + size_t(s * x.b * x.h) * es,
                          static_cast<const char*>(e.st->gathered.ptr) + size_t(s * block + aoff) * es,
                          size_t(x.b * x.h) * es, EXPANSE_COPY_DEVICE_TO_HOST));
    const expanse_tensor* finals[] = {e.a->dfinal_S, x.normalize ? e.a->dfinal_z : nullptr};
    const int64_t offsets[] = {0, x.S_size()}, sizes[] = {x.S_size(), x.z_size()};
    for (int i = 0; i < 2; ++i) {
      if (!finals[i]) continue;
      if (finals[i]->dtype != x.state_dtype)
        fail(EXPANSE_ERROR_INVALID_ARGUMENT, "context parallelism: the final state's cotangent must be %s",
             expanse_dtype_name(expanse_dtype(x.state_dtype)));
      call(expanse_memcpy(e.ctx, G.data() + size_t(offsets[i]) * es, finals[i]->data, size_t(sizes[i]) * es,
                          EXPANSE_COPY_DEVICE_TO_HOST));
    }
    call(expanse_synchronize(e.ctx));
    auto recurse = [&](auto zero) {  // G = dY_R, then dY_s for s = R - 1 .. r + 1
      using F = decltype(zero);
      F* g = reinterpret_cast<F*>(G.data());
      const F* decays = reinterpret_cast<const F*>(A.data());
      for (int64_t s = R - 1; s > r; --s) {
        const F* Ls = reinterpret_cast<const F*>(cot.data() + size_t(s) * slot_bytes);
        for (int64_t i = 0; i < slot; ++i) {
          // entry i of a slot: S [b, h, D, e] then z [b, h, D]; its (batch, head) picks the decay
          const int64_t bh = i < x.S_size() ? i / (x.D * x.e) : (i - x.S_size()) / x.D;
          g[i] = Ls[i] + std::exp(decays[s * x.b * x.h + bh]) * g[i];
        }
      }
    };
    if (x.state_dtype == EXPANSE_F64) recurse(0.0);
    else recurse(0.f);
    call(expanse_memcpy(e.ctx, e.dF, G.data(), slot_bytes, EXPANSE_COPY_HOST_TO_DEVICE));
    call(expanse_synchronize(e.ctx));  // G is freed at return
    return 0;
  } catch (const api_error& ex) {  // nothing may leave a C callback (it unwinds through the backend)
    e.failure = ex.message;
  } catch (const std::exception& ex) {
    e.failure = ex.what();
  } catch (...) {
    e.failure = "an unknown exception";
  }
  return 1;
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
    refuse_z_unnormalized(fn, a->normalize, {{a->initial_z, "initial_z"}, {a->final_z, "final_z"}});
    const layout_of_exchange x = exchange_layout(*cp, *a->k, *a->v, a->p, a->layout, a->normalize != 0);
    entering_states st(ctx, x);
    exchange_states(ctx, *cp, x, *a->k, *a->v, a->log_g, a->p, own_state_chunk(ctx, *a), a->layout, a->initial_S,
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
    refuse_z_unnormalized(fn, a->normalize, {{a->initial_z, "initial_z"}, {a->dfinal_z, "dfinal_z"},
                                             {a->dinitial_z, "dinitial_z"}});
    expanse_power_attention_args fwd;  // the forward of the piece, for the chunk size of its states
    expanse_power_attention_args_init(&fwd);
    fwd.q = a->q, fwd.k = a->k, fwd.v = a->v, fwd.log_g = a->log_g;
    // dout has o's shape and dtype, and o is absent unless normalized; only validated, never written.
    fwd.o = const_cast<expanse_tensor*>(a->dout);
    fwd.p = a->p, fwd.scale = a->scale, fwd.chunk_size = a->chunk_size, fwd.normalize = a->normalize, fwd.layout = a->layout;
    const layout_of_exchange x = exchange_layout(*cp, *a->k, *a->v, a->p, a->layout, a->normalize != 0);
    entering_states st(ctx, x);
    exchange_states(ctx, *cp, x, *a->k, *a->v, a->log_g, a->p, own_state_chunk(ctx, fwd), a->layout, a->initial_S,
                    a->initial_z, st);
    const int32_t sd = x.state_dtype;
    const int64_t Ds = x.D * x.e, slot = x.S_size() + x.z_size();  // a state and its normalizer
    const size_t es = x.element();
    const expanse_tensor S_in = st.S_at(x, cp->rank), z_in = x.normalize ? st.z_at(x, cp->rank) : expanse_tensor{};

    // One backward from the entering state (rank 0 without an initial state: from zero) whose final
    // state's cotangent comes from the pieces after this one (exchange_cotangents): first the entering
    // state's cotangent without it, L_r, into `send`; then dF_r into `dF`; then everything.
    device_buffer send(ctx, size_t(slot) * es), cot(ctx, size_t(x.R * slot) * es), dF(ctx, size_t(slot) * es);
    expanse_tensor L = view(send.ptr, sd, *a->k, {x.b, x.h, x.D, x.e}, {x.h * Ds, Ds, x.e, 1});
    expanse_tensor Lz = view(send.ptr, sd, *a->k, {x.b, x.h, x.D}, {x.h * x.D, x.D, 1}, x.S_size());
    expanse_tensor dFS = view(dF.ptr, sd, *a->k, {x.b, x.h, x.D, x.e}, {x.h * Ds, Ds, x.e, 1});
    expanse_tensor dFz = view(dF.ptr, sd, *a->k, {x.b, x.h, x.D}, {x.h * x.D, x.D, 1}, x.S_size());
    expanse_power_attention_backward_args piece = *a;
    piece.initial_S = &S_in;
    piece.initial_z = x.normalize ? &z_in : nullptr;
    piece.dinitial_S = &L;
    piece.dinitial_z = x.normalize ? &Lz : nullptr;
    piece.dfinal_S = &dFS;
    piece.dfinal_z = x.normalize ? &dFz : nullptr;
    cotangent_exchange ex{ctx, cp, &x, &st, a, send.ptr, cot.ptr, dF.ptr, {}};
    const expanse_status st_bwd = expanse_power_attention_backward_exchange(ctx, &piece, &exchange_cotangents, &ex);
    if (!ex.failure.empty()) fail(EXPANSE_ERROR_INTERNAL, "%s: %s", fn, ex.failure.c_str());
    call(st_bwd);

    // The sequence's initial state is rank 0's entering state: its cotangent is L_0 with dF_0 (which
    // the backward left in `send`); the other ranks' is zero.
    if (cp->rank == 0) {
      if (a->dinitial_S) copy_per_batch(ctx, *a->dinitial_S, L, x.h * Ds);
      if (a->dinitial_z) copy_per_batch(ctx, *a->dinitial_z, Lz, x.h * x.D);
    } else {
      if (a->dinitial_S) zero(ctx, *a->dinitial_S);
      if (a->dinitial_z) zero(ctx, *a->dinitial_z);
    }
    call(expanse_synchronize(ctx));
  });
}

}  // extern "C"
