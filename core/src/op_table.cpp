// The tensor arguments of every operation, in one table: which fields of each *_args struct hold
// tensors, whether they are read, written or updated in place, and whether they may be NULL.
// Validation walks it for the checks every tensor gets (required, overlap, finite values); so do the
// tests and the fuzzers, through expanse_op_tensor_args.
#include "op_table.hpp"

#include <cstddef>

#include "codes.hpp"
#include "errors.hpp"

namespace expanse::detail {
namespace {

constexpr int32_t kIn = EXPANSE_ARG_INPUT, kOut = EXPANSE_ARG_OUTPUT, kInOut = EXPANSE_ARG_IN_OUT;

#define EXPANSE_ARG(args, field, role, required) {#field, offsetof(args, field), role, required}

const expanse_tensor_arg_info kSympowExpand[] = {
    EXPANSE_ARG(expanse_sympow_expand_args, x, kIn, 1),
    EXPANSE_ARG(expanse_sympow_expand_args, out, kOut, 1),
};
const expanse_tensor_arg_info kUpdateState[] = {
    EXPANSE_ARG(expanse_update_state_args, k, kIn, 1),
    EXPANSE_ARG(expanse_update_state_args, v, kIn, 1),
    EXPANSE_ARG(expanse_update_state_args, log_g, kIn, 0),
    EXPANSE_ARG(expanse_update_state_args, S, kOut, 1),
    EXPANSE_ARG(expanse_update_state_args, z, kOut, 0),
};
const expanse_tensor_arg_info kDiscumsum[] = {
    EXPANSE_ARG(expanse_discumsum_args, X, kIn, 1),
    EXPANSE_ARG(expanse_discumsum_args, A, kIn, 1),
    EXPANSE_ARG(expanse_discumsum_args, Y_init, kIn, 0),
    EXPANSE_ARG(expanse_discumsum_args, Y, kOut, 1),
};
const expanse_tensor_arg_info kQueryState[] = {
    EXPANSE_ARG(expanse_query_state_args, q, kIn, 1),
    EXPANSE_ARG(expanse_query_state_args, S, kIn, 1),
    EXPANSE_ARG(expanse_query_state_args, z, kIn, 0),
    EXPANSE_ARG(expanse_query_state_args, log_g, kIn, 0),
    EXPANSE_ARG(expanse_query_state_args, y, kIn, 0),
    EXPANSE_ARG(expanse_query_state_args, l, kIn, 0),
    EXPANSE_ARG(expanse_query_state_args, rowmax, kIn, 0),
    EXPANSE_ARG(expanse_query_state_args, o, kOut, 1),
};
const expanse_tensor_arg_info kChunkAttention[] = {
    EXPANSE_ARG(expanse_chunk_attention_args, q, kIn, 1),
    EXPANSE_ARG(expanse_chunk_attention_args, k, kIn, 1),
    EXPANSE_ARG(expanse_chunk_attention_args, v, kIn, 1),
    EXPANSE_ARG(expanse_chunk_attention_args, log_g, kIn, 0),
    EXPANSE_ARG(expanse_chunk_attention_args, y, kOut, 1),
    EXPANSE_ARG(expanse_chunk_attention_args, l, kOut, 1),
    EXPANSE_ARG(expanse_chunk_attention_args, rowmax, kOut, 1),
};
const expanse_tensor_arg_info kPowerAttention[] = {
    EXPANSE_ARG(expanse_power_attention_args, q, kIn, 1),
    EXPANSE_ARG(expanse_power_attention_args, k, kIn, 1),
    EXPANSE_ARG(expanse_power_attention_args, v, kIn, 1),
    EXPANSE_ARG(expanse_power_attention_args, log_g, kIn, 0),
    EXPANSE_ARG(expanse_power_attention_args, initial_S, kIn, 0),
    EXPANSE_ARG(expanse_power_attention_args, initial_z, kIn, 0),
    EXPANSE_ARG(expanse_power_attention_args, o, kOut, 1),
    EXPANSE_ARG(expanse_power_attention_args, final_S, kOut, 0),
    EXPANSE_ARG(expanse_power_attention_args, final_z, kOut, 0),
};
const expanse_tensor_arg_info kPowerAttentionStep[] = {
    EXPANSE_ARG(expanse_power_attention_step_args, q, kIn, 1),
    EXPANSE_ARG(expanse_power_attention_step_args, k, kIn, 1),
    EXPANSE_ARG(expanse_power_attention_step_args, v, kIn, 1),
    EXPANSE_ARG(expanse_power_attention_step_args, log_g, kIn, 0),
    EXPANSE_ARG(expanse_power_attention_step_args, S, kInOut, 1),
    EXPANSE_ARG(expanse_power_attention_step_args, z, kInOut, 0),
    EXPANSE_ARG(expanse_power_attention_step_args, o, kOut, 1),
};

#undef EXPANSE_ARG

template <size_t N>
constexpr op_tensor_table table(const expanse_tensor_arg_info (&args)[N], size_t args_size) {
  return {args, static_cast<int32_t>(N), args_size};
}

const op_tensor_table kTables[EXPANSE_OP_COUNT] = {
    table(kSympowExpand, sizeof(expanse_sympow_expand_args)),
    table(kUpdateState, sizeof(expanse_update_state_args)),
    table(kDiscumsum, sizeof(expanse_discumsum_args)),
    table(kQueryState, sizeof(expanse_query_state_args)),
    table(kChunkAttention, sizeof(expanse_chunk_attention_args)),
    table(kPowerAttention, sizeof(expanse_power_attention_args)),
    table(kPowerAttentionStep, sizeof(expanse_power_attention_step_args)),
};

}  // namespace

const op_tensor_table* op_tensors(int32_t kind) {
  return kind >= 0 && kind < EXPANSE_OP_COUNT ? &kTables[kind] : nullptr;
}

const expanse_tensor* tensor_at(const void* args, const expanse_tensor_arg_info& info) {
  const expanse_tensor* t;
  std::memcpy(&t, static_cast<const char*>(args) + info.offset, sizeof(t));
  return t;
}

bool writes_anything(const op_tensor_table& table, const void* args) {
  for (int32_t i = 0; i < table.count; ++i) {
    const expanse_tensor* t = tensor_at(args, table.args[i]);
    if (table.args[i].role == EXPANSE_ARG_INPUT || !t) continue;
    bool empty = false;
    for (int d = 0; d < t->ndim; ++d) empty = empty || t->shape[d] == 0;
    if (!empty) return true;
  }
  return false;
}

}  // namespace expanse::detail

using namespace expanse::detail;

extern "C" {

EXPANSE_API int32_t expanse_op_tensor_args(expanse_op_kind op, const expanse_tensor_arg_info** args) {
  const op_tensor_table* table = op_tensors(enum_code(op));
  if (args) *args = table ? table->args : nullptr;
  return table ? table->count : -1;
}

EXPANSE_API size_t expanse_op_args_size(expanse_op_kind op) {
  const op_tensor_table* table = op_tensors(enum_code(op));
  return table ? table->args_size : 0;
}

}  // extern "C"
