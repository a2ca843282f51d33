// chunk_attention (docs/spec.md, chunked algorithm 4): causal power attention inside each chunk,
// stabilized in log space. For j <= i of one chunk (and j at or after i's last reset):
//   s_ij = p log|scale q_i . k_j| + Gc_i - Gc_j,  sign_ij = sign(q_i . k_j)^p,  rowmax_i = max_j s_ij,
//   y_i = sum_j sign_ij exp(s_ij - rowmax_i) v_j,  l_i = sum_j sign_ij exp(s_ij - rowmax_i)
// (a row with no finite score: rowmax = 0, y = 0, l = 0). y may be absent (the backward's denominators
// need only l and rowmax): its sums are then skipped. A team per (batch, query head, chunk,
// block of kTokens queries) walks the keys in tiles of kKeys held in scratch; each query row keeps
// its running maximum and rescales its sums when it grows (one pass over the keys, latest first).
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
        // The keys go from the latest back (tiles and keys within them): gated scores mostly fall with
        // the distance, so a row's maximum is then found early and seldom grows (a log and a rescale
        // each time it does).
        const int64_t key0 = g.first_key(bh, first + i0), key_tiles = (i0 + tq - key0 + kKeys - 1) / kKeys;
        for (int64_t tile = key_tiles - 1; tile >= 0; --tile) {
          const int64_t j0 = key0 + tile * kKeys, tk = j0 + kKeys < i0 + tq ? kKeys : i0 + tq - j0;
          team.team_barrier();
          team_load_rows(team, ks, k, batch, first + j0, kv, tk, d);
          team_load_rows(team, vs, v, batch, first + j0, kv, tk, e);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
            const int64_t i = i0 + row, lo = g.first_key(bh, first + i);
            float* yr = ys + row * e;
            for (int64_t j = (i < j0 + tk - 1 ? i : j0 + tk - 1); j >= j0 && j >= lo; --j) {
              const float* kr = ks + (j - j0) * d;
              const double dot = scaled_dot(qs + row * d, kr, d, pb.scale);
              if (dot == 0.0) continue;
              // exp(s - rowmax) = |dot|^p exp(log_decay - rowmax): a log only where the maximum grows
              // (a log per pair was 7% of the README demo's forward)
              const float decay = g.log_decay(bh, first + j, first + i);
              double mag = 1.0;
              for (int k = 0; k < pb.p; ++k) mag *= math::fabs(dot);
              float w = float(mag * math::exp(decay - mx[row]));  // inf for the first finite score
              if (w > 1.f) {
                const float s = float(pb.p * math::log(math::fabs(dot))) + decay;
                if (s > mx[row]) {
                  const float f = math::exp(mx[row] - s);  // 0 for the first finite score
                  for (int64_t col = 0; col < (want_y ? e : 0); ++col) yr[col] *= f;
                  ls[row] *= f;
                  mx[row] = s;
                }
                w = math::exp(s - mx[row]);
              }
              if (pb.p % 2 == 1 && dot < 0.0) w = -w;
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
