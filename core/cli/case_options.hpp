// Command-line options that describe one harness case (shared by `expanse check` and `expanse bench`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cases.hpp"
#include "cli_options.hpp"

namespace expanse_cli {

// The fields of op_config, each unset unless given: --b --t --hq --h --d --e --p --chunk_size (or
// --chunk) --layout --dtype --gated --resets --normalize --initial-state --final-state --intra --scale.
class CaseOptions {
 public:
  // Adds the options to cmd, in their own group of its help.
  explicit CaseOptions(CLI::App* cmd);
  // True when any of them was given.
  bool any() const;
  // A config for `op` with the given options applied over `defaults`.
  expanse::harness::op_config apply(expanse_op_kind op, expanse::harness::op_config defaults) const;

 private:
  std::vector<CLI::Option*> options_;
  std::optional<int64_t> b_, t_, hq_, h_, d_, e_;
  std::optional<int32_t> p_;
  std::optional<std::string> chunk_, layout_, dtype_;
  std::optional<bool> gated_, resets_, growing_, normalize_, initial_state_, final_state_, intra_;
  std::optional<double> scale_;
};

}  // namespace expanse_cli
