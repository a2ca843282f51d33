// The causal pairs of one chunk, for the gradients (power_attention_backward, chunk_attention_backward):
// query rows i and keys j <= i of the chunk, with
//   A_ij = (scale q_i . k_j)^p exp(Gc_i - Gc_j)     (Gc: the chunk's inclusive log_g sums)
//   M_ij = dnum_i . v_j + dden_i                    (the cotangents of i's numerator and denominator)
// Query rows go in blocks of kRowBlock, so the [rows x keys] matrices stay small.
#ifndef EXPANSE_REFERENCE_CAUSAL_PAIRS_HPP
#define EXPANSE_REFERENCE_CAUSAL_PAIRS_HPP

#include <cmath>

#include "reference/common.hpp"

namespace expanse_ref {

// The pairs of query rows i0 .. i0 + rows - 1 with their keys: dots(r, j) = scale q_i . k_j and
// decay(r, j) = exp(Gc_i - Gc_j) (0 for j > i and across a reset).
struct causal_block {
  RowMatrix dots, decay;
  causal_block(const Eigen::Ref<const RowMatrix>& Qs, const RowMatrix& K, const PrefixSum& Gc, int64_t i0)
      : dots(Qs * K.topRows(i0 + Qs.rows()).transpose()), decay(RowMatrix::Zero(dots.rows(), dots.cols())) {
    for (int64_t r = 0; r < dots.rows(); ++r)
      for (int64_t j = 0; j <= i0 + r; ++j) decay(r, j) = std::exp(Gc.diff(i0 + r, j));
  }
  int64_t keys() const { return dots.cols(); }
  double score(int64_t r, int64_t j, int p) const { return decay(r, j) == 0.0 ? 0.0 : ipow(dots(r, j), p) * decay(r, j); }
};

// sum_j A_ij for each query row of the chunk (the intra-chunk denominator).
inline Vector causal_row_sums(const RowMatrix& Qs, const RowMatrix& K, const PrefixSum& Gc, int p) {
  Vector sums = Vector::Zero(Qs.rows());
  for (int64_t i0 = 0; i0 < Qs.rows(); i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, Qs.rows() - i0);
    const causal_block blk(Qs.middleRows(i0, rows), K, Gc, i0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j <= i0 + r; ++j) sums(i0 + r) += blk.score(r, j, p);
  }
  return sums;
}

// The pairs' gradients, added: dQs_i += sum_j B_ij k_j (the gradient w.r.t. scale q_i), dK_j += sum_i
// B_ij scale q_i, dV_j += sum_i A_ij dnum_i with B_ij = p (scale q_i . k_j)^(p-1) exp(Gc_i - Gc_j) M_ij;
// and dG (the cotangent of Gc) += sum_j A_ij M_ij at i, -= sum_i A_ij M_ij at j.
// Normalized attention passes its outputs O: there dden_i = -dnum_i . o_i, and M_ij is taken as
// dnum_i . (v_j - o_i), the same value but exactly 0 where v_j = o_i. A key alone in its segment
// gives o_i = v_j whatever q_i, so q_i's true gradient is 0; dnum_i . v_j + dden_i would instead
// leave a rounding residue of |dnum_i| |v_j|, which a denominator near 0 makes large.
inline void add_causal_gradients(const RowMatrix& Qs, const RowMatrix& K, const RowMatrix& V, const PrefixSum& Gc,
                                 int p, const RowMatrix& dnum, const Vector& dden, const RowMatrix* O,
                                 RowMatrix& dQs, RowMatrix& dK, RowMatrix& dV, Vector& dG) {
  for (int64_t i0 = 0; i0 < Qs.rows(); i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, Qs.rows() - i0);
    const causal_block blk(Qs.middleRows(i0, rows), K, Gc, i0);
    const int64_t keys = blk.keys();
    RowMatrix M(rows, keys);  // M_ij
    if (O) {
      for (int64_t r = 0; r < rows; ++r)
        M.row(r) = ((V.topRows(keys).rowwise() - O->row(i0 + r)) * dnum.row(i0 + r).transpose()).transpose();
    } else {
      M = (dnum.middleRows(i0, rows) * V.topRows(keys).transpose()).colwise() + dden.segment(i0, rows);
    }
    RowMatrix A = RowMatrix::Zero(rows, keys), B = RowMatrix::Zero(rows, keys);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j <= i0 + r; ++j) {
        if (blk.decay(r, j) == 0.0) continue;
        const double m_ij = M(r, j);
        A(r, j) = blk.score(r, j, p);
        B(r, j) = p * ipow(blk.dots(r, j), p - 1) * blk.decay(r, j) * m_ij;
        dG(i0 + r) += A(r, j) * m_ij;
        dG(j) -= A(r, j) * m_ij;
      }
    dQs.middleRows(i0, rows) += B * K.topRows(keys);
    dK.topRows(keys) += B.transpose() * Qs.middleRows(i0, rows);
    dV.topRows(keys) += A.transpose() * dnum.middleRows(i0, rows);
  }
}

// dlog_g_l = sum_{i >= l} dG_i over a range of tokens (a chunk, or the whole sequence), restarted at
// each reset and exactly 0 there: the decay across a reset is 0 for any log_g near it.
inline Vector reverse_cumsum_by_segment(const Vector& dG, const Vector& log_g) {
  Vector out(dG.size());
  double sum = 0.0;
  for (int64_t l = dG.size() - 1; l >= 0; --l) {
    if (log_g(l) == -std::numeric_limits<double>::infinity()) {
      out(l) = sum = 0.0;
    } else {
      sum += dG(l);
      out(l) = sum;
    }
  }
  return out;
}

}  // namespace expanse_ref

#endif  // EXPANSE_REFERENCE_CAUSAL_PAIRS_HPP
