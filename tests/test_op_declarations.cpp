// The public face of the table of operations (core/src/op_table.cpp): names, parameter tables whose
// defaults are what the _args_init functions set, and the output shapes the shape rules give.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "expanse/expanse.hpp"

namespace {

std::vector<int64_t> output_shape(expanse_op_kind op, const void* args, const char* name, int32_t* dtype = nullptr) {
  const expanse_tensor_arg_info* infos = nullptr;
  const int32_t n = expanse_op_tensor_args(op, &infos);
  for (int32_t i = 0; i < n; ++i)
    if (std::strcmp(infos[i].name, name) == 0) {
      int32_t ndim = 0;
      int64_t shape[EXPANSE_MAX_DIMS] = {};
      expanse::check(expanse_output_shape(op, args, i, &ndim, shape, dtype));
      return {shape, shape + ndim};
    }
  FAIL("no tensor " << name);
  return {};
}

expanse_tensor view(std::vector<int64_t> shape, expanse_dtype dtype = EXPANSE_F32) {
  static double fake[1];  // shapes only: expanse_output_shape reads no data
  return expanse::tensor_of(fake, dtype, shape, EXPANSE_DEVICE_CPU);
}

}  // namespace

TEST_CASE("op declarations: names, parameters and their defaults") {
  for (int k = 0; k < EXPANSE_OP_COUNT; ++k) {
    const auto op = static_cast<expanse_op_kind>(k);
    expanse_op_kind back;
    REQUIRE(expanse_op_from_name(expanse_op_name(op), &back) == EXPANSE_OK);
    CHECK(back == op);
    // expanse_op_args_init sets every parameter to the table's default, every tensor to NULL.
    std::vector<unsigned char> args(expanse_op_args_size(op), 0xAB);
    REQUIRE(expanse_op_args_init(op, args.data()) == EXPANSE_OK);
    const expanse_param_info* params = nullptr;
    const int32_t np = expanse_op_params(op, &params);
    REQUIRE(np >= 0);
    for (int32_t i = 0; i < np; ++i) {
      const unsigned char* at = args.data() + params[i].offset;
      INFO(expanse_op_name(op) << "." << params[i].name);
      CHECK(params[i].help != nullptr);
      if (params[i].type == EXPANSE_PARAM_INT32) CHECK(*reinterpret_cast<const int32_t*>(at) == params[i].default_value);
      if (params[i].type == EXPANSE_PARAM_INT64) CHECK(*reinterpret_cast<const int64_t*>(at) == params[i].default_value);
      if (params[i].type == EXPANSE_PARAM_DOUBLE) CHECK(*reinterpret_cast<const double*>(at) == params[i].default_value);
    }
    const expanse_tensor_arg_info* tensors = nullptr;
    const int32_t nt = expanse_op_tensor_args(op, &tensors);
    CHECK(tensors[0].offset == 0);  // every args struct starts with a tensor (backends read its device there)
    for (int32_t i = 0; i < nt; ++i) {
      CHECK(*reinterpret_cast<void* const*>(args.data() + tensors[i].offset) == nullptr);
      CHECK(std::strlen(tensors[i].dims) > 0);
    }
  }
  expanse_op_kind op;
  CHECK(expanse_op_from_name("power_attention_backwards", &op) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("known: sympow_expand, update_state") != std::string::npos);
  CHECK(expanse_op_args_init(static_cast<expanse_op_kind>(99), &op) == EXPANSE_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("op declarations: output shapes by the shape rules") {
  const expanse_tensor q = view({2, 10, 4, 8}), k = view({2, 10, 2, 8}), v = view({2, 10, 2, 6});
  const int64_t D = expanse::expanded_dim(2, 8);  // 36

  auto pa = expanse::power_attention_args();
  pa.q = &q, pa.k = &k, pa.v = &v;
  int32_t dtype = -1;
  CHECK(output_shape(EXPANSE_OP_POWER_ATTENTION, &pa, "o", &dtype) == std::vector<int64_t>{2, 10, 4, 6});
  CHECK(dtype == EXPANSE_F32);
  CHECK(output_shape(EXPANSE_OP_POWER_ATTENTION, &pa, "final_S") == std::vector<int64_t>{2, 2, D, 6});
  CHECK(output_shape(EXPANSE_OP_POWER_ATTENTION, &pa, "final_z") == std::vector<int64_t>{2, 2, D});

  auto us = expanse::update_state_args();
  us.k = &k, us.v = &v, us.chunk_size = 3;
  CHECK(output_shape(EXPANSE_OP_UPDATE_STATE, &us, "S") == std::vector<int64_t>{2, 4, 2, D, 6});  // ceil(10/3)

  const expanse_tensor X = view({1, 5, 3, 7, 2}, EXPANSE_F64), A = view({1, 5, 3});
  auto dc = expanse::discumsum_args();
  dc.X = &X, dc.A = &A;
  CHECK(output_shape(EXPANSE_OP_DISCUMSUM, &dc, "Y", &dtype) == std::vector<int64_t>{1, 6, 3, 7, 2});
  CHECK(dtype == EXPANSE_F64);

  const expanse_tensor x = view({3, 5, 4}, EXPANSE_BF16);
  auto se = expanse::sympow_expand_args();
  se.x = &x, se.p = 3;
  CHECK(output_shape(EXPANSE_OP_SYMPOW_EXPAND, &se, "out", &dtype) == std::vector<int64_t>{3, 5, 20});
  CHECK(dtype == EXPANSE_BF16);

  // A decoding step's tensors may omit the token axis; its output then omits it too.
  const expanse_tensor sq = view({2, 4, 8}), sk = view({2, 2, 8}), sv = view({2, 2, 6}), S = view({2, 2, D, 6}),
                       z = view({2, 2, D});
  auto st = expanse::power_attention_step_args();
  st.q = &sq, st.k = &sk, st.v = &sv, st.S = const_cast<expanse_tensor*>(&S), st.z = const_cast<expanse_tensor*>(&z);
  CHECK(output_shape(EXPANSE_OP_POWER_ATTENTION_STEP, &st, "o") == std::vector<int64_t>{2, 4, 6});
  // Several tokens keep the axis; a tensor without it is one token and cannot join them.
  const expanse_tensor tq = view({2, 3, 4, 8}), tk = view({2, 3, 2, 8}), tv = view({2, 3, 2, 6});
  st.q = &tq, st.k = &tk, st.v = &tv;
  CHECK(output_shape(EXPANSE_OP_POWER_ATTENTION_STEP, &st, "o") == std::vector<int64_t>{2, 3, 4, 6});
  st.k = &sk;
  int32_t step_ndim;
  int64_t step_shape[EXPANSE_MAX_DIMS];
  CHECK(expanse_output_shape(EXPANSE_OP_POWER_ATTENTION_STEP, &st, 6, &step_ndim, step_shape, nullptr) ==
        EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("argument 'k' has rank 3: without its token axis it is one token, "
                                               "but 'q' has t=3") != std::string::npos);
  const expanse_tensor q5 = view({2, 3, 1, 4, 8});  // neither rank 4 nor rank 3
  st.q = &q5, st.k = &tk, st.v = &tv;
  CHECK(expanse_output_shape(EXPANSE_OP_POWER_ATTENTION_STEP, &st, 6, &step_ndim, step_shape, nullptr) ==
        EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("argument 'q' must have rank 4 [b,t,hq,d], or 3 without its token "
                                               "axis (one token), got rank 5") != std::string::npos);
  st.q = &sq, st.k = &sk, st.v = &tv;
  CHECK(expanse_output_shape(EXPANSE_OP_POWER_ATTENTION_STEP, &st, 6, &step_ndim, step_shape, nullptr) ==
        EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("argument 'v': dimension 1 (t) must be 1 to match 'q' (one token") !=
        std::string::npos);

  // Inputs are validated first, naming the argument.
  const expanse_tensor bad_v = view({2, 9, 2, 6});
  pa.v = &bad_v;
  int32_t ndim;
  int64_t shape[EXPANSE_MAX_DIMS];
  CHECK(expanse_output_shape(EXPANSE_OP_POWER_ATTENTION, &pa, 6, &ndim, shape, nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("argument 'v': dimension 1 (t) must be 10 to match 'q'") != std::string::npos);
  pa.v = &v;
  CHECK(expanse_output_shape(EXPANSE_OP_POWER_ATTENTION, &pa, 0, &ndim, shape, nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
}
