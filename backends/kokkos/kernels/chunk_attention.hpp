// chunk_attention (docs/spec.md, chunked algorithm 4): causal power attention inside each chunk,
// stabilized in log space. For j <= i of one chunk (and j at or after i's last reset):
//   s_ij = p log|scale q_i . k_j| + Gc_i - Gc_j,  sign_ij = sign(q_i . k_j)^p,  rowmax_i = max_j s_ij,
//   y_i = sum_j sign_ij exp(s_ij - rowmax_i) v_j,  l_i = sum_j sign_ij exp(s_ij - rowmax_i)
// (a row with no finite score: rowmax = 0, y = 0, l = 0). y may be absent (the backward's denominators
// need only l and rowmax): its sums are then skipped. A team per (batch, query head, chunk,
// block of kTokens queries) walks the keys in tiles of kKeys held in scratch; each query row keeps
// its running maximum and rescales its sums when it grows (one pass over the keys).
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

template <class Space>
void launch_chunk_attention(const Space& space, tensor_ref q, tensor_ref k, tensor_ref v, gate_sums g,
                            expanse_problem pb, tensor_ref y, tensor_ref l, tensor_ref rowmax) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kTokens = 32, kKeys = 32;
  const bool want_y = y.present();
  const size_t bytes = sizeof(float) * size_t(kTokens * (pb.d + pb.e + 2) + kKeys * (pb.d + pb.e));
  policy teams(space, query_block::teams(kTokens, pb), Kokkos::AUTO);
  const int level = set_team_scratch(teams, bytes);
  Kokkos::parallel_for(
      "expanse::chunk_attention", teams, KOKKOS_LAMBDA(const member& team) {
        const query_block qb(team.league_rank(), kTokens, pb);
        if (qb.count == 0) return;
        const int64_t batch = qb.batch, qh = qb.qh, kv = qb.kv, bh = qb.bh, first = qb.first, i0 = qb.i0;
        const int64_t tq = qb.count, d = pb.d, e = pb.e;
        float* qs = team_floats(team, level, bytes);
        float* ys = qs + kTokens * d;   // [kTokens][e]
        float* mx = ys + kTokens * e;   // [kTokens]: running maximum
        float* ls = mx + kTokens;       // [kTokens]
        float* ks = ls + kTokens;       // [kKeys][d]
        float* vs = ks + kKeys * d;     // [kKeys][e]
        team_load_rows(team, qs, q, batch, first + i0, qh, tq, d);  // unscaled (scaled_dot)
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq * e), [&](int64_t i) { ys[i] = 0.f; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t i) {
          mx[i] = -INFINITY;
          ls[i] = 0.f;
        });
        // Resets only move a row's first key later, so the block's first row sees the earliest one.
        for (int64_t j0 = g.first_key(bh, first + i0); j0 < i0 + tq; j0 += kKeys) {
          const int64_t tk = j0 + kKeys < i0 + tq ? kKeys : i0 + tq - j0;
          team.team_barrier();
          team_load_rows(team, ks, k, batch, first + j0, kv, tk, d);
          team_load_rows(team, vs, v, batch, first + j0, kv, tk, e);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
            const int64_t i = i0 + row, lo = g.first_key(bh, first + i);
            float* yr = ys + row * e;
            for (int64_t j = j0 > lo ? j0 : lo; j <= i && j < j0 + tk; ++j) {
              const float* kr = ks + (j - j0) * d;
              const double dot = scaled_dot(qs + row * d, kr, d, pb.scale);
              if (dot == 0.0) continue;
              const float s = float(pb.p * math::log(math::fabs(dot))) + g.log_decay(bh, first + j, first + i);
              if (s > mx[row]) {
                const float f = math::exp(mx[row] - s);  // 0 for the first finite score
                for (int64_t col = 0; col < (want_y ? e : 0); ++col) yr[col] *= f;
                ls[row] *= f;
                mx[row] = s;
              }
              const float w = (pb.p % 2 == 1 && dot < 0.0 ? -1.f : 1.f) * math::exp(s - mx[row]);
              const float* vr = vs + (j - j0) * e;
              for (int64_t col = 0; col < (want_y ? e : 0); ++col) yr[col] += w * vr[col];
              ls[row] += w;
            }
          });
        }
        team.team_barrier();
        team_for_2d(team, want_y ? tq : 0, e, [&](int64_t row, int64_t col) {
          y.set(y.at(batch, first + i0 + row, qh, col), ys[row * e + col]);
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
          const bool empty = mx[row] == -INFINITY;
          if (l.present()) l.set(l.at(batch, first + i0 + row, qh), ls[row]);
          rowmax.set(rowmax.at(batch, first + i0 + row, qh), empty ? 0.f : mx[row]);
        });
      });
}

}  // namespace expanse_kokkos
