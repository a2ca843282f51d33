// Launchers of the state kernels, each used by its operation's implementation list (power_attention
// runs its steps through those lists), and the discumsum step's arguments.
#pragma once

#include <string>

#include "dispatch.hpp"
#include "kernels/common.cuh"
#include "ops/op_common.hpp"

namespace expanse_cuda {

// update_state (ops/update_state.cu). z may be a tensor with null data (no z).
void launch_simple_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                const expanse_tensor& z, cudaStream_t stream);
std::string mma_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                      const expanse_tensor& S, const expanse_tensor* z, const device_props& props);
void launch_mma_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                             const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                             launch_context& lc);
std::string wgmma_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                        const expanse_tensor& S, const expanse_tensor* z, const device_props& props);
void launch_wgmma_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                               const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                               launch_context& lc);
std::string blocked_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                          const expanse_tensor& S, const expanse_tensor* z, const device_props& props);
void launch_blocked_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                 const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                 const expanse_tensor* z, launch_context& lc);

// discumsum as a step of power_attention: Y holds the n states entering the chunks (in place over X)
// and the state after the last chunk goes to final_state (null: not wanted), which the public
// operation's Y (n + 1 slots) cannot express. The step's problem has want_final_state set, which a
// public discumsum's never has; its A may be absent (no gates: no decay).
struct discumsum_step_args {
  expanse_discumsum_args op;
  const expanse_tensor* final_state;
};

// query_state (ops/query_state.cu). S/z with null data: no inter-chunk term. y/l/rowmax with null
// data: no intra-chunk term.
struct query_inputs {
  expanse_tensor q, S, z, y, l, rowmax, o;
};
void launch_simple_query_state(const query_inputs& in, const gates& g, const phi_tables& phi,
                               const expanse_problem& pb, bool normalize, cudaStream_t stream);
std::string mma_query_state_declines(const expanse_problem& pb, const query_inputs& in, const device_props& props);
void launch_mma_query_state(const query_inputs& in, const gates& g, const phi_tables& phi, const expanse_problem& pb,
                            bool normalize, launch_context& lc);
std::string wgmma_query_state_declines(const expanse_problem& pb, const query_inputs& in, const device_props& props);
void launch_wgmma_query_state(const query_inputs& in, const gates& g, const phi_tables& phi,
                              const expanse_problem& pb, bool normalize, launch_context& lc);
std::string blocked_query_state_declines(const expanse_problem& pb, const query_inputs& in, const device_props& props);
void launch_blocked_query_state(const query_inputs& in, const gates& g, const phi_tables& phi,
                                const expanse_problem& pb, bool normalize, launch_context& lc);
// The F16 kernel (one f16 product per step), after a pass that writes the states' column scales
// and f16 B tiles into its scratch.
struct f16_state_scratch {
  float* scales = nullptr;  // null: not taken
  __half* tiles = nullptr;
};
std::string f16_query_state_declines(const expanse_problem& pb, const query_inputs& in, const device_props& props);
f16_state_scratch take_f16_state_scratch(const expanse_problem& pb, workspace& ws);
void launch_f16_query_state(const query_inputs& in, const gates& g, const phi_tables& phi, const f16_state_scratch& f16,
                            const expanse_problem& pb, bool normalize, launch_context& lc);
// chunk_attention (ops/chunk_attention.cu).
struct attention_inputs {
  expanse_tensor q, k, v, y, l, rowmax;
};
void launch_simple_chunk_attention(const attention_inputs& in, const gates& g, const expanse_problem& pb,
                                   cudaStream_t stream);
std::string flash_chunk_attention_declines(const expanse_problem& pb, const attention_inputs& in,
                                           const device_props& props);
void launch_flash_chunk_attention(const attention_inputs& in, const gates& g, const expanse_problem& pb,
                                  launch_context& lc);

}  // namespace expanse_cuda
