#include "case_options.hpp"

namespace expanse_cli {

CaseOptions::CaseOptions(CLI::App* cmd) {
  const std::string group = "Case options";
  auto add = [&](const char* name, auto& value, const char* type, const char* help) {
    options_.push_back(cmd->add_option(name, value, help)->type_name(type)->group(group));
    return options_.back();
  };
  const CLI::Validator dim = in_range(1, 1 << 16);
  add("--b", b_, "B", "batch")->check(in_range(0, 1 << 20));
  add("--t", t_, "T", "tokens (rows for sympow_expand)")->check(in_range(int64_t(0), int64_t(1) << 32));
  add("--hq", hq_, "HQ", "query heads (default: h)")->check(dim);
  add("--h", h_, "H", "key/value heads")->check(dim);
  add("--d", d_, "D", "key/query head dim")->check(dim);
  add("--e", e_, "E", "value head dim")->check(dim);
  add("--p", p_, "P", "degree of the power")->check(in_range(1, 16));
  add("--chunk_size,--chunk", chunk_, "C",
      "chunk size; power_attention(_backward): auto (default: the library picks\n"
      "the form and size by t and backend), 0 (the quadratic form) or C; other ops: C\n"
      "(chunk_attention 0: one chunk)");
  add("--layout", layout_, "L", "sympow, tensor or tiled:N");
  add("--dtype", dtype_, "T", "f32, bf16, f16 or f64");
  add("--gated", gated_, "0|1", "use log_g gating");
  add("--resets", resets_, "0|1", "with gating: some gates exactly 0 (log_g = -inf, a reset)");
  add("--growing", growing_, "0|1", "with gating: some gates above 1 (log_g > 0)");
  add("--normalize", normalize_, "0|1", "normalized form (even p only)");
  add("--initial-state", initial_state_, "0|1", "pass an initial state (discumsum: Y_init)");
  add("--final-state", final_state_, "0|1", "ask for the final state");
  add("--intra", intra_, "0|1", "query_state: add the intra-chunk result");
  add("--scale", scale_, "S", "query scale (0: 1/sqrt(d))")->check(finite_number());
}

bool CaseOptions::any() const {
  for (const CLI::Option* o : options_)
    if (o->count() > 0) return true;
  return false;
}

expanse::harness::op_config CaseOptions::apply(expanse_op_kind op, expanse::harness::op_config c) const {
  c.op = op;
  c.b = b_.value_or(c.b);
  c.t = t_.value_or(c.t);
  c.h = h_.value_or(c.h);
  c.hq = hq_.value_or(h_ ? c.h : c.hq);
  c.d = d_.value_or(c.d);
  c.e = e_.value_or(c.e);
  c.p = p_.value_or(c.p);
  bool auto_chunk = false;  // an op whose chunk size the library chooses by default (the table says)
  for (const expanse_param_info& param : expanse::params(op))
    auto_chunk = auto_chunk || (std::string(param.name) == "chunk_size" && param.default_value == EXPANSE_CHUNK_AUTO);
  if (chunk_) c.c = parse_chunk(*chunk_, "--chunk_size", /*allow_auto=*/auto_chunk);
  else if (auto_chunk) c.c = EXPANSE_CHUNK_AUTO;  // the library's default
  if (layout_) c.layout = parse_layout(*layout_, "--layout");
  if (dtype_) c.dtype = parse_dtype(*dtype_, "--dtype");
  c.gated = gated_.value_or(c.gated);
  c.resets = resets_.value_or(c.resets);
  c.growing = growing_.value_or(c.growing);
  c.normalize = normalize_.value_or(c.p % 2 == 0 ? c.normalize : false);
  c.initial_state = initial_state_.value_or(c.initial_state);
  c.final_state = final_state_.value_or(c.final_state);
  c.intra = intra_.value_or(c.intra);
  c.scale = scale_.value_or(c.scale);
  if ((op == expanse::ops::update_state || op == expanse::ops::query_state || op == expanse::ops::discumsum ||
       op == expanse::ops::sequence_state) &&
      c.c < 1)
    c.c = 128;
  return c;
}

}  // namespace expanse_cli
