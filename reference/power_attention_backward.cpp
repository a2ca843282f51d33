// power_attention_backward (docs/spec.md "Gradients"): the gradients of
//   L = sum_i dout_i . o_i + <dfinal_S, S_t> + <dfinal_z, z_t>
// with respect to q, k, v, log_g and the initial state, by the chunked form of the forward
// (power_attention.cpp) run backwards, per (batch, kv head):
//  * a forward sweep over the chunks recomputes the states S_m, z_m entering each chunk;
//  * each query token's cotangents of its numerator and denominator: normalized,
//    dnum_i = dout_i / den_i and dden_i = -(dout_i . o_i) / den_i (den_i recomputed, both 0 where
//    den_i = 0); unnormalized, dnum_i = dout_i and dden_i = 0;
//  * a reverse sweep carries dY, dZ: the cotangents of the state entering the next chunk. In chunk m
//      dq_i += scale J^T(scale q_i) [exp(Gc_i) (S_m dnum_i + z_m dden_i)]
//      dk_j += J^T(k_j) [exp(A_m - Gc_j) (dY v_j + dZ)],   dv_j += exp(A_m - Gc_j) dY^T phi(k_j)
//    plus the causal pairs inside the chunk, then
//      dY <- exp(A_m) dY + sum_i exp(Gc_i) phi(scale q_i) dnum_i^T   (dZ likewise with dden_i),
//    so that dY after chunk 0 is the initial state's gradient;
//  * dlog_g_l = sum_{i >= l} dG_i within l's segment (0 at a reset): the decay of a pair j < l <= i
//    holds log_g_l, and dG_i = (what query i's pairs give) - (what key i's pairs give), plus
//    <dfinal_S, S_t> + <dfinal_z, z_t> at the last token, so the pairs with both ends at or after l
//    cancel in the sum.
// The quadratic form is the same code with one chunk; query rows are taken in blocks so that the
// score matrix stays small.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "reference/causal_pairs.hpp"
#include "reference/common.hpp"
#include "reference/ops.hpp"
#include "reference/sympow.hpp"

namespace expanse_ref {
namespace {

// The cotangents of one query head's numerators and denominators in one chunk (see the top).
struct query_cotangents {
  RowMatrix dnum;  // [len x e]
  Vector dden;     // [len]
  RowMatrix o;     // [len x e], the forward's outputs; empty unless normalized
};

query_cotangents cotangents(const expanse_problem& pb, const expanse_power_attention_backward_args& a,
                            int64_t bi, int64_t qh, const ChunkRange& ch, const RowMatrix& Qs, const RowMatrix& phiQ,
                            const RowMatrix& K, const PrefixSum& Gc, const Vector& decay, const Vector& z) {
  query_cotangents c{gather_tokens(*a.dout, bi, qh, ch.first, ch.len), Vector::Zero(ch.len), RowMatrix()};
  if (!pb.normalize) return c;
  const Vector den = decay.cwiseProduct(phiQ * z) + causal_row_sums(Qs, K, Gc, pb.p);  // state + pairs
  c.o = gather_tokens(*a.o, bi, qh, ch.first, ch.len);
  for (int64_t i = 0; i < ch.len; ++i) {
    if (den(i) == 0.0) {  // o_i = 0 there, whatever the inputs: no gradient flows
      c.dnum.row(i).setZero();
      continue;
    }
    c.dden(i) = -c.dnum.row(i).dot(c.o.row(i)) / den(i);
    c.dnum.row(i) /= den(i);
  }
  return c;
}

}  // namespace

void power_attention_backward(const expanse_problem& pb, const expanse_power_attention_backward_args& a) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: power_attention_backward D mismatch");
  const int64_t group = pb.hq / pb.h, c = chunk_size_of(pb);

  parallel_for_index(pb.b * pb.h, [&](int64_t task) {
    const int64_t kv = task % pb.h, bi = task / pb.h;

    // Forward sweep: S[m], z[m] enter chunk m; S[n], z[n] is the final state.
    std::vector<RowMatrix> S(size_t(pb.n + 1));
    std::vector<Vector> z(size_t(pb.n + 1));
    S[0] = a.initial_S ? gather_state(*a.initial_S, {bi, kv}) : RowMatrix::Zero(pb.D, pb.e);
    z[0] = a.initial_z ? gather_state_vector(*a.initial_z, {bi, kv}) : Vector::Zero(pb.D);
    for (int64_t m = 0; m < pb.n; ++m) {
      const ChunkRange ch = chunk_range(m, c, pb.t);
      const PrefixSum Gc(gather_log_g(a.log_g, bi, kv, ch.first, ch.len));
      const RowMatrix phiK = phi.expand_rows(gather_tokens(*a.k, bi, kv, ch.first, ch.len));
      Vector w(ch.len);  // exp(A_m - Gc_j)
      for (int64_t j = 0; j < ch.len; ++j) w(j) = std::exp(Gc.to_end(j));
      const double chunk_decay = std::exp(Gc.total());
      S[size_t(m + 1)] = chunk_decay * S[size_t(m)] + phiK.transpose() * (w.asDiagonal() * gather_tokens(*a.v, bi, kv, ch.first, ch.len));
      z[size_t(m + 1)] = chunk_decay * z[size_t(m)] + phiK.transpose() * w;
    }

    // Reverse sweep.
    RowMatrix dY = a.dfinal_S ? gather_state(*a.dfinal_S, {bi, kv}) : RowMatrix::Zero(pb.D, pb.e);
    Vector dZ = a.dfinal_z ? gather_state_vector(*a.dfinal_z, {bi, kv}) : Vector::Zero(pb.D);
    Vector dG = Vector::Zero(pb.t);  // dL/dG_i, G the inclusive cumsum of log_g
    if (pb.t > 0) dG(pb.t - 1) = (dY.cwiseProduct(S[size_t(pb.n)])).sum() + dZ.dot(z[size_t(pb.n)]);
    for (int64_t m = pb.n - 1; m >= 0; --m) {
      const ChunkRange ch = chunk_range(m, c, pb.t);
      const PrefixSum Gc(gather_log_g(a.log_g, bi, kv, ch.first, ch.len));
      const RowMatrix K = gather_tokens(*a.k, bi, kv, ch.first, ch.len);
      const RowMatrix V = gather_tokens(*a.v, bi, kv, ch.first, ch.len);
      const RowMatrix phiK = phi.expand_rows(K);
      Vector decay(ch.len), w(ch.len);  // exp(Gc_i), exp(A_m - Gc_j)
      for (int64_t i = 0; i < ch.len; ++i) decay(i) = std::exp(Gc.at(i)), w(i) = std::exp(Gc.to_end(i));
      const RowMatrix& Sm = S[size_t(m)];
      const Vector& zm = z[size_t(m)];

      RowMatrix dK = RowMatrix::Zero(ch.len, pb.d), dV = RowMatrix::Zero(ch.len, pb.e);
      RowMatrix dYq = RowMatrix::Zero(pb.D, pb.e);  // sum_i exp(Gc_i) phi(scale q_i) dnum_i^T, all query heads
      Vector dZq = Vector::Zero(pb.D);
      Vector dGc = Vector::Zero(ch.len);  // this chunk's dG

      for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) {
        const RowMatrix Qs = pb.scale * gather_tokens(*a.q, bi, qh, ch.first, ch.len);
        const RowMatrix phiQ = phi.expand_rows(Qs);
        const query_cotangents ct = cotangents(pb, a, bi, qh, ch, Qs, phiQ, K, Gc, decay, zm);

        // The state entering the chunk: dphi(scale q_i) = exp(Gc_i) (S_m dnum_i + z_m dden_i).
        const RowMatrix dPhiQ = decay.asDiagonal() * (ct.dnum * Sm.transpose() + ct.dden * zm.transpose());
        dGc += phiQ.cwiseProduct(dPhiQ).rowwise().sum();
        RowMatrix dQs = phi.pullback_rows(Qs, dPhiQ);  // w.r.t. scale q; the chain rule's scale below
        add_causal_gradients(Qs, K, V, Gc, pb.p, ct.dnum, ct.dden, pb.normalize ? &ct.o : nullptr, dQs, dK, dV, dGc);
        scatter_tokens(*a.dq, bi, qh, ch.first, pb.scale * dQs);
        dYq += phiQ.transpose() * (decay.asDiagonal() * ct.dnum);
        dZq += phiQ.transpose() * decay.cwiseProduct(ct.dden);
      }

      // The state leaving the chunk: dphi(k_j) = exp(A_m - Gc_j) (dY v_j + dZ).
      const RowMatrix dPhiK = w.asDiagonal() * ((V * dY.transpose()).rowwise() + dZ.transpose());
      dGc -= phiK.cwiseProduct(dPhiK).rowwise().sum();
      dK += phi.pullback_rows(K, dPhiK);
      dV += w.asDiagonal() * (phiK * dY);
      scatter_tokens(*a.dk, bi, kv, ch.first, dK);
      scatter_tokens(*a.dv, bi, kv, ch.first, dV);
      dG.segment(ch.first, ch.len) += dGc;

      const double chunk_decay = std::exp(Gc.total());
      dY = chunk_decay * dY + dYq;
      dZ = chunk_decay * dZ + dZq;
    }
    if (a.dinitial_S) scatter_state(*a.dinitial_S, {bi, kv}, dY);
    if (a.dinitial_z) scatter_state_vector(*a.dinitial_z, {bi, kv}, dZ);

    if (a.dlog_g)
      scatter_token_scalars(*a.dlog_g, bi, kv, 0, reverse_cumsum_by_segment(dG, gather_log_g(a.log_g, bi, kv, 0, pb.t)));
  });
}

}  // namespace expanse_ref
