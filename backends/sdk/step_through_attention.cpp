#include "sdk/step_through_attention.hpp"

#include "sdk/dispatcher.hpp"
#include "sdk/op_args.hpp"

namespace expanse_sdk {
namespace {

// A dense tensor in the workspace with `like`'s shape, dtype and device (a state: f32 or f64).
expanse_tensor dense_like(const expanse_tensor& like, workspace& ws) {
  expanse_tensor t = like;
  const int64_t count = set_dense_strides(t);
  const size_t element = like.dtype == EXPANSE_F64 ? 8 : 4;
  t.data = ws.take<unsigned char>(size_t(count) * element);
  return t;
}

// The memo slot of power_attention's choice: the last, as power_attention's own steps take the first.
constexpr int kAttentionSlot = kStepSlots;

}  // namespace

void run_step_through_attention(const expanse_op& op, launch_context& lc, copy_state_fn copy) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_step_args>(op);
  if (pb.t == 0) return;  // no token: the state stays as it is
  const expanse_tensor S0 = dense_like(*a.S, lc.ws);
  const expanse_tensor z0 = a.z ? dense_like(*a.z, lc.ws) : expanse_tensor{};
  if (!lc.ws.sizing()) {
    copy(*a.S, S0, lc);
    if (a.z) copy(*a.z, z0, lc);
  }
  const expanse_power_attention_args attention{a.q, a.k, a.v, a.log_g, &S0, a.z ? &z0 : nullptr, a.o, a.S, a.z,
                                               pb.p, pb.scale, pb.c, pb.normalize, pb.layout};
  expanse_problem attention_pb = pb;
  attention_pb.has_initial_state = attention_pb.want_final_state = 1;
  lc.dispatch.run_step({EXPANSE_OP_POWER_ATTENTION, &attention, &attention_pb, nullptr}, kAttentionSlot, lc);
}

}  // namespace expanse_sdk
