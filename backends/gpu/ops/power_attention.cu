// power_attention: the chunked algorithm composed from the other operations, on workspace tensors:
//   1. chunk_attention -> (y, l, rowmax)                        intra-chunk terms
//   2. update_state -> per-chunk states; discumsum in place     states entering each chunk, final state
//   3. query_state with the intra terms -> o                    inter-chunk terms, combined, normalized
// The quadratic form is the same with one chunk (c = t): step 2 then only runs for an initial or
// final state. Exchanging (expanse_power_attention_exchange), step 2 scans from zero into the final
// state, the callback brings the initial state, whose decayed share is then added to every chunk's. Each step runs through its operation's implementation list (the fastest that takes
// the step's problem; EXPANSE_<BACKEND>_SKIP and _VERBOSE apply), on the phi table and gate
// sums made once here for all of them.
#include "gpu/ops/chunk_states.hpp"
#include "gpu/ops/common.hpp"
#include "gpu/ops/discumsum.hpp"
#include "gpu/ops/implementations.hpp"

namespace expanse_gpu {
namespace {

// The memo slots of the steps' choices (dispatcher::run_step); run_chunk_states takes kUpdateState and
// the two after it.
enum step_slot { kChunkAttention = 1, kUpdateState, kQueryState = kUpdateState + 3 };

}  // namespace

std::string power_attention_chunked_declines(const expanse_op& op, const device_props&) {
  const auto& a = args_of<expanse_power_attention_args>(op);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.initial_S) || !is_f32(a.initial_z) || !is_f32(a.final_S) ||
                      !is_f32(a.final_z)))
    why = "log_g and states must be f32";
  return why;
}

namespace {

void run_chunked(const expanse_op& op, launch_context& lc, const expanse_sdk::exchange_call* exchange,
                 update_state_launcher update) {
  const expanse_problem& pb = *op.problem;
  const auto& a = args_of<expanse_power_attention_args>(op);
  const expanse_tensor& dev = *a.q;  // the device of the workspace views
  const bool need_states = pb.n > 1 || pb.has_initial_state || pb.want_final_state;
  const bool need_z = pb.normalize || a.final_z != nullptr;

  step_inputs shared;
  shared.phi = need_states ? make_phi_tables(pb, lc) : phi_tables{};
  shared.g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  expanse_tensor y = f32_view(lc.ws.take<float>(size_t(pb.b * pb.t * pb.hq * pb.e)), {pb.b, pb.t, pb.hq, pb.e}, dev);
  expanse_tensor l = f32_view(lc.ws.take<float>(size_t(pb.b * pb.t * pb.hq)), {pb.b, pb.t, pb.hq}, dev);
  expanse_tensor rowmax = f32_view(lc.ws.take<float>(size_t(pb.b * pb.t * pb.hq)), {pb.b, pb.t, pb.hq}, dev);
  expanse_tensor S{}, z{};
  if (need_states) S = f32_view(lc.ws.take<float>(size_t(pb.b * pb.n * pb.h * pb.D * pb.e)), {pb.b, pb.n, pb.h, pb.D, pb.e}, dev);
  if (need_states && need_z) z = f32_view(lc.ws.take<float>(size_t(pb.b * pb.n * pb.h * pb.D)), {pb.b, pb.n, pb.h, pb.D}, dev);
  launch_context steps{lc.stream, lc.ws, lc.props, lc.dispatch, lc.call, &shared};
  auto run_step = [&](expanse_op_kind kind, const void* args, const expanse_problem& problem, int slot) {
    const expanse_op step{kind, args, &problem, nullptr};
    lc.dispatch.run_step(step, slot, steps);
  };

  // 1. Intra-chunk attention.
  expanse_chunk_attention_args att{a.q, a.k, a.v, a.log_g, &y, &l, &rowmax, pb.p, pb.scale, pb.c};
  const expanse_problem att_pb = step_problem(pb, pb.input_dtype, EXPANSE_F32);
  run_step(EXPANSE_OP_CHUNK_ATTENTION, &att, att_pb, kChunkAttention);

  // 2. States entering each chunk (and the final state).
  if (need_states)
    run_chunk_states(pb, {a.k, a.v, a.log_g, S, z, exchange ? nullptr : a.initial_S, exchange ? nullptr : a.initial_z,
                          a.final_S, a.final_z},
                     shared, lc, kUpdateState, update);
  if (exchange && !lc.ws.sizing()) {
    if (exchange->fn(lc.stream.raw, exchange->user) != 0)
      throw std::runtime_error("power_attention: the exchange callback failed");
    const expanse_tensor A = shared.g.total ? totals_view(shared.g, pb, *a.k) : expanse_tensor{};
    launch_add_initial(S, A, *a.initial_S, pb.n, lc.stream);
    if (z.data && a.initial_z) launch_add_initial(z, A, *a.initial_z, pb.n, lc.stream);
  }

  // 3. Inter-chunk terms combined with the intra-chunk ones.
  expanse_query_state_args qs{a.q,  S.data ? &S : nullptr, z.data ? &z : nullptr, a.log_g, &y, &l, &rowmax, a.o,
                              pb.p, pb.scale, pb.c, pb.normalize, pb.layout};
  expanse_problem qs_pb = step_problem(pb, pb.input_dtype, pb.output_dtype);
  qs_pb.has_intra = 1;
  run_step(EXPANSE_OP_QUERY_STATE, &qs, qs_pb, kQueryState);
}

}  // namespace

void power_attention_chunked_run(const expanse_op& op, launch_context& lc) { run_chunked(op, lc, nullptr, nullptr); }

void power_attention_chunked_run_exchanging(const expanse_op& op, launch_context& lc,
                                            const expanse_sdk::exchange_call& exchange) {
  run_chunked(op, lc, &exchange, nullptr);
}

void power_attention_chunked_run_with(const expanse_op& op, launch_context& lc, update_state_launcher update,
                                      const expanse_sdk::exchange_call* exchange) {
  run_chunked(op, lc, exchange, update);
}

}  // namespace expanse_gpu
