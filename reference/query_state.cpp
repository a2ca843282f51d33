// query_state (docs/spec.md "chunked algorithm", 3): for query i in chunk m = i / c,
//   num_i = phi(scale q_i)^T S_m exp(Gc_i)        den_i = phi(scale q_i)^T z_m exp(Gc_i)
// with S [b,n,h,D,e], z [b,n,h,D] the states entering each chunk and Gc the inclusive cumsum of
// log_g inside the chunk. With the intra-chunk result of chunk_attention (y, l, rowmax), whose true
// numerator and denominator are y exp(rowmax) and l exp(rowmax):
//   num_i += y_i exp(rowmax_i)                    den_i += l_i exp(rowmax_i)
// Output o = num / den (0 where den == 0) when normalized, else o = num.
#include <cmath>
#include <stdexcept>

#include "reference/causal_pairs.hpp"
#include "reference/common.hpp"
#include "reference/ops.hpp"
#include "reference/sympow.hpp"

namespace expanse_ref {

void query_state(const expanse_problem& pb, const expanse_query_state_args& args) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: query_state D mismatch");
  if (pb.normalize && args.z == nullptr) throw std::logic_error("reference: query_state needs z");
  const bool intra = pb.has_intra && args.y != nullptr;
  if (intra && (args.rowmax == nullptr || (pb.normalize && args.l == nullptr)))
    throw std::logic_error("reference: query_state intra term needs l and rowmax");

  // One task per (batch, query head, chunk): they are independent.
  parallel_for_index(pb.b * pb.hq * pb.n, [&](int64_t task) {
    const int64_t m = task % pb.n, qh = (task / pb.n) % pb.hq, bi = task / (pb.n * pb.hq);
    const int64_t kv = kv_head_of(pb, qh);
    const ChunkRange ch = chunk_range(m, chunk_size_of(pb), pb.t);
    if (ch.len == 0) return;

    const PrefixSum Gc(gather_log_g(args.log_g, bi, kv, ch.first, ch.len));
    const RowMatrix phiQ = phi.expand_rows(pb.scale * gather_tokens(*args.q, bi, qh, ch.first, ch.len));

    RowMatrix num = phiQ * gather_state(*args.S, {bi, m, kv});  // [len x e]
    Vector den = Vector::Zero(ch.len);
    if (pb.normalize) den = phiQ * gather_state_vector(*args.z, {bi, m, kv});
    for (int64_t i = 0; i < ch.len; ++i) {
      const double decay = std::exp(Gc.at(i));  // from the chunk start to token i
      num.row(i) *= decay;
      den(i) *= decay;
    }

    if (intra) {
      const RowMatrix y = gather_tokens(*args.y, bi, qh, ch.first, ch.len);
      const Vector rowmax = gather_token_scalars(*args.rowmax, bi, qh, ch.first, ch.len);
      const Vector l = pb.normalize ? gather_token_scalars(*args.l, bi, qh, ch.first, ch.len)
                                    : Vector::Zero(ch.len);
      for (int64_t i = 0; i < ch.len; ++i) {
        const double f = std::exp(rowmax(i));
        num.row(i) += f * y.row(i);
        den(i) += f * l(i);
      }
    }

    if (pb.normalize) divide_rows(num, den);
    scatter_tokens(*args.o, bi, qh, ch.first, num);
  });
}

}  // namespace expanse_ref

namespace expanse_ref {

// query_state_backward (docs/spec.md "Gradients"): per query i of chunk m, with den_i recomputed
// and dnum_i, dden_i as in power_attention_backward,
//   dq_i = scale J_phi(scale q_i)^T [exp(Gc_i) (S_m dnum_i + z_m dden_i)]
//   dS_m = sum_{heads, i in m} exp(Gc_i) phi(scale q_i) dnum_i^T      (dz_m likewise with dden_i)
//   dy_i = exp(rowmax_i) dnum_i,  dl_i = exp(rowmax_i) dden_i          (rowmax: no gradient)
//   dlog_g_l = sum_{heads, i >= l in m} phi(scale q_i) . dphi(scale q_i)  (Gc_i holds log_g_l for l <= i)
void query_state_backward(const expanse_problem& pb, const expanse_query_state_backward_args& a) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: query_state_backward D mismatch");
  const bool intra = a.y != nullptr;
  const int64_t group = pb.hq / pb.h;
  // One task per (batch, kv head, chunk): the state gradients sum over the kv head's query heads.
  parallel_for_index(pb.b * pb.h * pb.n, [&](int64_t task) {
    const int64_t m = task % pb.n, kv = (task / pb.n) % pb.h, bi = task / (pb.n * pb.h);
    const ChunkRange ch = chunk_range(m, chunk_size_of(pb), pb.t);
    const Vector log_g = gather_log_g(a.log_g, bi, kv, ch.first, ch.len);
    const PrefixSum Gc(log_g);
    Vector decay(ch.len);
    for (int64_t i = 0; i < ch.len; ++i) decay(i) = std::exp(Gc.at(i));
    const RowMatrix S = gather_state(*a.S, {bi, m, kv});
    const Vector z = a.z ? gather_state_vector(*a.z, {bi, m, kv}) : Vector::Zero(pb.D);
    RowMatrix dS = RowMatrix::Zero(pb.D, pb.e);
    Vector dz = Vector::Zero(pb.D), dG = Vector::Zero(ch.len);
    for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) {
      const RowMatrix Qs = pb.scale * gather_tokens(*a.q, bi, qh, ch.first, ch.len);
      const RowMatrix phiQ = phi.expand_rows(Qs);
      RowMatrix dnum = gather_tokens(*a.dout, bi, qh, ch.first, ch.len);
      Vector dden = Vector::Zero(ch.len), scale_intra = Vector::Zero(ch.len);
      if (intra) {
        const Vector rowmax = gather_token_scalars(*a.rowmax, bi, qh, ch.first, ch.len);
        for (int64_t i = 0; i < ch.len; ++i) scale_intra(i) = std::exp(rowmax(i));
      }
      if (pb.normalize) {
        Vector den = decay.cwiseProduct(phiQ * z);
        if (intra) den += scale_intra.cwiseProduct(gather_token_scalars(*a.l, bi, qh, ch.first, ch.len));
        const RowMatrix O = gather_tokens(*a.o, bi, qh, ch.first, ch.len);
        for (int64_t i = 0; i < ch.len; ++i) {
          if (den(i) == 0.0) {
            dnum.row(i).setZero();
            continue;
          }
          dden(i) = -dnum.row(i).dot(O.row(i)) / den(i);
          dnum.row(i) /= den(i);
        }
      }
      const RowMatrix dPhiQ = decay.asDiagonal() * (dnum * S.transpose() + dden * z.transpose());
      dG += phiQ.cwiseProduct(dPhiQ).rowwise().sum();
      scatter_tokens(*a.dq, bi, qh, ch.first, pb.scale * phi.pullback_rows(Qs, dPhiQ));
      dS += phiQ.transpose() * (decay.asDiagonal() * dnum);
      dz += phiQ.transpose() * decay.cwiseProduct(dden);
      if (a.dy) scatter_tokens(*a.dy, bi, qh, ch.first, scale_intra.asDiagonal() * dnum);
      if (a.dl) scatter_token_scalars(*a.dl, bi, qh, ch.first, scale_intra.cwiseProduct(dden));
    }
    scatter_state(*a.dS, {bi, m, kv}, dS);
    if (a.dz) scatter_state_vector(*a.dz, {bi, m, kv}, dz);
    if (a.dlog_g) scatter_token_scalars(*a.dlog_g, bi, kv, ch.first, reverse_cumsum_by_segment(dG, log_g));
  });
}

}  // namespace expanse_ref
