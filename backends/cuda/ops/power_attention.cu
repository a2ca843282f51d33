// power_attention on the CUDA backend: the chunked algorithm every GPU backend shares (each step
// through its own list; gpu/ops/power_attention.cu) with its states made by update_state with split
// operands at p <= 2, then "fused" (the state kept on chip; P1's shapes; ops/power_attention_fused.cu).
// fused comes second because it is slower today (5.8 against 2.2 ms at P1, t = 65536; docs/fused.md):
// it runs where chunked is skipped (EXPANSE_CUDA_SKIP=chunked). Its exchanging call (context
// parallelism) is chunked's.
#include "gpu/ops/chunk_states.hpp"
#include "gpu/ops/implementations.hpp"
#include "ops/op_common.hpp"
#include "ops/update_state.hpp"

namespace expanse_cuda {

// ops/power_attention_fused.cu
std::string fused_power_attention_declines(const expanse_op& op, const device_props& props);
void fused_power_attention_run(const expanse_op& op, launch_context& lc);

namespace {

// The chunk states to about 16 significant bits: update_state with its operands split into b16 hi +
// lo on the tensor cores (the blocked wgmma kernel at p = 2, d = e = 64 on sm_90a, else the sm_80
// one), or the SIMT kernel's f32 where neither takes the shape. A query's normalizer phi(q) . z
// cancels when its state holds few keys (after a reset near a chunk's end, or under strong decay) and
// the query is nearly orthogonal to them: with the keys' features rounded to b16 as the update_state
// list's fastest kernels make them, such a row of o came out 20% off and the whole output 3.5e-2 (bf16,
// resets; tests/gpu_regressions.txt). The split sweep costs 0.33 ms more at P1 t = 65536 (forward 1.97 -> 2.30 ms).
void launch_accurate_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                  const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                  const expanse_tensor* z, launch_context& lc) {
  const device_props& props = lc.props;
  const bool tensor_cores = (props.features & kMmaSync) != 0 && mma_update_state_declines(pb, k, v, S, z, props).empty();
  if (tensor_cores && (props.features & kSm90a) != 0 && pb.p == 2 && pb.d == 64 && pb.e == 64 &&
      blocked_update_state_declines(pb, k, v, S, z, props).empty())
    launch_blocked_split_update_state(k, v, g, phi, pb, S, z, lc);
  else if (tensor_cores)
    launch_split_update_state(k, v, g, phi, pb, S, z, lc);
  else
    expanse_gpu::launch_simple_update_state(k, v, g, phi, pb, S, z, lc);
}

// p <= 2 only: at p = 3, 4 the cancellation grows as the dot's cosine to the power p, and the split
// states did not help (P1-like bf16 cases with resets failed with and without them; docs/spec.md).
update_state_launcher states_for(const expanse_op& op) { return op.problem->p <= 2 ? launch_accurate_update_state : nullptr; }

void chunked_run(const expanse_op& op, launch_context& lc) {
  expanse_gpu::power_attention_chunked_run_with(op, lc, states_for(op), nullptr);
}
void chunked_run_exchanging(const expanse_op& op, launch_context& lc, const expanse_sdk::exchange_call& exchange) {
  expanse_gpu::power_attention_chunked_run_with(op, lc, states_for(op), &exchange);
}

const registered_list kList(cuda_lists(), EXPANSE_OP_POWER_ATTENTION,
                            {{"chunked", expanse_sdk::any_device, expanse_gpu::power_attention_chunked_declines,
                              chunked_run, chunked_run_exchanging},
                             {"fused", sm80, fused_power_attention_declines, fused_power_attention_run,
                              chunked_run_exchanging}});

}  // namespace
}  // namespace expanse_cuda
