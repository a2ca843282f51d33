// Gated power attention (p = 2) through the installed library: select a backend by name, describe
// the tensors, call power_attention. Build: see CMakeLists.txt beside this file.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <expanse/expanse.hpp>

int main(int argc, char** argv) {
  const int64_t b = 1, t = 1000, h = 4, d = 32, e = 32;
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  std::vector<float> q(b * t * h * d), k(q.size()), v(b * t * h * e), log_g(b * t * h), o(v.size());
  for (auto* x : {&q, &k, &v})
    for (float& xi : *x) xi = normal(rng);
  for (float& g : log_g) g = -std::log1p(std::exp(-normal(rng)));  // log of a decay in (0, 1)

  try {
    expanse::context ctx(argc > 1 ? argv[1] : "reference");  // a backend by name
    expanse_tensor tq = expanse::tensor(q.data(), {b, t, h, d});  // [b, t, heads, dim]
    expanse_tensor tk = expanse::tensor(k.data(), {b, t, h, d});
    expanse_tensor tv = expanse::tensor(v.data(), {b, t, h, e});
    expanse_tensor tg = expanse::tensor(log_g.data(), {b, t, h});
    expanse_tensor to = expanse::tensor(o.data(), {b, t, h, e});

    auto args = expanse::power_attention_args();  // defaults: p = 2, normalized, scale 1/sqrt(d)
    args.q = &tq; args.k = &tk; args.v = &tv; args.log_g = &tg; args.o = &to;
    args.chunk_size = 128;  // chunks of 128; default: the backend chooses; 0 = quadratic
    ctx.power_attention(args);
    std::printf("backend %s: o[0, 0, 0, :4] = %.4f %.4f %.4f %.4f\n", ctx.backend().c_str(), o[0], o[1], o[2], o[3]);

    args.p = 3;  // odd p cannot be normalized: a clear error, nothing written
    ctx.power_attention(args);
  } catch (const expanse::error& err) {
    std::printf("error (%s): %s\n", expanse_status_name(err.status()), err.what());
    return err.status() == EXPANSE_ERROR_INVALID_ARGUMENT ? 0 : 1;
  }
  return 1;
}
