// discumsum (docs/spec.md, chunked algorithm 2): Y_0 = Y_init (0 when absent), Y_{m+1} = exp(A_m) Y_m
// + X_m, a thread per (batch, head, block of entries) walking the chunks in order. A_m = -inf (a
// reset in chunk m) makes exp(A_m) exactly 0: Y_{m+1} is X_m alone.
#pragma once

#include <initializer_list>

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

// A state tensor [b, n, h, ...] (or [b, h, ...] with chunk_axis false) with its trailing dims.
struct state_ref {
  tensor_ref t;
  int64_t shape[kMaxDims] = {};
  bool chunk_axis = true;
  // The stride of one element where the trailing dims are packed (then elem_offset is elem times it,
  // with no division per dim: they were most of discumsum on the host); 0 where they are not.
  int64_t packed_stride = 0;
  // The offset of element `elem` (row-major over the trailing dims) of (batch, chunk, head), in two
  // parts: of (batch, chunk, head) and of the element.
  KOKKOS_INLINE_FUNCTION int64_t offset(int64_t batch, int64_t chunk, int64_t head, int64_t elem) const {
    return row_offset(batch, chunk, head) + elem_offset(elem);
  }
  KOKKOS_INLINE_FUNCTION int64_t row_offset(int64_t batch, int64_t chunk, int64_t head) const {
    return batch * t.stride[0] + (chunk_axis ? chunk * t.stride[1] + head * t.stride[2] : head * t.stride[1]);
  }
  KOKKOS_INLINE_FUNCTION int64_t elem_offset(int64_t elem) const {
    if (packed_stride != 0) return elem * packed_stride;
    int64_t off = 0;
    for (int dim = t.ndim - 1; dim >= (chunk_axis ? 3 : 2); --dim) {
      off += (elem % shape[dim]) * t.stride[dim];
      elem /= shape[dim];
    }
    return off;
  }
  // The stride from one chunk to the next (0 without a chunk axis).
  KOKKOS_INLINE_FUNCTION int64_t chunk_stride() const { return chunk_axis ? t.stride[1] : 0; }
};

// packed_stride of s: its last dim's stride where every trailing dim steps by the size of the next.
inline void find_packed_stride(state_ref& s) {
  const int first = s.chunk_axis ? 3 : 2, last = s.t.ndim - 1;
  bool packed = last >= first;
  for (int dim = first; packed && dim < last; ++dim) packed = s.t.stride[dim] == s.t.stride[dim + 1] * s.shape[dim + 1];
  s.packed_stride = packed ? s.t.stride[last] : 0;
}

// A contiguous state buffer t of the given shape [b, chunks, h, ...] (the composed operations' own).
inline state_ref chunk_states_of(const tensor_ref& t, std::initializer_list<int64_t> shape) {
  state_ref s;
  s.t = t;
  for (size_t i = 0; i < shape.size(); ++i) s.shape[i] = shape.begin()[i];
  find_packed_stride(s);
  return s;
}

inline state_ref state_of(const expanse_tensor* x, bool chunk_axis) {
  state_ref s;
  s.t = tensor_ref(x);
  s.chunk_axis = chunk_axis;
  if (x != nullptr) {
    for (int i = 0; i < x->ndim; ++i) s.shape[i] = x->shape[i];
    find_packed_stride(s);
  }
  return s;
}

// The scan of n chunks of X: the state entering chunk m goes to `entering` at chunk m (m < n; it may
// be X itself: each X_m is read before its slot is written), Y_n to `final_state` at chunk n (when
// present: the public operation's Y itself, or a [b,h,...] state without a chunk axis). A [b,n,h]
// log decays (absent: 0), init [b,h,...] (absent: 0). With `reverse`, the chunks are taken from the
// last to the first (the cotangents of the states: `entering` then gets the carry before chunk m,
// i.e. the cotangent of the state leaving chunk m, and `final_state` that of the state entering 0).
template <class Space>
void launch_discumsum(const Space& space, state_ref X, tensor_ref A, state_ref init, state_ref entering,
                      state_ref final_state, int64_t b, int64_t n, int64_t h, int64_t elems, bool reverse = false) {
  // A thread walks the chunks for kEntries entries of one (batch, head): on a GPU one entry (a
  // thread each), on the host 64, so that each chunk's decay costs one exp per 64 entries (one per
  // entry took 7-11% of power_attention on Serial).
  constexpr int64_t kEntries = kHostSpace<Space> ? 64 : 1;
  const int64_t blocks = (elems + kEntries - 1) / kEntries;
  Kokkos::parallel_for(
      "expanse::discumsum", Kokkos::RangePolicy<Space>(space, 0, b * h * blocks), KOKKOS_LAMBDA(const int64_t i) {
        const int64_t blk = i % blocks, head = (i / blocks) % h, batch = i / (blocks * h);
        const int64_t e0 = blk * kEntries, count = e0 + kEntries <= elems ? kEntries : elems - e0;
        const int64_t xs = X.chunk_stride(), ys = entering.chunk_stride();
        int64_t x0[kEntries] = {}, y0[kEntries] = {};
        float carry[kEntries] = {};
        for (int64_t j = 0; j < count; ++j) {
          x0[j] = X.offset(batch, 0, head, e0 + j);
          y0[j] = entering.offset(batch, 0, head, e0 + j);
          carry[j] = init.t.present() ? init.t.get(init.offset(batch, 0, head, e0 + j)) : 0.f;
        }
        for (int64_t step = 0; step < n; ++step) {
          const int64_t m = reverse ? n - 1 - step : step;
          const float decay = A.present() ? math::exp(A.get(A.at(batch, m, head))) : 1.f;
          for (int64_t j = 0; j < count; ++j) {
            const float x = X.t.get(x0[j] + m * xs);  // read before its slot is written (X may be `entering`)
            entering.t.set(y0[j] + m * ys, carry[j]);
            carry[j] = decay * carry[j] + x;
          }
        }
        if (final_state.t.present())
          for (int64_t j = 0; j < count; ++j) final_state.t.set(final_state.offset(batch, n, head, e0 + j), carry[j]);
      });
}

}  // namespace expanse_kokkos
