// Properties of the reference in f64 (docs/spec.md): the chunked form equals the quadratic form for any
// chunk size, grouped heads equal explicitly repeated heads, carrying the state across a split equals
// one call, repeated decoding steps equal the full sequence, and all of it agrees with the
// token-by-token recurrence (the naive oracle) to 1e-12.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "cases.hpp"
#include "naive_oracle.hpp"
#include "test_seed.hpp"

namespace h = expanse::harness;

namespace {

// max |a - b| / max |b| over all elements.
double max_rel_error(const h::host_tensor& a, const h::host_tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.get(i) - b.get(i)));
    scale = std::max(scale, std::fabs(b.get(i)));
    if (std::isnan(a.get(i))) return INFINITY;
  }
  return scale > 0 ? diff / scale : diff;
}

// Tokens [b, t0:t1, ...] of a [b,t,...] tensor.
h::host_tensor slice_tokens(const h::host_tensor& x, int64_t t0, int64_t t1) {
  std::vector<int64_t> shape = x.shape;
  const int64_t t = shape[1];
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  shape[1] = t1 - t0;
  h::host_tensor out = h::host_tensor::zeros(x.dtype, shape);
  for (int64_t bi = 0; bi < shape[0]; ++bi)
    for (int64_t ti = t0; ti < t1; ++ti)
      for (int64_t i = 0; i < inner; ++i)
        out.set((bi * (t1 - t0) + (ti - t0)) * inner + i, x.get((bi * t + ti) * inner + i));
  return out;
}

// Repeats each head r times along dimension 2 of a [b,t,h,...] tensor.
h::host_tensor repeat_heads(const h::host_tensor& x, int64_t r) {
  std::vector<int64_t> shape = x.shape;
  const int64_t heads = shape[2];
  int64_t inner = 1;
  for (size_t i = 3; i < shape.size(); ++i) inner *= shape[i];
  shape[2] = heads * r;
  h::host_tensor out = h::host_tensor::zeros(x.dtype, shape);
  for (int64_t bt = 0; bt < shape[0] * shape[1]; ++bt)
    for (int64_t hi = 0; hi < heads * r; ++hi)
      for (int64_t i = 0; i < inner; ++i)
        out.set((bt * heads * r + hi) * inner + i, x.get((bt * heads + hi / r) * inner + i));
  return out;
}

h::op_config f64_attention(int64_t t, int64_t c, int32_t p) {
  h::op_config cfg;
  cfg.op = EXPANSE_OP_POWER_ATTENTION;
  cfg.b = 2; cfg.t = t; cfg.hq = 4; cfg.h = 2; cfg.d = 8; cfg.e = 5; cfg.p = p; cfg.c = c;
  cfg.dtype = EXPANSE_F64;
  cfg.normalize = p % 2 == 0;
  cfg.layout = {EXPANSE_LAYOUT_TILED, 4};
  return cfg;
}

}  // namespace

TEST_CASE("chunked equals quadratic for every chunk size, and both equal the recurrence") {
  expanse::context ctx("reference");
  for (int32_t p = 1; p <= 4; ++p)
    for (bool gated : {true, false}) {
      h::op_config quad = f64_attention(75, 0, p);
      quad.gated = gated;
      quad.initial_state = true;
      quad.final_state = true;
      const h::tensor_map in = h::make_inputs(quad, test_seed() + p);
      const h::tensor_map ref = h::run_on(ctx, quad, in, true);
      const h::tensor_map recurrent = h::naive::run(quad, in);
      INFO("p=" << p << " gated=" << gated << " seed=" << test_seed() + p);
      for (const auto& [name, x] : ref) CHECK(max_rel_error(x, recurrent.at(name)) <= 1e-12);
      // 75 = t; 74 leaves a last chunk of 1; 200 > t; EXPANSE_CHUNK_AUTO lets the library choose
      for (int64_t c : {int64_t(1), int64_t(7), int64_t(16), int64_t(74), int64_t(75), int64_t(200), int64_t(EXPANSE_CHUNK_AUTO)}) {
        h::op_config chunked = quad;
        chunked.c = c;
        const h::tensor_map out = h::run_on(ctx, chunked, in, true);
        INFO("chunk size " << c);
        for (const auto& [name, x] : out) CHECK(max_rel_error(x, ref.at(name)) <= 1e-12);
      }
    }
}

TEST_CASE("the automatic chunk size is the documented rule") {
  CHECK(expanse_auto_chunk_size(1) == 0);
  CHECK(expanse_auto_chunk_size(4096) == 0);
  CHECK(expanse_auto_chunk_size(4097) == 1024);
  CHECK(expanse_auto_chunk_size(65536) == 1024);
}

TEST_CASE("t = 1 and odd p unnormalized") {
  expanse::context ctx("reference");
  for (int32_t p : {1, 3}) {
    h::op_config cfg = f64_attention(1, 16, p);
    const h::tensor_map in = h::make_inputs(cfg, test_seed());
    const h::tensor_map out = h::run_on(ctx, cfg, in, true);
    CHECK(max_rel_error(out.at("o"), h::naive::run(cfg, in).at("o")) <= 1e-12);
  }
}

TEST_CASE("grouped-query heads equal explicitly repeated kv heads") {
  expanse::context ctx("reference");
  for (int64_t c : {0, 16}) {
    h::op_config gqa = f64_attention(40, c, 2);
    const h::tensor_map in = h::make_inputs(gqa, test_seed());
    h::op_config full = gqa;
    full.h = gqa.hq;
    h::tensor_map repeated = in;
    const int64_t r = gqa.hq / gqa.h;
    for (const char* name : {"k", "v", "log_g"}) repeated[name] = repeat_heads(in.at(name), r);
    INFO("chunk " << c << " seed " << test_seed());
    CHECK(max_rel_error(h::run_on(ctx, gqa, in, true).at("o"), h::run_on(ctx, full, repeated, true).at("o")) <= 1e-12);
  }
}

TEST_CASE("a sequence split in two with the state carried equals one call") {
  expanse::context ctx("reference");
  for (int32_t p : {2, 3}) {
    h::op_config whole = f64_attention(50, 16, p);
    whole.final_state = true;
    const h::tensor_map in = h::make_inputs(whole, test_seed());
    const h::tensor_map ref = h::run_on(ctx, whole, in, true);

    h::op_config first = whole, second = whole;
    first.t = 21;  // not a multiple of the chunk size
    second.t = whole.t - first.t;
    second.initial_state = true;
    h::tensor_map in1, in2;
    for (const char* name : {"q", "k", "v", "log_g"}) {
      in1[name] = slice_tokens(in.at(name), 0, first.t);
      in2[name] = slice_tokens(in.at(name), first.t, whole.t);
    }
    const h::tensor_map out1 = h::run_on(ctx, first, in1, true);
    in2["initial_S"] = out1.at("final_S");
    if (whole.normalize) in2["initial_z"] = out1.at("final_z");
    const h::tensor_map out2 = h::run_on(ctx, second, in2, true);
    INFO("p=" << p << " seed " << test_seed());
    CHECK(max_rel_error(out1.at("o"), slice_tokens(ref.at("o"), 0, first.t)) <= 1e-12);
    CHECK(max_rel_error(out2.at("o"), slice_tokens(ref.at("o"), first.t, whole.t)) <= 1e-12);
    CHECK(max_rel_error(out2.at("final_S"), ref.at("final_S")) <= 1e-12);
    if (whole.normalize) CHECK(max_rel_error(out2.at("final_z"), ref.at("final_z")) <= 1e-12);
  }
}

TEST_CASE("repeated power_attention_step equals the full sequence") {
  expanse::context ctx("reference");
  for (int32_t p : {1, 2, 4}) {
    h::op_config whole = f64_attention(12, 5, p);
    whole.final_state = true;
    whole.initial_state = true;
    const h::tensor_map in = h::make_inputs(whole, test_seed());
    const h::tensor_map ref = h::run_on(ctx, whole, in, true);

    h::op_config step = whole;
    step.op = EXPANSE_OP_POWER_ATTENTION_STEP;
    step.t = 1;
    h::host_tensor S = in.at("initial_S");
    h::host_tensor z = whole.normalize ? in.at("initial_z") : h::host_tensor();
    for (int64_t ti = 0; ti < whole.t; ++ti) {
      h::tensor_map sin;
      for (const char* name : {"q", "k", "v", "log_g"}) {
        h::host_tensor token = slice_tokens(in.at(name), ti, ti + 1);
        token.shape.erase(token.shape.begin() + 1);  // [b,1,...] -> [b,...]
        sin[name] = token;
      }
      sin["S"] = S;
      if (whole.normalize) sin["z"] = z;
      const h::tensor_map out = h::run_on(ctx, step, sin, true);
      h::host_tensor o = out.at("o");
      o.shape.insert(o.shape.begin() + 1, 1);
      INFO("p=" << p << " token " << ti << " seed " << test_seed());
      CHECK(max_rel_error(o, slice_tokens(ref.at("o"), ti, ti + 1)) <= 1e-12);
      S = out.at("S");
      if (whole.normalize) z = out.at("z");
    }
    CHECK(max_rel_error(S, ref.at("final_S")) <= 1e-12);
  }
}
