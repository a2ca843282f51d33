// update_state's kernels as the composed operations call them (defined in ops/update_state.cu): the
// checks of the tensor-core forms, and the launchers of the states with split operands (b16 hi + lo,
// about 16 significant bits), which power_attention's states and the backward's sweeps take where a
// normalizer or a state term cancels.
#pragma once

#include "ops/op_common.hpp"

namespace expanse_cuda {

// Why the sm_80 expand-MMA kernel (and so its split form) declines a problem; empty if it takes it.
std::string mma_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                      const expanse_tensor& S, const expanse_tensor* z, const device_props& props);
// Likewise for the blocked wgmma kernel (sm_90a); its split form takes p = 2, d = e = 64 of these.
std::string blocked_update_state_declines(const expanse_problem& pb, const expanse_tensor& k, const expanse_tensor& v,
                                          const expanse_tensor& S, const expanse_tensor* z, const device_props& props);
// The split states: the sm_80 kernel (what mma_update_state_declines accepts), and the blocked wgmma
// one (sm_90a, p = 2, d = e = 64).
void launch_split_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g, const phi_tables& phi,
                               const expanse_problem& pb, const expanse_tensor& S, const expanse_tensor* z,
                               launch_context& lc);
void launch_blocked_split_update_state(const expanse_tensor& k, const expanse_tensor& v, const gates& g,
                                       const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                       const expanse_tensor* z, launch_context& lc);
// The split states with a weight per token [b,t,h] (f32) in place of the gates (the backward's
// cotangent states); `blocked`: the wgmma kernel, else the sm_80 one. The blocked kernel also takes z
// (null: none), the sums of phi(k_j) with their own weights z_weight [b,t,h] (f32); the sm_80 one none.
void launch_weighted_split_update_state(const expanse_tensor& k, const expanse_tensor& v, const float* weight,
                                        const phi_tables& phi, const expanse_problem& pb, const expanse_tensor& S,
                                        const expanse_tensor* z, const float* z_weight, bool blocked,
                                        launch_context& lc);

}  // namespace expanse_cuda
