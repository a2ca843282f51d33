// Host side of the Kokkos backend's operations: the SDK's names, the reasons every operation
// declines, the phi table and gate sums made in the workspace, and the launch on the execution
// space of the operation's device.
#pragma once

#include <initializer_list>
#include <string>

#include "kokkos/kernels/backward_common.hpp"
#include "kokkos/kernels/common.hpp"
#include "kokkos/spaces.hpp"
#include "sdk/dispatcher.hpp"
#include "sdk/implementation.hpp"
#include "sdk/op_args.hpp"

namespace expanse_kokkos {

using expanse_sdk::args_of;
using expanse_sdk::device_props;
using expanse_sdk::launch_context;

// No f64 (the reference backend's oracle mode), p within the phi table's rows.
std::string common_declines(const expanse_op& op);

// The phi table of the problem's p, d and layout, in the workspace (filled unless sizing).
const phi_row* make_phi_table(const expanse_problem& pb, const expanse_op& op, launch_context& lc);

// The gate sums of the problem's chunks of a [b,t,h] log_g, in the workspace (computed unless sizing);
// empty when log_g is null.
gate_sums make_gate_sums(const expanse_tensor* log_g, const expanse_problem& pb, const expanse_op& op,
                         launch_context& lc);

// A contiguous f32 tensor over workspace memory.
tensor_ref f32_buffer(float* data, std::initializer_list<int64_t> shape);

// A [b,t,heads,width] f32 buffer taken from the workspace (absent when `wanted` is false).
token_buffer take_tokens(launch_context& lc, int64_t b, int64_t t, int64_t heads, int64_t width, bool wanted = true);
// The same buffer as a tensor ([b,t,heads,width], or [b,t,heads] for width 1).
tensor_ref tensor_of(const token_buffer& buf, int64_t b);

// Calls f(space) with the instance of the operation's execution space on the caller's stream.
template <class F>
void on_space(const expanse_op& op, const launch_context& lc, F&& f) {
  with_space(expanse_sdk::device_of(op), [&](auto tag) { f(instance_for<decltype(tag)>(lc.stream.raw)); });
}

}  // namespace expanse_kokkos
