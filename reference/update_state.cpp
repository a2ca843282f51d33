// update_state (docs/spec.md "chunked algorithm", 1): the local state of each chunk m,
//   S_m = sum_{j in m} exp(A_m - Gc_j) phi(k_j) v_j^T      [D x e]
//   z_m = sum_{j in m} exp(A_m - Gc_j) phi(k_j)            [D]
// with Gc the inclusive cumsum of log_g inside the chunk and A_m its last value. Keys are not
// scaled (the scale applies to queries only).
#include <stdexcept>

#include "reference/common.hpp"
#include "reference/ops.hpp"
#include "reference/sympow.hpp"

namespace expanse_ref {

void update_state(const expanse_problem& pb, const expanse_update_state_args& args) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: update_state D mismatch");

  // Chunks are independent: one task per (batch, kv head, chunk).
  parallel_for_index(pb.b * pb.h * pb.n, [&](int64_t task) {
    const int64_t m = task % pb.n, hi = (task / pb.n) % pb.h, bi = task / (pb.n * pb.h);
    const ChunkRange ch = chunk_range(m, chunk_size_of(pb), pb.t);

    const PrefixSum Gc(gather_log_g(args.log_g, bi, hi, ch.first, ch.len));
    Vector w(ch.len);  // w_j = exp(A_m - Gc_j)
    for (int64_t j = 0; j < ch.len; ++j) w(j) = std::exp(Gc.to_end(j));

    const RowMatrix phiK = phi.expand_rows(gather_tokens(*args.k, bi, hi, ch.first, ch.len));
    const RowMatrix V = gather_tokens(*args.v, bi, hi, ch.first, ch.len);
    const RowMatrix S = phiK.transpose() * (w.asDiagonal() * V);  // sum_j w_j phi(k_j) v_j^T
    scatter_state(*args.S, {bi, m, hi}, S);
    if (args.z != nullptr) scatter_state_vector(*args.z, {bi, m, hi}, phiK.transpose() * w);
  });
}

}  // namespace expanse_ref
