// The intra-chunk pairs of the backward (docs/spec.md "Gradients"): for j <= i of one chunk (j at or
// after i's last reset), with the cotangents dnum_i, dden_i of query i,
//   A_ij = s_ij^p exp(Gc_i - Gc_j),  s_ij = scale q_i . k_j,  M_ij = dnum_i . v_j + dden_i,
//   B_ij = p s_ij^(p-1) exp(Gc_i - Gc_j) M_ij,
//   dq_i += scale sum_j B_ij k_j,  dk_j += sum_i B_ij scale q_i,  dv_j += sum_i A_ij dnum_i,
// and the sums the gates' gradient takes: rows_i = sum_j A_ij M_ij, cols_j = sum_i A_ij M_ij.
// Two kernels, so that every sum has one owner: query-major (a team per (batch, query head, chunk,
// kTokens queries), a thread per query over tiles of the keys) for dq and the row sums; key-major (a
// team per (batch, kv head, chunk, kTokens keys), a thread per key over the queries of every head of
// its group) for dk, dv and the column sums.
#pragma once

#include "kokkos/kernels/backward_common.hpp"

namespace expanse_kokkos {

// A_ij M_ij and B_ij of one pair, from s = scale q_i . k_j, its log decay and M.
struct pair_terms {
  float am, b, a;
  KOKKOS_INLINE_FUNCTION pair_terms(float s, float log_decay, float M, int p) {
    float pw = 1.f;
    for (int k = 1; k < p; ++k) pw *= s;
    const float decay = math::exp(log_decay);
    a = pw * s * decay;
    am = a * M;
    b = float(p) * pw * decay * M;
  }
};

struct pair_outputs {
  token_buffer dq, rows;      // [b,t,hq,d], [b,t,hq]: added to, written
  token_buffer dk, dv, cols;  // [b,t,h,d], [b,t,h,e]: added to; [b,t,h]: written
};

template <class Space>
void launch_pair_gradients(const Space& space, tensor_ref q, tensor_ref k, tensor_ref v, gate_sums g, expanse_problem pb,
                           query_cotangents cot, pair_outputs out) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kTokens = 32;
  const int64_t d = pb.d, e = pb.e, group = pb.hq / pb.h;
  const float scale = float(pb.scale);
  const bool exact = cot.dout.present();
  // Query-major: qs, dq [kTokens][d], the staged cotangents [kTokens][e] twice and [kTokens], rows
  // [kTokens]; keys ks [kTokens][d], vs [kTokens][e].
  const size_t query_bytes = sizeof(float) * size_t(kTokens * (3 * d + 3 * e + 2));
  policy query_teams(space, query_block::teams(kTokens, pb), Kokkos::AUTO);
  const int query_level = set_team_scratch(query_teams, query_bytes);
  Kokkos::parallel_for(
      "expanse::pair_gradients_queries", query_teams, KOKKOS_LAMBDA(const member& team) {
        const query_block qb(team.league_rank(), kTokens, pb);
        if (qb.count == 0) return;
        const int64_t batch = qb.batch, qh = qb.qh, kv = qb.kv, bh = qb.bh, first = qb.first, i0 = qb.i0, tq = qb.count;
        float* qs = team_floats(team, query_level, query_bytes);
        float* dqs = qs + kTokens * d;
        float* ks = dqs + kTokens * d;
        float* vs = ks + kTokens * d;
        const staged_cotangents sc{vs + kTokens * e, vs + 2 * kTokens * e, vs + 3 * kTokens * e, e, exact};
        float* rows = sc.w + kTokens;
        team_load_rows(team, qs, q, batch, first + i0, qh, tq, d);  // unscaled (scaled_dot)
        team_load_cotangents(team, sc, cot, batch, first + i0, qh, tq);
        team_zero(team, dqs, tq * d);
        team_zero(team, rows, tq);
        for (int64_t j0 = g.first_key(bh, first + i0); j0 < i0 + tq; j0 += kTokens) {
          const int64_t tk = j0 + kTokens < i0 + tq ? kTokens : i0 + tq - j0;
          team.team_barrier();
          team_load_rows(team, ks, k, batch, first + j0, kv, tk, d);
          team_load_rows(team, vs, v, batch, first + j0, kv, tk, e);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
            const int64_t i = i0 + row, lo = g.first_key(bh, first + i);
            for (int64_t j = j0 > lo ? j0 : lo; j <= i && j < j0 + tk; ++j) {
              const float* kr = ks + (j - j0) * d;
              const float* vr = vs + (j - j0) * e;
              const float s = scaled_dot(qs + row * d, kr, d, pb.scale);
              const pair_terms pt(s, g.log_decay(bh, first + j, first + i), sc.M(row, vr), pb.p);
              rows[row] += pt.am;
              for (int64_t a = 0; a < d; ++a) dqs[row * d + a] += pt.b * kr[a];
            }
          });
        }
        team.team_barrier();
        team_for_2d(team, tq, d, [&](int64_t row, int64_t a) {
          out.dq.row(batch, first + i0 + row, qh)[a] += scale * dqs[row * d + a];
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
          if (out.rows.present()) *out.rows.row(batch, first + i0 + row, qh) = rows[row];
        });
      });

  // Key-major: ks, dk [kTokens][d], vs, dv [kTokens][e], cols [kTokens]; queries qs [kTokens][d] and
  // their staged cotangents [kTokens][e] twice and [kTokens].
  const size_t key_bytes = sizeof(float) * size_t(kTokens * (3 * d + 4 * e + 2));
  policy key_teams(space, key_block::teams(kTokens, pb), Kokkos::AUTO);
  const int key_level = set_team_scratch(key_teams, key_bytes);
  Kokkos::parallel_for(
      "expanse::pair_gradients_keys", key_teams, KOKKOS_LAMBDA(const member& team) {
        const key_block kb(team.league_rank(), kTokens, pb);
        if (kb.count == 0) return;
        const int64_t batch = kb.batch, kv = kb.kv, bh = kb.bh, first = kb.first, len = kb.len, j0 = kb.j0, tk = kb.count;
        float* ks = team_floats(team, key_level, key_bytes);
        float* dks = ks + kTokens * d;
        float* qs = dks + kTokens * d;
        float* vs = qs + kTokens * d;
        float* dvs = vs + kTokens * e;
        const staged_cotangents sc{dvs + kTokens * e, dvs + 2 * kTokens * e, dvs + 3 * kTokens * e, e, exact};
        float* cols = sc.w + kTokens;
        team_load_rows(team, ks, k, batch, first + j0, kv, tk, d);
        team_load_rows(team, vs, v, batch, first + j0, kv, tk, e);
        team_zero(team, dks, tk * d);
        team_zero(team, dvs, tk * e);
        team_zero(team, cols, tk);
        for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh)
          for (int64_t i0 = j0; i0 < len; i0 += kTokens) {
            const int64_t tq = i0 + kTokens < len ? kTokens : len - i0;
            team.team_barrier();
            team_load_rows(team, qs, q, batch, first + i0, qh, tq, d);  // unscaled (scaled_dot)
            team_load_cotangents(team, sc, cot, batch, first + i0, qh, tq);
            team.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk), [&](int64_t key) {
              const int64_t j = j0 + key;
              const float* kr = ks + key * d;
              const float* vr = vs + key * e;
              for (int64_t row = 0; row < tq; ++row) {
                const int64_t i = i0 + row;
                if (i < j || g.first_key(bh, first + i) > j) continue;
                const float s = scaled_dot(qs + row * d, kr, d, pb.scale);
                const pair_terms pt(s, g.log_decay(bh, first + j, first + i), sc.M(row, vr), pb.p);
                cols[key] += pt.am;
                for (int64_t a = 0; a < d; ++a) dks[key * d + a] += pt.b * scale * qs[row * d + a];
                for (int64_t col = 0; col < e; ++col) dvs[key * e + col] += pt.a * sc.dnum(row, col);
              }
            });
          }
        team.team_barrier();
        team_for_2d(team, tk, d, [&](int64_t key, int64_t a) { out.dk.row(batch, first + j0 + key, kv)[a] += dks[key * d + a]; });
        team_for_2d(team, tk, e, [&](int64_t key, int64_t col) {
          out.dv.row(batch, first + j0 + key, kv)[col] += dvs[key * e + col];
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk), [&](int64_t key) {
          if (out.cols.present()) *out.cols.row(batch, first + j0 + key, kv) = cols[key];
        });
      });
}

}  // namespace expanse_kokkos
