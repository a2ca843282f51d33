// The key side of the state terms (update_state_backward, and power_attention_backward with the
// cotangent of the state leaving each chunk): for key j of chunk m, w_j = exp(A_m - Gc_j) and
//   dPhi_j = w_j (dS_m v_j + dz_m),  dk_j += J_phi(k_j)^T dPhi_j,  dv_j += w_j dS_m^T phi(k_j),
//   c_j = phi(k_j) . dPhi_j     (the key's term of the gates' gradient)
// A team per (batch, chunk, kv head, kTokens keys) takes dS_m in tiles of kRows rows: it forms the
// tile of dPhi (kTokens x kRows) and phi, pulls dPhi back, and adds phi's product with the rows to dv.
#pragma once

#include "kokkos/kernels/backward_common.hpp"

namespace expanse_kokkos {

struct key_gradient_outputs {
  token_buffer dk, dv;  // [b,t,h,d], [b,t,h,e]: added to
  token_buffer c;       // [b,t,h]: written
};

template <class Space>
void launch_key_gradients(const Space& space, tensor_ref k, tensor_ref v, gate_sums g, const phi_row* table,
                          expanse_problem pb, tensor_ref dS, tensor_ref dz, key_gradient_outputs out) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kRows = 32, kTokens = 32;
  const int64_t d = pb.d, e = pb.e, E1 = e + 1;
  // dks [kTokens][d] (f64, first: aligned); ks [kTokens][d]; vv, dvs [kTokens][E1]; st [kRows][E1]; ph, dphi
  // [kTokens][kRows]; w, c [kTokens].
  const size_t bytes = sizeof(double) * size_t(kTokens * d) +
                       sizeof(float) * size_t(kTokens * d + 2 * kTokens * E1 + kRows * E1 + 2 * kTokens * kRows + 2 * kTokens);
  policy teams(space, key_block::teams(kTokens, pb), Kokkos::AUTO);
  const int level = set_team_scratch(teams, bytes);
  Kokkos::parallel_for(
      "expanse::key_gradients", teams, KOKKOS_LAMBDA(const member& team) {
        const key_block kb(team.league_rank(), kTokens, pb);
        if (kb.count == 0) return;
        const int64_t batch = kb.batch, kv = kb.kv, bh = kb.bh, m = kb.m, j0 = kb.j0, tk = kb.count;
        const int64_t last = kb.first + kb.len - 1, key0 = kb.first + j0;
        double* dks = reinterpret_cast<double*>(team_floats(team, level, bytes));
        float* ks = reinterpret_cast<float*>(dks + kTokens * d);
        float* vv = ks + kTokens * d;
        float* dvs = vv + kTokens * E1;
        float* st = dvs + kTokens * E1;
        float* ph = st + kRows * E1;
        float* dphi = ph + kTokens * kRows;
        float* w = dphi + kTokens * kRows;
        float* c = w + kTokens;
        team_load_rows(team, ks, k, batch, key0, kv, tk, d);
        team_zero(team, dks, tk * d);
        team_for_2d(team, tk, E1, [&](int64_t key, int64_t col) {
          vv[key * E1 + col] = col < e ? v.get(v.at(batch, key0 + key, kv, col)) : 1.f;
          dvs[key * E1 + col] = 0.f;
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk), [&](int64_t key) {
          const int64_t j = j0 + key;  // keys before the chunk's last reset do not reach its end
          w[key] = j < g.first_key(bh, last) ? 0.f : math::exp(g.log_decay(bh, key0 + key, last));
          c[key] = 0.f;
        });
        for (int64_t r0 = 0; r0 < pb.D; r0 += kRows) {
          const int64_t rows = r0 + kRows < pb.D ? kRows : pb.D - r0;
          team.team_barrier();
          team_for_2d(team, rows, E1, [&](int64_t row, int64_t col) {
            const int64_t r = r0 + row;
            st[row * E1 + col] = col < e ? dS.get(dS.at(batch, m, kv, r, col)) : dz.present() ? dz.get(dz.at(batch, m, kv, r)) : 0.f;
          });
          team_phi_tile(team, ph, 1, kRows, table, r0, rows, pb.p, ks, tk, d);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk * rows), [&](int64_t i) {
            const int64_t key = i / rows, r = i % rows;
            float sum = 0.f;
            for (int64_t col = 0; col < E1; ++col) sum += vv[key * E1 + col] * st[r * E1 + col];
            dphi[key * kRows + r] = w[key] * sum;
          });
          team_add_product(team, dvs, ph, kRows, st, tk, rows, E1);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk), [&](int64_t key) {
            c[key] += float(pull_back_tile(table, r0, rows, pb.p, ks + key * d, ph + key * kRows, dphi + key * kRows,
                                           dks + key * d));
          });
        }
        team.team_barrier();
        team_for_2d(team, tk, d, [&](int64_t key, int64_t a) { out.dk.row(batch, key0 + key, kv)[a] += float(dks[key * d + a]); });
        team_for_2d(team, tk, e, [&](int64_t key, int64_t col) {
          out.dv.row(batch, key0 + key, kv)[col] += w[key] * dvs[key * E1 + col];
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tk), [&](int64_t key) {
          if (out.c.present()) *out.c.row(batch, key0 + key, kv) = c[key];
        });
      });
}

}  // namespace expanse_kokkos
