// How query_state's outputs combine the inter-chunk term with the intra-chunk one, shared by every
// query_state kernel (the SIMT one here, the tensor-core ones of the CUDA backend).
#pragma once

#include "gpu/kernels/common.hpp"

namespace expanse_gpu {

// o = (num e^g + y e^rm) / (den e^g + l e^rm) (the denominator only when normalizing), with g the
// token's log decay from its chunk start (Gc_i) and rm the intra-chunk row maximum, as per-token
// factors: o = (num wn + y wy) r. Normalized, both terms are scaled by e^-max(g, rm) first: e^g
// alone underflows in f32 late in long, strongly gated chunks (Gc_i < -104), where the ratio itself
// is well defined; a denominator under 2^-64 is scaled by 2^64 (exact) before its reciprocal.
struct output_weights {
  float wn, wy, r;
};
__device__ __forceinline__ output_weights output_weights_of(float den, float g, bool intra, float l, float rm,
                                                            bool normalize) {
  if (!normalize) return {__expf(g), intra ? __expf(rm) : 0.f, 1.f};
  // A reset between the chunk start and the token (g = -inf) leaves no inter-chunk term at all.
  float fq = g == -INFINITY ? 0.f : 1.f, fi = 0.f;
  if (intra) {
    const float top = fmaxf(g, rm);
    fq = __expf(g - top);
    fi = __expf(rm - top);
    den = den * fq + l * fi;
  } else {
    den *= fq;
  }
  if (den == 0.f) return {0.f, 0.f, 0.f};
  const float s = fabsf(den) < 0x1p-64f ? 0x1p64f : 1.f;
  return {fq * s, fi * s, 1.f / (den * s)};
}
__device__ __forceinline__ float combine_output(float num, float den, float g, bool intra, float y, float l, float rm,
                                                bool normalize) {
  const output_weights w = output_weights_of(den, g, intra, l, rm, normalize);
  return (num * w.wn + y * w.wy) * w.r;
}

}  // namespace expanse_gpu
