// The shared case table: one description of each operation's problem, random inputs for it, a run
// on any backend, and the comparison with an oracle. `expanse check`, `expanse bench` and the test
// suite all use it, so a case is written once and runs on every backend (ggml's test-backend-ops).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "expanse/expanse.hpp"

namespace expanse::harness {

// One problem of one operation. Its tensors carry the names, shape rules and dtype rules of the
// library's tables (expanse_op_tensor_args): input shapes follow from the config's sizes (sympow_expand
// reads t as its row count; discumsum has d and e as its two trailing dims), output shapes come from
// the library (expanse_output_shape). Which optional tensors a config has: log_g with `gated`,
// initial states (and discumsum's Y_init) with `initial_state`, final states with `final_state`,
// query_state's y, l, rowmax with `intra`, a normalizer (z, *_z) only with `normalize`.
struct op_config {
  expanse_op_kind op = expanse::ops::power_attention;
  int64_t b = 1, t = 64, hq = 2, h = 2, d = 16, e = 16;
  int32_t p = 2;
  int64_t c = 0;  // chunk size; 0 = quadratic / whole sequence where allowed; power_attention also
                  // EXPANSE_CHUNK_AUTO (the library's choice)
  expanse_layout layout{EXPANSE_LAYOUT_SYMPOW, 0};
  expanse_dtype dtype = EXPANSE_F32;  // of the token inputs
  bool gated = true;
  bool resets = false;         // with gating: some gates exactly 0 (log_g = -inf), resets (docs/spec.md)
  bool growing = false;        // with gating: some gates above 1 too (log_g > 0), which docs/spec.md allows
  bool normalize = true;
  bool initial_state = false;  // power_attention S0/z0, discumsum Y_init
  bool final_state = false;    // power_attention S/z outputs
  bool intra = false;          // query_state with the chunk_attention result
  double scale = 0.0;          // 0: the default 1/sqrt(d)

  std::string label() const;  // a one-line description usable as CLI flags
};

// ceil(t / c) for c >= 1, without the overflow of (t + c - 1) / c at chunk sizes near INT64_MAX.
inline int64_t chunk_count(int64_t t, int64_t c) { return t / c + (t % c != 0); }

// A host tensor in any dtype, contiguous.
struct host_tensor {
  expanse_dtype dtype = EXPANSE_F64;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;

  int64_t numel() const;
  double get(int64_t i) const;
  void set(int64_t i, double value);  // rounds to nearest even for f16/bf16/f32
  std::vector<double> to_double() const;
  static host_tensor zeros(expanse_dtype dtype, std::vector<int64_t> shape);
};

double f16_to_double(uint16_t h);
uint16_t double_to_f16(double x);
double bf16_to_double(uint16_t h);
uint16_t double_to_bf16(double x);

// src's values in another dtype (rounded to nearest even).
host_tensor cast(const host_tensor& src, expanse_dtype dtype);

using tensor_map = std::map<std::string, host_tensor>;

// The dtype and shape of one tensor of a case, known before any memory is allocated.
struct tensor_spec {
  expanse_dtype dtype;
  std::vector<int64_t> shape;
};
using spec_map = std::map<std::string, tensor_spec>;
// The inputs make_inputs draws and the outputs make_outputs allocates, as specs.
spec_map input_specs(const op_config& cfg);
spec_map output_specs(const op_config& cfg, bool oracle);

// Fresh random inputs for a config (normal q/k/v, log_g = logsigmoid of noise, states as produced
// by a random sequence), rounded to cfg.dtype. `consistent` = false replaces query_state's states and
// intra-chunk inputs by plain noise (for timing at sizes where the naive oracle would be too slow).
// A backward's o is its forward's output on the drawn inputs, from `forward` where given (a backend's
// run: bench at lengths where the naive oracle would take minutes), else from the naive oracle.
using forward_runner = std::function<tensor_map(const op_config& forward, const tensor_map& inputs)>;
tensor_map make_inputs(const op_config& cfg, uint64_t seed, bool consistent = true, const forward_runner& forward = {});
// Output names and shapes of a config, with the dtypes a backend writes: `oracle` asks for f64
// everywhere (the reference as oracle), otherwise the native dtypes (token outputs in cfg.dtype,
// states and y/l/rowmax in f32).
tensor_map make_outputs(const op_config& cfg, bool oracle);

// cfg's inputs and outputs on ctx's device, ready to run any number of times (for timing).
class prepared_run {
 public:
  // Copies inputs to the device and allocates outputs poisoned with NaN (power_attention_step's
  // S and z start as the input state, since the step updates them in place).
  prepared_run(expanse::context& ctx, const op_config& cfg, const tensor_map& inputs, bool oracle);
  // Enqueues the op on ctx's stream (throws expanse::error). `adjust`, when given, receives the op's
  // *_args struct just before the call (tests break one argument at a time).
  void execute(const std::function<void(void* args)>& adjust = {});
  // Fills the op's *_args struct with the tensors and parameters and hands it to `call` instead of
  // running the op (an entry point that takes the same struct, e.g. context parallelism's).
  void call_with_args(const std::function<void(void* args)>& call);
  tensor_map download() const; // copies the outputs back and synchronizes

 private:
  friend void validate_case(expanse::context& ctx, const op_config& cfg);
  struct views_only {};
  // Views of cfg's tensors at distinct addresses that hold nothing (for validate_case).
  prepared_run(expanse::context& ctx, const op_config& cfg, views_only);

  const expanse_tensor* in(const char* name) const;
  expanse_tensor* out(const char* name);

  expanse::context& ctx_;
  op_config cfg_;
  tensor_map outputs_;  // host shapes and dtypes of the outputs
  std::map<std::string, expanse::device_buffer> buffers_;
  std::map<std::string, expanse_tensor> views_;
};

// The library's verdict on cfg for ctx (validation, then the backend's support) before any input is
// drawn or memory touched: throws expanse::error as running cfg would (INVALID_ARGUMENT,
// UNSUPPORTED). check_case and bench call it first, so a bad case fails at once even where drawing
// its inputs would take minutes (query_state's consistent states at p = 7, d = 32).
void validate_case(expanse::context& ctx, const op_config& cfg);

// Runs cfg once on ctx and returns the outputs (host). Throws expanse::error on failure
// (EXPANSE_ERROR_UNSUPPORTED included).
tensor_map run_on(expanse::context& ctx, const op_config& cfg, const tensor_map& inputs, bool oracle);

struct comparison {
  std::string output;
  double rel_error = 0;  // ||out - ref||_F / ||ref||_F (absolute when ||ref|| == 0)
  double tolerance = 0;
  int64_t nonfinite = 0;  // NaN/Inf where the reference is finite (poisoned = unwritten)
  bool pass = false;
};

// docs/spec.md tolerance per dtype: f64 1e-12 (oracle), f32 1e-5, f16 2e-3, bf16 5e-3.
double tolerance_for(expanse_dtype dtype);
std::vector<comparison> compare(const tensor_map& out, const tensor_map& ref, double tolerance);

struct check_result {
  op_config cfg;
  uint64_t seed = 0;
  std::string backend;
  std::string oracle;  // "reference" or "naive f64" (for the reference backend itself)
  std::vector<comparison> outputs;
  std::string skipped;  // reason when the backend declined the problem
  std::string error;    // error text when the run failed
  bool pass() const;
  std::string repro() const;  // the `expanse check` command that reruns this case
};

// What a case ran on, for those who study a result: its inputs, the backend's outputs, the oracle's.
using case_keeper = std::function<void(const tensor_map& inputs, const tensor_map& out, const tensor_map& ref)>;

// Runs cfg on backend_ctx and compares with the oracle: the reference backend for any other backend,
// or the independent naive f64 implementation (naive_oracle.hpp) when backend_ctx is the reference.
// `keep`, when given, receives the tensors before they are compared.
check_result check_case(expanse::context& backend_ctx, const op_config& cfg, uint64_t seed,
                        const case_keeper& keep = {});

// The table every backend runs: each op over awkward sizes, dtypes, p, layouts and options.
std::vector<op_config> standard_cases();
// A few representative cases per op (for `expanse check` without --all).
std::vector<op_config> quick_cases(expanse_op_kind op);

}  // namespace expanse::harness
