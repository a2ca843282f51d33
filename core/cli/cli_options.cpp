// Errors, help layout, value parsers and progress shared by the `expanse` subcommands (cli_options.hpp).
#include "cli_options.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <sys/ioctl.h>
#include <unistd.h>

namespace expanse_cli {

void check_status(expanse_status st, const char* what) {
  if (st == EXPANSE_OK) return;
  const char* err = expanse_last_error();
  std::string text = (err != nullptr) ? err : "";
  if (text.empty()) {
    const char* name = expanse_status_name(st);
    text = std::string(what ? what : "a library call") + " failed: " +
           (name ? name : ("status " + std::to_string(static_cast<int>(st))));
  }
  throw LibraryError(st, text);
}

// ---------------------------------------------------------------- help

std::string HelpFormatter::make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const {
  if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
  std::string help = make_usage(app, name) + "\n" + make_description(app) + make_positionals(app) +
                     make_groups(app, mode) + make_subcommands(app, mode) + "\n" + make_footer(app);
  for (size_t at; (at = help.find("\n\n\n")) != std::string::npos;) help.erase(at, 1);  // one blank line
  return help;
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  std::ostringstream out;
  CLI::detail::format_help(out, sub->get_name(), sub->get_description(), get_column_width());
  return out.str();
}

std::string HelpFormatter::make_usage(const CLI::App* app, std::string name) const {
  const auto it = usage.find(app);
  if (it == usage.end()) return CLI::Formatter::make_usage(app, name);
  return "usage: " + name + (it->second.empty() ? "" : " " + it->second) + "\n";
}

void set_usage(CLI::App* cmd, std::string text) {
  auto* formatter = dynamic_cast<HelpFormatter*>(cmd->get_formatter().get());
  if (formatter == nullptr) throw std::logic_error("set_usage: " + cmd->get_name() + " has no HelpFormatter");
  formatter->usage[cmd] = std::move(text);
}

// ---------------------------------------------------------------- value checks and parsers

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) {
        double v = 0;
        return CLI::detail::lexical_cast(text, v) && std::isfinite(v) ? std::string()
                                                                      : "Value " + text + " is not a finite number";
      },
      "", "finite");
}

namespace {

// Decimal integer (optional sign, no trailing garbage) in [lo, hi], hi a type's limit.
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  const std::string range = "an integer >= " + std::to_string(lo);
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  const bool bad = text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || end == s ||
                   *end != '\0';
  if (bad) throw UsageError("invalid value '" + text + "' for " + what + ": expected " + range);
  if (errno == ERANGE || v < lo || v > hi)
    throw UsageError("value " + text + " for " + what + " is out of range: expected " + range);
  return static_cast<int64_t>(v);
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

int64_t parse_chunk(const std::string& text, const std::string& what, bool allow_auto) {
  if (text == "auto" || (allow_auto && text == "-1")) {
    if (!allow_auto)
      throw UsageError("invalid value 'auto' for " + what + ": only power_attention chooses its own chunk size; "
                       "give a number");
    return EXPANSE_CHUNK_AUTO;
  }
  if (allow_auto && !text.empty() && text[0] == '-')
    throw UsageError("invalid value '" + text + "' for " + what + ": expected auto, 0 (the quadratic form) or a "
                     "chunk size >= 1");
  return parse_int(text, what, 0, INT64_MAX);
}

expanse_layout parse_layout(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  expanse_layout layout{};
  layout.d_tile = 0;
  if (t == "sympow") {
    layout.kind = EXPANSE_LAYOUT_SYMPOW;
    return layout;
  }
  if (t == "tensor") {
    layout.kind = EXPANSE_LAYOUT_TENSOR;
    return layout;
  }
  if (t.rfind("tiled", 0) == 0) {
    std::string rest = t.substr(5);
    if (rest.size() >= 2 && rest.front() == '(' && rest.back() == ')') {
      rest = rest.substr(1, rest.size() - 2);
    } else if (!rest.empty() && (rest.front() == ':' || rest.front() == '=')) {
      rest = rest.substr(1);
    } else {
      throw UsageError("invalid layout '" + text + "' for " + what +
                       ": the tiled layout needs a tile size, e.g. tiled:8");
    }
    layout.kind = EXPANSE_LAYOUT_TILED;
    layout.d_tile = static_cast<int32_t>(parse_int(rest, what + " (tile size of '" + text + "')", 1,
                                                   INT32_MAX));
    return layout;
  }
  throw UsageError("invalid layout '" + text + "' for " + what +
                   ": expected sympow, tensor or tiled:N (e.g. tiled:8)");
}

expanse_dtype parse_dtype(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "f16" || t == "float16" || t == "half" || t == "fp16") return EXPANSE_F16;
  if (t == "bf16" || t == "bfloat16") return EXPANSE_BF16;
  if (t == "f32" || t == "float32" || t == "float" || t == "fp32") return EXPANSE_F32;
  if (t == "f64" || t == "float64" || t == "double" || t == "fp64") return EXPANSE_F64;
  throw UsageError("invalid dtype '" + text + "' for " + what + ": expected f16, bf16, f32 or f64");
}

const char* dtype_to_string(expanse_dtype dtype) {
  switch (dtype) {
    case EXPANSE_F16: return "f16";
    case EXPANSE_BF16: return "bf16";
    case EXPANSE_F32: return "f32";
    case EXPANSE_F64: return "f64";
    default: return "?";
  }
}

expanse_op_kind parse_op(const std::string& text, const std::string& what) {
  std::string t = lower(text);
  std::replace(t.begin(), t.end(), '-', '_');
  for (int i = 0; i < EXPANSE_OP_COUNT; ++i) {
    const char* name = expanse_op_name(static_cast<expanse_op_kind>(i));
    if (name != nullptr && t == name) return static_cast<expanse_op_kind>(i);
  }
  throw UsageError("unknown " + what + " '" + text + "': expected one of " + op_names_list());
}

std::string op_names_list() {
  std::string out;
  for (int i = 0; i < EXPANSE_OP_COUNT; ++i) {
    const char* name = expanse_op_name(static_cast<expanse_op_kind>(i));
    if (!out.empty()) out += ", ";
    out += (name != nullptr) ? name : "?";
  }
  return out;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// ---------------------------------------------------------------- Progress

namespace {
size_t terminal_columns() {
  winsize ws{};
  return ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
}
}  // namespace

Progress::Progress(size_t total) : total_(total), enabled_(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { clear(); }

void Progress::show(size_t index, const std::string& what) {
  if (!enabled_) return;
  std::string line = "[" + std::to_string(index + 1) + "/" + std::to_string(total_) + "] " + what;
  const size_t width = terminal_columns() - 1;  // a line that wraps could not be rewritten in place
  if (line.size() > width) line = line.substr(0, width);
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  shown_ = true;
}

void Progress::clear() {
  if (!shown_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace expanse_cli
