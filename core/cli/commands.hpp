// The subcommands of the `expanse` executable. Each add_* adds its subcommand (options, help) to the
// CLI11 app of main.cpp and returns it with what runs it once its command line is parsed.
//
// Contract for run:
//   - returns the process exit status (0 success, 1 failure);
//   - reports a bad command line that CLI11 did not catch by throwing expanse_cli::UsageError (main
//     prints it, exits 2);
//   - reports any other failure by throwing (expanse_cli::LibraryError for a failed library call,
//     std::runtime_error otherwise; main prints "expanse: error: <what()>", exits 1), or by printing
//     its own message and returning 1.
// Shared errors, value parsers and the help layout live in cli_options.hpp; .npy I/O in npy.hpp.
#ifndef EXPANSE_CLI_COMMANDS_HPP
#define EXPANSE_CLI_COMMANDS_HPP

#include <functional>

namespace CLI {
class App;
}

struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command add_info(CLI::App& app);   // cmd_info.cpp: version, backends, devices
Command add_run(CLI::App& app);    // cmd_run.cpp: run one op on .npy inputs, write .npy outputs
Command add_check(CLI::App& app);  // cmd_check.cpp: compare a backend against the reference
Command add_bench(CLI::App& app);  // cmd_bench.cpp: timing

#endif  // EXPANSE_CLI_COMMANDS_HPP
