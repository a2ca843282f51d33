// update_state (docs/spec.md, chunked algorithm 1): S_m[r, col] = sum_{j in m} exp(A_m - Gc_j)
// phi_r(k_j) v_j[col], z_m[r] the same with v_j[col] = 1. A team per (batch, chunk, kv head, block of
// kRows rows of phi); over tiles of kTokens keys it expands phi(k) for its rows in scratch and adds the
// tile's product to its kRows x (e + 1) accumulators (expand-MMA: phi is never in memory).
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

template <class Space>
void launch_update_state(const Space& space, tensor_ref k, tensor_ref v, gate_sums g, const phi_row* table,
                         expanse_problem pb, tensor_ref S, tensor_ref z) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kRows = 32, kTokens = 32;
  const int64_t E1 = pb.e + 1, blocks = (pb.D + kRows - 1) / kRows;
  const size_t bytes = sizeof(float) * size_t(kRows * E1 + kTokens * pb.d + kTokens * E1 + kRows * kTokens);
  policy teams(space, pb.b * pb.n * pb.h * blocks, Kokkos::AUTO);
  teams.set_scratch_size(0, Kokkos::PerTeam(bytes));
  Kokkos::parallel_for(
      "expanse::update_state", teams, KOKKOS_LAMBDA(const member& team) {
        int64_t task = team.league_rank();
        const int64_t blk = task % blocks;
        task /= blocks;
        const int64_t head = task % pb.h;
        task /= pb.h;
        const int64_t m = task % pb.n, batch = task / pb.n, bh = batch * pb.h + head;
        const int64_t first = m * pb.c, len = first + pb.c < pb.t ? pb.c : pb.t - first, last = first + len - 1;
        const int64_t r0 = blk * kRows, rows = r0 + kRows < pb.D ? kRows : pb.D - r0;
        const int64_t d = pb.d, e = pb.e;
        float* acc = static_cast<float*>(team.team_shmem().get_shmem(bytes));
        float* keys = acc + kRows * E1;    // [kTokens][d]
        float* wv = keys + kTokens * d;    // [kTokens][E1]: the decayed v, then the decay
        float* ph = wv + kTokens * E1;     // [kRows][kTokens]
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, int64_t(kRows) * E1), [&](int64_t i) { acc[i] = 0.f; });
        // Keys before the chunk's last reset do not reach its end.
        for (int64_t j0 = g.first_key(bh, last); j0 < len; j0 += kTokens) {
          const int64_t tk = j0 + kTokens < len ? kTokens : len - j0;
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk * d), [&](int64_t i) {
            keys[i] = k.get(k.at(batch, first + j0 + i / d, head, i % d));
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk * E1), [&](int64_t i) {
            const int64_t tok = first + j0 + i / E1, col = i % E1;
            const float w = math::exp(g.log_decay(bh, tok, last));
            wv[i] = col < e ? w * v.get(v.at(batch, tok, head, col)) : w;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * tk), [&](int64_t i) {
            ph[(i / tk) * kTokens + i % tk] = phi_value(table[r0 + i / tk], pb.p, keys + (i % tk) * d);
          });
          team.team_barrier();
          team_add_product(team, acc, ph, kTokens, wv, rows, tk, E1);
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows * E1), [&](int64_t i) {
          const int64_t r = r0 + i / E1, col = i % E1;
          if (col < e) S.set(S.at(batch, m, head, r, col), acc[i]);
          else if (z.present()) z.set(z.at(batch, m, head, r), acc[i]);
        });
      });
}

}  // namespace expanse_kokkos
