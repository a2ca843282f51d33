// chunk_attention (docs/spec.md "chunked algorithm", 4): causal power attention restricted to each
// chunk, returned stabilized in log space. For i, j in the same chunk with j <= i:
//   s_ij    = p log|scale q_i . k_j| + Gc_i - Gc_j         (-inf where the dot is exactly 0)
//   sign_ij = sign(q_i . k_j)^p                           (+1 for even p)
//   rowmax_i = max_j s_ij
//   y_i = sum_j sign_ij exp(s_ij - rowmax_i) v_j           l_i = sum_j sign_ij exp(s_ij - rowmax_i)
// so the true numerator is y_i exp(rowmax_i) and the denominator l_i exp(rowmax_i). A row whose
// scores are all -inf gets rowmax = 0, y = 0, l = 0 (never NaN).
#include <cmath>
#include <limits>

#include "reference/causal_pairs.hpp"
#include "reference/common.hpp"
#include "reference/ops.hpp"

namespace expanse_ref {

void chunk_attention(const expanse_problem& pb, const expanse_chunk_attention_args& args) {
  const int p = pb.p;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Tasks: (batch, query head, chunk, block of query rows inside the chunk).
  const int64_t c = chunk_size_of(pb);
  const int64_t blocks = (c + kRowBlock - 1) / kRowBlock;

  parallel_for_index(pb.b * pb.hq * pb.n * blocks, [&](int64_t task) {
    const int64_t blk = task % blocks;
    const int64_t m = (task / blocks) % pb.n;
    const int64_t qh = (task / (blocks * pb.n)) % pb.hq;
    const int64_t bi = task / (blocks * pb.n * pb.hq);
    const int64_t kv = kv_head_of(pb, qh);
    const ChunkRange ch = chunk_range(m, c, pb.t);
    // Local query rows [i0, i1) of the chunk; they see the keys [0, i1) of the chunk.
    const int64_t i0 = blk * kRowBlock, i1 = std::min(ch.len, i0 + kRowBlock);
    if (i0 >= i1) return;
    const int64_t rows = i1 - i0;

    const PrefixSum Gc(gather_log_g(args.log_g, bi, kv, ch.first, i1));
    const RowMatrix Qs = pb.scale * gather_tokens(*args.q, bi, qh, ch.first + i0, rows);
    const RowMatrix K = gather_tokens(*args.k, bi, kv, ch.first, i1);
    const RowMatrix V = gather_tokens(*args.v, bi, kv, ch.first, i1);
    const RowMatrix dots = Qs * K.transpose();  // [rows x i1]: scale q_i . k_j

    // W(r, j) = sign_ij exp(s_ij - rowmax_i), 0 for masked (j > i) or -inf scores.
    RowMatrix W = RowMatrix::Zero(rows, i1);
    Vector rowmax(rows);
    std::vector<double> s(static_cast<size_t>(i1));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      double mx = neg_inf;
      for (int64_t j = 0; j <= i; ++j) {
        const double a = dots(r, j);
        s[j] = a == 0.0 ? neg_inf : p * std::log(std::fabs(a)) + Gc.diff(i, j);
        mx = std::max(mx, s[j]);
      }
      if (mx == neg_inf) {  // every dot is exactly 0: an empty row
        rowmax(r) = 0.0;
        continue;
      }
      rowmax(r) = mx;
      for (int64_t j = 0; j <= i; ++j) {
        if (s[j] == neg_inf) continue;
        const double w = std::exp(s[j] - mx);
        W(r, j) = (p % 2 == 1 && dots(r, j) < 0.0) ? -w : w;
      }
    }

    const RowMatrix y = W * V;  // [rows x e]
    const Vector l = W.rowwise().sum();
    scatter_tokens(*args.y, bi, qh, ch.first + i0, y);
    if (args.l != nullptr) scatter_token_scalars(*args.l, bi, qh, ch.first + i0, l);
    if (args.rowmax != nullptr) scatter_token_scalars(*args.rowmax, bi, qh, ch.first + i0, rowmax);
  });
}

}  // namespace expanse_ref

namespace expanse_ref {

// chunk_attention_backward (docs/spec.md "Gradients"): with rowmax held at the forward's value, y_i
// and l_i are exp(-rowmax_i) times the chunk's causal numerator and denominator, so the pairs'
// gradients of causal_pairs.hpp apply with dnum_i = exp(-rowmax_i) dy_i, dden_i = exp(-rowmax_i) dl_i.
void chunk_attention_backward(const expanse_problem& pb, const expanse_chunk_attention_backward_args& a) {
  const int64_t c = chunk_size_of(pb), group = pb.hq / pb.h;
  // One task per (batch, kv head, chunk): dk, dv and the gates' gradient sum over its query heads.
  parallel_for_index(pb.b * pb.h * pb.n, [&](int64_t task) {
    const int64_t m = task % pb.n, kv = (task / pb.n) % pb.h, bi = task / (pb.n * pb.h);
    const ChunkRange ch = chunk_range(m, c, pb.t);
    const Vector log_g = gather_log_g(a.log_g, bi, kv, ch.first, ch.len);
    const PrefixSum Gc(log_g);
    const RowMatrix K = gather_tokens(*a.k, bi, kv, ch.first, ch.len);
    const RowMatrix V = gather_tokens(*a.v, bi, kv, ch.first, ch.len);
    RowMatrix dK = RowMatrix::Zero(ch.len, pb.d), dV = RowMatrix::Zero(ch.len, pb.e);
    Vector dG = Vector::Zero(ch.len);
    for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) {
      const RowMatrix Qs = pb.scale * gather_tokens(*a.q, bi, qh, ch.first, ch.len);
      const Vector rowmax = gather_token_scalars(*a.rowmax, bi, qh, ch.first, ch.len);
      Vector unscale(ch.len);
      for (int64_t i = 0; i < ch.len; ++i) unscale(i) = std::exp(-rowmax(i));
      const RowMatrix dnum = unscale.asDiagonal() * gather_tokens(*a.dy, bi, qh, ch.first, ch.len);
      const Vector dden = a.dl ? Vector(unscale.cwiseProduct(gather_token_scalars(*a.dl, bi, qh, ch.first, ch.len)))
                               : Vector(Vector::Zero(ch.len));
      RowMatrix dQs = RowMatrix::Zero(ch.len, pb.d);
      add_causal_gradients(Qs, K, V, Gc, pb.p, dnum, dden, /*O=*/nullptr, dQs, dK, dV, dG);
      scatter_tokens(*a.dq, bi, qh, ch.first, pb.scale * dQs);
    }
    scatter_tokens(*a.dk, bi, kv, ch.first, dK);
    scatter_tokens(*a.dv, bi, kv, ch.first, dV);
    if (a.dlog_g) scatter_token_scalars(*a.dlog_g, bi, kv, ch.first, reverse_cumsum_by_segment(dG, log_g));
  });
}

}  // namespace expanse_ref
