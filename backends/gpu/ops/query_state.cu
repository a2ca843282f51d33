// query_state's SIMT implementation (gpu/kernels/query_state_simple.hpp): any shape and dtype.
#include <cmath>

#include "gpu/ops/implementations.hpp"
#include "gpu/ops/query_state.hpp"

namespace expanse_gpu {

float scale_power(const expanse_problem& pb) { return static_cast<float>(std::pow(pb.scale, pb.p)); }

query_inputs query_inputs_of(const expanse_query_state_args& a) {
  query_inputs in{};
  in.q = *a.q;
  if (a.S) in.S = *a.S;
  if (a.z) in.z = *a.z;
  if (a.y) {
    in.y = *a.y;
    in.rowmax = *a.rowmax;
    if (a.l) in.l = *a.l;
  }
  in.o = *a.o;
  return in;
}

std::string query_state_f32_declines(const expanse_query_state_args& a) {
  if (!is_f32(a.S) || !is_f32(a.z) || !is_f32(a.log_g) || !is_f32(a.y) || !is_f32(a.l) || !is_f32(a.rowmax))
    return "S, z, log_g, y, l and rowmax must be f32";
  return {};
}

std::string query_state_simple_declines(const expanse_op& op, const device_props&) {
  std::string why = common_declines(op);
  if (why.empty()) why = query_state_f32_declines(args_of<expanse_query_state_args>(op));
  return why;
}

void query_state_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_query_state_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  const int64_t threads = pb.b * pb.t * pb.hq * kLaneGroup;
  if (threads == 0) return;
  const query_inputs in = query_inputs_of(a);
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    simple_query_state_kernel<T><<<grid_for(threads, 256), 256, 0, lc.stream>>>(in, g, table, pb, pb.normalize ? 1 : 0,
                                                                                 scale_power(pb));
  });
  check_launch("simple query_state");
}

}  // namespace expanse_gpu
