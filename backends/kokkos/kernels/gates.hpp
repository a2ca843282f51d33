// The gate sums of every chunk (kernels/common.hpp, gate_sums): one thread per (batch, kv head,
// chunk) walks its tokens in order.
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

// log_g [b,t,h] f32 -> since, reset [b,h,t] for chunks of c tokens.
template <class Space>
void launch_gate_sums(const Space& space, tensor_ref log_g, int64_t b, int64_t t, int64_t h, int64_t c, double* since,
                      int32_t* reset) {
  const int64_t n = (t + c - 1) / c;
  Kokkos::parallel_for(
      "expanse::gate_sums", Kokkos::RangePolicy<Space>(space, 0, b * h * n), KOKKOS_LAMBDA(const int64_t task) {
        const int64_t m = task % n, bh = task / n, batch = bh / h, head = bh % h;
        const int64_t first = m * c, last = first + c < t ? first + c : t;
        double sum = 0.0;
        int32_t last_reset = -1;
        for (int64_t i = first; i < last; ++i) {
          const float lg = log_g.get(log_g.at(batch, i, head));
          if (lg == -INFINITY) {  // a reset: nothing before it reaches i or later tokens
            last_reset = int32_t(i - first);
            sum = 0.0;
          } else {
            sum += lg;
          }
          since[bh * t + i] = sum;
          reset[bh * t + i] = last_reset;
        }
      });
}

// The chunk totals A [b,n,h] (discumsum's log decays) from the gate sums: -inf for a chunk with a reset.
template <class Space>
void launch_chunk_totals(const Space& space, gate_sums g, int64_t b, int64_t h, int64_t n, float* A) {
  Kokkos::parallel_for(
      "expanse::chunk_totals", Kokkos::RangePolicy<Space>(space, 0, b * n * h), KOKKOS_LAMBDA(const int64_t i) {
        const int64_t head = i % h, m = (i / h) % n, batch = i / (h * n), bh = batch * h + head;
        const int64_t last = (m + 1) * g.c < g.t ? (m + 1) * g.c - 1 : g.t - 1;
        A[i] = g.log_from_chunk_start(bh, last);
      });
}

// A sequence's total log decay out [b,h] (sequence_state's A): the sum of its n chunk totals, -inf from a
// reset on; 0 without gates.
template <class Space>
void launch_sequence_totals(const Space& space, gate_sums g, int64_t b, int64_t h, int64_t n, tensor_ref out) {
  Kokkos::parallel_for(
      "expanse::sequence_totals", Kokkos::RangePolicy<Space>(space, 0, b * h), KOKKOS_LAMBDA(const int64_t bh) {
        double sum = 0.0;
        for (int64_t m = 0; g.present() && m < n; ++m) {
          const int64_t last = (m + 1) * g.c < g.t ? (m + 1) * g.c - 1 : g.t - 1;
          sum += g.log_from_chunk_start(bh, last);
        }
        out.set(out.at(bh / h, bh % h, 0), float(sum));
      });
}

}  // namespace expanse_kokkos
