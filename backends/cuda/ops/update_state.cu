// update_state: chunk states S_m = sum_j exp(A_m - Gc_j) phi(k_j) v_j^T and z_m likewise.
// Implementations, best first: "wgmma_blocked" (Hopper, layouts with a block form: tiled:8, and the
// symmetric layout at p = 2), "wgmma" (expand-MMA on Hopper's warpgroup tensor cores), "mma"
// (expand-MMA on tensor cores of sm_80 and later), "simple" (any shape and dtype, one thread per
// state entry; shared with the HIP backend, gpu/ops/update_state.cu). The expand-MMA kernels take
// f16/bf16 with d and e in {32, 64, 128}.
#include "gpu/ops/implementations.hpp"
#include "kernels/sm80/mma_update_state.cuh"
#include "kernels/sm90/blocked_update_state.cuh"
#include "kernels/sm90/wgmma_update_state.cuh"
#include "ops/op_common.hpp"
#include "ops/update_state.hpp"

namespace expanse_cuda {

// This backend's own implementations: why each declines a problem, and its launcher (defined
// below, declared here for the list's entries that call them; ops/update_state.hpp has the rest).
void launch_mma_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                             const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                             launch_context& lc);
std::string wgmma_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                        const expanse_tensor& S, const expanse_tensor* z, const device_props& props);
void launch_wgmma_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                               const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                               launch_context& lc);
void launch_blocked_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                 const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                 const expanse_tensor* z, launch_context& lc);

namespace {

template <std::string (*kernel_declines)(const expanse_problem&, const expanse_tensor&, const expanse_tensor&,
                                         const expanse_tensor&, const expanse_tensor*, const device_props&)>
std::string tensor_core_declines(const expanse_op& op, const device_props& props) {
  const auto& a = *static_cast<const expanse_update_state_args*>(op.args);
  std::string why = common_declines(op);
  if (why.empty()) why = kernel_declines(*op.problem, *a.k, *a.v, *a.S, a.z, props);
  return why;
}

template <void (*launch)(const expanse_tensor&, const expanse_tensor&, const gates&, const phi_tables&,
                         const expanse_problem&, const expanse_tensor&, const expanse_tensor*, launch_context&)>
void tensor_core_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = *static_cast<const expanse_update_state_args*>(op.args);
  const phi_tables phi = make_phi_tables(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  launch(*a.k, *a.v, g, phi, pb, *a.S, a.z, lc);
}

// The parameters of both expand-MMA kernels, for CTAs of `rows` rows of phi.
mma_update_state_params update_state_params(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                            const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                            const expanse_tensor* z, int rows) {
  mma_update_state_params P{};
  P.k = k.data; P.v = v.data;
  P.k_sb = k.strides[0]; P.k_st = k.strides[1]; P.k_sh = k.strides[2];
  P.v_sb = v.strides[0]; P.v_st = v.strides[1]; P.v_sh = v.strides[2];
  P.g = g.keys();  // exp(A_m - Gc_j) as each key's decay to the chunk end, reset-safe
  P.table = phi.rows; P.blocks = phi.blocks;
  P.S = static_cast<float*>(S.data);
  P.S_sb = S.strides[0]; P.S_sn = S.strides[1]; P.S_sh = S.strides[2]; P.S_sD = S.strides[3];
  if (z != nullptr && z->data != nullptr) {
    P.z = static_cast<float*>(z->data);
    P.z_sb = z->strides[0]; P.z_sn = z->strides[1]; P.z_sh = z->strides[2]; P.z_sD = z->strides[3];
  }
  P.t = pb.t; P.c = pb.c; P.n = pb.n; P.h = pb.h; P.D = pb.D; P.d = static_cast<int>(pb.d); P.p = pb.p;
  P.row_tiles = static_cast<int>((pb.D + rows - 1) / rows);
  return P;
}

}  // namespace


std::string mma_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                      const expanse_tensor& S, const expanse_tensor* z, const device_props& props) {
  (void)props;
  if (pb.input_dtype != EXPANSE_F16 && pb.input_dtype != EXPANSE_BF16) return "inputs must be f16 or bf16";
  if (pb.p > 4) return "p must be at most 4";
  // f16 keeps 5 exponent bits: products of 3 or 4 entries fall into its subnormals and lose the
  // SPEC accuracy (measured 2.3e-3 > 2e-3 at p = 4); bf16 has f32's exponent range.
  if (pb.input_dtype == EXPANSE_F16 && pb.p > 2) return "f16 inputs need p <= 2 on tensor cores";
  if (pb.e != 32 && pb.e != 64 && pb.e != 128) return "e must be 32, 64 or 128";
  if (pb.d != 32 && pb.d != 64 && pb.d != 128) return "d must be 32, 64 or 128";
  if (k.strides[3] != 1 || v.strides[3] != 1 || S.strides[4] != 1) return "k, v and S need a contiguous last dim";
  for (int i = 0; i < 3; ++i)
    if (k.strides[i] % 8 != 0 || v.strides[i] % 8 != 0) return "k and v need strides that are multiples of 8";
  if (S.strides[3] % 2 != 0 || !aligned16(k.data) || !aligned16(v.data) || reinterpret_cast<uintptr_t>(S.data) % 8 != 0)
    return "k and v need 16-byte aligned data, S 8-byte aligned rows";
  (void)z;
  return {};
}

template <bool kSplit>
static void launch_mma_update_state_form(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                         const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                         const expanse_tensor* z, launch_context& lc, const float* weight = nullptr) {
  using namespace mma_update_state_cfg;
  mma_update_state_params P = update_state_params(k, v, g, phi, pb, S, z, kRows);
  P.weight = weight;
  const int64_t ctas = int64_t(P.row_tiles) * pb.n * pb.h * pb.b;
  if (ctas == 0) return;
  with_b16_head_dims(pb.input_dtype, pb.d, pb.e, [&](auto type_tag, auto d_tag, auto e_tag) {
    using T = decltype(type_tag);
    constexpr int DH = decltype(d_tag)::value, E = decltype(e_tag)::value;
    const size_t smem = mma_update_state_smem<T, DH, E, kSplit>();
    if (pb.p <= 2) launch_with_smem(mma_update_state_kernel<T, DH, E, kSplit, 2>, ctas, kThreads, smem, lc.stream, P);
    else launch_with_smem(mma_update_state_kernel<T, DH, E, kSplit, 4>, ctas, kThreads, smem, lc.stream, P);
  });
  check_launch(kSplit ? "mma update_state (split operands)" : "mma update_state");
}

void launch_mma_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                             const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                             launch_context& lc) {
  launch_mma_update_state_form<false>(k, v, g, phi, pb, S, z, lc);
}

// The states to about 16 significant bits (operands split into b16 hi + lo): the forward sweep of the
// tensor-core power_attention_backward. Takes what mma_update_state_declines accepts.
void launch_split_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                               const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                               launch_context& lc) {
  launch_mma_update_state_form<true>(k, v, g, phi, pb, S, z, lc);
}

std::string wgmma_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                        const expanse_tensor& S, const expanse_tensor* z, const device_props& props) {
  return mma_update_state_declines(pb, k, v, S, z, props);
}

void launch_wgmma_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                               const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                               launch_context& lc) {
  using namespace wgmma_update_state_cfg;
  const mma_update_state_params P = update_state_params(k, v, g, phi, pb, S, z, kRows);
  const int64_t ctas = int64_t(P.row_tiles) * pb.n * pb.h * pb.b;
  if (ctas == 0) return;
  with_b16_head_dims(pb.input_dtype, pb.d, pb.e, [&](auto type_tag, auto d_tag, auto e_tag) {
    using T = decltype(type_tag);
    constexpr int DH = decltype(d_tag)::value, E = decltype(e_tag)::value;
    auto launch = [&](auto kernel) {
      launch_with_smem(kernel, ctas, kThreads, wgmma_update_state_smem<T, DH, E>(), lc.stream, P);
    };
    if (pb.p <= 2) launch(wgmma_update_state_kernel<T, DH, E, 2>);
    else launch(wgmma_update_state_kernel<T, DH, E, 4>);
  });
  check_launch("wgmma update_state");
}

std::string blocked_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                          const expanse_tensor& S, const expanse_tensor* z, const device_props& props) {
  if (phi_block_count(pb) == 0) return "needs p >= 2 with the tiled:8 layout, or p = 2 with the symmetric layout";
  std::string why = wgmma_update_state_declines(pb, k, v, S, z, props);
  if (why.empty()) {
    using namespace blocked_update_state_cfg;
    with_b16_head_dims(pb.input_dtype, pb.d, pb.e, [&](auto type_tag, auto d_tag, auto e_tag) {
      using T = decltype(type_tag);
      constexpr int DH = decltype(d_tag)::value, E = decltype(e_tag)::value;
      if (blocked_update_state_smem<T, DH, E>(kMinRawStages, kMinRawStages) > props.smem_optin)
        why = "needs more shared memory per block than the device offers";
    });
  }
  return why;
}

// kZWeight (with kSplit): z's sums take z_weight in place of `weight` (the kernel's template argument,
// so that the forms without it keep their raw stages and code).
template <bool kSplit, bool kZWeight = false>
static void launch_blocked_update_state_form(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                             const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                             const expanse_tensor* z, launch_context& lc, const float* weight = nullptr,
                                             const float* z_weight = nullptr) {
  using namespace blocked_update_state_cfg;
  static_assert(kSplit || !kZWeight, "z's own weights come with the split form");
  mma_update_state_params P = update_state_params(k, v, g, phi, pb, S, z, 64 * kBlocksPerCta);
  P.weight = weight;
  P.z_weight = z_weight;
  P.row_tiles = static_cast<int>((phi.blocks.count + kBlocksPerCta - 1) / kBlocksPerCta);
  P.tile_count = int64_t(P.row_tiles) * pb.n * pb.h * pb.b;
  if (P.tile_count == 0) return;
  with_b16_head_dims(pb.input_dtype, pb.d, pb.e, [&](auto type_tag, auto d_tag, auto e_tag) {
    using T = decltype(type_tag);
    constexpr int DH = decltype(d_tag)::value, E = decltype(e_tag)::value;
    // The deepest rings that fit: extra step buffers first, then raw stages (declines checked the
    // smallest, kMinRawStages of each).
    auto bytes = [&] { return blocked_update_state_smem<T, DH, E, kSplit, kZWeight>(P.ring, P.raw_stages); };
    P.raw_stages = P.ring = kMinRawStages;
    bool found = false;
    for (int extra = kExtraBuffers; extra >= 0 && !found; --extra)
      for (int raw = kMaxRawStages; raw >= kMinRawStages && !found; --raw)
        if (blocked_update_state_smem<T, DH, E, kSplit, kZWeight>(raw + extra, raw) <= lc.props.smem_optin) {
          P.raw_stages = raw;
          P.ring = raw + extra;
          found = true;
        }
    auto launch = [&](auto kernel) {
      // One persistent CTA per SM (at most one per tile).
      launch_with_smem(kernel, std::min<int64_t>(P.tile_count, std::max(lc.props.multiprocessors, 1)), block_threads<kSplit>(), bytes(),
                       lc.stream, P);
    };
    if constexpr (kSplit) {  // the tensor-core backward's shapes only: p = 2, d = e = 64
      if constexpr (DH == 64 && E == 64) launch(blocked_update_state_kernel<T, DH, E, 2, true, kZWeight>);
      else throw std::logic_error("the split blocked update_state is built for d = e = 64");
    }
    else if (pb.p == 2) launch(blocked_update_state_kernel<T, DH, E, 2>);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) launch(blocked_update_state_kernel<T, DH, E, 4>);  // f16 takes p <= 2
  });
  check_launch(kSplit ? "blocked update_state (split operands)" : "blocked update_state");
}

void launch_blocked_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                 const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                 const expanse_tensor* z, launch_context& lc) {
  launch_blocked_update_state_form<false>(k, v, g, phi, pb, S, z, lc);
}

// The forward sweep's split states on Hopper at p = 2 in the symmetric layout (what
// blocked_update_state_declines accepts there).
void launch_blocked_split_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                       const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                       const expanse_tensor* z, launch_context& lc) {
  launch_blocked_update_state_form<true>(k, v, g, phi, pb, S, z, lc);
}

// The split states with a weight per token [b,t,h] (f32, contiguous) in place of the gates (pb
// ungated): S_m = sum_j weight_j phi(k_j) v_j^T, the tensor-core power_attention_backward's cotangent
// states; `blocked`: the Hopper kernel (as launch_blocked_split_update_state takes), which also gives
// z_m = sum_j z_weight_j phi(k_j) (its ones column carries z_weight instead of weight), else the sm_80
// one (whose weight multiplies phi(k_j): no z).
void launch_weighted_split_update_state(const expanse_tensor& k, const expanse_tensor& v, const float* weight,
                                        const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                        const expanse_tensor* z, const float* z_weight, bool blocked,
                                        launch_context& lc) {
  if ((z != nullptr) != (z_weight != nullptr))
    throw std::logic_error("weighted split update_state: z and its weights come together");
  if (blocked && z_weight) launch_blocked_update_state_form<true, true>(k, v, gates{}, phi, pb, S, z, lc, weight, z_weight);
  else if (blocked) launch_blocked_update_state_form<true>(k, v, gates{}, phi, pb, S, nullptr, lc, weight);
  else if (z) throw std::logic_error("weighted split update_state: the sm_80 kernel gives no z");
  else launch_mma_update_state_form<true>(k, v, gates{}, phi, pb, S, nullptr, lc, weight);
}

namespace {
const registered_list kList(
    cuda_lists(), EXPANSE_OP_UPDATE_STATE,
    {{"wgmma_blocked", sm90a, tensor_core_declines<blocked_update_state_declines>,
      tensor_core_run<launch_blocked_update_state>},
     {"wgmma", sm90a, tensor_core_declines<wgmma_update_state_declines>, tensor_core_run<launch_wgmma_update_state>},
     {"mma", sm80, tensor_core_declines<mma_update_state_declines>, tensor_core_run<launch_mma_update_state>},
     expanse_gpu::update_state_simple});
}  // namespace

}  // namespace expanse_cuda
