// update_state's SIMT implementation (gpu/kernels/update_state_simple.hpp): any shape and dtype.
#include "gpu/kernels/backward_simple.hpp"
#include "gpu/kernels/update_state_simple.hpp"
#include "gpu/ops/chunk_states.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {

std::string update_state_simple_declines(const expanse_op& op, const device_props&) { return common_declines(op); }

void launch_simple_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                                const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                                launch_context& lc) {
  const int64_t work = pb.b * pb.n * pb.h * pb.D * (pb.e + 1);
  if (work == 0) return;
  const expanse_tensor zt = z ? *z : expanse_tensor{};  // data null: no z
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    simple_update_state_kernel<T><<<grid_for(work, 256), 256, 0, lc.stream>>>(k, v, g.keys(), phi.rows, pb, S, zt);
  });
  check_launch("simple update_state");
}

void update_state_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_args>(op);
  phi_tables phi;
  phi.rows = make_phi_table(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  if (lc.ws.sizing()) return;
  launch_simple_update_state(*a.k, *a.v, g, phi, pb, *a.S, a.z, lc);
}

// update_state_backward: each key's gradients from its chunk's dS, dz (the state term of
// key_gradients_kernel), dlog_g by the exclusive sums of k . dk / p inside each chunk.
std::string update_state_backward_simple_declines(const expanse_op& op, const device_props&) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_backward_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (pb.d > kBackwardMaxDim || pb.e > kBackwardMaxDim))
    why = "d and e must be at most " + std::to_string(kBackwardMaxDim);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.dS) || !is_f32(a.dz) || !is_f32(a.dlog_g)))
    why = "log_g, dS, dz and dlog_g must be f32";
  return why;
}

void update_state_backward_simple_run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_update_state_backward_args>(op);
  const phi_entry* table = make_phi_table(pb, lc);
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  backward_work w{};
  w.kdk = lc.ws.take<float>(size_t(pb.b * pb.t * pb.h));
  if (lc.ws.sizing() || pb.b * pb.t * pb.h == 0) return;
  const backward_tensors in{{}, *a.k, *a.v, {}, {}, {}, {}, {}, *a.dk, *a.dv};
  const backward_states st{{}, {}, *a.dS, tensor_or_empty(a.dz)};
  with_input_type(pb.input_dtype, [&](auto tag) {
    using T = decltype(tag);
    key_gradients_kernel<T><<<unsigned(pb.b * pb.t * pb.h), kBackwardThreads, 0, lc.stream>>>(in, st, w, g, table, pb,
                                                                                           backward_form{0, 0});
  });
  check_launch("update_state_backward");
  if (a.dlog_g) {
    chunk_gate_gradients_kernel<<<grid_for(pb.b * pb.h * pb.n, 256), 256, 0, lc.stream>>>(
        *a.log_g, *a.dlog_g, w, pb, chunk_gate_sum::exclusive_keys);
    check_launch("update_state_backward dlog_g");
  }
}

}  // namespace expanse_gpu
