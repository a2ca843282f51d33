// The launcher of the state terms' pullback (ops/state_pullback.hpp), the one place its kernel is
// instantiated.
#include "kernels/sm80/mma_state_pullback.cuh"
#include "kernels/sm90/wgmma_state_pullback.cuh"
#include "kernels/sm90/wgmma_state_tiles_query.cuh"
#include "ops/state_pullback.hpp"

namespace expanse_cuda {

namespace {
// The tiles of one state (p = 1 or 2, d = e = 64), and the bytes of a tile's image (hi and lo).
int64_t state_tiles_of(const expanse_problem& pb) {
  return pb.p == 1 ? pullback_cfg::state_tiles<1, 64>() : pullback_cfg::state_tiles<2, 64>();
}
int64_t tile_image_bytes(pullback_product product) {
  return 2 * 2 * int64_t(product == pullback_product::wgmma ? wgmma_pullback_tiles<__half, 64>::kElems
                                                              : mma_pullback_tiles<__half, 64>::kElems);
}
}  // namespace

size_t state_pullback_workspace(const expanse_problem& pb, pullback_product product) {
  return size_t(pb.b * pb.n * pb.h * state_tiles_of(pb) * (tile_image_bytes(product) + 64 * 4));
}

void launch_state_pullback(const state_pullback& s, const expanse_problem& pb, launch_context& lc) {
  using namespace pullback_cfg;
  const int64_t states = pb.b * pb.n * pb.h, tiles = states * state_tiles_of(pb);
  if (tiles == 0) return;
  split_tiles_params S{};
  const expanse_tensor& M = *s.M;
  S.M = static_cast<const float*>(M.data);
  S.M_sb = M.strides[0], S.M_sn = M.strides[1], S.M_sh = M.strides[2], S.M_sr = M.strides[3];
  if (s.z && s.z->data) {
    S.z = static_cast<const float*>(s.z->data);
    S.z_sb = s.z->strides[0], S.z_sn = s.z->strides[1], S.z_sh = s.z->strides[2];
  }
  S.n = pb.n, S.h = pb.h;
  pullback_params P{};
  const expanse_tensor &y = *s.y, &x = *s.x;
  P.y = y.data, P.y_sb = y.strides[0], P.y_st = y.strides[1], P.y_sh = y.strides[2], P.y_scale = s.y_scale;
  P.x = x.data, P.x_sb = x.strides[0], P.x_st = x.strides[1], P.x_sh = x.strides[2];
  P.r = s.r, P.alpha = s.alpha;
  P.sum = s.sum, P.am = s.am, P.grad = *s.grad, P.dot = s.dot, P.grad_scale = s.grad_scale, P.pf = float(pb.p);
  P.g = s.g, P.keys = s.keys ? 1 : 0;
  P.t = pb.t, P.c = pb.c, P.n = pb.n, P.H = s.heads, P.h = pb.h;
  P.token_tiles = int((std::min(pb.c, pb.t) + kRows - 1) / kRows);
  const int64_t ctas = int64_t(P.token_tiles) * pb.n * s.heads * pb.b;
  if (ctas == 0) return;
  // The tiles, then their z entries.
  S.tiles = s.tiles;
  S.ztiles = reinterpret_cast<float*>(static_cast<unsigned char*>(s.tiles) + tiles * tile_image_bytes(s.product));
  P.tiles = S.tiles, P.ztiles = S.ztiles;
  const auto launch = [&](auto layout) {
    using Tiles = decltype(layout);
    using T = typename Tiles::type;
    const auto run = [&](auto degree) {
      constexpr int kP = decltype(degree)::value;
      split_state_tiles_kernel<T, 64, 64, kP, Tiles><<<unsigned(tiles), 256, 0, lc.stream>>>(S);
      check_launch("state pullback tiles");
      launch_with_smem(state_pullback_kernel<T, 64, 64, kP, Tiles>, ctas, kThreads, pullback_smem<T, 64, 64, Tiles>(), lc.stream, P);
    };
    if (pb.p == 1) run(std::integral_constant<int, 1>{});
    else run(std::integral_constant<int, 2>{});
  };
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    if (s.product == pullback_product::wgmma) launch(wgmma_pullback_tiles<T, 64>{});
    else launch(mma_pullback_tiles<T, 64>{});
  });
  check_launch("state pullback");
}

void launch_state_tiles_query(const expanse_tensor& k, const expanse_tensor& out, const void* tiles,
                              const expanse_problem& pb, launch_context& lc) {
  if (pb.p != 2) throw std::logic_error("launch_state_tiles_query: p must be 2");
  tiles_query_params P{};
  P.k = k.data, P.k_sb = k.strides[0], P.k_st = k.strides[1], P.k_sh = k.strides[2];
  P.tiles = tiles, P.out = out;
  P.t = pb.t, P.c = pb.c, P.n = pb.n, P.h = pb.h;
  P.token_tiles = int((std::min(pb.c, pb.t) + tiles_query_cfg::kRows - 1) / tiles_query_cfg::kRows);
  const int64_t ctas = int64_t(P.token_tiles) * pb.n * pb.h * pb.b;
  if (ctas == 0) return;
  with_b16_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_with_smem(state_tiles_query_kernel<T, 64, 64>, ctas, tiles_query_cfg::kThreads, tiles_query_smem<T, 64, 64>(),
                     lc.stream, P);
  });
  check_launch("state tiles query");
}

}  // namespace expanse_cuda
