// check_case(): one case of the shared case table (core/harness) on a backend against its oracle,
// exactly as `expanse check` runs it: the harness draws the random inputs, runs them on the backend
// and compares every output with the reference, or, for the reference itself, with the independent
// naive f64 implementation (core/harness/naive_oracle.cpp). expanse.check() is a thin wrapper.
#include <cstdint>
#include <string>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "cases.hpp"
#include "errors.hpp"
#include "tensors.hpp"

namespace expanse_py {
namespace {

namespace h = expanse::harness;

expanse_op_kind op_kind(const std::string& name) {
  for (int k = 0; k < EXPANSE_OP_COUNT; ++k)
    if (name == expanse_op_name(expanse_op_kind(k))) return expanse_op_kind(k);
  raise_status(EXPANSE_ERROR_INVALID_ARGUMENT, "check: unknown operation '" + name + "'");
}

// check_case() keeps only the text of an error. To report its status too (a bad setting is an
// invalid argument, a kernel failure an internal error), the sides of the case run again on the same
// seed: the same error comes back, this time with its status. EXPANSE_ERROR_INTERNAL when the rerun
// does not fail.
expanse_status status_of_failure(expanse::context& ctx, const h::op_config& cfg, uint64_t seed) {
  try {
    const h::tensor_map inputs = h::make_inputs(cfg, seed);
    const bool reference = ctx.backend() == "reference";
    if (!reference) {
      expanse::context ref("reference");
      h::run_on(ref, cfg, inputs, /*oracle=*/true);
    }
    h::run_on(ctx, cfg, inputs, /*oracle=*/reference);
  } catch (const expanse::error& e) {
    return e.status();
  } catch (const std::exception&) {
  }
  return EXPANSE_ERROR_INTERNAL;
}

nb::dict result_dict(const h::check_result& r, expanse_status failure) {
  nb::list outputs;
  for (const h::comparison& c : r.outputs) {
    nb::dict d;
    d["name"] = c.output;
    d["rel_error"] = c.rel_error;
    d["tolerance"] = c.tolerance;
    d["nonfinite"] = c.nonfinite;
    d["pass"] = c.pass;
    outputs.append(d);
  }
  nb::dict d;
  d["backend"] = r.backend;
  d["oracle"] = r.oracle;
  d["outputs"] = outputs;
  d["skipped"] = r.skipped;
  d["error"] = r.error;
  d["error_status"] = static_cast<int>(failure);
  d["pass"] = r.pass();
  d["repro"] = r.repro();
  return d;
}

// Every argument arrives checked by expanse/_check.py (types, and sizes within the bounds of the
// command's case options); the library validates the problem itself.
nb::dict check_case(const std::string& backend, int32_t device, const std::string& op, uint64_t seed,
                    const std::string& dtype, int64_t b, int64_t t, int64_t hq, int64_t h, int64_t d, int64_t e,
                    int32_t p, int64_t chunk_size, std::pair<int32_t, int32_t> layout, double scale, bool gated,
                    bool resets, bool normalize, bool initial_state, bool final_state, bool intra) {
  h::op_config cfg;
  cfg.op = op_kind(op);
  cfg.dtype = expanse_dtype_of(dtype);
  cfg.b = b; cfg.t = t; cfg.hq = hq; cfg.h = h; cfg.d = d; cfg.e = e;
  cfg.p = p; cfg.c = chunk_size; cfg.layout = expanse_layout{layout.first, layout.second}; cfg.scale = scale;
  cfg.gated = gated; cfg.resets = resets; cfg.normalize = normalize; cfg.initial_state = initial_state; cfg.final_state = final_state;
  cfg.intra = intra;

  h::check_result r;
  expanse_status failure = EXPANSE_OK;
  std::string context_error;
  {
    // The harness computes for as long as the case takes (the naive oracle in long double): let
    // other Python threads run. Nothing below touches Python objects.
    nb::gil_scoped_release release;
    try {
      expanse::context ctx(backend, device);
      r = h::check_case(ctx, cfg, seed);
      if (!r.error.empty()) failure = status_of_failure(ctx, cfg, seed);
    } catch (const expanse::error& err) {  // the backend is missing or unavailable
      failure = err.status();
      context_error = err.what();
    }
  }
  if (!context_error.empty()) raise_status(failure, context_error);
  return result_dict(r, failure);
}

}  // namespace

void bind_check(nb::module_& m) {
  m.def("check_case", &check_case, nb::arg("backend"), nb::arg("device"), nb::arg("op"), nb::arg("seed"),
        nb::arg("dtype"), nb::arg("b"), nb::arg("t"), nb::arg("hq"), nb::arg("h"), nb::arg("d"), nb::arg("e"),
        nb::arg("p"), nb::arg("chunk_size"), nb::arg("layout"), nb::arg("scale"), nb::arg("gated"),
        nb::arg("resets"), nb::arg("normalize"), nb::arg("initial_state"), nb::arg("final_state"), nb::arg("intra"),
        "Runs one case of the harness (expanse::harness::check_case, as `expanse check` does) and returns "
        "backend, oracle, outputs (name, rel_error, tolerance, nonfinite, pass), skipped, error and "
        "error_status (the expanse_status of a failed run, 0 without error), pass and repro. Raises when the "
        "backend cannot be opened.");
  m.def("check_tolerance", [](const std::string& dtype) { return h::tolerance_for(expanse_dtype_of(dtype)); },
        nb::arg("dtype"), "The tolerance of docs/spec.md for a dtype of the token inputs, as `expanse check` uses it.");
}

}  // namespace expanse_py
