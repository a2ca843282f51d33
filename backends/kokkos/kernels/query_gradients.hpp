// The query side of the backward (docs/spec.md "Gradients", chunked form): for query i of chunk m,
// with the states S_m, z_m entering its chunk,
//   den_i = exp(Gc_i) phi(scale q_i) . z_m [+ exp(rowmax_i) l_i]                (normalized)
//   dnum_i = dout_i / den_i,  dden_i = -(dout_i . o_i) / den_i   (0 where den_i = 0; unnormalized:
//   dnum_i = dout_i, dden_i = 0)
//   dPhi_i = exp(Gc_i) (S_m dnum_i + z_m dden_i),  dq_i = scale J_phi(scale q_i)^T dPhi_i,
//   dG_i = phi(scale q_i) . dPhi_i      (the query's term of the gates' gradient)
// A team per (batch, query head, chunk, block of kTokens queries) sums the denominators' state part
// over phi's rows in f64 (normalized), then takes the rows in tiles of kRows for dPhi, whose tile it
// pulls back at once.
// As in query_state, exp(Gc_i) and exp(rowmax_i) are scaled by exp(-max(Gc_i, rowmax_i)) first.
#pragma once

#include "kokkos/kernels/backward_common.hpp"
#include "kokkos/kernels/query_state.hpp"

namespace expanse_kokkos {

struct query_gradient_outputs {
  query_cotangents cot;  // dnum, dden and r (where present) written
  token_buffer dq;       // [b,t,hq,d]: written
  token_buffer dG;       // [b,t,hq]: written
};

template <class Space>
void launch_query_gradients(const Space& space, tensor_ref q, tensor_ref S, tensor_ref z, gate_sums g,
                            const phi_row* table, expanse_problem pb, intra_terms intra, tensor_ref o, tensor_ref dout,
                            query_gradient_outputs out) {
  using policy = Kokkos::TeamPolicy<Space>;
  using member = typename policy::member_type;
  constexpr int kRows = 32, kTokens = 32;
  const int64_t E1 = pb.e + 1;
  // f64 first (aligned): dout_o [kTokens], dq [kTokens][d]; then qs [kTokens][d]; cot [kTokens][E1];
  // st [kRows][E1]; ph, dphi [kTokens][kRows]; factor, dG [kTokens].
  const size_t bytes = sizeof(double) * size_t(kTokens + kTokens * pb.d) +
                       sizeof(float) * size_t(kTokens * pb.d + kTokens * E1 + kRows * E1 + 2 * kTokens * kRows + 2 * kTokens);
  policy teams(space, query_block::teams(kTokens, pb), Kokkos::AUTO);
  const int level = set_team_scratch(teams, bytes);
  Kokkos::parallel_for(
      "expanse::query_gradients", teams, KOKKOS_LAMBDA(const member& team) {
        const query_block qb(team.league_rank(), kTokens, pb);
        if (qb.count == 0) return;
        const int64_t batch = qb.batch, qh = qb.qh, kv = qb.kv, bh = qb.bh, m = qb.m, first = qb.first + qb.i0;
        const int64_t tq = qb.count, d = pb.d, e = pb.e;
        double* dout_o = reinterpret_cast<double*>(team_floats(team, level, bytes));  // -(dout_i . o_i)
        double* dqs = dout_o + kTokens;
        float* qs = reinterpret_cast<float*>(dqs + kTokens * d);
        float* cot = qs + kTokens * d;    // dout_i and -(dout_i . o_i) (normalized; else 0)
        float* st = cot + kTokens * E1;   // state rows and z
        float* ph = st + kRows * E1;
        float* dphi = ph + kTokens * kRows;
        float* factor = dphi + kTokens * kRows;  // exp(Gc_i) / den_i (normalized; else exp(Gc_i))
        float* dG = factor + kTokens;
        team_load_rows(team, qs, q, batch, first, qh, tq, d, float(pb.scale));
        const bool has_state = S.present();  // none in the quadratic form without states
        if (pb.normalize && has_state) {
          // The state's part of den_i, phi(scale q_i) . z_m, all in f64 from the unscaled q_i (in dqs
          // until the pullbacks): z_m's entries have both signs, and for a query nearly orthogonal to
          // the keys behind z_m the sum cancels (by 1e4 on a case of the table, where f32 phi entries
          // and coefficients left dq and dinitial_S 1e-4 off, tolerance 1e-5).
          team_for_2d(team, tq, d, [&](int64_t row, int64_t a) { dqs[row * d + a] = q.get(q.at(batch, first + row, qh, a)); });
          team.team_barrier();
          double scale_p = 1.0;
          for (int k = 0; k < pb.p; ++k) scale_p *= pb.scale;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
            double sum = 0.0;
            for (int64_t r = 0; r < pb.D; ++r)
              sum += phi_entry<double>(table[r], pb.p, dqs + row * d) * z.get(z.at(batch, m, kv, r));
            factor[row] = float(scale_p * sum);
          });
          team.team_barrier();
        }
        team_zero(team, dqs, tq * d);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
          double dot = 0.0;  // -(dout . o) multiplies z in dPhi, where S dout nearly cancels it: summed in f64
          for (int64_t col = 0; col < e; ++col) {
            const float x = dout.get(dout.at(batch, first + row, qh, col));
            cot[row * E1 + col] = x;
            if (pb.normalize) dot += double(x) * o.get(o.at(batch, first + row, qh, col));
          }
          dout_o[row] = -dot;
          cot[row * E1 + e] = float(-dot);
          if (!(pb.normalize && has_state)) factor[row] = 0.f;
          dG[row] = 0.f;
        });
        auto stage_rows = [&](int64_t r0, int64_t rows) {
          team.team_barrier();
          team_for_2d(team, rows, E1, [&](int64_t row, int64_t col) {
            const int64_t r = r0 + row;
            st[row * E1 + col] = col < e ? S.get(S.at(batch, m, kv, r, col)) : z.present() ? z.get(z.at(batch, m, kv, r)) : 0.f;
          });
          team_phi_tile(team, ph, 1, kRows, table, r0, rows, pb.p, qs, tq, d);
          team.team_barrier();
        };
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
          const int64_t tok = first + row;
          const float gl = has_state ? g.log_from_chunk_start(bh, tok) : -INFINITY;
          float r = 1.f, fq = math::exp(gl);  // dnum_i = dout_i r, dPhi_i = fq (S dout_i + z cot_e) for the state
          if (pb.normalize) {
            const bool has_intra = intra.l.present();
            const float rm = has_intra ? intra.rowmax.get(intra.rowmax.at(batch, tok, qh)) : -INFINITY;
            const float top = gl > rm ? gl : rm;
            const float wq = gl == -INFINITY ? 0.f : math::exp(gl - top), wi = has_intra ? math::exp(rm - top) : 0.f;
            const float den = factor[row] * wq + (has_intra ? intra.l.get(intra.l.at(batch, tok, qh)) * wi : 0.f);
            r = den == 0.f ? 0.f : math::exp(-top) / den;  // 1 / den_i
            fq = den == 0.f ? 0.f : wq / den;
          }
          factor[row] = fq;
          float* dn = out.cot.dnum.row(batch, tok, qh);
          for (int64_t col = 0; col < e; ++col) dn[col] = r * cot[row * E1 + col];
          if (out.cot.dden.present()) *out.cot.dden.row(batch, tok, qh) = r * cot[row * E1 + e];
          if (out.cot.r.present()) *out.cot.r.row(batch, tok, qh) = r;
        });
        for (int64_t r0 = 0; has_state && r0 < pb.D; r0 += kRows) {
          const int64_t rows = r0 + kRows < pb.D ? kRows : pb.D - r0;
          stage_rows(r0, rows);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq * rows), [&](int64_t i) {
            const int64_t row = i / rows, r = i % rows;
            // S_m dout_i nearly cancels z_m (dout_i . o_i) where the state dominates o_i: products in f64
            double sum = 0.0;
            for (int64_t col = 0; col < e; ++col) sum += double(cot[row * E1 + col]) * st[r * E1 + col];
            sum += dout_o[row] * st[r * E1 + e];
            dphi[row * kRows + r] = factor[row] * sum;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
            dG[row] += float(pull_back_tile(table, r0, rows, pb.p, qs + row * d, ph + row * kRows, dphi + row * kRows,
                                            dqs + row * d));
          });
        }
        team.team_barrier();
        team_for_2d(team, tq, d, [&](int64_t row, int64_t a) {
          out.dq.row(batch, first + row, qh)[a] = float(pb.scale * dqs[row * d + a]);
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, tq), [&](int64_t row) {
          if (out.dG.present()) *out.dG.row(batch, first + row, qh) = dG[row];
        });
      });
}

}  // namespace expanse_kokkos
