// update_state (docs/spec.md, chunked algorithm 1) and the sums of the same shape the backward needs:
//   S_m[r, col] = sum_{heads, i in m} w_i phi_r(s x_i) v_i[col],  z_m[r] = sum_{heads, i in m} w_i phi_r(s x_i) u_i
// update_state: x = k, v, u = 1, w = exp(A_m - Gc_j) (to the chunk's end); the cotangent of the state
// entering a chunk (power_attention_backward, query_state_backward): x = q (s = scale), v = dnum,
// u = dden, w = exp(Gc_i) (from the chunk's start), summed over the query heads of the kv head.
// A team per (batch, chunk, kv head, block of kRows rows of phi); over tiles of kTokens tokens it
// expands phi for its rows in scratch and adds the tile's product to its kRows x (e + 1)
// accumulators (expand-MMA: phi is never in memory).
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

struct state_sum_source {
  tensor_ref x;           // [b,t,heads,d]
  float x_scale = 1.f;
  tensor_ref v;           // [b,t,heads,e]
  tensor_ref u;           // [b,t,heads] (the z column); absent: 1
  int64_t group = 1;      // heads summed into one kv head (heads = h * group)
  bool from_start = false;
};

template <class Space>
void launch_state_sums(const Space& space, state_sum_source src, gate_sums g, const phi_row* table, expanse_problem pb,
                       tensor_ref S, tensor_ref z) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kRows = 64, kTokens = 32;
  const int64_t E1 = pb.e + 1, blocks = (pb.D + kRows - 1) / kRows;
  const size_t bytes = sizeof(float) * size_t(kRows * E1 + kTokens * pb.d + kTokens * E1 + kRows * kTokens);
  policy teams(space, pb.b * pb.n * pb.h * blocks, Kokkos::AUTO);
  const int level = set_team_scratch(teams, bytes);
  Kokkos::parallel_for(
      "expanse::state_sums", teams, KOKKOS_LAMBDA(const member& team) {
        int64_t task = team.league_rank();
        const int64_t blk = task % blocks;
        task /= blocks;
        const int64_t kv = task % pb.h;
        task /= pb.h;
        const int64_t m = task % pb.n, batch = task / pb.n, bh = batch * pb.h + kv;
        const int64_t first = m * pb.c, len = first + pb.c < pb.t ? pb.c : pb.t - first, last = first + len - 1;
        const int64_t r0 = blk * kRows, rows = r0 + kRows < pb.D ? kRows : pb.D - r0;
        const int64_t d = pb.d, e = pb.e;
        float* acc = team_floats(team, level, bytes);
        float* xs = acc + kRows * E1;    // [kTokens][d]
        float* wv = xs + kTokens * d;    // [kTokens][E1]: w v, then w u
        float* ph = wv + kTokens * E1;   // [kRows][kTokens]
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, int64_t(kRows) * E1), [&](int64_t i) { acc[i] = 0.f; });
        // To the chunk's end, keys before its last reset do not count; from its start, all may.
        const int64_t j_begin = src.from_start ? 0 : g.first_key(bh, last);
        for (int64_t head = kv * src.group; head < (kv + 1) * src.group; ++head)
          for (int64_t j0 = j_begin; j0 < len; j0 += kTokens) {
            const int64_t tk = j0 + kTokens < len ? kTokens : len - j0;
            team.team_barrier();
            team_load_rows(team, xs, src.x, batch, first + j0, head, tk, d, src.x_scale);
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk), [&](int64_t j) {
              const int64_t tok = first + j0 + j;
              const float w = math::exp(src.from_start ? g.log_from_chunk_start(bh, tok) : g.log_decay(bh, tok, last));
              float* row = wv + j * E1;
              Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, e), [&](int64_t col) {
                row[col] = w * src.v.get(src.v.at(batch, tok, head, col));
              });
              Kokkos::single(Kokkos::PerThread(team), [&] { row[e] = src.u.present() ? w * src.u.get(src.u.at(batch, tok, head)) : w; });
            });
            team.team_barrier();
            team_phi_tile(team, ph, kTokens, 1, table, r0, rows, pb.p, xs, tk, d);
            team.team_barrier();
            team_add_product(team, acc, ph, kTokens, wv, rows, tk, E1);
          }
        team.team_barrier();
        team_for_2d(team, rows, E1, [&](int64_t row, int64_t col) {
          const float sum = acc[row * E1 + col];
          if (col < e) S.set(S.at(batch, m, kv, r0 + row, col), sum);
          else if (z.present()) z.set(z.at(batch, m, kv, r0 + row), sum);
        });
      });
}

// update_state itself.
template <class Space>
void launch_update_state(const Space& space, tensor_ref k, tensor_ref v, gate_sums g, const phi_row* table,
                         expanse_problem pb, tensor_ref S, tensor_ref z) {
  state_sum_source src;
  src.x = k;
  src.v = v;
  launch_state_sums(space, src, g, table, pb, S, z);
}

}  // namespace expanse_kokkos
