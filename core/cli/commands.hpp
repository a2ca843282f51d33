// The subcommands of the `expanse` executable. main.cpp dispatches `expanse <command> [options]` to
// one of these with argv[0] set to the command name ("info", "run", ...).
//
// Contract for every command:
//   - returns the process exit status (0 success, 1 failure);
//   - handles `--help` / `-h` itself (prints its help to stdout, returns 0);
//   - reports a bad command line by throwing expanse_cli::UsageError (main prints it, exits 2);
//   - reports any other failure by throwing (expanse_cli::LibraryError for a failed library call,
//     std::runtime_error otherwise; main prints "expanse: error: <what()>", exits 1), or by printing
//     its own message and returning 1.
// Shared option parsing and value parsers live in cli_options.hpp; .npy I/O in npy.hpp.
#ifndef EXPANSE_CLI_COMMANDS_HPP
#define EXPANSE_CLI_COMMANDS_HPP

int cmd_info(int argc, char** argv);   // cmd_info.cpp: version, backends, devices
int cmd_run(int argc, char** argv);    // cmd_run.cpp: run one op on .npy inputs, write .npy outputs
int cmd_check(int argc, char** argv);  // cmd_check.cpp: compare a backend against the reference
int cmd_bench(int argc, char** argv);  // cmd_bench.cpp: timing

#endif  // EXPANSE_CLI_COMMANDS_HPP
