// What the `expanse` subcommands share besides CLI11 (option parsing, help) and npy.hpp: error
// types, the help layout, parsers for option values CLI11 does not know (chunk sizes, layouts,
// dtypes, operation names) and a progress line.
#ifndef EXPANSE_CLI_OPTIONS_HPP
#define EXPANSE_CLI_OPTIONS_HPP

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "expanse/expanse.h"

namespace expanse_cli {

// A wrong command line found after parsing. main() prints "expanse: error: <what>" and exits with
// status 2, as for CLI11's own parse errors.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A library call that did not return EXPANSE_OK; what() is the library's error text. Exit status 1.
class LibraryError : public std::runtime_error {
 public:
  LibraryError(expanse_status status, const std::string& text) : std::runtime_error(text), status_(status) {}
  expanse_status status() const { return status_; }

 private:
  expanse_status status_;
};

// Throws LibraryError when st != EXPANSE_OK. Its text is expanse_last_error(); if that is empty, it is
// "<what> failed: <status name>".
void check_status(expanse_status st, const char* what);

// CLI11's help, with the usage line first and, for a command given one by set_usage, that line.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;
  std::string make_subcommand(const CLI::App* sub) const override;  // its name without aliases
  std::map<const CLI::App*, std::string> usage;  // what follows the command's name
};
// The usage line of cmd's help: "usage: expanse run " + text. cmd's formatter is a HelpFormatter.
void set_usage(CLI::App* cmd, std::string text);

// ---------------------------------------------------------------- value checks and parsers

// CLI11 checks that leave the help's value column alone: a number in [lo, hi]; a finite number.
template <class T>
CLI::Validator in_range(T lo, T hi) {
  return CLI::Range(lo, hi).description("");
}
CLI::Validator finite_number();

// `what` names the option in the error text (a UsageError), e.g. "--layout".

// A chunk size: when `allow_auto`, "auto" or -1 (EXPANSE_CHUNK_AUTO: the library picks the form and
// the chunk size, for power_attention); else an integer >= 0 (0: the quadratic form / one chunk).
int64_t parse_chunk(const std::string& text, const std::string& what, bool allow_auto);

// "sympow", "tensor", "tiled:8" (also "tiled(8)", "tiled=8"): tiled with d_tile 8.
expanse_layout parse_layout(const std::string& text, const std::string& what);

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
