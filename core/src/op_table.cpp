// The table of operations: each operation declared once, here. An entry names the operation's
// arguments struct, then its tensors (role, required, shape rule, dtype rule, what they tell the
// backend) and its parameters (type, default, check). docs/design.md, "Adding an operation", says
// what else a new operation needs.
#include "op_table.hpp"

#include <cstddef>
#include <cstring>
#include <string>

#include "codes.hpp"
#include "errors.hpp"

namespace expanse::detail {
namespace {

constexpr int32_t kIn = EXPANSE_ARG_INPUT, kOut = EXPANSE_ARG_OUTPUT, kInOut = EXPANSE_ARG_IN_OUT;
constexpr int32_t kRequired = 1, kOptional = 0;
using D = dtype_rule;

// A tensor field of struct S: name, role, required, shape rule, dtype rule, then the optional fields
// of tensor_decl (other, flags, needs, with_normalize, group). The public dtypes text is filled below.
#define EXPANSE_TENSOR(S, field, role, required, dims, ...) \
  tensor_decl { {#field, offsetof(S, field), role, required, dims, nullptr}, __VA_ARGS__ }
// A parameter field of struct S: type, default, check, help.
#define EXPANSE_PARAM(S, field, type, value, check, help) \
  param_decl { {#field, offsetof(S, field), type, value, help}, param_check::check }

#define EXPANSE_P(S, max) \
  EXPANSE_PARAM(S, p, EXPANSE_PARAM_INT32, 2, degree, "degree of the power (1.." #max ")")
#define EXPANSE_LAYOUT(S)                                                              \
  EXPANSE_PARAM(S, layout, EXPANSE_PARAM_LAYOUT, EXPANSE_LAYOUT_SYMPOW, layout,        \
                "feature map layout: sympow, tensor or tiled:N (N divides d)")
#define EXPANSE_SCALE(S) \
  EXPANSE_PARAM(S, scale, EXPANSE_PARAM_DOUBLE, 0, scale, "query scale; 0 means 1/sqrt(d)")
#define EXPANSE_NORMALIZE(S) \
  EXPANSE_PARAM(S, normalize, EXPANSE_PARAM_INT32, 1, flag, "1: divide by the normalizer (even p only); 0: no")

// ---------------------------------------------------------------- sympow_expand
using sympow_expand = expanse_sympow_expand_args;
const tensor_decl kSympowExpandTensors[] = {
    EXPANSE_TENSOR(sympow_expand, x, kIn, kRequired, "... d", D::any_float),
    EXPANSE_TENSOR(sympow_expand, out, kOut, kRequired, "... D", D::output_of, "x", kPrimary),
};
const param_decl kSympowExpandParams[] = {
    EXPANSE_PARAM(sympow_expand, p, EXPANSE_PARAM_INT32, 2, degree, "degree of the power (1..6)"),
    EXPANSE_LAYOUT(sympow_expand),
};

// ---------------------------------------------------------------- update_state
using update_state = expanse_update_state_args;
const tensor_decl kUpdateStateTensors[] = {
    EXPANSE_TENSOR(update_state, k, kIn, kRequired, "b t h d", D::any_float),
    EXPANSE_TENSOR(update_state, v, kIn, kRequired, "b t h e", D::same_as, "k"),
    EXPANSE_TENSOR(update_state, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(update_state, S, kOut, kRequired, "b n h D e", D::state_float, nullptr, kState | kPrimary),
    EXPANSE_TENSOR(update_state, z, kOut, kOptional, "b n h D", D::same_as, "S", kState),
};
const param_decl kUpdateStateParams[] = {
    EXPANSE_P(update_state, 4),
    EXPANSE_PARAM(update_state, chunk_size, EXPANSE_PARAM_INT64, 128, chunk, "tokens per chunk (>= 1)"),
    EXPANSE_LAYOUT(update_state),
};

// ---------------------------------------------------------------- discumsum
using discumsum = expanse_discumsum_args;
const tensor_decl kDiscumsumTensors[] = {
    EXPANSE_TENSOR(discumsum, X, kIn, kRequired, "b n h ...", D::any_float),
    EXPANSE_TENSOR(discumsum, A, kIn, kRequired, "b n h", D::state_float),
    EXPANSE_TENSOR(discumsum, Y_init, kIn, kOptional, "b h ...", D::any_float, nullptr, kInitial),
    EXPANSE_TENSOR(discumsum, Y, kOut, kRequired, "b n+1 h ...", D::state_float, nullptr, kState | kPrimary),
};

// ---------------------------------------------------------------- query_state
using query_state = expanse_query_state_args;
const tensor_decl kQueryStateTensors[] = {
    EXPANSE_TENSOR(query_state, q, kIn, kRequired, "b t hq d", D::any_float),
    EXPANSE_TENSOR(query_state, S, kIn, kRequired, "b n h D e", D::state_float, nullptr, kState),
    EXPANSE_TENSOR(query_state, z, kIn, kOptional, "b n h D", D::same_as, "S", kState, nullptr, true),
    EXPANSE_TENSOR(query_state, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(query_state, y, kIn, kOptional, "b t hq e", D::state_float, nullptr, kIntra, nullptr, false, 1),
    EXPANSE_TENSOR(query_state, l, kIn, kOptional, "b t hq", D::state_float, nullptr, 0, nullptr, false, 1),
    EXPANSE_TENSOR(query_state, rowmax, kIn, kOptional, "b t hq", D::state_float, nullptr, 0, nullptr, false, 1),
    EXPANSE_TENSOR(query_state, o, kOut, kRequired, "b t hq e", D::output_of, "q", kPrimary),
};
const param_decl kQueryStateParams[] = {
    EXPANSE_P(query_state, 4),
    EXPANSE_SCALE(query_state),
    EXPANSE_PARAM(query_state, chunk_size, EXPANSE_PARAM_INT64, 128, chunk, "tokens per chunk (>= 1)"),
    EXPANSE_NORMALIZE(query_state),
    EXPANSE_LAYOUT(query_state),
};

// ---------------------------------------------------------------- chunk_attention
using chunk_attention = expanse_chunk_attention_args;
const tensor_decl kChunkAttentionTensors[] = {
    EXPANSE_TENSOR(chunk_attention, q, kIn, kRequired, "b t hq d", D::any_float),
    EXPANSE_TENSOR(chunk_attention, k, kIn, kRequired, "b t h d", D::same_as, "q"),
    EXPANSE_TENSOR(chunk_attention, v, kIn, kRequired, "b t h e", D::same_as, "q"),
    EXPANSE_TENSOR(chunk_attention, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(chunk_attention, y, kOut, kRequired, "b t hq e", D::state_float, nullptr, kState | kPrimary),
    EXPANSE_TENSOR(chunk_attention, l, kOut, kRequired, "b t hq", D::state_float),
    EXPANSE_TENSOR(chunk_attention, rowmax, kOut, kRequired, "b t hq", D::state_float),
};
const param_decl kChunkAttentionParams[] = {
    EXPANSE_P(chunk_attention, 4),
    EXPANSE_SCALE(chunk_attention),
    EXPANSE_PARAM(chunk_attention, chunk_size, EXPANSE_PARAM_INT64, 128, chunk_or_all,
                  "tokens per chunk (>= 1); 0: one chunk over the whole sequence"),
};

// ---------------------------------------------------------------- power_attention
using power_attention = expanse_power_attention_args;
const tensor_decl kPowerAttentionTensors[] = {
    EXPANSE_TENSOR(power_attention, q, kIn, kRequired, "b t hq d", D::any_float),
    EXPANSE_TENSOR(power_attention, k, kIn, kRequired, "b t h d", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention, v, kIn, kRequired, "b t h e", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(power_attention, initial_S, kIn, kOptional, "b h D e", D::state_float, nullptr, kState | kInitial),
    EXPANSE_TENSOR(power_attention, initial_z, kIn, kOptional, "b h D", D::same_as, "initial_S", kState,
                   "initial_S", true),
    EXPANSE_TENSOR(power_attention, o, kOut, kRequired, "b t hq e", D::output_of, "v", kPrimary),
    EXPANSE_TENSOR(power_attention, final_S, kOut, kOptional, "b h D e", D::state_float, nullptr, kState | kFinal),
    EXPANSE_TENSOR(power_attention, final_z, kOut, kOptional, "b h D", D::same_as, "final_S", kState, "final_S"),
};
const param_decl kPowerAttentionParams[] = {
    EXPANSE_P(power_attention, 4),
    EXPANSE_SCALE(power_attention),
    EXPANSE_PARAM(power_attention, chunk_size, EXPANSE_PARAM_INT64, EXPANSE_CHUNK_AUTO, chunk_or_auto,
                  "tokens per chunk (>= 1); 0: the quadratic form; -1: the backend chooses"),
    EXPANSE_NORMALIZE(power_attention),
    EXPANSE_LAYOUT(power_attention),
};

// ---------------------------------------------------------------- power_attention_step
using power_attention_step = expanse_power_attention_step_args;
const tensor_decl kPowerAttentionStepTensors[] = {
    EXPANSE_TENSOR(power_attention_step, q, kIn, kRequired, "b t? hq d", D::any_float),
    EXPANSE_TENSOR(power_attention_step, k, kIn, kRequired, "b t? h d", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention_step, v, kIn, kRequired, "b t? h e", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention_step, log_g, kIn, kOptional, "b t? h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(power_attention_step, S, kInOut, kRequired, "b h D e", D::state_float, nullptr,
                   kState | kInitial | kFinal),
    EXPANSE_TENSOR(power_attention_step, z, kInOut, kOptional, "b h D", D::same_as, "S", kState, nullptr, true),
    EXPANSE_TENSOR(power_attention_step, o, kOut, kRequired, "b t? hq e", D::output_of, "v", kPrimary),
};
const param_decl kPowerAttentionStepParams[] = {
    EXPANSE_P(power_attention_step, 4),
    EXPANSE_SCALE(power_attention_step),
    EXPANSE_NORMALIZE(power_attention_step),
    EXPANSE_LAYOUT(power_attention_step),
};

// ---------------------------------------------------------------- power_attention_backward
using power_attention_backward = expanse_power_attention_backward_args;
const tensor_decl kPowerAttentionBackwardTensors[] = {
    EXPANSE_TENSOR(power_attention_backward, q, kIn, kRequired, "b t hq d", D::any_float),
    EXPANSE_TENSOR(power_attention_backward, k, kIn, kRequired, "b t h d", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention_backward, v, kIn, kRequired, "b t h e", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention_backward, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(power_attention_backward, initial_S, kIn, kOptional, "b h D e", D::state_float, nullptr,
                   kState | kInitial),
    EXPANSE_TENSOR(power_attention_backward, initial_z, kIn, kOptional, "b h D", D::same_as, "initial_S", kState,
                   "initial_S", true),
    EXPANSE_TENSOR(power_attention_backward, o, kIn, kOptional, "b t hq e", D::same_as, "q", 0, nullptr, true),
    EXPANSE_TENSOR(power_attention_backward, dout, kIn, kRequired, "b t hq e", D::same_as, "q"),
    EXPANSE_TENSOR(power_attention_backward, dfinal_S, kIn, kOptional, "b h D e", D::state_float, nullptr,
                   kState | kFinal),
    EXPANSE_TENSOR(power_attention_backward, dfinal_z, kIn, kOptional, "b h D", D::state_float, nullptr,
                   kState | kFinal),
    EXPANSE_TENSOR(power_attention_backward, dq, kOut, kRequired, "b t hq d", D::output_of, "q", kPrimary),
    EXPANSE_TENSOR(power_attention_backward, dk, kOut, kRequired, "b t h d", D::output_of, "k"),
    EXPANSE_TENSOR(power_attention_backward, dv, kOut, kRequired, "b t h e", D::output_of, "v"),
    EXPANSE_TENSOR(power_attention_backward, dlog_g, kOut, kOptional, "b t h", D::state_float, nullptr, 0, "log_g"),
    EXPANSE_TENSOR(power_attention_backward, dinitial_S, kOut, kOptional, "b h D e", D::state_float, nullptr, kState,
                   "initial_S"),
    EXPANSE_TENSOR(power_attention_backward, dinitial_z, kOut, kOptional, "b h D", D::state_float, nullptr, kState,
                   "initial_z"),
};
const param_decl kPowerAttentionBackwardParams[] = {
    EXPANSE_P(power_attention_backward, 4),
    EXPANSE_SCALE(power_attention_backward),
    EXPANSE_PARAM(power_attention_backward, chunk_size, EXPANSE_PARAM_INT64, EXPANSE_CHUNK_AUTO, chunk_or_auto,
                  "tokens per chunk (>= 1); 0: the quadratic form; -1: the backend chooses"),
    EXPANSE_NORMALIZE(power_attention_backward),
    EXPANSE_LAYOUT(power_attention_backward),
};

// ---------------------------------------------------------------- update_state_backward
using update_state_backward = expanse_update_state_backward_args;
const tensor_decl kUpdateStateBackwardTensors[] = {
    EXPANSE_TENSOR(update_state_backward, k, kIn, kRequired, "b t h d", D::any_float),
    EXPANSE_TENSOR(update_state_backward, v, kIn, kRequired, "b t h e", D::same_as, "k"),
    EXPANSE_TENSOR(update_state_backward, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(update_state_backward, dS, kIn, kRequired, "b n h D e", D::state_float, nullptr, kState),
    EXPANSE_TENSOR(update_state_backward, dz, kIn, kOptional, "b n h D", D::same_as, "dS", kState),
    EXPANSE_TENSOR(update_state_backward, dk, kOut, kRequired, "b t h d", D::output_of, "k", kPrimary),
    EXPANSE_TENSOR(update_state_backward, dv, kOut, kRequired, "b t h e", D::output_of, "v"),
    EXPANSE_TENSOR(update_state_backward, dlog_g, kOut, kOptional, "b t h", D::state_float, nullptr, 0, "log_g"),
};
const param_decl kUpdateStateBackwardParams[] = {
    EXPANSE_P(update_state_backward, 4),
    EXPANSE_PARAM(update_state_backward, chunk_size, EXPANSE_PARAM_INT64, 128, chunk, "tokens per chunk (>= 1)"),
    EXPANSE_LAYOUT(update_state_backward),
};

// ---------------------------------------------------------------- discumsum_backward
using discumsum_backward = expanse_discumsum_backward_args;
const tensor_decl kDiscumsumBackwardTensors[] = {
    EXPANSE_TENSOR(discumsum_backward, X, kIn, kRequired, "b n h ...", D::any_float),
    EXPANSE_TENSOR(discumsum_backward, A, kIn, kRequired, "b n h", D::state_float),
    EXPANSE_TENSOR(discumsum_backward, Y_init, kIn, kOptional, "b h ...", D::any_float, nullptr, kInitial),
    EXPANSE_TENSOR(discumsum_backward, dY, kIn, kRequired, "b n+1 h ...", D::state_float, nullptr, kState),
    EXPANSE_TENSOR(discumsum_backward, dX, kOut, kRequired, "b n h ...", D::output_of, "X", kPrimary),
    EXPANSE_TENSOR(discumsum_backward, dA, kOut, kOptional, "b n h", D::state_float),
    EXPANSE_TENSOR(discumsum_backward, dY_init, kOut, kOptional, "b h ...", D::output_of, "Y_init", 0, "Y_init"),
};

// ---------------------------------------------------------------- query_state_backward
using query_state_backward = expanse_query_state_backward_args;
const tensor_decl kQueryStateBackwardTensors[] = {
    EXPANSE_TENSOR(query_state_backward, q, kIn, kRequired, "b t hq d", D::any_float),
    EXPANSE_TENSOR(query_state_backward, S, kIn, kRequired, "b n h D e", D::state_float, nullptr, kState),
    EXPANSE_TENSOR(query_state_backward, z, kIn, kOptional, "b n h D", D::same_as, "S", kState, nullptr, true),
    EXPANSE_TENSOR(query_state_backward, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(query_state_backward, y, kIn, kOptional, "b t hq e", D::state_float, nullptr, kIntra, nullptr, false, 1),
    EXPANSE_TENSOR(query_state_backward, l, kIn, kOptional, "b t hq", D::state_float, nullptr, 0, nullptr, false, 1),
    EXPANSE_TENSOR(query_state_backward, rowmax, kIn, kOptional, "b t hq", D::state_float, nullptr, 0, nullptr, false, 1),
    EXPANSE_TENSOR(query_state_backward, o, kIn, kOptional, "b t hq e", D::same_as, "q", 0, nullptr, true),
    EXPANSE_TENSOR(query_state_backward, dout, kIn, kRequired, "b t hq e", D::same_as, "q"),
    EXPANSE_TENSOR(query_state_backward, dq, kOut, kRequired, "b t hq d", D::output_of, "q", kPrimary),
    EXPANSE_TENSOR(query_state_backward, dS, kOut, kRequired, "b n h D e", D::state_float),
    EXPANSE_TENSOR(query_state_backward, dz, kOut, kOptional, "b n h D", D::state_float, nullptr, 0, "z"),
    EXPANSE_TENSOR(query_state_backward, dlog_g, kOut, kOptional, "b t h", D::state_float, nullptr, 0, "log_g"),
    EXPANSE_TENSOR(query_state_backward, dy, kOut, kOptional, "b t hq e", D::state_float, nullptr, 0, "y"),
    EXPANSE_TENSOR(query_state_backward, dl, kOut, kOptional, "b t hq", D::state_float, nullptr, 0, "l"),
};
const param_decl kQueryStateBackwardParams[] = {
    EXPANSE_P(query_state_backward, 4),
    EXPANSE_SCALE(query_state_backward),
    EXPANSE_PARAM(query_state_backward, chunk_size, EXPANSE_PARAM_INT64, 128, chunk, "tokens per chunk (>= 1)"),
    EXPANSE_NORMALIZE(query_state_backward),
    EXPANSE_LAYOUT(query_state_backward),
};

// ---------------------------------------------------------------- chunk_attention_backward
using chunk_attention_backward = expanse_chunk_attention_backward_args;
const tensor_decl kChunkAttentionBackwardTensors[] = {
    EXPANSE_TENSOR(chunk_attention_backward, q, kIn, kRequired, "b t hq d", D::any_float),
    EXPANSE_TENSOR(chunk_attention_backward, k, kIn, kRequired, "b t h d", D::same_as, "q"),
    EXPANSE_TENSOR(chunk_attention_backward, v, kIn, kRequired, "b t h e", D::same_as, "q"),
    EXPANSE_TENSOR(chunk_attention_backward, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(chunk_attention_backward, rowmax, kIn, kRequired, "b t hq", D::state_float),
    EXPANSE_TENSOR(chunk_attention_backward, dy, kIn, kRequired, "b t hq e", D::state_float, nullptr, kState),
    EXPANSE_TENSOR(chunk_attention_backward, dl, kIn, kOptional, "b t hq", D::state_float),
    EXPANSE_TENSOR(chunk_attention_backward, dq, kOut, kRequired, "b t hq d", D::output_of, "q", kPrimary),
    EXPANSE_TENSOR(chunk_attention_backward, dk, kOut, kRequired, "b t h d", D::output_of, "k"),
    EXPANSE_TENSOR(chunk_attention_backward, dv, kOut, kRequired, "b t h e", D::output_of, "v"),
    EXPANSE_TENSOR(chunk_attention_backward, dlog_g, kOut, kOptional, "b t h", D::state_float, nullptr, 0, "log_g"),
};
const param_decl kChunkAttentionBackwardParams[] = {
    EXPANSE_P(chunk_attention_backward, 4),
    EXPANSE_SCALE(chunk_attention_backward),
    EXPANSE_PARAM(chunk_attention_backward, chunk_size, EXPANSE_PARAM_INT64, 128, chunk_or_all,
                  "tokens per chunk (>= 1); 0: one chunk over the whole sequence"),
};

// ---------------------------------------------------------------- sequence_state
using sequence_state = expanse_sequence_state_args;
const tensor_decl kSequenceStateTensors[] = {
    EXPANSE_TENSOR(sequence_state, k, kIn, kRequired, "b t h d", D::any_float),
    EXPANSE_TENSOR(sequence_state, v, kIn, kRequired, "b t h e", D::same_as, "k"),
    EXPANSE_TENSOR(sequence_state, log_g, kIn, kOptional, "b t h", D::state_float, nullptr, kGates),
    EXPANSE_TENSOR(sequence_state, S, kOut, kRequired, "b h D e", D::state_float, nullptr, kState | kPrimary),
    EXPANSE_TENSOR(sequence_state, z, kOut, kOptional, "b h D", D::same_as, "S", kState),
    EXPANSE_TENSOR(sequence_state, A, kOut, kOptional, "b h", D::same_as, "S"),
};
const param_decl kSequenceStateParams[] = {
    EXPANSE_P(sequence_state, 4),
    EXPANSE_PARAM(sequence_state, chunk_size, EXPANSE_PARAM_INT64, 128, chunk, "tokens per chunk (>= 1)"),
    EXPANSE_LAYOUT(sequence_state),
};

#undef EXPANSE_TENSOR
#undef EXPANSE_PARAM
#undef EXPANSE_P
#undef EXPANSE_LAYOUT
#undef EXPANSE_SCALE
#undef EXPANSE_NORMALIZE

// The public views (arrays of expanse_tensor_arg_info / expanse_param_info) of a declaration.
template <size_t N>
struct tensor_infos {
  expanse_tensor_arg_info items[N];
  std::string dtypes[N];  // the text of each dtype rule, which items[i].dtypes points into
  explicit tensor_infos(const tensor_decl (&decls)[N]) : items{} {
    for (size_t i = 0; i < N; ++i) {
      const tensor_decl& t = decls[i];
      dtypes[i] = t.dtype == dtype_rule::any_float     ? "float"
                  : t.dtype == dtype_rule::state_float ? "f32|f64"
                  : t.dtype == dtype_rule::same_as     ? "=" + std::string(t.other)
                                                       : "=" + std::string(t.other) + "|f64";
      items[i] = t.info;
      items[i].dtypes = dtypes[i].c_str();
    }
  }
};
template <size_t N>
struct param_infos {
  expanse_param_info items[N];
  explicit constexpr param_infos(const param_decl (&decls)[N]) : items{} {
    for (size_t i = 0; i < N; ++i) items[i] = decls[i].info;
  }
};

template <class Args, size_t NT, size_t NP>
op_decl declare(const char* name, const tensor_decl (&tensors)[NT], const param_decl (&params)[NP],
                const char* positive, int32_t max_p) {
  static const tensor_infos<NT> tinfo(tensors);
  static const param_infos<NP> pinfo(params);
  return {name, sizeof(Args), tensors, int32_t(NT), params, int32_t(NP), positive, max_p, tinfo.items, pinfo.items};
}
template <class Args, size_t NT>
op_decl declare(const char* name, const tensor_decl (&tensors)[NT], const char* positive) {
  static const tensor_infos<NT> tinfo(tensors);
  return {name, sizeof(Args), tensors, int32_t(NT), nullptr, 0, positive, 0, tinfo.items, nullptr};
}

const op_decl kOps[EXPANSE_OP_COUNT] = {
    declare<sympow_expand>("sympow_expand", kSympowExpandTensors, kSympowExpandParams, "d", 6),
    declare<update_state>("update_state", kUpdateStateTensors, kUpdateStateParams, "d e h", 4),
    declare<discumsum>("discumsum", kDiscumsumTensors, ""),
    declare<query_state>("query_state", kQueryStateTensors, kQueryStateParams, "d e h hq", 4),
    declare<chunk_attention>("chunk_attention", kChunkAttentionTensors, kChunkAttentionParams, "d e h hq", 4),
    declare<power_attention>("power_attention", kPowerAttentionTensors, kPowerAttentionParams, "d e h hq", 4),
    declare<power_attention_step>("power_attention_step", kPowerAttentionStepTensors, kPowerAttentionStepParams,
                                  "d e h hq", 4),
    declare<power_attention_backward>("power_attention_backward", kPowerAttentionBackwardTensors,
                                      kPowerAttentionBackwardParams, "d e h hq", 4),
    declare<update_state_backward>("update_state_backward", kUpdateStateBackwardTensors,
                                   kUpdateStateBackwardParams, "d e h", 4),
    declare<discumsum_backward>("discumsum_backward", kDiscumsumBackwardTensors, ""),
    declare<query_state_backward>("query_state_backward", kQueryStateBackwardTensors, kQueryStateBackwardParams,
                                  "d e h hq", 4),
    declare<chunk_attention_backward>("chunk_attention_backward", kChunkAttentionBackwardTensors,
                                      kChunkAttentionBackwardParams, "d e h hq", 4),
    declare<sequence_state>("sequence_state", kSequenceStateTensors, kSequenceStateParams, "d e h", 4),
};

// The table is in the order of expanse_op_kind: each entry's name is the one EXPANSE_OPERATIONS gives
// its kind (checked once, at load, by the test of the table).
}  // namespace

const op_decl* op_declaration(int32_t kind) {
  return kind >= 0 && kind < EXPANSE_OP_COUNT ? &kOps[kind] : nullptr;
}

const expanse_tensor* tensor_at(const void* args, const expanse_tensor_arg_info& info) {
  const expanse_tensor* t;
  std::memcpy(&t, static_cast<const char*>(args) + info.offset, sizeof(t));
  return t;
}

bool writes_anything(const op_decl& op, const void* args) {
  for (int32_t i = 0; i < op.tensor_count; ++i) {
    const expanse_tensor_arg_info& info = op.tensors[i].info;
    const expanse_tensor* t = tensor_at(args, info);
    if (info.role == EXPANSE_ARG_INPUT || !t) continue;
    bool empty = false;
    for (int d = 0; d < t->ndim; ++d) empty = empty || t->shape[d] == 0;
    if (!empty) return true;
  }
  return false;
}

void init_args(const op_decl& op, void* args) {
  std::memset(args, 0, op.args_size);
  char* base = static_cast<char*>(args);
  for (int32_t i = 0; i < op.param_count; ++i) {
    const expanse_param_info& p = op.params[i].info;
    switch (p.type) {
      case EXPANSE_PARAM_INT32: {
        const int32_t v = static_cast<int32_t>(p.default_value);
        std::memcpy(base + p.offset, &v, sizeof(v));
        break;
      }
      case EXPANSE_PARAM_INT64: {
        const int64_t v = static_cast<int64_t>(p.default_value);
        std::memcpy(base + p.offset, &v, sizeof(v));
        break;
      }
      case EXPANSE_PARAM_DOUBLE: std::memcpy(base + p.offset, &p.default_value, sizeof(double)); break;
      case EXPANSE_PARAM_LAYOUT: {
        const expanse_layout v{static_cast<int32_t>(p.default_value), 0};
        std::memcpy(base + p.offset, &v, sizeof(v));
        break;
      }
    }
  }
}

}  // namespace expanse::detail

using namespace expanse::detail;

extern "C" {

EXPANSE_API const char* expanse_op_name(expanse_op_kind op) {
  const op_decl* decl = op_declaration(enum_code(op));
  return decl ? decl->name : "unknown";
}

EXPANSE_API expanse_status expanse_op_from_name(const char* name, expanse_op_kind* op) {
  return guarded([&] {
    if (!op) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_op_from_name: argument 'op' is NULL");
    std::string known;
    for (int32_t k = 0; k < EXPANSE_OP_COUNT; ++k) {
      if (name && std::strcmp(name, kOps[k].name) == 0) {
        *op = static_cast<expanse_op_kind>(k);
        return;
      }
      known += (k ? ", " : "") + std::string(kOps[k].name);
    }
    fail(EXPANSE_ERROR_INVALID_ARGUMENT, "unknown operation '%s' (known: %s)", name ? name : "(null)", known.c_str());
  });
}

EXPANSE_API int32_t expanse_op_tensor_args(expanse_op_kind op, const expanse_tensor_arg_info** args) {
  const op_decl* decl = op_declaration(enum_code(op));
  if (args) *args = decl ? decl->tensor_infos : nullptr;
  return decl ? decl->tensor_count : -1;
}

EXPANSE_API int32_t expanse_op_params(expanse_op_kind op, const expanse_param_info** params) {
  const op_decl* decl = op_declaration(enum_code(op));
  if (params) *params = decl ? decl->param_infos : nullptr;
  return decl ? decl->param_count : -1;
}

EXPANSE_API size_t expanse_op_args_size(expanse_op_kind op) {
  const op_decl* decl = op_declaration(enum_code(op));
  return decl ? decl->args_size : 0;
}

EXPANSE_API expanse_status expanse_op_args_init(expanse_op_kind op, void* args) {
  return guarded([&] {
    const op_decl* decl = op_declaration(enum_code(op));
    if (!decl) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_op_args_init: argument 'op': unknown operation kind %d", enum_code(op));
    if (!args) fail(EXPANSE_ERROR_INVALID_ARGUMENT, "expanse_op_args_init: argument 'args' is NULL");
    init_args(*decl, args);
  });
}

// expanse_<name>_args_init for every operation.
#define EXPANSE_ARGS_INIT(name, NAME)                                       \
  EXPANSE_API void expanse_##name##_args_init(expanse_##name##_args* a) {   \
    if (a) init_args(*op_declaration(EXPANSE_OP_##NAME), a);                \
  }
EXPANSE_OPERATIONS(EXPANSE_ARGS_INIT)
#undef EXPANSE_ARGS_INIT

}  // extern "C"

namespace {
// EXPANSE_OPERATIONS lists the operations in the order of their kinds, so that arrays built from it
// are indexed by kind.
#define EXPANSE_KIND_OF(name, NAME) EXPANSE_OP_##NAME,
constexpr expanse_op_kind kListed[] = {EXPANSE_OPERATIONS(EXPANSE_KIND_OF)};
#undef EXPANSE_KIND_OF
constexpr bool listed_in_kind_order() {
  for (int i = 0; i < int(sizeof(kListed) / sizeof(kListed[0])); ++i)
    if (kListed[i] != i) return false;
  return sizeof(kListed) / sizeof(kListed[0]) == EXPANSE_OP_COUNT;
}
static_assert(listed_in_kind_order(), "EXPANSE_OPERATIONS must list every operation in the order of its kind");
}  // namespace
