// The code in a markdown file, for the tests that hold the docs to the code:
// the lines of its code blocks (fenced, or indented by four spaces after a
// blank line) and the `code spans` of its text (a span may run over a line
// break), each with the line it starts on.
#pragma once
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace qattn::test {

struct DocCode {
  std::vector<std::pair<int, std::string>> block_lines, spans;
};

inline DocCode doc_code(const std::filesystem::path& file) {
  std::ifstream f(file);
  static const std::regex code_span("`([^`]+)`");
  DocCode out;
  bool in_block = false;
  std::string text, paragraph;
  int paragraph_line = 0;
  // A paragraph ends at a blank line, a heading, a fence or a table row (a row is one line).
  const auto flush = [&] {
    for (auto it = std::sregex_iterator(paragraph.begin(), paragraph.end(), code_span);
         it != std::sregex_iterator(); ++it)
      out.spans.push_back({paragraph_line, (*it)[1]});
    paragraph.clear();
  };
  for (int n = 1; std::getline(f, text); ++n) {
    const bool fence = text.rfind("```", 0) == 0;
    if (fence || in_block) {
      if (fence) {
        flush();
        in_block = !in_block;
      } else {
        out.block_lines.push_back({n, text});
      }
      continue;
    }
    if (paragraph.empty() && text.rfind("    ", 0) == 0) {  // an indented block
      out.block_lines.push_back({n, text});
      continue;
    }
    const bool alone = text.rfind("#", 0) == 0 || text.rfind("|", 0) == 0;
    if (text.empty() || alone) flush();
    if (text.empty()) continue;
    if (paragraph.empty()) paragraph_line = n;
    paragraph += (paragraph.empty() ? "" : " ") + text;
    if (alone) flush();
  }
  flush();
  return out;
}

}  // namespace qattn::test
