// The launcher of the state terms' pullback (ops/state_pullback.hpp), the one place its kernel is
// instantiated.
#include "kernels/sm80/mma_state_pullback.cuh"
#include "kernels/sm90/wgmma_state_pullback.cuh"
#include "ops/state_pullback.hpp"

namespace expanse_cuda {

void launch_state_pullback(const state_pullback& s, const expanse_problem& pb, launch_context& lc) {
  using namespace pullback_cfg;
  pullback_params P{};
  const expanse_tensor &y = *s.y, &x = *s.x, &M = *s.M;
  P.y = y.data, P.y_sb = y.strides[0], P.y_st = y.strides[1], P.y_sh = y.strides[2], P.y_scale = s.y_scale;
  P.x = x.data, P.x_sb = x.strides[0], P.x_st = x.strides[1], P.x_sh = x.strides[2];
  P.r = s.r, P.alpha = s.alpha;
  P.M = static_cast<const float*>(M.data);
  P.M_sb = M.strides[0], P.M_sn = M.strides[1], P.M_sh = M.strides[2], P.M_sr = M.strides[3];
  if (s.z && s.z->data) {
    P.z = static_cast<const float*>(s.z->data);
    P.z_sb = s.z->strides[0], P.z_sn = s.z->strides[1], P.z_sh = s.z->strides[2];
  }
  P.sum = s.sum, P.am = s.am, P.grad = *s.grad, P.dot = s.dot, P.grad_scale = s.grad_scale, P.pf = float(pb.p);
  P.g = s.g, P.keys = s.keys ? 1 : 0;
  P.t = pb.t, P.c = pb.c, P.n = pb.n, P.H = s.heads, P.h = pb.h;
  P.token_tiles = int((std::min(pb.c, pb.t) + kRows - 1) / kRows);
  const int64_t ctas = int64_t(P.token_tiles) * pb.n * s.heads * pb.b;
  if (ctas == 0) return;
  const auto launch = [&](auto tiles) {
    using Tiles = decltype(tiles);
    using T = typename Tiles::type;
    if (pb.p == 1) launch_with_smem(state_pullback_kernel<T, 64, 64, 1, Tiles>, ctas, kThreads, pullback_smem<T, 64, 64, Tiles>(), lc.stream, P);
    else launch_with_smem(state_pullback_kernel<T, 64, 64, 2, Tiles>, ctas, kThreads, pullback_smem<T, 64, 64, Tiles>(), lc.stream, P);
  };
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (s.product == pullback_product::wgmma) launch(wgmma_pullback_tiles<T, 64>{});
    else launch(mma_pullback_tiles<T, 64>{});
  });
  check_launch("state pullback");
}

}  // namespace expanse_cuda
