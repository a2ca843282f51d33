// power_attention_step (docs/spec.md, recurrent form) of one decoding token, the state in place,
//   S <- exp(log_g) S + phi(k) v^T,  z <- exp(log_g) z + phi(k),  o = phi(scale q)^T S [/ phi(scale q)^T z]
// (0 where the denominator is 0). One thread per state row updates it, then one per output entry
// reduces over the rows. Token tensors come as [b,1,heads,dim] or [b,heads,dim], log_g as [b,1,h]
// or [b,h]: batch is the first dim, head and dim the last ones.
#pragma once

#include "kokkos/kernels/common.hpp"

namespace expanse_kokkos {

struct token_ref {
  tensor_ref t;
  KOKKOS_INLINE_FUNCTION float get(int64_t batch, int64_t head, int64_t col) const {
    return t.get(batch * t.stride[0] + head * t.stride[t.ndim - 2] + col * t.stride[t.ndim - 1]);
  }
  KOKKOS_INLINE_FUNCTION void set(int64_t batch, int64_t head, int64_t col, float x) const {
    t.set(batch * t.stride[0] + head * t.stride[t.ndim - 2] + col * t.stride[t.ndim - 1], x);
  }
  KOKKOS_INLINE_FUNCTION float scalar(int64_t batch, int64_t head) const {
    return t.get(batch * t.stride[0] + head * t.stride[t.ndim - 1]);
  }
};

template <class Space>
void launch_power_attention_step(const Space& space, token_ref q, token_ref k, token_ref v, token_ref log_g,
                                 const phi_row* table, expanse_problem pb, tensor_ref S, tensor_ref z, token_ref o) {
  const int64_t D = pb.D, e = pb.e;
  Kokkos::parallel_for(
      "expanse::power_attention_step_state", Kokkos::RangePolicy<Space>(space, 0, pb.b * pb.h * D),
      KOKKOS_LAMBDA(const int64_t i) {
        const int64_t r = i % D, head = (i / D) % pb.h, batch = i / (D * pb.h);
        const float g = log_g.t.present() ? math::exp(log_g.scalar(batch, head)) : 1.f;
        const phi_row& row = table[r];
        float f = row.coef;
        for (int a = 0; a < pb.p; ++a) f *= k.get(batch, head, row.idx[a]);
        for (int64_t col = 0; col < e; ++col) {
          const int64_t at = S.at(batch, head, r, col);
          S.set(at, g * S.get(at) + f * v.get(batch, head, col));
        }
        if (z.present()) z.set(z.at(batch, head, r), g * z.get(z.at(batch, head, r)) + f);
      });
  Kokkos::parallel_for(
      "expanse::power_attention_step_output", Kokkos::RangePolicy<Space>(space, 0, pb.b * pb.hq * e),
      KOKKOS_LAMBDA(const int64_t i) {
        const int64_t col = i % e, qh = (i / e) % pb.hq, batch = i / (e * pb.hq), head = qh / (pb.hq / pb.h);
        float num = 0.f, den = 0.f;
        for (int64_t r = 0; r < D; ++r) {
          const phi_row& row = table[r];
          float f = row.coef;
          for (int a = 0; a < pb.p; ++a) f *= float(pb.scale) * q.get(batch, qh, row.idx[a]);
          num += f * S.get(S.at(batch, head, r, col));
          if (pb.normalize) den += f * z.get(z.at(batch, head, r));
        }
        o.set(batch, qh, col, !pb.normalize ? num : den == 0.f ? 0.f : num / den);
      });
}

// The multi-token step's copy of the state `from` (any strides; [b,h,D,e] or [b,h,D], f32) into the
// dense f32 tensor `to` (sdk/step_through_attention.hpp).
template <class Space>
void launch_copy_state(const Space& space, tensor_ref src, const expanse_tensor& from, const expanse_tensor& to) {
  const int64_t h = from.shape[1], D = from.shape[2], e = from.ndim == 4 ? from.shape[3] : 1;
  float* const dst = static_cast<float*>(to.data);
  Kokkos::parallel_for(
      "expanse::copy_state", Kokkos::RangePolicy<Space>(space, 0, from.shape[0] * h * D * e),
      KOKKOS_LAMBDA(const int64_t i) {
        const int64_t col = i % e, r = (i / e) % D, head = (i / (e * D)) % h, batch = i / (e * D * h);
        dst[i] = src.get(batch * src.stride[0] + head * src.stride[1] + r * src.stride[2] +
                         (src.ndim == 4 ? col * src.stride[3] : 0));
      });
}

}  // namespace expanse_kokkos
