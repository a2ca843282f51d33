// `expanse <command> [options]`: entry point of the command-line tool. CLI11 parses the command line
// and writes the help; each command (commands.hpp) declares its options.
//
// Exit status: 0 success, 1 failure (library error, bad file, check failure), 2 bad command line.
// Every exception is caught here and printed as "expanse: error: <text>" on stderr.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cli_options.hpp"
#include "commands.hpp"
#include "expanse/expanse.h"

using namespace expanse_cli;

namespace {

// "expanse run power_attention": the commands parsed, for "see '... --help'".
std::string parsed_command(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
    a = a->get_subcommands().front();
    name += " " + a->get_name();
  }
  return name;
}

int error(const std::string& text, int status) {
  std::fflush(stdout);
  std::fprintf(stderr, "expanse: error: %s\n", text.c_str());
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("The command line of expanse, large-state linear attention.", "expanse");
  app.formatter(std::make_shared<HelpFormatter>());
  app.get_formatter()->column_width(28);
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::Throw);  // an option given twice
  const char* version = expanse_version();
  app.set_version_flag("-V,--version", std::string("expanse ") + (version ? version : "(unknown version)"));
  try {
    set_usage(&app, "COMMAND [options]");
    const Command commands[] = {add_info(app), add_run(app), add_check(app), add_bench(app)};
    std::string names;
    for (const Command& c : commands) {
      c.app->group("Commands (expanse COMMAND --help: its options)");
      names += (names.empty() ? "" : ", ") + c.app->get_name();
    }
    app.add_option_function<std::string>("COMMAND", [&names](const std::string& name) {
         throw UsageError("unknown command '" + name + "' (commands: " + names + ")");
       })->group("");
    app.footer(
        "Environment: EXPANSE_BACKEND (default backend), EXPANSE_BACKEND_PATH (colon-separated\n"
        "directories searched for backend plugins libexpanse-<name>.so).\n"
        "Exit status: 0 success, 1 failure, 2 bad command line.");

    // `expanse help [COMMAND...]` is `expanse [COMMAND...] --help`, `expanse version` `expanse --version`.
    std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
    if (!args.empty() && args.front() == "help") {
      args.erase(args.begin());
      args.push_back("--help");
    } else if (args.size() == 1 && args.front() == "version") {
      args.front() = "--version";
    }
    if (args.empty()) {
      std::cerr << app.help();
      return 2;
    }
    std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
    app.parse(args);
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run();
    std::cerr << app.help();
    return 2;
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return error(std::string(e.what()) + "\n(see '" + parsed_command(app) + " --help')", 2);
  } catch (const UsageError& e) {
    return error(std::string(e.what()) + "\n(see '" + parsed_command(app) + " --help')", 2);
  } catch (const std::bad_alloc&) {
    return error("out of host memory", 1);
  } catch (const std::exception& e) {
    return error(e.what(), 1);
  } catch (...) {
    return error("unknown exception in '" + parsed_command(app) + "'", 1);
  }
}
