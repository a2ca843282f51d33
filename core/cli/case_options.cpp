#include "case_options.hpp"

namespace expanse_cli {

std::vector<OptionSpec> case_option_specs() {
  return {
      {"b", true, "B", "batch"},
      {"t", true, "T", "tokens (rows for sympow_expand)"},
      {"hq", true, "HQ", "query heads (default: h)"},
      {"h", true, "H", "key/value heads"},
      {"d", true, "D", "key/query head dim"},
      {"e", true, "E", "value head dim"},
      {"p", true, "P", "degree of the power"},
      {"chunk", true, "C", "chunk size; power_attention: auto (default: the library picks the form\n"
                           "and size by t and backend), 0 (the quadratic form) or C; other ops: C\n"
                           "(chunk_attention 0: one chunk)"},
      {"layout", true, "L", "sympow, tensor or tiled:N"},
      {"dtype", true, "T", "f32, bf16, f16 or f64"},
      {"gated", true, "0|1", "use log_g gating"},
      {"resets", true, "0|1", "with gating: some gates exactly 0 (log_g = -inf, a reset)"},
      {"normalize", true, "0|1", "normalized form (even p only)"},
      {"initial-state", true, "0|1", "pass an initial state (discumsum: Y_init)"},
      {"final-state", true, "0|1", "ask for the final state"},
      {"intra", true, "0|1", "query_state: add the intra-chunk result"},
      {"scale", true, "S", "query scale (0: 1/sqrt(d))"},
  };
}

bool has_case_options(const ArgParser& args) {
  for (const OptionSpec& s : case_option_specs())
    if (args.has(s.name)) return true;
  return false;
}

expanse::harness::op_config case_from_options(const ArgParser& args, expanse_op_kind op,
                                              expanse::harness::op_config c) {
  c.op = op;
  c.b = args.get_int("b", c.b, 0, 1 << 20);
  c.t = args.get_int("t", c.t, 0, int64_t(1) << 32);
  c.h = args.get_int("h", c.h, 1, 1 << 16);
  c.hq = args.get_int("hq", args.has("h") ? c.h : c.hq, 1, 1 << 16);
  c.d = args.get_int("d", c.d, 1, 1 << 16);
  c.e = args.get_int("e", c.e, 1, 1 << 16);
  c.p = static_cast<int32_t>(args.get_int("p", c.p, 1, 16));
  const bool attention = op == expanse::ops::power_attention;
  if (args.has("chunk")) c.c = parse_chunk(args.get_string("chunk", ""), "--chunk", /*allow_auto=*/attention);
  else if (attention) c.c = EXPANSE_CHUNK_AUTO;  // the library's default
  if (args.has("layout")) c.layout = parse_layout(args.get_string("layout", ""), "--layout");
  if (args.has("dtype")) c.dtype = parse_dtype(args.get_string("dtype", ""), "--dtype");
  auto flag = [&](const char* name, bool def) {
    return args.has(name) ? parse_bool(args.get_string(name, ""), std::string("--") + name) : def;
  };
  c.gated = flag("gated", c.gated);
  c.resets = flag("resets", c.resets);
  c.normalize = flag("normalize", c.p % 2 == 0 ? c.normalize : false);
  c.initial_state = flag("initial-state", c.initial_state);
  c.final_state = flag("final-state", c.final_state);
  c.intra = flag("intra", c.intra);
  c.scale = args.get_double("scale", c.scale);
  if ((op == expanse::ops::update_state || op == expanse::ops::query_state || op == expanse::ops::discumsum) && c.c < 1)
    c.c = 128;
  return c;
}

}  // namespace expanse_cli
