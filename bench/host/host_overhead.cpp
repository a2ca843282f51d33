// The host's cost of one call: how long expanse_power_attention_step (a decoding step, whose device
// work is microseconds) and expanse_supports (validation and the backend's choice alone) take per
// call on a backend, for a tiny problem, so that what the library adds around each kernel is seen
// apart from the kernel. On a GPU backend the calls are enqueued back to back and the stream is
// synchronized once at the end, so the figure is the host's time per call unless the device is slower.
//
//   expanse_host_overhead [backend] [calls]      (default: reference, 20000 calls)
// Prints one JSON line per measurement.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "expanse/expanse.hpp"

namespace {

double seconds_per_call(int calls, const std::function<void()>& body) {
  for (int i = 0; i < calls / 10 + 1; ++i) body();  // warm up: contexts, plugin, caches
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "reference";
  const int calls = argc > 2 ? std::atoi(argv[2]) : 20000;
  try {
    expanse::context ctx(backend);
    const int64_t b = 1, h = 1, d = 16, e = 16, D = expanse::expanded_dim(2, d, {EXPANSE_LAYOUT_SYMPOW, 0});
    const auto dev = ctx.device_type();
    auto buffer = [&](int64_t floats) {
      expanse::device_buffer buf = ctx.allocate(size_t(floats) * sizeof(float));
      std::vector<float> zeros(size_t(floats), 0.01f);
      ctx.copy(buf.data(), zeros.data(), zeros.size() * sizeof(float), EXPANSE_COPY_HOST_TO_DEVICE);
      return buf;
    };
    expanse::device_buffer q = buffer(b * h * d), k = buffer(b * h * d), v = buffer(b * h * e), g = buffer(b * h),
                           S = buffer(b * h * D * e), z = buffer(b * h * D), o = buffer(b * h * e);
    ctx.synchronize();
    expanse_tensor tq = expanse::tensor_of(q.data(), EXPANSE_F32, {b, h, d}, dev);
    expanse_tensor tk = expanse::tensor_of(k.data(), EXPANSE_F32, {b, h, d}, dev);
    expanse_tensor tv = expanse::tensor_of(v.data(), EXPANSE_F32, {b, h, e}, dev);
    expanse_tensor tg = expanse::tensor_of(g.data(), EXPANSE_F32, {b, h}, dev);
    expanse_tensor tS = expanse::tensor_of(S.data(), EXPANSE_F32, {b, h, D, e}, dev);
    expanse_tensor tz = expanse::tensor_of(z.data(), EXPANSE_F32, {b, h, D}, dev);
    expanse_tensor to = expanse::tensor_of(o.data(), EXPANSE_F32, {b, h, e}, dev);
    expanse_power_attention_step_args a;
    expanse_power_attention_step_args_init(&a);
    a.q = &tq, a.k = &tk, a.v = &tv, a.log_g = &tg, a.S = &tS, a.z = &tz, a.o = &to;
    const double step = seconds_per_call(calls, [&] { ctx.power_attention_step(a); });
    ctx.synchronize();
    const double supports = seconds_per_call(calls, [&] { ctx.supports(expanse::ops::power_attention_step, &a); });
    std::printf("{\"backend\": \"%s\", \"what\": \"power_attention_step b=1 h=1 d=16 e=16 p=2 f32\", "
                "\"us_per_call\": %.3f}\n", backend.c_str(), step * 1e6);
    std::printf("{\"backend\": \"%s\", \"what\": \"expanse_supports of that step\", \"us_per_call\": %.3f}\n",
                backend.c_str(), supports * 1e6);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse_host_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
