// update_state (docs/spec.md "chunked algorithm", 1): the local state of each chunk m,
//   S_m = sum_{j in m} exp(A_m - Gc_j) phi(k_j) v_j^T      [D x e]
//   z_m = sum_{j in m} exp(A_m - Gc_j) phi(k_j)            [D]
// with Gc the inclusive cumsum of log_g inside the chunk and A_m its last value. Keys are not
// scaled (the scale applies to queries only).
#include <cmath>
#include <limits>
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

namespace expanse_ref {

// update_state_backward (docs/spec.md "Gradients"): with dphi(k_j) = w_j (dS_m v_j + dz_m),
//   dk_j = J_phi(k_j)^T dphi(k_j),   dv_j = w_j dS_m^T phi(k_j),
//   dlog_g_l = sum_{j < l in m} phi(k_j) . dphi(k_j)    (w_j = exp(A_m - Gc_j) holds log_g of j+1 .. last)
void update_state_backward(const expanse_problem& pb, const expanse_update_state_backward_args& args) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: update_state_backward D mismatch");
  parallel_for_index(pb.b * pb.h * pb.n, [&](int64_t task) {
    const int64_t m = task % pb.n, hi = (task / pb.n) % pb.h, bi = task / (pb.n * pb.h);
    const ChunkRange ch = chunk_range(m, chunk_size_of(pb), pb.t);
    const Vector log_g = gather_log_g(args.log_g, bi, hi, ch.first, ch.len);
    const PrefixSum Gc(log_g);
    Vector w(ch.len);
    for (int64_t j = 0; j < ch.len; ++j) w(j) = std::exp(Gc.to_end(j));
    const RowMatrix K = gather_tokens(*args.k, bi, hi, ch.first, ch.len);
    const RowMatrix V = gather_tokens(*args.v, bi, hi, ch.first, ch.len);
    const RowMatrix phiK = phi.expand_rows(K);
    const RowMatrix dS = gather_state(*args.dS, {bi, m, hi});
    const Vector dz = args.dz ? gather_state_vector(*args.dz, {bi, m, hi}) : Vector::Zero(pb.D);
    const RowMatrix dPhiK = w.asDiagonal() * ((V * dS.transpose()).rowwise() + dz.transpose());
    scatter_tokens(*args.dk, bi, hi, ch.first, phi.pullback_rows(K, dPhiK));
    scatter_tokens(*args.dv, bi, hi, ch.first, w.asDiagonal() * (phiK * dS));
    if (args.dlog_g) {
      const Vector c = phiK.cwiseProduct(dPhiK).rowwise().sum();
      Vector dlog_g(ch.len);
      double below = 0.0;  // sum of c_j over the keys before l
      for (int64_t l = 0; l < ch.len; ++l) {
        dlog_g(l) = log_g(l) == -std::numeric_limits<double>::infinity() ? 0.0 : below;
        below += c(l);
      }
      scatter_token_scalars(*args.dlog_g, bi, hi, ch.first, dlog_g);
    }
  });
}

}  // namespace expanse_ref
