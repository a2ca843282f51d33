// power_attention_step (docs/spec.md "Recurrent form"): one decoding step, the state updated in place,
//   S <- exp(log_g) S + phi(k) v^T,   z <- exp(log_g) z + phi(k),
//   o = phi(scale q)^T S  [/ phi(scale q)^T z]       (with the updated state; 0 where den == 0).
// Token tensors come as [b,1,heads,dim] or [b,heads,dim] (log_g [b,1,h] or [b,h]); the rank-3 forms
// are read through a view with a size-1 token dim inserted.
#include <cmath>
#include <stdexcept>

#include "reference/common.hpp"
#include "reference/ops.hpp"
#include "reference/sympow.hpp"

namespace expanse_ref {
namespace {

// The tensor as rank `full_rank` with the token dim (index 1): inserts a dim of size 1 when it is
// missing.
expanse_tensor with_token_dim(const expanse_tensor& x, int full_rank) {
  if (x.ndim == full_rank) return x;
  if (x.ndim != full_rank - 1) throw std::logic_error("reference: step tensor of unexpected rank");
  expanse_tensor v = x;
  v.ndim = full_rank;
  for (int dim = full_rank - 1; dim >= 2; --dim) {
    v.shape[dim] = x.shape[dim - 1];
    v.strides[dim] = x.strides[dim - 1];
  }
  v.shape[1] = 1;
  v.strides[1] = 0;
  return v;
}

}  // namespace

void power_attention_step(const expanse_problem& pb, const expanse_power_attention_step_args& args) {
  const FeatureMap phi(pb.p, pb.d, pb.layout);
  if (phi.D() != pb.D) throw std::logic_error("reference: power_attention_step D mismatch");
  if (pb.normalize && args.z == nullptr) throw std::logic_error("reference: step needs z to normalize");
  const expanse_tensor q = with_token_dim(*args.q, 4), k = with_token_dim(*args.k, 4),
                       v = with_token_dim(*args.v, 4), o = with_token_dim(*args.o, 4);
  expanse_tensor log_g{};
  if (args.log_g != nullptr) log_g = with_token_dim(*args.log_g, 3);
  const int64_t group = pb.hq / pb.h;

  // One task per (batch, kv head): each owns its slice of S and z.
  parallel_for_index(pb.b * pb.h, [&](int64_t task) {
    const int64_t kv = task % pb.h, bi = task / pb.h;
    const double g = args.log_g != nullptr ? std::exp(read_element(log_g, element_offset(log_g, {bi, 0, kv})))
                                           : 1.0;
    // Read the whole old state first, then write: S and z are updated in place.
    RowMatrix S = gather_state(*args.S, {bi, kv});
    const RowMatrix phik = phi.expand_rows(gather_tokens(k, bi, kv, 0, 1));  // [1 x D]
    S = g * S + phik.transpose() * gather_tokens(v, bi, kv, 0, 1);
    scatter_state(*args.S, {bi, kv}, S);
    Vector z;
    if (args.z != nullptr) {
      z = g * gather_state_vector(*args.z, {bi, kv}) + phik.row(0).transpose();
      scatter_state_vector(*args.z, {bi, kv}, z);
    }

    for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) {
      const RowMatrix phiq = phi.expand_rows(pb.scale * gather_tokens(q, bi, qh, 0, 1));  // [1 x D]
      RowMatrix out = phiq * S;  // [1 x e]
      if (pb.normalize) divide_rows(out, phiq * z);
      scatter_tokens(o, bi, qh, 0, out);
    }
  });
}

}  // namespace expanse_ref
