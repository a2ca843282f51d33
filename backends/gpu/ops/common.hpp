// Host-side helpers of the operations every GPU backend shares (gpu/ops/*.cu) and of the backends'
// own implementations: the SDK's names, dtype dispatch, the common reasons to decline, the phi table
// and the gate sums made in the workspace, workspace tensor views.
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>

#include "gpu/kernels/common.hpp"
#include "gpu/vendor.hpp"
#include "sdk/dispatcher.hpp"
#include "sdk/implementation.hpp"
#include "sdk/op_args.hpp"

namespace expanse_gpu {

using expanse_sdk::args_of;
using expanse_sdk::device_props;
using expanse_sdk::implementation;
using expanse_sdk::launch_context;
using expanse_sdk::op_name;
using expanse_sdk::registered_list;
using expanse_sdk::workspace;

// Calls f with a value of the C++ type of an input dtype (f32, f16 or bf16).
template <class F>
void with_input_type(int32_t dtype, F&& f) {
  switch (dtype) {
    case EXPANSE_F32: f(float{}); break;
    case EXPANSE_F16: f(half_t{}); break;
    case EXPANSE_BF16: f(bfloat16_t{}); break;
    default: throw std::runtime_error("unsupported input dtype");
  }
}

// The reasons every implementation shares: no f64 (that is the reference's oracle mode), indices
// of phi that fit the table.
std::string common_declines(const expanse_op& op);
inline bool is_f32(const expanse_tensor* t) { return t == nullptr || t->dtype == EXPANSE_F32; }

// Whether t's entries from axis first_dim on are laid out row-major without gaps (size-1 axes may
// have any stride).
inline bool dense_from(const expanse_tensor& t, int first_dim) {
  int64_t stride = 1;
  for (int dim = t.ndim - 1; dim >= first_dim; --dim) {
    if (t.shape[dim] != 1 && t.strides[dim] != stride) return false;
    stride *= t.shape[dim];
  }
  return true;
}

// The phi table and, where the layout has one, its block form (kernels/common.hpp, phi_block), for
// the state operations.
struct phi_tables {
  const phi_entry* rows = nullptr;
  phi_blocks blocks;
};

// What a composed operation (power_attention) makes once for all its steps, handed to them as
// launch_context::prepared: make_phi_table(s) and make_gates then return these instead of building
// their own.
struct step_inputs {
  phi_tables phi;  // empty where no step reads phi
  gates g;
};
inline const step_inputs* prepared_of(const launch_context& lc) { return static_cast<const step_inputs*>(lc.prepared); }

// The phi table of the problem's p, d and layout, built in the workspace; make_phi_tables adds the
// block form where the layout has one.
const phi_entry* make_phi_table(const expanse_problem& pb, launch_context& lc);
phi_tables make_phi_tables(const expanse_problem& pb, launch_context& lc);
// The number of phi blocks of the problem's expansion; 0 when its layout has no block form.
int64_t phi_block_count(const expanse_problem& pb);

// Gate prefix sums per chunk of size c (c = t: one chunk) of a [b,t,h] log_g, in the workspace.
// Returns empty gates when log_g is null.
gates make_gates(const expanse_tensor* log_g, int64_t b, int64_t t, int64_t h, int64_t c, launch_context& lc);

inline int64_t chunk_count(int64_t t, int64_t c) { return (t + c - 1) / c; }

// *t, or a tensor with null data (absent) for a null pointer: kernels take tensors by value.
inline expanse_tensor tensor_or_empty(const expanse_tensor* t) { return t ? *t : expanse_tensor{}; }

// A contiguous f32 tensor over workspace memory, on the device of `like`.
expanse_tensor f32_view(float* data, std::initializer_list<int64_t> shape, const expanse_tensor& like);

// A [b,n,h]-indexed view of the chunk totals of `g`, stored [b,h,n] (discumsum's A).
expanse_tensor totals_view(const gates& g, const expanse_problem& pb, const expanse_tensor& like);

// A step of a composed operation (power_attention and its backward): the composed problem's sizes,
// with the dtypes of the step's tensors, f32 states, and no initial, final or intra term.
expanse_problem step_problem(const expanse_problem& pb, int32_t input_dtype, int32_t output_dtype);

}  // namespace expanse_gpu
