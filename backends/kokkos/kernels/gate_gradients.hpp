// The gates' gradient from per-token terms (docs/spec.md "Gradients"), one thread per (batch, kv
// head, chunk): dlog_g is 0 at a reset, and otherwise
//   dlog_g_l = sum_{i >= l in l's segment} R_i  +  [no reset after l in the chunk] (sum_{j < l in m} P_j + E_m)
// R: the terms summed backwards (power_attention: the query's Phi . dPhi and the pairs' row sums
// minus their column sums; query_state: the first; chunk_attention: the last two), P: those summed
// forwards (the keys' Phi . dPhi: update_state, power_attention), E_m: the entering boundary
// exp(A_m) (<dY_{m+1}, S_m> + <dZ_{m+1}, z_m>) (power_attention). This is the spec's chunked sum, whose
// boundary <dY_{m+1}, S_{m+1}> + <dZ_{m+1}, z_{m+1}> is exp(A_m) (...) + sum_{j in m} P_j: the keys'
// terms that it would cancel are summed forwards instead, and the remaining dot product takes the
// state entering the chunk (the exact initial state in the first) rather than the one leaving it.
// Each term is a [b,t,heads] buffer with a sign (query heads summed over their kv head's group).
#pragma once

#include "kokkos/kernels/backward_common.hpp"

namespace expanse_kokkos {

struct gate_terms {
  static constexpr int kMax = 3;
  token_buffer term[kMax];
  float sign[kMax] = {};
  int count = 0;
  void add(token_buffer t, float s) {
    term[count] = t;
    sign[count++] = s;
  }
  KOKKOS_INLINE_FUNCTION float at(int64_t batch, int64_t tok, int64_t kv, int64_t h) const {
    float sum = 0.f;
    for (int k = 0; k < count; ++k) {
      const int64_t group = term[k].heads / h;
      for (int64_t head = kv * group; head < (kv + 1) * group; ++head) sum += sign[k] * *term[k].row(batch, tok, head);
    }
    return sum;
  }
};

// entering: E [b,h,n] (null: 0).
template <class Space>
void launch_gate_gradients(const Space& space, gate_terms backwards, gate_terms forwards, const float* entering,
                           tensor_ref log_g, expanse_problem pb, tensor_ref dlog_g) {
  Kokkos::parallel_for(
      "expanse::gate_gradients", Kokkos::RangePolicy<Space>(space, 0, pb.b * pb.h * pb.n), KOKKOS_LAMBDA(int64_t task) {
        const int64_t m = task % pb.n, kv = (task / pb.n) % pb.h, batch = task / (pb.n * pb.h);
        const int64_t first = m * pb.c, len = first + pb.c < pb.t ? pb.c : pb.t - first;
        auto is_reset = [&](int64_t tok) { return log_g.get(log_g.at(batch, tok, kv)) == -INFINITY; };
        // The forward sums first, in place (they count only after the chunk's last reset).
        float prefix = 0.f;
        for (int64_t l = first; l < first + len; ++l) {
          if (is_reset(l)) prefix = 0.f;
          dlog_g.set(dlog_g.at(batch, l, kv), prefix);
          prefix += forwards.at(batch, l, kv, pb.h);
        }
        const float edge = entering ? entering[(batch * pb.h + kv) * pb.n + m] : 0.f;
        float sum = 0.f;
        bool reset_after = false;
        for (int64_t l = first + len - 1; l >= first; --l) {
          const int64_t at = dlog_g.at(batch, l, kv);
          if (is_reset(l)) {
            dlog_g.set(at, 0.f);
            sum = 0.f;
            reset_after = true;
            continue;
          }
          sum += backwards.at(batch, l, kv, pb.h);
          dlog_g.set(at, reset_after ? sum : sum + dlog_g.get(at) + edge);
        }
      });
}

// entering[b,h,m] = exp(A_m) (<dY_m, S_m> + <dZ_m, z_m>) (dY_m, dZ_m: the cotangents of the state
// leaving chunk m, [b,n,h,D,e] and [b,n,h,D]; S, z: the states entering each chunk, [b,n+1,h,D,e] and
// [b,n+1,h,D]; A [b,n,h] the chunk totals, null: 0; dZ null: no z term). A team per (batch, kv head,
// chunk).
template <class Space>
void launch_entering_boundaries(const Space& space, const float* dY, const float* dZ, const float* S, const float* z,
                                const float* A, expanse_problem pb, float* entering) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  const int64_t De = pb.D * pb.e;
  Kokkos::parallel_for(
      "expanse::entering_boundaries", policy(space, pb.b * pb.h * pb.n, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const int64_t task = team.league_rank(), m = task % pb.n, kv = (task / pb.n) % pb.h, batch = task / (pb.n * pb.h);
        const float* dy = dY + ((batch * pb.n + m) * pb.h + kv) * De;
        const float* s = S + ((batch * (pb.n + 1) + m) * pb.h + kv) * De;
        double sum = 0.0;  // one term for many tokens, of many products that cancel: summed in f64
        Kokkos::parallel_reduce(Kokkos::TeamThreadRange(team, De), [&](int64_t i, double& acc) { acc += double(dy[i]) * s[i]; }, sum);
        if (dZ != nullptr) {
          const float* dzr = dZ + ((batch * pb.n + m) * pb.h + kv) * pb.D;
          const float* zr = z + ((batch * (pb.n + 1) + m) * pb.h + kv) * pb.D;
          double zsum = 0.0;
          Kokkos::parallel_reduce(Kokkos::TeamThreadRange(team, pb.D), [&](int64_t i, double& acc) { acc += double(dzr[i]) * zr[i]; }, zsum);
          sum += zsum;
        }
        const float decay = A ? math::exp(A[(batch * pb.n + m) * pb.h + kv]) : 1.f;
        Kokkos::single(Kokkos::PerTeam(team), [&] { entering[(batch * pb.h + kv) * pb.n + m] = decay == 0.f ? 0.f : float(decay * sum); });
      });
}

}  // namespace expanse_kokkos
