// query_state (docs/spec.md, chunked algorithm 3): for query i of chunk m,
//   num_i = phi(scale q_i)^T S_m exp(Gc_i),   den_i = phi(scale q_i)^T z_m exp(Gc_i),
// with the intra-chunk terms y_i exp(rowmax_i), l_i exp(rowmax_i) added where given, o = num / den
// normalized (0 where den is 0), else num. A team per (batch, query head, chunk, block of kTokens
// queries): over tiles of kRows rows of phi it expands phi(scale q) in scratch and adds the tile's
// product with the state rows to its kTokens x (e + 1) accumulators.
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

// o = (num e^g + y e^rm) / (den e^g + l e^rm) (normalized; else the numerator), with g the token's log
// decay from its chunk start and rm the intra row maximum. Normalized, both terms are scaled by
// e^-max(g, rm) first, as e^g alone underflows in f32 late in long, strongly gated chunks where the
// ratio is well defined; a denominator under 2^-64 is scaled by 2^64 (exact) before the division.
KOKKOS_INLINE_FUNCTION float combine_output(float num, float den, float g, bool intra, float y, float l, float rm,
                                            bool normalize) {
  if (!normalize) return num * math::exp(g) + (intra ? y * math::exp(rm) : 0.f);
  float fq = g == -INFINITY ? 0.f : 1.f, fi = 0.f;
  if (intra) {
    const float top = g > rm ? g : rm;
    fq = math::exp(g - top);
    fi = math::exp(rm - top);
  }
  den = den * fq + l * fi;
  if (den == 0.f) return 0.f;
  const float s = math::fabs(den) < 0x1p-64f ? 0x1p64f : 1.f;
  return (num * fq + y * fi) * s / (den * s);
}

struct intra_terms {
  tensor_ref y, l, rowmax;  // y absent: no intra-chunk term
};

template <class Space>
void launch_query_state(const Space& space, tensor_ref q, tensor_ref S, tensor_ref z, gate_sums g,
                        const phi_row* table, expanse_problem pb, intra_terms intra, tensor_ref o) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kRows = 32, kTokens = 32;
  const int64_t E1 = pb.e + 1;
  const size_t bytes = sizeof(float) * size_t(kTokens * pb.d + kTokens * E1 + kRows * E1 + kTokens * kRows);
  const bool has_state = S.present();
  double scale_p = 1.0;
  for (int k = 0; k < pb.p; ++k) scale_p *= pb.scale;
  policy teams(space, query_block::teams(kTokens, pb), Kokkos::AUTO);
  const int level = set_team_scratch(teams, bytes);
  Kokkos::parallel_for(
      "expanse::query_state", teams, KOKKOS_LAMBDA(const member& team) {
        const query_block qb(team.league_rank(), kTokens, pb);
        if (qb.count == 0) return;
        const int64_t batch = qb.batch, qh = qb.qh, kv = qb.kv, bh = qb.bh, m = qb.m, first = qb.first, i0 = qb.i0;
        const int64_t tq = qb.count, d = pb.d, e = pb.e;
        float* qs = team_floats(team, level, bytes);
        float* acc = qs + kTokens * d;     // [kTokens][E1]: numerator, then denominator
        float* st = acc + kTokens * E1;    // [kRows][E1]: state rows, then z
        float* ph = st + kRows * E1;       // [kTokens][kRows]
        team_load_rows(team, qs, q, batch, first + i0, qh, tq, d);  // unscaled: the phi tile takes scale^p
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, int64_t(kTokens) * E1), [&](int64_t i) { acc[i] = 0.f; });
        for (int64_t r0 = 0; has_state && r0 < pb.D; r0 += kRows) {
          const int64_t rows = r0 + kRows < pb.D ? kRows : pb.D - r0;
          team.team_barrier();
          team_for_2d(team, rows, E1, [&](int64_t row, int64_t col) {
            const int64_t r = r0 + row;
            st[row * E1 + col] = col < e ? S.get(S.at(batch, m, kv, r, col)) : z.present() ? z.get(z.at(batch, m, kv, r)) : 0.f;
          });
          team_phi_tile_exact(team, ph, 1, kRows, table, r0, rows, pb.p, qs, tq, d, scale_p);
          team.team_barrier();
          team_add_product(team, acc, ph, kRows, st, tq, rows, E1);
        }
        team.team_barrier();
        team_for_2d(team, tq, e, [&](int64_t row, int64_t col) {
          const int64_t tok = first + i0 + row;
          const bool has_intra = intra.y.present();
          const float y = has_intra ? intra.y.get(intra.y.at(batch, tok, qh, col)) : 0.f;
          const float l = has_intra && pb.normalize ? intra.l.get(intra.l.at(batch, tok, qh)) : 0.f;
          const float rm = has_intra ? intra.rowmax.get(intra.rowmax.at(batch, tok, qh)) : 0.f;
          const float gl = has_state ? g.log_from_chunk_start(bh, tok) : -INFINITY;
          o.set(o.at(batch, tok, qh, col),
                combine_output(acc[row * E1 + col], acc[row * E1 + e], gl, has_intra, y, l, rm, pb.normalize));
        });
      });
}

}  // namespace expanse_kokkos
