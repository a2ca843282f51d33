// Command-line options that describe one harness case (shared by `expanse check` and `expanse bench`).
#pragma once

#include <vector>

#include "cases.hpp"
#include "cli_options.hpp"

namespace expanse_cli {

// The option specs of op_config's fields: --b --t --hq --h --d --e --p --chunk --layout --dtype
// --gated --normalize --initial-state --final-state --intra --scale.
std::vector<OptionSpec> case_option_specs();
// True when any of those options was given.
bool has_case_options(const ArgParser& args);
// A config for `op` with the given options applied over `defaults`.
expanse::harness::op_config case_from_options(const ArgParser& args, expanse_op_kind op,
                                              expanse::harness::op_config defaults);

}  // namespace expanse_cli
