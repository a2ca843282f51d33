// chunk_attention's SIMT implementation (gpu/kernels/chunk_attention_simple.hpp): any shape and dtype.
#include "gpu/ops/chunk_attention.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {

attention_inputs attention_inputs_of(const expanse_chunk_attention_args& a) {
  attention_inputs in{};
  in.q = *a.q; in.k = *a.k; in.v = *a.v; in.y = *a.y;
  if (a.l) in.l = *a.l;
  if (a.rowmax) in.rowmax = *a.rowmax;
  return in;
}

std::string chunk_attention_f32_declines(const expanse_chunk_attention_args& a) {
  if (!is_f32(a.log_g) || !is_f32(a.y) || !is_f32(a.l) || !is_f32(a.rowmax)) return "log_g, y, l and rowmax must be f32";
  return {};
}

std::string chunk_attention_simple_declines(const expanse_op& op, const device_props&) {
  std::string why = common_declines(op);
  if (why.empty()) why = chunk_attention_f32_declines(args_of<expanse_chunk_attention_args>(op));
  return why;
}

void chunk_attention_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_chunk_attention_args>(op);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  const int64_t threads = pb.b * pb.t * pb.hq * kLaneGroup;
  if (threads == 0) return;
  const attention_inputs in = attention_inputs_of(a);
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    simple_chunk_attention_kernel<T><<<grid_for(threads, 256), 256, 0, lc.stream>>>(in, g, pb);
  });
  check_launch("simple chunk_attention");
}

}  // namespace expanse_gpu
