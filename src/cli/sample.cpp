// qattn sample --checkpoint DIR --prompt TEXT --tokens N [--temperature T --top-k K --seed S --ids]
// Generates text from a checkpoint with the CPU model: the context is
// end-of-text + the prompt, each new token is drawn from the softmax of the
// last position's logits / T over the K most likely tokens (T = 0: greedy).
// --ids prints the new tokens' ids instead of text, for comparing with
// another implementation token for token (tools/dev/hf_check.sh).
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <numeric>
#include <random>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/checkpoint.hpp"
#include "qattn/cpu/gpt2.hpp"
#include "qattn/tokenizer.hpp"

namespace qattn::cli {

namespace {

// Draws a token id from one row of logits (vocab).
int sample_token(const float* logits, int vocab, double temperature, int top_k, std::mt19937_64& rng) {
  if (temperature <= 0) return static_cast<int>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  const int k = top_k > 0 ? std::min(top_k, vocab) : vocab;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> p(k);
  for (int i = 0; i < k; ++i) p[i] = std::exp((logits[ids[i]] - logits[ids[0]]) / temperature);
  std::discrete_distribution<int> pick(p.begin(), p.end());
  return ids[pick(rng)];
}

// The tokenizer a model's vocab implies (bytes: 257, gpt2: 50257), or the one asked for.
std::unique_ptr<Tokenizer> tokenizer_for(const std::string& kind, int vocab, const std::string& vocab_dir) {
  std::string k = kind;
  if (k == "auto") {
    if (vocab == 257) k = "bytes";
    else if (vocab == 50257) k = "gpt2";
    else
      throw std::runtime_error("sample: model.vocab = " + std::to_string(vocab) +
                               " matches no known tokenizer (bytes: 257, gpt2: 50257); give --tokenizer");
  }
  auto t = make_tokenizer(k, vocab_dir);
  if (t->vocab_size() > vocab)
    throw std::runtime_error("sample: tokenizer " + k + " has " + std::to_string(t->vocab_size()) +
                             " tokens but the model only " + std::to_string(vocab));
  return t;
}

}  // namespace

void add_sample_command(CLI::App& app) {
  struct Args {
    std::string checkpoint, prompt, tokenizer = "auto", vocab_dir = "data/cache/gpt2";
    int tokens = 200, top_k = 40;
    double temperature = 1.0;
    uint64_t seed = 1337;
    bool ids = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint directory, or a run directory (its newest checkpoint)")
      ->required()
      ->check(nonempty_path());
  cmd->add_option("--prompt", args->prompt, "text the generation continues")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "tokens to generate")->check(integer_range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "softmax temperature (0: greedy)")
      ->check(number_range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "sample among the K most likely tokens (0: all)")
      ->check(integer_range(0, 65536))
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "sampling seed")
      ->check(integer_range(0, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer, "auto (from model.vocab), bytes or gpt2")
      ->check(CLI::IsMember({"auto", "bytes", "gpt2"}))
      ->capture_default_str();
  cmd->add_flag("--ids", args->ids, "print the generated token ids, space-separated, instead of the text");
  cmd->add_option("--vocab", args->vocab_dir, "gpt2: directory with encoder.json and vocab.bpe")
      ->check(nonempty_path())
      ->capture_default_str();
  cmd->callback([args] {
    const Checkpoint ck = load_checkpoint(resolve_checkpoint(args->checkpoint));
    const Config cfg = config_of_checkpoint(ck.config);
    cpu::Gpt2<float> model(cfg.model, cfg.attention_per_layer());
    if (ck.params.size() != model.params.size())
      throw CheckpointError("sample: the checkpoint holds " + std::to_string(ck.params.size()) +
                            " parameters; its config's model has " + std::to_string(model.params.size()));
    model.params = ck.params;
    const auto tokenizer = tokenizer_for(args->tokenizer, cfg.model.vocab, args->vocab_dir);

    std::vector<int32_t> context = {tokenizer->eot()};
    for (uint16_t t : tokenizer->encode(args->prompt)) context.push_back(t);
    std::mt19937_64 rng(args->seed);
    const int V = cfg.model.vocab, T_max = cfg.model.seq_len;
    // A model's vocab may be larger than its tokenizer's (padded, or trained on
    // ids of another tokenizer): draw among the ids the tokenizer can decode.
    const int drawn = tokenizer->vocab_size();
    if (!args->ids) std::cout << args->prompt << std::flush;
    for (int n = 0; n < args->tokens; ++n) {
      // The last seq_len tokens; the targets are unused but the forward computes a loss.
      const int T = std::min<int>(static_cast<int>(context.size()), T_max);
      const std::vector<int32_t> window(context.end() - T, context.end()), targets(T, 0);
      model.forward(window.data(), targets.data(), 1, T);
      const int next = sample_token(model.logits().data() + static_cast<size_t>(T - 1) * V, drawn,
                                    args->temperature, args->top_k, rng);
      context.push_back(next);
      const uint16_t tok = static_cast<uint16_t>(next);
      if (args->ids)
        std::cout << (n ? " " : "") << next << std::flush;
      else
        std::cout << tokenizer->decode({&tok, 1}) << std::flush;
    }
    std::cout << '\n';
  });
}

}  // namespace qattn::cli
