// Checks every operation gets from the table of its tensor arguments (expanse_op_tensor_args):
// a NULL required tensor, an output that overlaps another argument, and (with the finite check on)
// a NaN in an input are each refused with the argument named, and nothing is written. The loops
// run over the table, so a new operation or argument is covered without a new test.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cases.hpp"
#include "test_seed.hpp"

namespace h = expanse::harness;

namespace {

// A representative valid problem of op with every optional tensor present where the op has one.
h::op_config full_config(expanse_op_kind op) {
  h::op_config c = h::quick_cases(op).front();
  c.gated = true;
  if (op == EXPANSE_OP_POWER_ATTENTION) c.initial_state = c.final_state = true;
  if (op == EXPANSE_OP_DISCUMSUM) c.initial_state = true;
  if (op == EXPANSE_OP_QUERY_STATE) c.intra = true;
  return c;
}

std::vector<expanse_tensor_arg_info> table_of(expanse_op_kind op) {
  const expanse_tensor_arg_info* args = nullptr;
  const int32_t n = expanse_op_tensor_args(op, &args);
  REQUIRE(n > 0);
  return {args, args + n};
}

expanse_tensor*& slot(void* args, const expanse_tensor_arg_info& info) {
  return *reinterpret_cast<expanse_tensor**>(static_cast<char*>(args) + info.offset);
}

struct stop_before_call {};

// Whether the args of `run` hold every tensor named in `infos` (some optional ones are absent in
// some configurations, e.g. z without normalization).
bool has_tensors(h::prepared_run& run, std::initializer_list<const expanse_tensor_arg_info*> infos) {
  bool present = true;
  try {
    run.execute([&](void* args) {
      for (const auto* info : infos) present = present && slot(args, *info) != nullptr;
      throw stop_before_call{};
    });
  } catch (const stop_before_call&) {
  }
  return present;
}

// Runs cfg with `adjust` applied to its args, when they hold every tensor of `infos`; expects
// INVALID_ARGUMENT whose message starts with the op and contains `mention`, and outputs exactly as
// before the call.
void expect_refused(expanse::context& ctx, const h::op_config& cfg,
                    std::initializer_list<const expanse_tensor_arg_info*> infos,
                    const std::function<void(void*)>& adjust, const std::string& mention) {
  const h::tensor_map inputs = h::make_inputs(cfg, test_seed());
  h::prepared_run run(ctx, cfg, inputs, false);
  if (!has_tensors(run, infos)) return;
  const h::tensor_map before = run.download();
  std::string message;
  expanse_status status = EXPANSE_OK;
  try {
    run.execute(adjust);
  } catch (const expanse::error& e) {
    status = e.status();
    message = e.what();
  }
  INFO(cfg.label() << " -> " << message);
  CHECK(status == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(message.find(mention) != std::string::npos);
  CHECK(message.find(expanse_op_name(cfg.op)) == 0);
  const h::tensor_map after = run.download();
  for (const auto& out : before)  // (no structured binding: clang 14 cannot capture one in CHECK_MESSAGE)
    CHECK_MESSAGE(out.second.bytes == after.at(out.first).bytes, "output '" << out.first << "' was written");
}

}  // namespace

TEST_CASE("the op table lists every operation's tensors") {
  for (int op = 0; op < EXPANSE_OP_COUNT; ++op) {
    const auto table = table_of(expanse_op_kind(op));
    CHECK(expanse_op_args_size(expanse_op_kind(op)) > table.back().offset);
    int outputs = 0;
    for (const auto& a : table) outputs += a.role != EXPANSE_ARG_INPUT;
    CHECK(outputs >= 1);
  }
  const expanse_tensor_arg_info* none = reinterpret_cast<const expanse_tensor_arg_info*>(1);
  CHECK(expanse_op_tensor_args(expanse_op_kind(EXPANSE_OP_COUNT), &none) == -1);
  CHECK(none == nullptr);
  CHECK(expanse_op_args_size(expanse_op_kind(-3)) == 0);
}

TEST_CASE("every required tensor of every operation: NULL is refused by name") {
  expanse::context ctx("reference");
  for (int op = 0; op < EXPANSE_OP_COUNT; ++op) {
    const h::op_config cfg = full_config(expanse_op_kind(op));
    for (const auto& info : table_of(expanse_op_kind(op))) {
      if (!info.required) continue;
      expect_refused(ctx, cfg, {&info}, [&](void* args) { slot(args, info) = nullptr; },
                     "argument '" + std::string(info.name) + "' is required but NULL");
    }
  }
}

TEST_CASE("an output sharing memory with any other argument is refused") {
  expanse::context ctx("reference");
  for (int op = 0; op < EXPANSE_OP_COUNT; ++op) {
    const h::op_config cfg = full_config(expanse_op_kind(op));
    const auto table = table_of(expanse_op_kind(op));
    for (const auto& out : table) {
      if (out.role == EXPANSE_ARG_INPUT) continue;
      for (const auto& other : table) {
        if (&other == &out) continue;
        // Both tensors moved into one buffer large enough for either, so that a missed overlap
        // could not write outside memory the test owns.
        std::vector<double> shared(1 << 16);
        expanse_tensor moved_out{}, moved_other{};
        expect_refused(ctx, cfg, {&out, &other}, [&](void* args) {
          moved_out = *slot(args, out);
          moved_other = *slot(args, other);
          moved_out.data = shared.data();
          moved_other.data = shared.data() + 1;  // overlapping (8 bytes in: every output is longer), not identical
          slot(args, out) = &moved_out;
          slot(args, other) = &moved_other;
        }, "overlaps");
      }
    }
  }
}

TEST_CASE("the finite check names the first non-finite input and its index") {
  expanse::context ctx("reference");
  ctx.set_check_finite(true);
  CHECK(expanse_context_set_check_finite(ctx.get(), 2) == EXPANSE_ERROR_INVALID_ARGUMENT);
  for (int op = 0; op < EXPANSE_OP_COUNT; ++op) {
    const h::op_config cfg = full_config(expanse_op_kind(op));
    for (const auto& info : table_of(expanse_op_kind(op))) {
      if (info.role == EXPANSE_ARG_OUTPUT) continue;
      for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
        std::vector<unsigned char> copy;
        expanse_tensor poisoned{};
        expect_refused(ctx, cfg, {&info}, [&](void* args) {
          // A host copy of the input with its last element replaced (the reference reads host memory).
          const expanse_tensor* t = slot(args, info);
          poisoned = *t;
          int64_t numel = 1;
          for (int i = 0; i < t->ndim; ++i) numel *= t->shape[i];
          h::host_tensor host;
          host.dtype = expanse_dtype(t->dtype);
          host.shape.assign(t->shape, t->shape + t->ndim);
          host.bytes.assign(static_cast<const unsigned char*>(t->data),
                            static_cast<const unsigned char*>(t->data) + numel * expanse_dtype_size(host.dtype));
          host.set(numel - 1, bad);
          copy = host.bytes;
          poisoned.data = copy.data();
          slot(args, info) = &poisoned;
        }, "argument '" + std::string(info.name) + "' holds a non-finite value");
      }
    }
  }
}

TEST_CASE("the finite check lets a reset (log_g = -inf) through, and is off by default") {
  h::op_config cfg = full_config(EXPANSE_OP_POWER_ATTENTION);
  h::tensor_map inputs = h::make_inputs(cfg, test_seed());
  inputs.at("log_g").set(3, -std::numeric_limits<double>::infinity());
  for (int check : {0, 1}) {
    expanse::context ctx("reference");
    REQUIRE(expanse_context_set_check_finite(ctx.get(), check) == EXPANSE_OK);
    CHECK_NOTHROW(h::run_on(ctx, cfg, inputs, false));
  }
  inputs.at("q").set(0, std::numeric_limits<double>::quiet_NaN());
  expanse::context ctx("reference");
  CHECK_NOTHROW(h::run_on(ctx, cfg, inputs, false));  // off: no word (docs/spec.md)
}

TEST_CASE("sizes: chunk sizes up to INT64_MAX mean one chunk, and no size computation overflows") {
  expanse::context ctx("reference");
  h::op_config cfg = full_config(EXPANSE_OP_POWER_ATTENTION);
  const h::tensor_map inputs = h::make_inputs(cfg, test_seed());
  cfg.c = 0;
  const h::tensor_map quadratic = h::run_on(ctx, cfg, inputs, false);
  for (int64_t huge : {cfg.t, cfg.t + 1, int64_t(1) << 40, INT64_MAX - 1, INT64_MAX}) {
    cfg.c = huge;  // (t + c - 1) / c once overflowed to n = 0 and left o unwritten
    const h::tensor_map one_chunk = h::run_on(ctx, cfg, inputs, false);
    for (const auto& out : quadratic)
      CHECK_MESSAGE(h::compare({{out.first, one_chunk.at(out.first)}}, {out}, 1e-5).front().pass,
                    out.first << " at c = " << huge);
  }
  // chunk_attention's work follows t, not the chunk size (c = 2^62 once took hours at t = 16).
  h::op_config att = full_config(EXPANSE_OP_CHUNK_ATTENTION);
  att.t = 16;
  att.c = int64_t(1) << 62;
  CHECK_NOTHROW(h::run_on(ctx, att, h::make_inputs(att, test_seed()), false));

  int64_t D = -1;
  CHECK(expanse_expanded_dim(2, INT64_MAX, {EXPANSE_LAYOUT_SYMPOW, 0}, &D) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(expanse_expanded_dim(1, INT64_MAX, {EXPANSE_LAYOUT_SYMPOW, 0}, &D) == EXPANSE_OK);
  CHECK(D == INT64_MAX);
  CHECK(expanse_expanded_dim(3, int64_t(1) << 40, {EXPANSE_LAYOUT_TENSOR, 0}, &D) == EXPANSE_ERROR_INVALID_ARGUMENT);
  expanse_tensor t{};
  const int64_t shape[] = {int64_t(1) << 40, int64_t(1) << 40};
  CHECK(expanse_tensor_make(&t, nullptr, EXPANSE_F32, 2, shape, EXPANSE_DEVICE_CPU, 0) == EXPANSE_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("enum arguments: codes outside the enums are named, never loaded as enums") {
  int32_t bad = 17;
  expanse_dtype dtype;
  expanse_op_kind op;
  expanse_status status;
  std::memcpy(&dtype, &bad, sizeof(bad));  // what a C caller can pass
  std::memcpy(&op, &bad, sizeof(bad));
  std::memcpy(&status, &bad, sizeof(bad));
  CHECK(expanse_dtype_size(dtype) == 0);
  CHECK(std::string(expanse_dtype_name(dtype)) == "unknown");
  CHECK(std::string(expanse_op_name(op)) == "unknown");
  CHECK(std::string(expanse_status_name(status)) == "unknown status");
  CHECK(expanse_op_tensor_args(op, nullptr) == -1);
  expanse::context ctx("reference");
  CHECK(expanse_run(ctx.get(), op, nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("unknown operation kind 17") != std::string::npos);
}
