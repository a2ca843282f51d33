// power_attention_step (docs/spec.md "Recurrent form"): t decoding tokens, the state updated in place
// token by token,
//   S <- exp(log_g_i) S + phi(k_i) v_i^T,   z <- exp(log_g_i) z + phi(k_i),
//   o_i = phi(scale q_i)^T S  [/ phi(scale q_i)^T z]       (with the updated state; 0 where den == 0).
// Token tensors come as [b,t,heads,dim], or [b,heads,dim] for one token (log_g [b,t,h] or [b,h]); the
// rank-3 forms are read through a view with a size-1 token dim inserted. The recurrence, not the
// chunked form the GPU backends run a multi-token step in: an oracle independent of them.
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
    // Read the whole old state first, write it after the last token: S and z are updated in place.
    RowMatrix S = gather_state(*args.S, {bi, kv});
    Vector z;
    if (args.z != nullptr) z = gather_state_vector(*args.z, {bi, kv});
    for (int64_t i = 0; i < pb.t; ++i) {
      const double g =
          args.log_g != nullptr ? std::exp(read_element(log_g, element_offset(log_g, {bi, i, kv}))) : 1.0;
      const RowMatrix phik = phi.expand_rows(gather_tokens(k, bi, kv, i, 1));  // [1 x D]
      S = g * S + phik.transpose() * gather_tokens(v, bi, kv, i, 1);
      if (args.z != nullptr) z = g * z + phik.row(0).transpose();
      for (int64_t qh = kv * group; qh < (kv + 1) * group; ++qh) {
        const RowMatrix phiq = phi.expand_rows(pb.scale * gather_tokens(q, bi, qh, i, 1));  // [1 x D]
        RowMatrix out = phiq * S;  // [1 x e]
        if (pb.normalize) divide_rows(out, phiq * z);
        scatter_tokens(o, bi, qh, i, out);
      }
    }
    scatter_state(*args.S, {bi, kv}, S);
    if (args.z != nullptr) scatter_state_vector(*args.z, {bi, kv}, z);
  });
}

}  // namespace expanse_ref
