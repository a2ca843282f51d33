// Option parsing and value parsers shared by the `expanse` subcommands (see cli_options.hpp).
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

// ---------------------------------------------------------------- ArgParser

ArgParser::ArgParser(std::string command, std::vector<OptionSpec> options)
    : command_(std::move(command)), specs_(std::move(options)) {}

const OptionSpec* ArgParser::find(const std::string& name) const {
  for (const auto& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

void ArgParser::assert_known(const std::string& name) const {
  // A programming error in a command (asking for an option it never declared): report it loudly
  // rather than silently returning the default.
  if (find(name) == nullptr)
    throw std::logic_error("expanse " + command_ + ": option --" + name + " is not declared");
}

void ArgParser::parse(int argc, char** argv) {
  bool only_positional = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = (argv[i] != nullptr) ? argv[i] : "";
    if (only_positional || arg.empty() || arg[0] != '-' || arg == "-") {
      positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      help_ = true;
      continue;
    }
    if (arg.size() < 3 || arg[1] != '-') {
      throw UsageError("expanse " + command_ + ": unknown option '" + arg +
                       "' (options are spelled --name)");
    }
    std::string name = arg.substr(2);
    std::optional<std::string> inline_value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const OptionSpec* spec = find(name);
    if (spec == nullptr) {
      std::string known;
      for (const auto& s : specs_) known += (known.empty() ? "--" : ", --") + s.name;
      throw UsageError("expanse " + command_ + ": unknown option --" + name +
                       (known.empty() ? std::string(" (this command takes no options)")
                                      : " (known options: " + known + ", --help)"));
    }
    if (has(name)) throw UsageError("expanse " + command_ + ": option --" + name + " given twice");
    if (!spec->takes_value) {
      if (inline_value)
        throw UsageError("expanse " + command_ + ": option --" + name + " is a flag and takes no value");
      given_.emplace_back(name, std::nullopt);
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc || argv[i + 1] == nullptr)
        throw UsageError("expanse " + command_ + ": option --" + name + " needs a value (" +
                         spec->value_name + ")");
      inline_value = std::string(argv[++i]);
    }
    given_.emplace_back(name, inline_value);
  }
}

bool ArgParser::has(const std::string& name) const {
  for (const auto& g : given_)
    if (g.first == name) return true;
  return false;
}

std::optional<std::string> ArgParser::value(const std::string& name) const {
  assert_known(name);
  for (const auto& g : given_)
    if (g.first == name) return g.second;
  return std::nullopt;
}

bool ArgParser::get_flag(const std::string& name) const {
  assert_known(name);
  return has(name);
}

std::vector<std::string> ArgParser::given() const {
  std::vector<std::string> names;
  for (const auto& g : given_) names.push_back(g.first);
  return names;
}

std::string ArgParser::get_string(const std::string& name, const std::string& def) const {
  auto v = value(name);
  return v ? *v : def;
}

int64_t ArgParser::get_int(const std::string& name, int64_t def, int64_t lo, int64_t hi) const {
  auto v = value(name);
  return v ? parse_int(*v, "--" + name, lo, hi) : def;
}

double ArgParser::get_double(const std::string& name, double def) const {
  auto v = value(name);
  return v ? parse_double(*v, "--" + name) : def;
}

std::string ArgParser::options_help() const {
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& s : specs_)
    rows.emplace_back("--" + s.name + (s.takes_value ? " " + s.value_name : std::string()), s.help);
  rows.emplace_back("-h, --help", "show this help");
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  std::string out;
  const std::string indent(width + 4, ' ');  // continuation lines of a help text line up
  for (const auto& r : rows) {
    std::string help = r.second;
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1))
      help.insert(at + 1, indent);
    out += "  " + r.first + std::string(width - r.first.size() + 2, ' ') + help + "\n";
  }
  return out;
}

// ---------------------------------------------------------------- value parsers

int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  const std::string range = (lo == INT64_MIN && hi == INT64_MAX)
                                ? std::string("an integer")
                                : ((hi == INT64_MAX || hi == INT32_MAX) ? "an integer >= " + std::to_string(lo)
                                                   : "an integer in [" + std::to_string(lo) + ", " +
                                                         std::to_string(hi) + "]");
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

double parse_double(const std::string& text, const std::string& what) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  const bool bad = text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || end == s ||
                   *end != '\0';
  if (bad) throw UsageError("invalid value '" + text + "' for " + what + ": expected a number");
  if (!std::isfinite(v) || errno == ERANGE)
    throw UsageError("value " + text + " for " + what + " is out of range: expected a finite number");
  return v;
}

int64_t parse_chunk(const std::string& text, const std::string& what, bool allow_auto) {
  if (text == "auto") {
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

std::string chunk_to_string(int64_t chunk) {
  return chunk == EXPANSE_CHUNK_AUTO ? std::string("auto") : std::to_string(chunk);
}

static std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool parse_bool(const std::string& text, const std::string& what) {
  const std::string t = lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  throw UsageError("invalid value '" + text + "' for " + what + ": expected 0 or 1");
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

std::string layout_to_string(expanse_layout layout) {
  switch (layout.kind) {
    case EXPANSE_LAYOUT_SYMPOW: return "sympow";
    case EXPANSE_LAYOUT_TENSOR: return "tensor";
    case EXPANSE_LAYOUT_TILED: return "tiled:" + std::to_string(layout.d_tile);
    default: return "layout(" + std::to_string(layout.kind) + ")";
  }
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
