// Small helpers shared by the `expanse` subcommands: error types, a command-line option parser and
// parsers for the values the commands take (integers, numbers, layouts, dtypes, op names).
//
// Typical use in a command:
//
//   using namespace expanse_cli;
//   ArgParser args("run", {
//       {"backend", true, "NAME", "backend to use (default: expanse_default_backend())"},
//       {"p", true, "P", "degree of the power (default 2)"},
//       {"final-state", false, "", "also write the final state"},
//   });
//   args.parse(argc, argv);                       // throws UsageError naming the bad option
//   if (args.help_requested()) { print_help(args.options_help()); return 0; }
//   int p = (int)args.get_int("p", 2, 1, 64);     // "--p 2", "--p=2"
//   expanse_layout L = parse_layout(args.get_string("layout", "sympow"), "--layout");
#ifndef EXPANSE_CLI_OPTIONS_HPP
#define EXPANSE_CLI_OPTIONS_HPP

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "expanse/expanse.h"

namespace expanse_cli {

// A wrong command line. main() prints "expanse: error: <what>" and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A library call that did not return EXPANSE_OK; what() is the library's error text. Exit status 1.
class LibraryError : public std::runtime_error {
 public:
  LibraryError(expanse_status status, const std::string& text)
      : std::runtime_error(text), status_(status) {}
  expanse_status status() const { return status_; }

 private:
  expanse_status status_;
};

// Throws LibraryError when st != EXPANSE_OK. Its text is expanse_last_error(); if that is empty, it is
// "<what> failed: <status name>".
void check_status(expanse_status st, const char* what);

// ---------------------------------------------------------------- option parser

struct OptionSpec {
  std::string name;        // without the leading "--", e.g. "backend"
  bool takes_value;        // true: "--name value" / "--name=value"; false: a flag "--name"
  std::string value_name;  // shown in help, e.g. "NAME" (ignored for flags)
  std::string help;        // one line
};

// Parses `--name value`, `--name=value` and flags `--name`. `-h` / `--help` set help_requested().
// Arguments not starting with "-" (and everything after a bare "--") are positional. An option given
// twice, an unknown option, a missing value or a value given to a flag is a UsageError naming the
// option and the command.
class ArgParser {
 public:
  ArgParser(std::string command, std::vector<OptionSpec> options);

  // argv[0] is the subcommand name and is skipped.
  void parse(int argc, char** argv);

  bool help_requested() const { return help_; }
  bool has(const std::string& name) const;  // given on the command line (flag or value)
  std::optional<std::string> value(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // Names of the options given, in command-line order.
  std::vector<std::string> given() const;

  std::string get_string(const std::string& name, const std::string& def) const;
  bool get_flag(const std::string& name) const;
  // Integer in [lo, hi]; errors name "--<name>".
  int64_t get_int(const std::string& name, int64_t def, int64_t lo = INT64_MIN,
                  int64_t hi = INT64_MAX) const;
  // A finite number; errors name "--<name>".
  double get_double(const std::string& name, double def) const;

  // Aligned "  --name VALUE   help" lines for the options (plus --help), for a command's help text.
  std::string options_help() const;
  const std::string& command() const { return command_; }

 private:
  const OptionSpec* find(const std::string& name) const;
  void assert_known(const std::string& name) const;

  std::string command_;
  std::vector<OptionSpec> specs_;
  std::vector<std::pair<std::string, std::optional<std::string>>> given_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// ---------------------------------------------------------------- value parsers
// `what` names the option or thing being parsed in the error text, e.g. "--p".

// Decimal integer (optional sign, no trailing garbage) in [lo, hi].
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo = INT64_MIN,
                  int64_t hi = INT64_MAX);
// A finite floating-point number.
double parse_double(const std::string& text, const std::string& what);
// "0"/"1", "false"/"true", "no"/"yes", "off"/"on".
bool parse_bool(const std::string& text, const std::string& what);

// A chunk size: "auto" (EXPANSE_CHUNK_AUTO: the library picks the form and the chunk size, for
// power_attention) when `allow_auto`, else an integer >= 0 (0: the quadratic form / one chunk).
int64_t parse_chunk(const std::string& text, const std::string& what, bool allow_auto);
// The spelling parse_chunk reads: "auto" or the number.
std::string chunk_to_string(int64_t chunk);

// "sympow", "tensor", "tiled:8" (also "tiled(8)", "tiled=8"): tiled with d_tile 8.
expanse_layout parse_layout(const std::string& text, const std::string& what);
// The spelling parse_layout reads: "sympow", "tensor", "tiled:8".
std::string layout_to_string(expanse_layout layout);

// "f16", "bf16", "f32", "f64" (also "float16", "bfloat16", "float32", "float64", "half", "float",
// "double").
expanse_dtype parse_dtype(const std::string& text, const std::string& what);
// "f16", "bf16", "f32", "f64" ("?" for anything else). Does not need the library.
const char* dtype_to_string(expanse_dtype dtype);

// An op name as returned by expanse_op_name ("power_attention", ...); '-' is read as '_'.
expanse_op_kind parse_op(const std::string& text, const std::string& what);
// All op names, comma-separated, for help and error texts.
std::string op_names_list();

// "[2, 3, 4]" ("[]" for a 0-d shape).
std::string shape_to_string(const std::vector<int64_t>& shape);

// ---------------------------------------------------------------- progress

// Progress of a long command on stderr, shown only when stderr is a terminal (a log file or a pipe
// gets nothing extra): one line "[3/104] <what>" rewritten in place. clear() erases it, so call it
// before printing results to stdout (which may be the same terminal); the destructor clears too.
class Progress {
 public:
  explicit Progress(size_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void show(size_t index, const std::string& what);  // index counts from 0
  void clear();

 private:
  size_t total_;
  bool enabled_;
  bool shown_ = false;
};

}  // namespace expanse_cli

#endif  // EXPANSE_CLI_OPTIONS_HPP
