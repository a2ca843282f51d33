// The CUDA backend's own implementations of update_state, query_state and chunk_attention (sm80 and
// sm90 kernels): why each declines a problem and its launcher, for the lists of ops/<operation>.cu.
#pragma once

#include <string>

#include "dispatch.hpp"
#include "gpu/ops/chunk_attention.hpp"
#include "gpu/ops/query_state.hpp"
#include "kernels/common.cuh"
#include "ops/op_common.hpp"

namespace expanse_cuda {

// update_state (ops/update_state.cu).
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

// query_state (ops/query_state.cu), on query_inputs (gpu/kernels/query_state_simple.hpp).
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

// chunk_attention (ops/chunk_attention.cu), on attention_inputs (gpu/kernels/chunk_attention_simple.hpp).
std::string flash_chunk_attention_declines(const expanse_problem& pb, const attention_inputs& in,
                                           const device_props& props);
void launch_flash_chunk_attention(const attention_inputs& in, const gates& g, const expanse_problem& pb,
                                  launch_context& lc);

}  // namespace expanse_cuda
