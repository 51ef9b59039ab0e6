// Every command line README.md shows works as shown: each `build/qattn` line
// names every option its subcommand requires (checked against --help; that it
// names no other option, the docs test below checks in every doc); then each
// runs on tiny inputs with its placeholders filled in and its optional [...]
// parts left out. The scripts it shows exist, and data/prepare.sh knows every
// recipe it names.
// The command-line reference (docs/runs.md, "The command line") lists every
// subcommand, option and positional of --help with the defaults --help shows,
// and no doc names a subcommand or an option that qattn lacks.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <map>
#include <regex>
#include <set>

#include "doc_code.hpp"
#include "run_helpers.hpp"

using namespace qattn::test;
using nlohmann::json;

namespace {

struct Line {
  int number;
  std::vector<std::string> words;  // the command, without its comment
};

// The lines of the ```bash blocks.
std::vector<Line> readme_commands() {
  std::ifstream f(fs::path(QATTN_SOURCE_DIR) / "README.md");
  std::vector<Line> out;
  bool in_bash = false;
  std::string text;
  for (int n = 1; std::getline(f, text); ++n) {
    if (text.rfind("```", 0) == 0) {
      in_bash = !in_bash && text == "```bash";
      continue;
    }
    if (!in_bash) continue;
    if (const auto hash = text.find(" #"); hash != std::string::npos) text.resize(hash);
    std::istringstream words(text);
    Line line{n, {}};
    for (std::string w; words >> w;) line.words.push_back(w);
    if (!line.words.empty()) out.push_back(line);
  }
  return out;
}

// What `qattn SUB... --help` says: the options, which of them take a value
// (a type such as TEXT or INT follows the name), which are required and the
// defaults it shows; how many positionals there are and how many are
// required; the subcommands.
struct Help {
  std::set<std::string> options, with_value, required;
  std::map<std::string, std::string> defaults;
  int positionals = 0, required_positionals = 0;
  std::vector<std::string> subcommands;
};

Help help_of(const std::vector<std::string>& sub, const fs::path& log) {
  std::vector<std::string> args = sub;
  args.push_back("--help");
  const Outcome r = qattn_outcome(args, log);
  REQUIRE(r.code == 0);
  Help h;
  static const std::regex option(R"(^\s+(?:-\w,)?(--[\w-]+)( [A-Z]+(?=[:= ]|$))?.*)");
  // CLI11 writes a default after the type: "TEXT=fpa", "INT:INT in [1 - 64]=1", "TEXT:{a,b}=a".
  static const std::regex shown_default(R"(^\s+(?:-\w,)?--[\w-]+ (?:TEXT(?::PATH)?|[A-Z]+:[^=]*?[\]\)\}])=(\S+).*)");
  static const std::regex positional(R"(^\s+\w+ [A-Z]+.*)");
  static const std::regex subcommand(R"(^\s+([a-z]+)\s.*)");
  std::string section;
  std::istringstream lines(r.output);
  for (std::string s; std::getline(lines, s);) {
    if (!s.empty() && s[0] != ' ') section = s;
    std::smatch m;
    if (std::regex_match(s, m, option)) {
      h.options.insert(m[1]);
      if (m[2].matched) h.with_value.insert(m[1]);
      if (s.find(" REQUIRED") != std::string::npos) h.required.insert(m[1]);
      if (std::smatch d; std::regex_match(s, d, shown_default)) h.defaults[m[1]] = d[1];
    } else if (section == "Positionals:" && std::regex_match(s, positional)) {
      ++h.positionals;
      if (s.find(" REQUIRED") != std::string::npos) ++h.required_positionals;
    } else if (section == "Subcommands:" && std::regex_match(s, m, subcommand)) {
      h.subcommands.push_back(m[1]);
    }
  }
  h.options.erase("--help");
  return h;
}

// The options a README line names ("--a", from "[--a|--b]" both) and its
// positionals outside [...] (option values left out).
struct Shown {
  std::set<std::string> options;
  int positionals = 0;
};

Shown shown_in(const std::vector<std::string>& words, const Help& h) {
  Shown out;
  int depth = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string w = words[i];
    const int opens = static_cast<int>(w.find_first_not_of('['));
    depth += opens;
    w = w.substr(static_cast<size_t>(opens));
    const int closes = static_cast<int>(w.size() - (w.find_last_not_of(']') + 1));
    w.resize(w.size() - static_cast<size_t>(closes));
    if (w.rfind("--", 0) == 0) {
      std::istringstream alternatives(w);
      for (std::string a; std::getline(alternatives, a, '|');) out.options.insert(a.substr(0, a.find('=')));
      const std::string first = w.substr(0, w.find_first_of("|="));
      if (h.with_value.count(first) && w.find('=') == std::string::npos && closes == 0 && i + 1 < words.size()) {
        ++i;  // the value
        const std::string v = words[i];
        depth -= static_cast<int>(v.size() - (v.find_last_not_of(']') + 1));
      }
    } else if (depth == 0 && w != "...") {
      ++out.positionals;
    }
    depth -= closes;
  }
  return out;
}

// The words of a line as a user would type them: optional [...] groups
// left out, the first of "a|b" alternatives, placeholders filled in.
std::vector<std::string> concrete(const Line& line, const std::map<std::string, std::string>& values) {
  std::vector<std::string> out;
  int depth = 0;
  for (const auto& w : line.words) {
    const bool opens = w.front() == '[';
    depth += opens ? 1 : 0;
    const bool closes = w.back() == ']';
    if (depth == 0) {
      std::string word = w;
      if (word.find('|') != std::string::npos) word = word.substr(0, word.find('|'));
      const auto it = values.find(word);
      if (it != values.end()) {
        std::istringstream several(it->second);  // "FILE..." may stand for several files
        for (std::string v; several >> v;) out.push_back(v);
      } else {
        INFO("README.md:" << line.number << ": no tiny input for " << word);
        CHECK(std::regex_match(word, std::regex("[a-z][a-z0-9_.-]*|--[a-z-]+|[a-z/._-]+")));
        out.push_back(word);
      }
    }
    if (closes && depth > 0) --depth;
  }
  return out;
}

}  // namespace

TEST_CASE("README: every qattn command line matches the CLI and runs on tiny inputs", "[cli][readme]") {
  const auto d = scratch_dir("readme");
  make_corpus(d);
  const fs::path cfg = write_json(d / "tiny.json", tiny_config(d, "tiny", 4));
  const fs::path sweep = write_json(d / "sweep.json", {{"name", "sw"}, {"base", cfg.string()}, {"out", (d / "runs").string()},
                                                       {"grid", {{"train.lr", {0.01}}}}});
  std::ofstream(d / "a.txt") << "the first document";
  std::ofstream(d / "b.txt") << "the second document, which is longer than the first";
  const std::map<std::string, std::string> values = {
      {"CONFIG", cfg.string()},
      {"SWEEP.json", sweep.string()},
      {"FILE...", (d / "a.txt").string() + " " + (d / "b.txt").string()},
      {"DIR", (d / "tok").string()},
      {"SHARD...", (d / "tok" / "tok_val_000000.bin").string()},
      {"RUN_DIR", (d / "runs" / "tiny").string()},
      {"gpt2.bin", (d / "gpt2.bin").string()},
      {"B,H,T,d", "1,2,64,64"},
      {"runs/SWEEP", (d / "runs" / "sw").string()},
  };
  const bool have_matplotlib = std::system("/usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1") == 0;
  const auto lines = readme_commands();
  int qattn_lines = 0;
  for (const auto& line : lines) {
    const std::string& program = line.words[0];
    INFO("README.md:" << line.number << ": " << fmt::format("{}", fmt::join(line.words, " ")));
    if (program == "build/qattn") {
      ++qattn_lines;
      std::vector<std::string> sub;
      for (size_t i = 1; i < line.words.size() && std::regex_match(line.words[i], std::regex("[a-z]+")); ++i)
        sub.push_back(line.words[i]);
      REQUIRE(!sub.empty());
      const Help h = help_of(sub, d / "help.log");
      const Shown shown = shown_in({line.words.begin() + 1 + static_cast<long>(sub.size()), line.words.end()}, h);
      for (const auto& o : h.required) {
        INFO(o);
        CHECK(shown.options.count(o));  // and every option it requires
      }
      CHECK(shown.positionals >= h.required_positionals);
      if (sub[0] == "bench") continue;  // CUDA kernels: --help only
      std::vector<std::string> args = concrete(line, values);
      args.erase(args.begin());
      const Outcome r = qattn_outcome(args, d / "run.log");
      INFO(r.output);
      CHECK(r.code == 0);
    } else if (program == "data/prepare.sh") {
      const Outcome r = [&] {
        const fs::path log = d / "prepare.log";
        const int status = std::system(("'" + std::string(QATTN_SOURCE_DIR) + "/data/prepare.sh' --help > '" +
                                        log.string() + "' 2>&1").c_str());
        return Outcome{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
      }();
      REQUIRE(r.code == 0);
      std::string recipes = line.words[1];
      for (size_t at = 0; at != std::string::npos;) {
        const size_t bar = recipes.find('|', at);
        const std::string name = recipes.substr(at, bar == std::string::npos ? bar : bar - at);
        CHECK_THAT(r.output, Catch::Contains("\n  " + name + " "));
        at = bar == std::string::npos ? bar : bar + 1;
      }
    } else if (program == "tools/plot.py") {
      if (!have_matplotlib) {
        WARN("tools/plot.py: matplotlib is missing; its README line is not run");
        continue;
      }
      std::vector<std::string> args = concrete(line, values);
      std::string command = "/usr/bin/python3 '" + std::string(QATTN_SOURCE_DIR) + "/tools/plot.py'";
      for (size_t i = 1; i < args.size(); ++i) command += " '" + args[i] + "'";
      CHECK(std::system((command + " > '" + (d / "plot.log").string() + "' 2>&1").c_str()) == 0);
      CHECK(fs::exists(d / "runs" / "sw" / "loss.png"));
    } else {
      const fs::path script = fs::path(QATTN_SOURCE_DIR) / program;
      CHECK(fs::exists(script));
      CHECK((fs::status(script).permissions() & fs::perms::owner_exec) != fs::perms::none);
    }
  }
  CHECK(qattn_lines >= 10);
}

namespace {

// A `qattn SUB...` command as a doc writes it: the file and line, the words
// after qattn up to the end of the command.
struct Mention {
  std::string where;
  std::vector<std::string> words;
};

// Every qattn command in the user docs: the lines of fenced code (joined at a
// trailing backslash) and the code spans of the text in which the word qattn
// or a path ending in /qattn occurs.
std::vector<Mention> qattn_mentions() {
  const fs::path root = QATTN_SOURCE_DIR;
  std::vector<fs::path> docs = {root / "README.md", root / "data" / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md" && e.path().filename() != "changelog.md") docs.push_back(e.path());
  static const std::regex program(R"((?:[\w.-]*/)?qattn)");
  std::vector<Mention> out;
  for (const fs::path& doc : docs) {
    const DocCode code = doc_code(doc);
    std::vector<std::pair<int, std::string>> pieces = code.spans;  // line, text of a command
    std::string joined;
    for (auto [n, text] : code.block_lines) {
      if (const auto hash = text.find(" #"); hash != std::string::npos) text.resize(hash);
      joined += text;
      if (!joined.empty() && joined.back() == '\\') {
        joined.pop_back();
        continue;
      }
      pieces.push_back({n, joined});
      joined.clear();
    }
    for (const auto& [n, piece] : pieces) {
      std::istringstream words(piece);
      std::vector<std::string> w;
      for (std::string word; words >> word;) w.push_back(word);
      for (size_t i = 0; i < w.size(); ++i) {
        if (!std::regex_match(w[i], program)) continue;
        Mention m{fs::relative(doc, root).string() + ":" + std::to_string(n), {}};
        for (size_t j = i + 1; j < w.size() && w[j] != "|" && w[j] != "&&" && w[j] != ";" && w[j] != ">"; ++j)
          m.words.push_back(w[j]);
        out.push_back(m);
      }
    }
  }
  return out;
}

// The reference: per command ("train", "bench attention") its rows, the first
// cell (`--opt VALUE` or `POSITIONAL`) and the default cell.
std::map<std::string, std::vector<std::pair<std::string, std::string>>> command_reference() {
  std::ifstream f(fs::path(QATTN_SOURCE_DIR) / "docs" / "runs.md");
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> out;
  static const std::regex heading(R"(### qattn ([a-z ]+))");
  static const std::regex row(R"(\| `([^`]+)` \|([^|]*)\|.*)");
  bool in_reference = false;
  std::string command, text;
  while (std::getline(f, text)) {
    if (text.rfind("## ", 0) == 0) in_reference = text == "## The command line";
    if (!in_reference) continue;
    std::smatch m;
    if (std::regex_match(text, m, heading)) {
      command = m[1];
      out[command];
    } else if (!command.empty() && std::regex_match(text, m, row)) {
      std::string dflt = m[2];
      dflt.erase(0, dflt.find_first_not_of(' '));
      dflt.erase(dflt.find_last_not_of(' ') + 1);
      out[command].push_back({m[1], dflt});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("docs: runs.md lists every subcommand and option of --help, no doc names one qattn lacks",
          "[cli][docs]") {
  const auto d = scratch_dir("cli_docs");
  // The commands that run: the leaves of the subcommand tree.
  std::map<std::string, Help> commands;
  std::vector<std::vector<std::string>> todo = {{}};
  while (!todo.empty()) {
    const std::vector<std::string> sub = todo.back();
    todo.pop_back();
    const Help h = help_of(sub, d / "help.log");
    for (const auto& s : h.subcommands) {
      todo.push_back(sub);
      todo.back().push_back(s);
    }
    if (h.subcommands.empty()) commands[fmt::format("{}", fmt::join(sub, " "))] = h;
  }
  REQUIRE(commands.size() >= 10);

  const auto reference = command_reference();
  for (const auto& [command, rows] : reference) {
    INFO("docs/runs.md: qattn " << command);
    CHECK(commands.count(command));  // a command qattn has
  }
  for (const auto& [command, h] : commands) {
    INFO("qattn " << command << " --help");
    const auto it = reference.find(command);
    REQUIRE(it != reference.end());  // has its section in docs/runs.md
    std::set<std::string> documented;
    int positionals = 0;
    for (const auto& [first, dflt] : it->second) {
      INFO("docs/runs.md, qattn " << command << ": `" << first << "` | " << dflt);
      const std::string name = first.substr(0, first.find(' '));
      if (name.rfind("--", 0) != 0) {
        ++positionals;
        continue;
      }
      CHECK(documented.insert(name).second);
      CHECK(h.options.count(name));  // an option the command has
      const auto shown = h.defaults.find(name);
      CHECK(dflt == (shown == h.defaults.end() ? "" : shown->second));  // the default --help shows
    }
    for (const auto& o : h.options) {
      INFO(o);
      CHECK(documented.count(o));  // every option is documented
    }
    CHECK(positionals == h.positionals);
  }

  // Every qattn command any doc shows names a subcommand and options it has.
  int mentions = 0;
  for (const Mention& m : qattn_mentions()) {
    INFO(m.where << ": qattn " << fmt::format("{}", fmt::join(m.words, " ")));
    std::string command;
    size_t i = 0;
    for (; i < m.words.size() && std::regex_match(m.words[i], std::regex("[a-z]+")); ++i) {
      const std::string longer = command.empty() ? m.words[i] : command + " " + m.words[i];
      const bool is_prefix = std::any_of(commands.begin(), commands.end(), [&](const auto& c) {
        return c.first == longer || c.first.rfind(longer + " ", 0) == 0;
      });
      if (!is_prefix) break;
      command = longer;
    }
    if (command.empty()) {
      // `qattn` alone, or followed by a placeholder; a lower-case word must be a subcommand.
      CHECK_FALSE((i < m.words.size() && std::regex_match(m.words[i], std::regex("[a-z]+"))));
      continue;
    }
    if (!commands.count(command)) continue;  // "qattn bench" in the text: its subcommand follows elsewhere
    ++mentions;
    const Help& h = commands.at(command);
    for (const auto& o : shown_in({m.words.begin() + static_cast<long>(i), m.words.end()}, h).options) {
      INFO(o);
      CHECK(h.options.count(o));
    }
  }
  CHECK(mentions >= 40);
}
