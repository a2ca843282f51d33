// query_state (docs/spec.md "chunked algorithm", 3): for query i in chunk m = i / c,
//   num_i = phi(scale q_i)^T S_m exp(Gc_i)        den_i = phi(scale q_i)^T z_m exp(Gc_i)
// with S [b,n,h,D,e], z [b,n,h,D] the states entering each chunk and Gc the inclusive cumsum of
// log_g inside the chunk. With the intra-chunk result of chunk_attention (y, l, rowmax), whose true
// numerator and denominator are y exp(rowmax) and l exp(rowmax):
//   num_i += y_i exp(rowmax_i)                    den_i += l_i exp(rowmax_i)
// Output o = num / den (0 where den == 0) when normalized, else o = num.
#include <cmath>
#include <stdexcept>

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
