// docs/spec.md "Bad input": every rejected input returns EXPANSE_ERROR_INVALID_ARGUMENT (or the status
// named) with a message naming the argument, writes nothing, and never crashes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "expanse/expanse.hpp"

namespace {

// A valid power_attention problem on the reference backend, to be broken one field at a time.
struct attention_problem {
  int64_t b = 1, t = 10, hq = 4, h = 2, d = 8, e = 3;
  std::vector<float> q, k, v, g, o;
  expanse_tensor tq, tk, tv, tg, to;
  expanse_power_attention_args a;

  attention_problem() {
    q.assign(b * t * hq * d, 0.5f);
    k.assign(b * t * h * d, 0.25f);
    v.assign(b * t * h * e, 1.0f);
    g.assign(b * t * h, -0.1f);
    o.assign(b * t * hq * e, NAN);
    tq = expanse::tensor(q.data(), {b, t, hq, d});
    tk = expanse::tensor(k.data(), {b, t, h, d});
    tv = expanse::tensor(v.data(), {b, t, h, e});
    tg = expanse::tensor(g.data(), {b, t, h});
    to = expanse::tensor(o.data(), {b, t, hq, e});
    a = expanse::power_attention_args();
    a.q = &tq; a.k = &tk; a.v = &tv; a.log_g = &tg; a.o = &to; a.chunk_size = 4;
  }
};

struct bad_case {
  const char* what;
  std::function<void(attention_problem&)> mutate;
  const char* must_mention;
  expanse_status status = EXPANSE_ERROR_INVALID_ARGUMENT;
};

}  // namespace

TEST_CASE("the valid problem runs") {
  expanse_context* ctx = nullptr;
  REQUIRE(expanse_context_create("reference", 0, &ctx) == EXPANSE_OK);
  attention_problem pr;
  CHECK(expanse_power_attention(ctx, &pr.a) == EXPANSE_OK);
  for (float x : pr.o) CHECK(std::isfinite(x));
  expanse_context_destroy(ctx);
}

TEST_CASE("power_attention rejects bad input, names the argument and writes nothing") {
  static float misaligned_storage[64];
  const std::vector<bad_case> cases = {
      {"q of rank 3", [](attention_problem& p) { p.tq.ndim = 3; }, "'q'"},
      {"k with another d", [](attention_problem& p) { p.tk.shape[3] = 4; }, "'k'"},
      {"v with another t", [](attention_problem& p) { p.tv.shape[1] = 9; }, "'v'"},
      {"v with another h", [](attention_problem& p) { p.tv.shape[2] = 1; }, "'v'"},
      {"hq % h != 0", [](attention_problem& p) { p.tk.shape[2] = 3; p.tv.shape[2] = 3; p.tg.shape[2] = 3; }, "hq % h"},
      {"k dtype differs from q", [](attention_problem& p) { p.tk.dtype = EXPANSE_F64; }, "'k'"},
      {"unknown dtype code", [](attention_problem& p) { p.tq.dtype = 17; }, "'q'"},
      {"log_g in bf16", [](attention_problem& p) { p.tg.dtype = EXPANSE_BF16; }, "'log_g'"},
      {"log_g of wrong shape", [](attention_problem& p) { p.tg.shape[1] = 11; }, "'log_g'"},
      {"o of wrong shape", [](attention_problem& p) { p.to.shape[3] = 4; }, "'o'"},
      {"o of another dtype", [](attention_problem& p) { p.to.dtype = EXPANSE_F16; }, "'o'"},
      {"o missing", [](attention_problem& p) { p.a.o = nullptr; }, "'o'"},
      {"q missing", [](attention_problem& p) { p.a.q = nullptr; }, "'q'"},
      {"null data with elements", [](attention_problem& p) { p.tv.data = nullptr; }, "'v'"},
      {"p = 0", [](attention_problem& p) { p.a.p = 0; }, "p must be"},
      {"p = 5", [](attention_problem& p) { p.a.p = 5; }, "p must be"},
      {"normalize with odd p", [](attention_problem& p) { p.a.p = 3; }, "even p"},
      {"normalize = 2", [](attention_problem& p) { p.a.normalize = 2; }, "'normalize'"},
      {"negative chunk size", [](attention_problem& p) { p.a.chunk_size = -2; }, "chunk_size"},
      {"non-finite scale", [](attention_problem& p) { p.a.scale = NAN; }, "'scale'"},
      {"d % d_tile != 0", [](attention_problem& p) { p.a.layout = {EXPANSE_LAYOUT_TILED, 3}; }, "d_tile"},
      {"unknown layout", [](attention_problem& p) { p.a.layout = {7, 0}; }, "'layout'"},
      {"negative dimension", [](attention_problem& p) { p.tq.shape[0] = -1; }, "'q'"},
      {"negative stride", [](attention_problem& p) { p.tq.strides[1] = -5; }, "'q'"},
      {"shape overflow", [](attention_problem& p) { p.tq.shape[1] = int64_t(1) << 40; p.tq.shape[0] = int64_t(1) << 40; }, "'q'"},
      {"output overlapping itself", [](attention_problem& p) { p.to.strides[1] = 0; }, "overlaps"},
      {"misaligned data", [](attention_problem& p) {
         p.tq.data = reinterpret_cast<char*>(misaligned_storage) + 1;
         p.tq.shape[1] = 1; p.tk.shape[1] = 1; p.tv.shape[1] = 1; p.tg.shape[1] = 1; p.to.shape[1] = 1;
       }, "aligned"},
      {"tensor on a GPU", [](attention_problem& p) { p.tk.device_type = EXPANSE_DEVICE_CUDA; }, "'k'"},
      {"rank above the maximum", [](attention_problem& p) { p.tq.ndim = 9; }, "'q'"},
      {"initial_z without initial_S", [](attention_problem& p) { p.a.initial_z = &p.tg; }, "'initial_z'"},
      {"initial state of wrong shape", [](attention_problem& p) { p.a.initial_S = &p.tq; p.a.initial_z = &p.tg; }, "'initial_S'"},
  };
  expanse_context* ctx = nullptr;
  REQUIRE(expanse_context_create("reference", 0, &ctx) == EXPANSE_OK);
  for (const bad_case& c : cases) {
    attention_problem pr;
    c.mutate(pr);
    const std::vector<float> q_before = pr.q;
    const expanse_status st = expanse_power_attention(ctx, &pr.a);
    const std::string message = expanse_last_error();
    const std::string label = std::string(c.what) + " -> " + message;
    INFO(label);
    CHECK(st == c.status);
    CHECK(message.find(c.must_mention) != std::string::npos);
    CHECK(message.find("power_attention") != std::string::npos);
    CHECK(pr.q == q_before);
    for (float x : pr.o) CHECK(std::isnan(x));  // nothing written
  }
  expanse_context_destroy(ctx);
}

TEST_CASE("the other operations validate their arguments too") {
  expanse::context ctx("reference");
  std::vector<float> x(40, 1.0f), out(200, NAN);
  expanse_tensor tx = expanse::tensor(x.data(), {5, 8}), tout = expanse::tensor(out.data(), {5, 36});
  auto s = expanse::sympow_expand_args();
  s.x = &tx; s.out = &tout; s.p = 2;
  CHECK_NOTHROW(ctx.sympow_expand(s));
  s.p = 7;
  CHECK_THROWS_WITH_AS(ctx.sympow_expand(s), doctest::Contains("p must be in 1..6"), expanse::error);
  s.p = 2;
  tout.shape[1] = 35;
  CHECK_THROWS_WITH_AS(ctx.sympow_expand(s), doctest::Contains("'out'"), expanse::error);

  // update_state needs a chunk size >= 1 and states of the right shape.
  std::vector<float> k(2 * 9 * 1 * 4, 0.5f), v(2 * 9 * 1 * 3, 0.5f), S(2 * 3 * 1 * 10 * 3), z(2 * 3 * 1 * 10);
  expanse_tensor tk = expanse::tensor(k.data(), {2, 9, 1, 4}), tv = expanse::tensor(v.data(), {2, 9, 1, 3});
  expanse_tensor tS = expanse::tensor(S.data(), {2, 3, 1, 10, 3}), tz = expanse::tensor(z.data(), {2, 3, 1, 10});
  auto u = expanse::update_state_args();
  u.k = &tk; u.v = &tv; u.S = &tS; u.z = &tz; u.p = 2; u.chunk_size = 4;
  CHECK_NOTHROW(ctx.update_state(u));
  u.chunk_size = 0;
  CHECK_THROWS_WITH_AS(ctx.update_state(u), doctest::Contains("chunk_size"), expanse::error);
  u.chunk_size = 3;  // n = 3 chunks: fine; 2 would need n = 5
  CHECK_NOTHROW(ctx.update_state(u));
  u.chunk_size = 2;
  CHECK_THROWS_WITH_AS(ctx.update_state(u), doctest::Contains("'S'"), expanse::error);

  // discumsum: A must match X's [b,n,h].
  std::vector<float> X(2 * 3 * 1 * 5), A(2 * 3 * 1), Y(2 * 4 * 1 * 5);
  expanse_tensor tX = expanse::tensor(X.data(), {2, 3, 1, 5}), tA = expanse::tensor(A.data(), {2, 3, 1});
  expanse_tensor tY = expanse::tensor(Y.data(), {2, 4, 1, 5});
  auto dcs = expanse::discumsum_args();
  dcs.X = &tX; dcs.A = &tA; dcs.Y = &tY;
  CHECK_NOTHROW(ctx.discumsum(dcs));
  tA.shape[1] = 4;
  CHECK_THROWS_WITH_AS(ctx.discumsum(dcs), doctest::Contains("'A'"), expanse::error);
  tA.shape[1] = 3;
  tY.shape[1] = 3;
  CHECK_THROWS_WITH_AS(ctx.discumsum(dcs), doctest::Contains("'Y'"), expanse::error);
}

TEST_CASE("contexts: unknown backend, bad device, null arguments") {
  expanse_context* ctx = nullptr;
  CHECK(expanse_context_create("no-such-backend", 0, &ctx) == EXPANSE_ERROR_BACKEND);
  CHECK(std::string(expanse_last_error()).find("no-such-backend") != std::string::npos);
  CHECK(ctx == nullptr);
  CHECK(expanse_context_create("reference", 3, &ctx) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("'device'") != std::string::npos);
  CHECK(expanse_context_create("reference", 0, nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(expanse_power_attention(nullptr, nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
  REQUIRE(expanse_context_create("reference", 0, &ctx) == EXPANSE_OK);
  CHECK(expanse_power_attention(ctx, nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(expanse_run(ctx, expanse_op_kind(42), nullptr) == EXPANSE_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(expanse_last_error()).find("unknown operation") != std::string::npos);
  expanse_context_destroy(ctx);
}
