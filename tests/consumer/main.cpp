// Links expanse::expanse from the installed package, selects the reference backend by name and runs
// power_attention; exits non-zero unless the output is finite and the error path works.
#include <cmath>
#include <cstdio>
#include <vector>

#include <expanse/expanse.hpp>

int main() {
  const int64_t b = 1, t = 33, h = 2, d = 8, e = 4;
  std::vector<float> q(b * t * h * d), k(q.size()), v(b * t * h * e), o(v.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * i), k[i] = std::cos(0.11f * i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(1.3f * i);
  expanse::context ctx("reference");
  expanse_tensor tq = expanse::tensor(q.data(), {b, t, h, d}), tk = expanse::tensor(k.data(), {b, t, h, d});
  expanse_tensor tv = expanse::tensor(v.data(), {b, t, h, e}), to = expanse::tensor(o.data(), {b, t, h, e});
  auto a = expanse::power_attention_args();
  a.q = &tq; a.k = &tk; a.v = &tv; a.o = &to; a.p = 2; a.chunk_size = 16;
  ctx.power_attention(a);
  for (float x : o)
    if (!std::isfinite(x)) return 1;
  try {
    a.p = 3;  // normalized odd p is rejected
    ctx.power_attention(a);
    return 1;
  } catch (const expanse::error& err) {
    std::printf("expected error: %s\n", err.what());
  }
  std::printf("consumer ok: o[0] = %f (backend %s, expanse %s)\n", o[0], ctx.backend().c_str(), expanse_version());
  return 0;
}
