// qattn: one executable, one subcommand per file in src/cli/.
// Exit codes common to every subcommand: 0 done, 1 an error (a file that
// cannot be read or written, a damaged checkpoint, a failed run), 2 bad
// arguments, config or data; train and sweep add 3 (diverged) and 4 (stopped
// by a signal).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <new>
#include <stdexcept>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/config.hpp"

int main(int argc, char** argv) {
  CLI::App app{"qattn: GPT pre-training with low-bit attention (FPA, SageBwd INT8, K-interval)"};
  app.require_subcommand(1);
  qattn::cli::add_train_command(app);
  qattn::cli::add_validate_command(app);
  qattn::cli::add_info_command(app);
  qattn::cli::add_probe_command(app);
  qattn::cli::add_bench_command(app);
  qattn::cli::add_tokenize_command(app);
  qattn::cli::add_detokenize_command(app);
  qattn::cli::add_sweep_command(app);
  qattn::cli::add_sample_command(app);
  qattn::cli::add_export_command(app);
  // CLI11 answers a word that is not a subcommand with "A subcommand is
  // required", which names neither the word nor the subcommands: the words
  // that pick a subcommand (qattn bench attention) are checked first.
  std::string command = "qattn";
  for (CLI::App* level = &app; level && argc > 1;) {
    const auto subs = level->get_subcommands([](CLI::App*) { return true; });
    const int at = static_cast<int>(std::count(command.begin(), command.end(), ' ')) + 1;
    if (subs.empty() || at >= argc || argv[at][0] == '-') break;
    const auto it = std::find_if(subs.begin(), subs.end(), [&](CLI::App* sub) { return sub->check_name(argv[at]); });
    if (it == subs.end()) {
      std::string allowed;
      for (const CLI::App* sub : subs) allowed += (allowed.empty() ? "" : ", ") + sub->get_name();
      spdlog::error("{}: '{}' is not a subcommand; allowed: {}", command, argv[at], allowed);
      return qattn::cli::kExitBadInput;
    }
    command += " " + (*it)->get_name();
    level = *it;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a subcommand's own exit code
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message (or the help, code 0)
    return code == 0 ? 0 : qattn::cli::kExitBadInput;
  } catch (const std::filesystem::filesystem_error& e) {
    // The library's text ("filesystem error: ...") says less than path and reason.
    spdlog::error("{}: {}", e.path1().string(), e.code().message());
    return 1;
  } catch (const std::bad_alloc&) {
    spdlog::error("out of memory (a model, batch or file larger than this machine holds)");
    return 1;
  } catch (const std::invalid_argument& e) {  // a subcommand's own check of an argument
    spdlog::error("{}", e.what());
    return qattn::cli::kExitBadInput;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return dynamic_cast<const qattn::ConfigError*>(&e) ? qattn::cli::kExitBadInput : 1;
  }
  return 0;
}
