// sequence_state (docs/spec.md "Context parallelism"): the state a sequence leaves from zero and its
// total log decay, by chunks as update_state and discumsum compute them:
//   S <- exp(A_m) S + S_m^loc,   z <- exp(A_m) z + z_m^loc   over the chunks m in order,
//   A = the sum of log_g over the sequence (-inf from a reset on: PrefixSum::total).
// Sequential in the chunks; parallel over batch and kv heads.
#include <cmath>
#include <stdexcept>

#include "reference/common.hpp"
#include "reference/ops.hpp"
#include "reference/sympow.hpp"

namespace expanse_ref {

void sequence_state(const expanse_problem& pb, const expanse_sequence_state_args& args) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: sequence_state D mismatch");
  parallel_for_index(pb.b * pb.h, [&](int64_t task) {
    const int64_t hi = task % pb.h, bi = task / pb.h;
    RowMatrix S = RowMatrix::Zero(pb.D, pb.e);
    Vector z = Vector::Zero(pb.D);
    for (int64_t m = 0; m < pb.n; ++m) {
      const ChunkRange ch = chunk_range(m, chunk_size_of(pb), pb.t);
      const PrefixSum Gc(gather_log_g(args.log_g, bi, hi, ch.first, ch.len));
      Vector w(ch.len);  // exp(A_m - Gc_j)
      for (int64_t j = 0; j < ch.len; ++j) w(j) = std::exp(Gc.to_end(j));
      const RowMatrix phiK = phi.expand_rows(gather_tokens(*args.k, bi, hi, ch.first, ch.len));
      const double decay = std::exp(Gc.total());
      S = decay * S + phiK.transpose() * (w.asDiagonal() * gather_tokens(*args.v, bi, hi, ch.first, ch.len));
      z = decay * z + phiK.transpose() * w;
    }
    scatter_state(*args.S, {bi, hi}, S);
    if (args.z != nullptr) scatter_state_vector(*args.z, {bi, hi}, z);
    if (args.A != nullptr)
      write_element(*args.A, element_offset(*args.A, {bi, hi}), PrefixSum(gather_log_g(args.log_g, bi, hi, 0, pb.t)).total());
  });
}

}  // namespace expanse_ref
