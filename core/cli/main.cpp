// `expanse <command> [options]`: entry point of the command-line tool.
//
// Exit status: 0 success, 1 failure (library error, bad file, check failure), 2 bad command line.
// Every exception is caught here and printed as "expanse: error: <text>" on stderr.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli_options.hpp"
#include "commands.hpp"
#include "expanse/expanse.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"info", cmd_info, "version, backends and devices"},
    {"run", cmd_run, "run one operation on .npy inputs and write .npy outputs"},
    {"check", cmd_check, "compare a backend against the reference on random cases"},
    {"bench", cmd_bench, "time operations on a backend"},
};

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "usage: expanse <command> [options]\n"
               "       expanse <command> --help\n"
               "       expanse --version\n"
               "\n"
               "commands:\n");
  for (const auto& c : kCommands) std::fprintf(to, "  %-7s %s\n", c.name, c.summary);
  std::fprintf(to,
               "\n"
               "Environment: EXPANSE_BACKEND (default backend), EXPANSE_BACKEND_PATH (colon-separated\n"
               "directories searched for backend plugins libexpanse-<name>.so).\n"
               "Exit status: 0 success, 1 failure, 2 bad command line.\n");
}

const Command* find_command(const std::string& name) {
  for (const auto& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

std::string known_commands() {
  std::string out;
  for (const auto& c : kCommands) out += (out.empty() ? "" : ", ") + std::string(c.name);
  return out;
}

// Runs a command, turning every exception into a message and an exit status.
int run_guarded(const Command& cmd, int argc, char** argv) {
  try {
    return cmd.fn(argc, argv);
  } catch (const expanse_cli::UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "expanse: error: %s\n(see 'expanse %s --help')\n", e.what(), cmd.name);
    return 2;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "expanse: error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "expanse: error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fflush(stdout);
    std::fprintf(stderr, "expanse: error: unknown exception in 'expanse %s'\n", cmd.name);
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2 || argv[1] == nullptr) {
      print_usage(stderr);
      return 2;
    }
    const std::string first = argv[1];
    if (first == "--help" || first == "-h" || first == "help") {
      if (argc >= 3 && argv[2] != nullptr && first == "help") {
        // `expanse help run` is `expanse run --help`.
        const Command* cmd = find_command(argv[2]);
        if (cmd == nullptr) {
          std::fprintf(stderr, "expanse: error: unknown command '%s' (commands: %s)\n", argv[2],
                       known_commands().c_str());
          return 2;
        }
        char help_flag[] = "--help";
        char* sub_argv[] = {argv[2], help_flag, nullptr};
        return run_guarded(*cmd, 2, sub_argv);
      }
      print_usage(stdout);
      return 0;
    }
    if (first == "--version" || first == "-V" || first == "version") {
      const char* v = expanse_version();
      std::printf("expanse %s\n", v ? v : "(unknown version)");
      return 0;
    }
    const Command* cmd = find_command(first);
    if (cmd == nullptr) {
      if (!first.empty() && first[0] == '-')
        std::fprintf(stderr, "expanse: error: unknown option '%s' (options before the command: "
                             "--help, --version)\n", first.c_str());
      else
        std::fprintf(stderr, "expanse: error: unknown command '%s' (commands: %s; see 'expanse --help')\n",
                     first.c_str(), known_commands().c_str());
      return 2;
    }
    return run_guarded(*cmd, argc - 1, argv + 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "expanse: error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "expanse: error: unknown exception\n");
    return 1;
  }
}
