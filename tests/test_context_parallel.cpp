// Context parallelism on simulated ranks (core/harness/context_parallel.hpp): power_attention and its
// backward computed piece by piece, the pieces joined only through their final states, total
// decays and the state cotangents, equal the single-sequence results on every available backend
// (f64 on the reference, f32 elsewhere), within the docs/spec.md tolerance of the dtype: uneven
// pieces (one of a single token), grouped heads, gates with resets, initial and final states, b > 1.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cases.hpp"
#include "context_parallel.hpp"
#include "test_seed.hpp"

namespace h = expanse::harness;

namespace {

struct split_case {
  h::op_config cfg;  // a power_attention_backward config
  std::vector<int64_t> bounds;
};

std::vector<split_case> split_cases() {
  std::vector<split_case> cases;
  h::op_config c;
  c.op = expanse::ops::power_attention_backward;
  c.b = 2, c.t = 45, c.hq = 4, c.h = 2, c.d = 8, c.e = 6, c.p = 2, c.c = 8;
  c.gated = c.resets = c.normalize = c.initial_state = c.final_state = true;
  cases.push_back({c, {0, 13, 14, 31, 45}});
  c.b = 1, c.t = 30, c.hq = c.h = 2, c.d = 6, c.e = 5, c.p = 1, c.c = 5;
  c.resets = c.normalize = c.initial_state = false;
  cases.push_back({c, {0, 7, 30}});
  c.t = 40, c.hq = 2, c.h = 1, c.d = 8, c.e = 4, c.p = 4, c.c = 16, c.layout = {EXPANSE_LAYOUT_TILED, 4};
  c.gated = c.final_state = false;
  c.normalize = c.initial_state = true;
  cases.push_back({c, {0, 20, 21, 40}});
  return cases;
}

h::op_config forward_of(h::op_config cfg) {
  cfg.op = expanse::ops::power_attention;
  return cfg;
}

// The forward's inputs among a backward's.
h::tensor_map forward_inputs(const h::tensor_map& in) {
  h::tensor_map f;
  for (const char* name : {"q", "k", "v", "log_g", "initial_S", "initial_z"})
    if (in.count(name)) f[name] = in.at(name);
  return f;
}

void check_equal(const h::tensor_map& pieces, const h::tensor_map& whole, double tolerance) {
  CHECK(pieces.size() == whole.size());
  for (const h::comparison& c : h::compare(pieces, whole, tolerance)) {
    INFO(c.output << ": rel. error " << c.rel_error << " (tolerance " << c.tolerance << ")");
    CHECK(c.pass);
  }
}

}  // namespace

TEST_CASE("context parallelism on simulated ranks equals one sequence, on every available backend") {
  for (const expanse_backend_info& info : expanse::backends()) {
    if (!info.available) continue;
    expanse::context ctx(info.name);
    const bool oracle = std::string(info.name) == "reference";  // f64 there
    const auto cases = split_cases();
    for (size_t i = 0; i < cases.size(); ++i) {
      h::op_config cfg = cases[i].cfg;
      cfg.dtype = oracle ? EXPANSE_F64 : EXPANSE_F32;
      const uint64_t seed = test_seed() + i;
      INFO("backend " << info.name << ", case " << i << " (" << cfg.label() << "), seed " << seed);
      const h::tensor_map in = h::make_inputs(cfg, seed);
      const double tol = h::tolerance_for(cfg.dtype);
      try {
        const h::tensor_map whole_fwd = h::run_on(ctx, forward_of(cfg), forward_inputs(in), oracle);
        check_equal(h::context_parallel_forward(ctx, forward_of(cfg), forward_inputs(in), cases[i].bounds, oracle),
                    whole_fwd, tol);
        const h::tensor_map whole_bwd = h::run_on(ctx, cfg, in, oracle);
        check_equal(h::context_parallel_backward(ctx, cfg, in, cases[i].bounds, oracle), whole_bwd, tol);
      } catch (const expanse::error& e) {
        if (e.status() != EXPANSE_ERROR_UNSUPPORTED) throw;
        MESSAGE("backend '" << info.name << "' declines case " << i << ": " << e.what());
      }
    }
  }
}

TEST_CASE("the C API's context parallelism, ranks as threads joined by a host all-gather, equals one sequence") {
  // The reference backend (host memory, contexts in parallel threads), in f64.
  expanse::context ctx("reference");
  const auto cases = split_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    h::op_config cfg = cases[i].cfg;
    cfg.dtype = EXPANSE_F64;
    const uint64_t seed = test_seed() + 100 + i;
    INFO("case " << i << " (" << cfg.label() << "), seed " << seed);
    const h::tensor_map in = h::make_inputs(cfg, seed);
    const double tol = h::tolerance_for(cfg.dtype);
    check_equal(h::context_parallel_threads("reference", forward_of(cfg), forward_inputs(in), cases[i].bounds),
                h::run_on(ctx, forward_of(cfg), forward_inputs(in), true), tol);
    check_equal(h::context_parallel_threads("reference", cfg, in, cases[i].bounds), h::run_on(ctx, cfg, in, true), tol);
  }
}

TEST_CASE("a rank's share of a single call's outputs: its tokens, the states, dinitial on rank 0 only") {
  h::tensor_map outputs;
  outputs["dq"] = h::host_tensor::zeros(EXPANSE_F32, {2, 10, 3, 4});  // [b, t, hq, d]
  for (int64_t i = 0; i < outputs["dq"].numel(); ++i) outputs["dq"].set(i, double(i));
  outputs["dinitial_S"] = h::host_tensor::zeros(EXPANSE_F32, {2, 3, 5, 4});
  outputs["final_S"] = h::host_tensor::zeros(EXPANSE_F32, {2, 3, 5, 4});
  const std::vector<int64_t> bounds{0, 6, 10};
  const h::tensor_map first = h::rank_share(outputs, bounds, 0), second = h::rank_share(outputs, bounds, 1);
  CHECK(first.count("dinitial_S") == 1);
  CHECK(second.count("dinitial_S") == 0);
  CHECK(second.count("final_S") == 1);
  REQUIRE(second.at("dq").shape == std::vector<int64_t>{2, 4, 3, 4});
  CHECK(second.at("dq").get(0) == double(6 * 12));                  // batch 0, token 6
  CHECK(second.at("dq").get(4 * 12) == double(10 * 12 + 6 * 12));   // batch 1, token 6
}

TEST_CASE("the C API's context parallelism refuses a bad rank or a missing all-gather by name") {
  expanse::context ctx("reference");
  expanse_power_attention_args a;
  expanse_power_attention_args_init(&a);
  const expanse_context_parallel no_gather{0, 2, nullptr, nullptr};
  CHECK(expanse_context_parallel_power_attention(ctx.get(), &no_gather, &a) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("allgather is NULL") != std::string::npos);
  const expanse_context_parallel bad_rank{2, 2, [](const void*, void*, size_t, void*, void*) { return int32_t(0); }, nullptr};
  CHECK(expanse_context_parallel_power_attention(ctx.get(), &bad_rank, &a) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("rank must be in [0, 2)") != std::string::npos);
  CHECK(expanse_context_parallel_power_attention(ctx.get(), nullptr, &a) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("argument 'cp' is NULL") != std::string::npos);
  void* proc = nullptr;
  CHECK(expanse_backend_proc(ctx.get(), "expanse_nccl_allgather", &proc) == EXPANSE_ERROR_UNSUPPORTED);

  // The states it copies flat must be contiguous: a final state (forward) or its cotangent (backward)
  // with its last two dims transposed is refused by name before anything runs.
  const expanse_context_parallel one{0, 1, [](const void*, void*, size_t, void*, void*) { return int32_t(1); }, nullptr};
  h::op_config cfg = split_cases()[0].cfg;
  cfg.dtype = EXPANSE_F64;
  const h::tensor_map in = h::make_inputs(cfg, test_seed());
  auto transposed = [](expanse_tensor t) {  // [.., D, e] with column-major strides in the last two dims
    t.strides[3] = t.shape[2];
    t.strides[2] = 1;
    return t;
  };
  for (bool backward : {false, true}) {
    const h::op_config c = backward ? cfg : forward_of(cfg);
    h::prepared_run run(ctx, c, backward ? in : forward_inputs(in), true);
    expanse_status st = EXPANSE_OK;
    run.call_with_args([&](void* args) {
      if (backward) {
        auto a = *static_cast<const expanse_power_attention_backward_args*>(args);
        const expanse_tensor t = transposed(*a.dfinal_S);
        a.dfinal_S = &t;
        st = expanse_context_parallel_power_attention_backward(ctx.get(), &one, &a);
      } else {
        auto a = *static_cast<const expanse_power_attention_args*>(args);
        expanse_tensor t = transposed(*a.final_S);
        a.final_S = &t;
        st = expanse_context_parallel_power_attention(ctx.get(), &one, &a);
      }
    });
    CHECK(st == EXPANSE_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(expanse_last_error()).find(backward ? "argument 'dfinal_S' must be contiguous"
                                                          : "argument 'final_S' must be contiguous") != std::string::npos);
  }
  CHECK(proc == nullptr);
}

namespace {

// An exchanging call's callback under test: it keeps what the call left in `seen_from` (the state or
// cotangent the call writes before it) and only then writes `to_S`, `to_z` (which held NaN until
// then) from `from_S`, `from_z`.
struct exchange_probe {
  expanse_context* ctx;
  const expanse_tensor *seen_from, *to_S, *to_z;
  const void *from_S, *from_z;  // on the device
  size_t bytes_S, bytes_z;
  h::host_tensor seen;
  int calls = 0;
};

int32_t probe_exchange(void*, void* user) {
  exchange_probe& p = *static_cast<exchange_probe*>(user);
  ++p.calls;
  if (expanse_memcpy(p.ctx, p.seen.bytes.data(), p.seen_from->data, p.seen.bytes.size(), EXPANSE_COPY_DEVICE_TO_HOST) ||
      expanse_memcpy(p.ctx, p.to_S->data, p.from_S, p.bytes_S, EXPANSE_COPY_DEVICE_TO_DEVICE) ||
      (p.to_z && expanse_memcpy(p.ctx, p.to_z->data, p.from_z, p.bytes_z, EXPANSE_COPY_DEVICE_TO_DEVICE)))
    return 1;
  return expanse_synchronize(p.ctx) == EXPANSE_OK ? 0 : 1;
}

// A contiguous tensor shaped as `like`, on its context's device, full of NaN.
struct nan_tensor {
  expanse::device_buffer memory;
  expanse_tensor view;
  size_t bytes;
  nan_tensor(expanse::context& ctx, const expanse_tensor& like) : view(like) {
    bytes = expanse_dtype_size(expanse_dtype(like.dtype));
    for (int i = 0; i < like.ndim; ++i) bytes *= size_t(like.shape[i]);
    memory = expanse::device_buffer(ctx.get(), bytes);
    const std::vector<unsigned char> nans(bytes, 0xFF);  // NaN in f32 and f64
    expanse::check(expanse_memcpy(ctx.get(), memory.data(), nans.data(), bytes, EXPANSE_COPY_HOST_TO_DEVICE));
    view.data = memory.data();
  }
};

// The probe of a call whose callback writes the pair (to_S, to_z), now NaN, from (S, z) as given.
exchange_probe probe_for(expanse::context& ctx, const expanse_tensor* seen_from, const std::vector<int64_t>& seen_shape,
                         const nan_tensor& to_S, const nan_tensor& to_z, const expanse_tensor& S, const expanse_tensor& z) {
  return {ctx.get(), seen_from, &to_S.view, &to_z.view, S.data, z.data, to_S.bytes, to_z.bytes,
          h::host_tensor::zeros(expanse_dtype(seen_from->dtype), seen_shape)};
}

}  // namespace

TEST_CASE("power_attention_backward_exchange: dinitial without dfinal at the callback, then the whole backward") {
  for (const expanse_backend_info& info : expanse::backends()) {
    if (!info.available) continue;
    expanse::context ctx(info.name);
    const bool oracle = std::string(info.name) == "reference";
    h::op_config cfg = split_cases()[0].cfg;  // normalized, gated with resets, initial and final states
    cfg.dtype = oracle ? EXPANSE_F64 : EXPANSE_F32;
    const uint64_t seed = test_seed() + 200;
    INFO("backend " << info.name << ", seed " << seed);
    const h::tensor_map in = h::make_inputs(cfg, seed);
    h::tensor_map without = in;  // no final-state cotangent
    without.erase("dfinal_S");
    without.erase("dfinal_z");
    h::op_config cfg_without = cfg;
    cfg_without.final_state = false;
    const h::tensor_map whole = h::run_on(ctx, cfg, in, oracle), first = h::run_on(ctx, cfg_without, without, oracle);

    h::prepared_run run(ctx, cfg, in, oracle);
    exchange_probe probe{};
    run.call_with_args([&](void* args) {
      auto a = *static_cast<const expanse_power_attention_backward_args*>(args);
      const nan_tensor dS(ctx, *a.dfinal_S), dz(ctx, *a.dfinal_z);  // dfinal only the callback fills
      probe = probe_for(ctx, a.dinitial_S, first.at("dinitial_S").shape, dS, dz, *a.dfinal_S, *a.dfinal_z);
      a.dfinal_S = &dS.view, a.dfinal_z = &dz.view;
      expanse::check(expanse_power_attention_backward_exchange(ctx.get(), &a, &probe_exchange, &probe));
      expanse::check(expanse_synchronize(ctx.get()));
    });
    CHECK(probe.calls == 1);
    check_equal({{"dinitial_S", probe.seen}}, {{"dinitial_S", first.at("dinitial_S")}}, h::tolerance_for(cfg.dtype));
    check_equal(run.download(), whole, h::tolerance_for(cfg.dtype));
  }
}

TEST_CASE("power_attention_exchange: the final state from zero at the callback, then o from the initial state") {
  for (const expanse_backend_info& info : expanse::backends()) {
    if (!info.available) continue;
    expanse::context ctx(info.name);
    const bool oracle = std::string(info.name) == "reference";
    h::op_config cfg = forward_of(split_cases()[0].cfg);  // normalized, gated with resets, initial and final states
    cfg.dtype = oracle ? EXPANSE_F64 : EXPANSE_F32;
    const uint64_t seed = test_seed() + 300;
    INFO("backend " << info.name << ", seed " << seed);
    const h::tensor_map in = forward_inputs(h::make_inputs(cfg, seed));
    h::tensor_map from_zero = in;  // the piece without its initial state
    from_zero.erase("initial_S");
    from_zero.erase("initial_z");
    h::op_config cfg_zero = cfg;
    cfg_zero.initial_state = false;
    const h::tensor_map whole = h::run_on(ctx, cfg, in, oracle), zero = h::run_on(ctx, cfg_zero, from_zero, oracle);

    h::prepared_run run(ctx, cfg, in, oracle);
    exchange_probe probe{};
    run.call_with_args([&](void* args) {
      auto a = *static_cast<const expanse_power_attention_args*>(args);
      const nan_tensor S0(ctx, *a.initial_S), z0(ctx, *a.initial_z);  // the initial state only the callback fills
      probe = probe_for(ctx, a.final_S, zero.at("final_S").shape, S0, z0, *a.initial_S, *a.initial_z);
      a.initial_S = &S0.view, a.initial_z = &z0.view;
      expanse::check(expanse_power_attention_exchange(ctx.get(), &a, &probe_exchange, &probe));
      expanse::check(expanse_synchronize(ctx.get()));
    });
    CHECK(probe.calls == 1);
    check_equal({{"final_S", probe.seen}}, {{"final_S", zero.at("final_S")}}, h::tolerance_for(cfg.dtype));
    const h::tensor_map out = run.download();
    check_equal({{"o", out.at("o")}}, {{"o", whole.at("o")}}, h::tolerance_for(cfg.dtype));
    check_equal({{"final_S", out.at("final_S")}}, {{"final_S", zero.at("final_S")}}, h::tolerance_for(cfg.dtype));
  }
}

TEST_CASE("the exchanging calls refuse a missing callback or state by name") {
  expanse::context ctx("reference");
  h::op_config cfg = split_cases()[0].cfg;
  cfg.dtype = EXPANSE_F64;
  const h::tensor_map in = h::make_inputs(cfg, test_seed());
  auto refused = [](expanse_status st, const char* text) {
    CHECK(st == EXPANSE_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(expanse_last_error()).find(text) != std::string::npos);
  };
  h::prepared_run backward(ctx, cfg, in, true);
  backward.call_with_args([&](void* args) {
    auto a = *static_cast<const expanse_power_attention_backward_args*>(args);
    refused(expanse_power_attention_backward_exchange(ctx.get(), &a, nullptr, nullptr), "argument 'exchange' is NULL");
    a.dfinal_z = nullptr;
    refused(expanse_power_attention_backward_exchange(ctx.get(), &a, &probe_exchange, nullptr),
            "argument 'dfinal_z' is required when normalize=1");
    a.dinitial_S = nullptr;
    refused(expanse_power_attention_backward_exchange(ctx.get(), &a, &probe_exchange, nullptr),
            "argument 'dinitial_S' is required");
  });
  h::prepared_run forward(ctx, forward_of(cfg), forward_inputs(in), true);
  forward.call_with_args([&](void* args) {
    auto a = *static_cast<const expanse_power_attention_args*>(args);
    refused(expanse_power_attention_exchange(ctx.get(), &a, nullptr, nullptr), "argument 'exchange' is NULL");
    a.initial_z = nullptr;
    refused(expanse_power_attention_exchange(ctx.get(), &a, &probe_exchange, nullptr),
            "argument 'initial_z' is required when normalize=1");
    a.final_S = nullptr;
    refused(expanse_power_attention_exchange(ctx.get(), &a, &probe_exchange, nullptr), "argument 'final_S' is required");
  });
}

TEST_CASE("the C API's context parallelism refuses z states of an unnormalized call by name") {
  expanse::context ctx("reference");
  h::op_config cfg = split_cases()[0].cfg;  // normalized: its z tensors stand in for an unnormalized call's
  cfg.dtype = EXPANSE_F64;
  const h::tensor_map in = h::make_inputs(cfg, test_seed());
  const expanse_context_parallel one{0, 1, [](const void*, void*, size_t, void*, void*) { return int32_t(0); }, nullptr};
  h::prepared_run backward(ctx, cfg, in, true);
  backward.call_with_args([&](void* args) {
    auto a = *static_cast<const expanse_power_attention_backward_args*>(args);
    a.normalize = 0;
    CHECK(expanse_context_parallel_power_attention_backward(ctx.get(), &one, &a) == EXPANSE_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(expanse_last_error()).find("argument 'initial_z' needs normalize=1") != std::string::npos);
    a.initial_z = a.dinitial_z = nullptr;
    CHECK(expanse_context_parallel_power_attention_backward(ctx.get(), &one, &a) == EXPANSE_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(expanse_last_error()).find("argument 'dfinal_z' needs normalize=1") != std::string::npos);
  });
  h::prepared_run forward(ctx, forward_of(cfg), forward_inputs(in), true);
  forward.call_with_args([&](void* args) {
    auto a = *static_cast<const expanse_power_attention_args*>(args);
    a.normalize = 0, a.initial_z = nullptr;
    CHECK(expanse_context_parallel_power_attention(ctx.get(), &one, &a) == EXPANSE_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(expanse_last_error()).find("argument 'final_z' needs normalize=1") != std::string::npos);
  });
}
