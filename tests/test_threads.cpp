// Many threads on the C ABI at once, each with its own contexts (the documented use: contexts are
// not shared, everything else is thread-safe). Run as the ctest test `threads`, and by
// scripts/test.sh under ThreadSanitizer (library and test built with -fsanitize=thread).
//
//  1. First use: every thread waits at a start line, then all at once make the program's first
//     calls into the library (backend discovery, context creation, backend info).
//  2. Work: each thread repeatedly creates a context, runs power_attention (chunked, gated,
//     grouped-query) and power_attention_step on its own buffers, compares with results computed
//     once on the main thread, and makes an invalid call whose error text is unique to the thread;
//     after a barrier, at which every other thread has made its own failing call, its
//     expanse_last_error() must still be its own message (the text is per thread), and a
//     successful call must clear it.
//
// oneTBB (libtbb.so) is not built with ThreadSanitizer, which cannot see the synchronization
// inside it; under TSan the test therefore limits oneTBB to one thread (tbb::global_control), so
// each parallel loop runs on its calling thread. The library's own code still runs on all the test
// threads at once. In ordinary builds oneTBB keeps its default parallelism.
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <tbb/global_control.h>

#include "expanse/expanse.h"

#if defined(__SANITIZE_THREAD__)
#define EXPANSE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EXPANSE_TSAN 1
#endif
#endif

namespace {

constexpr int kThreads = 16;
constexpr int kIterations = 16;

std::atomic<int> failures{0};

void fail(int thread, const std::string& what) {
  std::fprintf(stderr, "thread %d: %s\n", thread, what.c_str());
  failures.fetch_add(1);
}

// A reusable barrier (C++17 has no std::barrier).
class barrier {
 public:
  explicit barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const long gen = generation_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  long generation_ = 0;
};

expanse_tensor make(void* data, std::vector<int64_t> shape, expanse_dtype dtype = EXPANSE_F32) {
  expanse_tensor t;
  if (expanse_tensor_make(&t, data, dtype, static_cast<int32_t>(shape.size()), shape.data(), EXPANSE_DEVICE_CPU, 0) !=
      EXPANSE_OK) {
    std::fprintf(stderr, "expanse_tensor_make: %s\n", expanse_last_error());
    std::abort();
  }
  return t;
}

// One problem: inputs shared read-only by every thread, outputs per run.
struct problem {
  static constexpr int64_t b = 2, t = 40, hq = 4, h = 2, d = 8, e = 6, chunk = 16;
  int64_t D = 0;
  std::vector<float> q, k, v, log_g;          // power_attention
  std::vector<float> q1, k1, v1, log_g1;      // one decoding step
  std::vector<float> S0, z0;                  // the state before the step

  problem() {
    uint64_t s = 12345;
    auto uniform = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<double>(s >> 11) / 9007199254740992.0);
    };
    auto fill = [&](std::vector<float>& x, size_t n, float lo, float hi) {
      x.resize(n);
      for (float& xi : x) xi = lo + (hi - lo) * uniform();
    };
    fill(q, b * t * hq * d, -1, 1);
    fill(k, b * t * h * d, -1, 1);
    fill(v, b * t * h * e, -1, 1);
    fill(log_g, b * t * h, -0.3f, -0.01f);
    fill(q1, b * hq * d, -1, 1);
    fill(k1, b * h * d, -1, 1);
    fill(v1, b * h * e, -1, 1);
    fill(log_g1, b * h, -0.3f, -0.01f);
    expanse_layout sympow{EXPANSE_LAYOUT_SYMPOW, 0};
    expanse_expanded_dim(2, d, sympow, &D);
    fill(S0, b * h * D * e, -0.1f, 0.1f);
    fill(z0, b * h * D, 1.0f, 2.0f);  // positive: a well-defined normalizer
  }
};

struct results {
  std::vector<float> o, final_S, final_z;  // power_attention
  std::vector<float> o1, S1, z1;           // the step
};

// Runs both operations on ctx; returns false (with the error) when a call fails.
bool compute(expanse_context* ctx, const problem& pr, results& r, std::string& error) {
  using P = problem;
  r.o.assign(P::b * P::t * P::hq * P::e, NAN);
  r.final_S.assign(P::b * P::h * pr.D * P::e, NAN);
  r.final_z.assign(P::b * P::h * pr.D, NAN);
  expanse_tensor tq = make(const_cast<float*>(pr.q.data()), {P::b, P::t, P::hq, P::d});
  expanse_tensor tk = make(const_cast<float*>(pr.k.data()), {P::b, P::t, P::h, P::d});
  expanse_tensor tv = make(const_cast<float*>(pr.v.data()), {P::b, P::t, P::h, P::e});
  expanse_tensor tg = make(const_cast<float*>(pr.log_g.data()), {P::b, P::t, P::h});
  expanse_tensor to = make(r.o.data(), {P::b, P::t, P::hq, P::e});
  expanse_tensor tS = make(r.final_S.data(), {P::b, P::h, pr.D, P::e});
  expanse_tensor tz = make(r.final_z.data(), {P::b, P::h, pr.D});
  expanse_power_attention_args a;
  expanse_power_attention_args_init(&a);
  a.q = &tq; a.k = &tk; a.v = &tv; a.log_g = &tg; a.o = &to; a.final_S = &tS; a.final_z = &tz;
  a.p = 2;
  a.chunk_size = P::chunk;
  if (expanse_power_attention(ctx, &a) != EXPANSE_OK) {
    error = std::string("power_attention: ") + expanse_last_error();
    return false;
  }

  r.S1 = pr.S0;  // updated in place
  r.z1 = pr.z0;
  r.o1.assign(P::b * P::hq * P::e, NAN);
  expanse_tensor sq = make(const_cast<float*>(pr.q1.data()), {P::b, P::hq, P::d});
  expanse_tensor sk = make(const_cast<float*>(pr.k1.data()), {P::b, P::h, P::d});
  expanse_tensor sv = make(const_cast<float*>(pr.v1.data()), {P::b, P::h, P::e});
  expanse_tensor sg = make(const_cast<float*>(pr.log_g1.data()), {P::b, P::h});
  expanse_tensor sS = make(r.S1.data(), {P::b, P::h, pr.D, P::e});
  expanse_tensor sz = make(r.z1.data(), {P::b, P::h, pr.D});
  expanse_tensor so = make(r.o1.data(), {P::b, P::hq, P::e});
  expanse_power_attention_step_args s;
  expanse_power_attention_step_args_init(&s);
  s.q = &sq; s.k = &sk; s.v = &sv; s.log_g = &sg; s.S = &sS; s.z = &sz; s.o = &so;
  s.p = 2;
  if (expanse_power_attention_step(ctx, &s) != EXPANSE_OK) {
    error = std::string("power_attention_step: ") + expanse_last_error();
    return false;
  }
  return true;
}

// Largest |x - y| / max(1, |y|) over two arrays (inf when sizes differ or a value is not finite).
double max_error(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return INFINITY;
    worst = std::fmax(worst, std::fabs(double(x[i]) - y[i]) / std::fmax(1.0, std::fabs(double(y[i]))));
  }
  return worst;
}

// An invalid call whose message is unique to `thread`: p out of range, "... got <100 + thread>".
std::string invalid_call(expanse_context* ctx, const problem& pr, int thread) {
  using P = problem;
  std::vector<float> out(P::d * 64);
  expanse_tensor x = make(const_cast<float*>(pr.q.data()), {P::d});
  expanse_tensor o = make(out.data(), {64});
  expanse_sympow_expand_args a;
  expanse_sympow_expand_args_init(&a);
  a.x = &x;
  a.out = &o;
  a.p = 100 + thread;
  const expanse_status st = expanse_sympow_expand(ctx, &a);
  if (st != EXPANSE_ERROR_INVALID_ARGUMENT) fail(thread, "an invalid p was not rejected");
  return "got " + std::to_string(100 + thread);
}

}  // namespace

int main() {
#ifdef EXPANSE_TSAN
  tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
#endif
  // 1. First use, from every thread at once.
  {
    barrier start(kThreads);
    std::vector<std::thread> threads;
    std::atomic<int> counts[kThreads];
    for (int i = 0; i < kThreads; ++i)
      threads.emplace_back([&, i] {
        start.wait();
        expanse_context* ctx = nullptr;
        if (i % 3 == 0) counts[i] = expanse_backend_count();
        const expanse_status st = expanse_context_create(i % 2 ? "reference" : nullptr, 0, &ctx);
        if (st != EXPANSE_OK) fail(i, std::string("expanse_context_create: ") + expanse_last_error());
        expanse_backend_info info;
        if (expanse_backend_get_info(0, &info) != EXPANSE_OK || std::strcmp(info.name, "reference") != 0)
          fail(i, "backend 0 is not the reference");
        if (i % 3 != 0) counts[i] = expanse_backend_count();
        expanse_context_destroy(ctx);
      });
    for (std::thread& t : threads) t.join();
    for (int i = 1; i < kThreads; ++i)
      if (counts[i] != counts[0] || counts[0] < 1) fail(i, "threads saw different backend counts");
  }

  // 2. Expected results, once.
  const problem pr;
  results expected;
  {
    expanse_context* ctx = nullptr;
    std::string error;
    if (expanse_context_create("reference", 0, &ctx) != EXPANSE_OK || !compute(ctx, pr, expected, error)) {
      std::fprintf(stderr, "the single-threaded run failed: %s %s\n", error.c_str(), expanse_last_error());
      return 1;
    }
    expanse_context_destroy(ctx);
  }

  // 3. Every thread at once.
  barrier sync(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      for (int it = 0; it < kIterations; ++it) {
        expanse_context* ctx = nullptr;
        if (expanse_context_create("reference", 0, &ctx) != EXPANSE_OK) {
          fail(i, std::string("expanse_context_create: ") + expanse_last_error());
          sync.wait();
          continue;
        }
        const std::string mine = invalid_call(ctx, pr, i);
        sync.wait();  // every thread has now made its own failing call
        const std::string text = expanse_last_error();
        if (text.find(mine) == std::string::npos)
          fail(i, "expanse_last_error() is not this thread's error: '" + text + "' (expected '" + mine + "')");
        results r;
        std::string error;
        if (!compute(ctx, pr, r, error)) {
          fail(i, error);
        } else {
          if (expanse_last_error()[0] != '\0') fail(i, "a successful call left expanse_last_error() set");
          const double err = std::fmax(std::fmax(max_error(r.o, expected.o), max_error(r.final_S, expected.final_S)),
                                       std::fmax(std::fmax(max_error(r.final_z, expected.final_z),
                                                           max_error(r.o1, expected.o1)),
                                                 std::fmax(max_error(r.S1, expected.S1), max_error(r.z1, expected.z1))));
          if (!(err <= 1e-6)) fail(i, "results differ from the single-threaded run by " + std::to_string(err));
        }
        expanse_context_destroy(ctx);
      }
    });
  for (std::thread& t : threads) t.join();

  if (failures.load() != 0) {
    std::fprintf(stderr, "%d failure(s)\n", failures.load());
    return 1;
  }
  std::printf("%d threads x %d iterations: results match, errors stay per thread\n", kThreads, kIterations);
  return 0;
}
