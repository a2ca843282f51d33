// power_attention: the chunked algorithm composed from the core kernels, on workspace tensors:
//   1. chunk_attention -> (y, l, rowmax)                        intra-chunk terms
//   2. update_state -> per-chunk states; discumsum in place     states entering each chunk, final state
//   3. query_state with the intra terms -> o                    inter-chunk terms, combined, normalized
// The quadratic form is the same with one chunk (c = t): step 2 then only runs for an initial or
// final state. Each step uses its fastest kernel that takes the shape (wgmma/mma/flash), else its
// simple kernel.
#include "gpu/kernels/discumsum.hpp"
#include "ops/op_common.hpp"
#include "ops/state_ops.hpp"

namespace expanse_cuda {
namespace {

std::string declines(const expanse_op& op, const device_props&) {
  const auto& a = *static_cast<const expanse_power_attention_args*>(op.args);
  std::string why = common_declines(op);
  if (why.empty() && (!is_f32(a.log_g) || !is_f32(a.initial_S) || !is_f32(a.initial_z) || !is_f32(a.final_S) ||
                      !is_f32(a.final_z)))
    why = "log_g and states must be f32";
  return why;
}

// A [b,n,h]-indexed view of the chunk totals, stored [b,h,n].
expanse_tensor totals_view(const gates& g, const expanse_problem& pb, int32_t device) {
  expanse_tensor A = f32_view(const_cast<float*>(g.total), {pb.b, pb.n, pb.h}, device);
  A.strides[0] = pb.h * pb.n;
  A.strides[1] = 1;
  A.strides[2] = pb.n;
  return A;
}

void run(const expanse_op& op, launch_context& lc) {
  const expanse_problem& pb = *op.problem;
  const auto& a = *static_cast<const expanse_power_attention_args*>(op.args);
  const int32_t dev = a.q->device_id;
  const bool need_states = pb.n > 1 || pb.has_initial_state || pb.want_final_state;
  const bool need_z = pb.normalize || a.final_z != nullptr;

  const phi_tables phi = need_states ? make_phi_tables(pb, lc) : phi_tables{};
  const gates g = make_gates(a.log_g, pb.b, pb.t, pb.h, pb.c, lc);
  float* y = lc.ws.take<float>(size_t(pb.b * pb.t * pb.hq * pb.e));
  float* l = lc.ws.take<float>(size_t(pb.b * pb.t * pb.hq));
  float* rowmax = lc.ws.take<float>(size_t(pb.b * pb.t * pb.hq));
  float* S = need_states ? lc.ws.take<float>(size_t(pb.b * pb.n * pb.h * pb.D * pb.e)) : nullptr;
  float* z = need_states && need_z ? lc.ws.take<float>(size_t(pb.b * pb.n * pb.h * pb.D)) : nullptr;
  const f16_state_scratch f16 = need_states && f16_query_state_takes_workspace_states(pb, *a.q, lc.props)
                                    ? take_f16_state_scratch(pb, lc.ws)
                                    : f16_state_scratch{};
  if (lc.ws.sizing()) return;

  // 1. Intra-chunk attention.
  attention_inputs att{};
  att.q = *a.q; att.k = *a.k; att.v = *a.v;
  att.y = f32_view(y, {pb.b, pb.t, pb.hq, pb.e}, dev);
  att.l = f32_view(l, {pb.b, pb.t, pb.hq}, dev);
  att.rowmax = f32_view(rowmax, {pb.b, pb.t, pb.hq}, dev);
  if (flash_chunk_attention_declines(pb, att, lc.props).empty()) launch_flash_chunk_attention(att, g, pb, lc);
  else launch_simple_chunk_attention(att, g, pb, lc.stream);

  // 2. States entering each chunk (and the final state).
  query_inputs qin{};
  qin.q = *a.q;
  qin.y = att.y; qin.l = att.l; qin.rowmax = att.rowmax;
  qin.o = *a.o;
  if (need_states) {
    const expanse_tensor Sv = f32_view(S, {pb.b, pb.n, pb.h, pb.D, pb.e}, dev);
    expanse_tensor zv{};
    if (z) zv = f32_view(z, {pb.b, pb.n, pb.h, pb.D}, dev);
    launch_update_state(*a.k, *a.v, g, phi, pb, Sv, z ? &zv : nullptr, lc);
    expanse_tensor A{};
    if (g.total) A = totals_view(g, pb, dev);
    using expanse_gpu::launch_discumsum, expanse_gpu::with_chunk_axis;
    launch_discumsum(Sv, A, with_chunk_axis(a.initial_S), Sv, with_chunk_axis(a.final_S), pb.n, EXPANSE_F32, lc.stream);
    if (z) launch_discumsum(zv, A, with_chunk_axis(a.initial_z), zv, with_chunk_axis(a.final_z), pb.n, EXPANSE_F32, lc.stream);
    qin.S = Sv;
    qin.z = zv;
  }

  // 3. Inter-chunk terms combined with the intra-chunk ones.
  launch_query_state(qin, g, phi, f16, pb, pb.normalize != 0, lc);
}

}  // namespace

const std::vector<implementation>& power_attention_impls() {
  static const std::vector<implementation> list = {{"chunked", declines, run}};
  return list;
}

}  // namespace expanse_cuda
