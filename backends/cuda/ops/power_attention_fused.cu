// power_attention's "fused" implementation (CUDA, sm_80 and later; docs/fused.md): the intra-chunk
// term by the flash kernel, then one state pass that keeps every head's state on chip
// (kernels/sm80/fused_state_pass.cuh), then the combination into o. It takes P1's shapes (p = 2,
// d = e = 64, bf16, sympow or tiled:8) and leaves the rest to "chunked". Its chunk is its own
// (fused_cfg::kChunk): the result does not depend on it, and with no state in memory a small chunk
// only shortens the intra-chunk term.
#include <cstdlib>
#include <string>

#include "dispatch.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/implementations.hpp"
#include "kernels/sm80/fused_state_pass.cuh"
#include "ops/flash_chunk_attention.hpp"
#include "ops/op_common.hpp"

namespace expanse_cuda {

namespace {

// How a head's state is split: blocks_per_cta phi blocks (one warp each) by ncol value columns per CTA.
struct fused_split {
  int blocks_per_cta, ncol;
};

// The instantiated splits, the default first. EXPANSE_CUDA_FUSED_SPLIT=<blocks>x<columns> picks
// another (measurements).
constexpr fused_split kSplits[] = {{9, 16}, {6, 16}, {12, 16}, {9, 32}, {5, 32}};

fused_split choose_split() {
  if (const char* s = std::getenv("EXPANSE_CUDA_FUSED_SPLIT")) {
    int blocks = 0, cols = 0;
    if (std::sscanf(s, "%dx%d", &blocks, &cols) == 2)
      for (const fused_split& f : kSplits)
        if (f.blocks_per_cta == blocks && f.ncol == cols) return f;
    throw std::runtime_error(std::string("EXPANSE_CUDA_FUSED_SPLIT: no split ") + s);
  }
  return kSplits[0];
}

bool contiguous(const expanse_tensor* t) { return t == nullptr || dense_from(*t, 0); }

}  // namespace

std::string fused_power_attention_declines(const expanse_op& op, const device_props& props) {
  std::string why = expanse_gpu::power_attention_chunked_declines(op, props);
  if (!why.empty()) return why;
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_args>(op);
  if (pb.p != 2 || pb.d != fused_cfg::kDim || pb.e != 64) return "takes p = 2 with d = e = 64";
  if (pb.input_dtype != EXPANSE_BF16) return "takes bf16 inputs";
  if (pb.layout.kind != EXPANSE_LAYOUT_SYMPOW && !(pb.layout.kind == EXPANSE_LAYOUT_TILED && pb.layout.d_tile == 8))
    return "takes the sympow and tiled:8 layouts";
  attention_inputs in{};
  in.q = *a.q, in.k = *a.k, in.v = *a.v;
  why = flash_chunk_attention_declines(pb, in, props);
  if (!why.empty()) return why;
  if (a.o->strides[3] != 1) return "o needs a contiguous last dim";
  if (!contiguous(a.initial_S) || !contiguous(a.initial_z) || !contiguous(a.final_S) || !contiguous(a.final_z))
    return "states must be contiguous";
  return {};
}

namespace {

template <int NCOL, int WB>
void launch_state_pass(const fused_params& P, int64_t ctas, cudaStream_t stream) {
  launch_with_smem(fused_state_pass_kernel<NCOL, WB>, ctas, WB * 32, fused_smem<NCOL, WB>::bytes, stream, P);
}

}  // namespace

void fused_power_attention_run(const expanse_op& op, launch_context& lc) {
  const auto& a = args_of<expanse_power_attention_args>(op);
  expanse_problem pb = *op.problem;
  pb.c = fused_cfg::kChunk;
  pb.n = expanse_gpu::chunk_count(pb.t, pb.c);
  const expanse_tensor& dev = *a.q;
  const bool need_z = pb.normalize || a.final_z != nullptr;
  const int64_t rows = pb.b * pb.t * pb.hq;
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  float* num = lc.ws.take<float>(size_t(rows * pb.e));
  float* den = need_z ? lc.ws.take<float>(size_t(rows)) : nullptr;
  const expanse_tensor y = f32_view(lc.ws.take<float>(size_t(rows * pb.e)), {pb.b, pb.t, pb.hq, pb.e}, dev);
  const expanse_tensor l = f32_view(lc.ws.take<float>(size_t(rows)), {pb.b, pb.t, pb.hq}, dev);
  const expanse_tensor rowmax = f32_view(lc.ws.take<float>(size_t(rows)), {pb.b, pb.t, pb.hq}, dev);
  if (lc.ws.sizing() || rows == 0) return;

  // 1. The intra-chunk term.
  attention_inputs in{};
  in.q = *a.q, in.k = *a.k, in.v = *a.v, in.y = y, in.l = l, in.rowmax = rowmax;
  launch_flash_chunk_attention(in, g, step_problem(pb, pb.input_dtype, EXPANSE_F32), lc);

  // 2. The state pass.
  cudaMemsetAsync(num, 0, size_t(rows * pb.e) * sizeof(float), lc.stream);
  if (den) cudaMemsetAsync(den, 0, size_t(rows) * sizeof(float), lc.stream);
  const fused_split split = choose_split();
  fused_params P{};
  P.q = a.q->data, P.k = a.k->data, P.v = a.v->data;
  P.q_sb = a.q->strides[0], P.q_st = a.q->strides[1], P.q_sh = a.q->strides[2];
  P.k_sb = a.k->strides[0], P.k_st = a.k->strides[1], P.k_sh = a.k->strides[2];
  P.v_sb = a.v->strides[0], P.v_st = a.v->strides[1], P.v_sh = a.v->strides[2];
  P.g = g;
  P.num = num, P.den = den;
  P.S0 = a.initial_S ? static_cast<const float*>(a.initial_S->data) : nullptr;
  P.z0 = a.initial_z ? static_cast<const float*>(a.initial_z->data) : nullptr;
  P.S_final = a.final_S ? static_cast<float*>(a.final_S->data) : nullptr;
  P.z_final = a.final_z ? static_cast<float*>(a.final_z->data) : nullptr;
  P.t = pb.t, P.n = pb.n, P.h = pb.h, P.hq = pb.hq, P.e = pb.e, P.D = pb.D;
  P.sympow = pb.layout.kind == EXPANSE_LAYOUT_SYMPOW;
  P.blocks_per_cta = split.blocks_per_cta;
  P.row_parts = (fused_cfg::kBlocks + split.blocks_per_cta - 1) / split.blocks_per_cta;
  P.col_parts = int(pb.e / split.ncol);
  P.need_z = need_z;
  P.scale_p = float(pb.scale * pb.scale);
  const int64_t ctas = pb.b * pb.h * P.row_parts * P.col_parts;
  switch (split.blocks_per_cta * 100 + split.ncol) {
    case 916: launch_state_pass<16, 9>(P, ctas, lc.stream); break;
    case 616: launch_state_pass<16, 6>(P, ctas, lc.stream); break;
    case 1216: launch_state_pass<16, 12>(P, ctas, lc.stream); break;
    case 932: launch_state_pass<32, 9>(P, ctas, lc.stream); break;
    default: launch_state_pass<32, 5>(P, ctas, lc.stream); break;
  }
  check_launch("fused state pass");

  // 3. o.
  fused_output_params O{};
  O.num = num, O.den = den, O.y = static_cast<const float*>(y.data), O.l = static_cast<const float*>(l.data);
  O.rowmax = static_cast<const float*>(rowmax.data);
  O.o = a.o->data, O.o_sb = a.o->strides[0], O.o_st = a.o->strides[1], O.o_sh = a.o->strides[2];
  O.g = g;
  O.b = pb.b, O.t = pb.t, O.h = pb.h, O.hq = pb.hq, O.e = pb.e;
  O.normalize = pb.normalize;
  const int64_t outputs = rows * pb.e;
  if (pb.output_dtype == EXPANSE_BF16)
    fused_output_kernel<__nv_bfloat16><<<grid_for(outputs, 256), 256, 0, lc.stream>>>(O);
  else if (pb.output_dtype == EXPANSE_F16)
    fused_output_kernel<__half><<<grid_for(outputs, 256), 256, 0, lc.stream>>>(O);
  else
    fused_output_kernel<float><<<grid_for(outputs, 256), 256, 0, lc.stream>>>(O);
  check_launch("fused output");
}

}  // namespace expanse_cuda
