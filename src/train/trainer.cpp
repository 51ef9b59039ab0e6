// The training loop. One optimizer step = grad_accum micro-batches of
// (micro_batch, seq_len) tokens, then clip, AdamW, a metrics row, and on its
// schedule an evaluation and the SPEC §5 diagnostics.
#include "qattn/trainer.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "qattn/data.hpp"
#include "qattn/optimizer.hpp"

namespace qattn {

namespace fs = std::filesystem;

namespace {

std::string fmt_or_empty(bool present, double x, const char* f = "{:.6f}") {
  return present ? fmt::format(fmt::runtime(f), x) : std::string();
}

double mean_val_loss(Backend& backend, DataLoader& val, int batches, int B, int T) {
  std::vector<int32_t> in, tg;
  val.reset();
  double sum = 0;
  for (int i = 0; i < batches; ++i) {
    val.next(in, tg);
    sum += backend.forward_loss(in.data(), tg.data(), B, T);
  }
  return sum / batches;
}

void write_diag(std::ofstream& csv, int64_t step, const std::vector<LayerDiag>& rows) {
  for (const auto& d : rows) {
    csv << step << ',' << d.layer << ',' << d.q_rms << ',' << d.k_rms << ',' << d.max_abs_score;
    const double cmp[12] = {d.cos_o, d.cos_p, d.cos_ds, d.cos_dq, d.cos_dk, d.cos_dv,
                            d.rel_o, d.rel_p, d.rel_ds, d.rel_dq, d.rel_dk, d.rel_dv};
    for (double x : cmp) csv << ',' << (d.compared ? fmt::format("{:.8g}", x) : std::string());
    csv << '\n';
  }
  csv.flush();
}

}  // namespace

std::string run_directory(const Config& cfg) { return (fs::path(cfg.log.out) / cfg.log.name).string(); }

TrainResult train(const Config& cfg, Backend& backend, const std::string& run_dir) {
  const TrainConfig& tc = cfg.train;
  const int B = tc.micro_batch, T = cfg.model.seq_len;

  // ---- run directory and logs
  fs::create_directories(run_dir);
  {
    std::ofstream f(run_dir + "/config.json");
    f << cfg.effective.dump(2) << '\n';
  }
  auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(run_dir + "/events.log", true);
  auto console_sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
  spdlog::logger log("train", {console_sink, file_sink});
  log.set_pattern("[%H:%M:%S] %v");
  log.flush_on(spdlog::level::info);

  // ---- data
  DataLoader train_data(cfg.data.train, B, T, /*shuffle=*/true, tc.seed);
  DataLoader val_data(cfg.data.val, B, T, /*shuffle=*/false, tc.seed);
  for (const DataLoader* d : {&train_data, &val_data})
    if (d->max_token() >= cfg.model.vocab)
      throw DataError("data holds token id " + std::to_string(d->max_token()) +
                      " but model.vocab = " + std::to_string(cfg.model.vocab) +
                      "; allowed: model.vocab > every token id");
  const double fpt = flops_per_token(cfg.model);
  log.info("run {} | backend {} | {} parameters | {} layers x {} dim x {} heads, T {} | attention {}",
           cfg.log.name, backend.name(), num_parameters(cfg.model), cfg.model.layers,
           cfg.model.dim, cfg.model.heads, T, to_string(cfg.attention.kind));
  log.info("data: train {} tokens, val {} tokens | {} tokens/step = {} x {} x {} accum | {} steps",
           train_data.num_tokens(), val_data.num_tokens(), tc.tokens_per_step, B, T,
           tc.grad_accum, tc.steps);
  if (backend.memory_bytes()) log.info("device memory reserved: {:.2f} GiB", backend.memory_bytes() / 1073741824.0);

  std::ofstream metrics(run_dir + "/metrics.csv", std::ios::trunc);
  metrics << "step,tokens,lr,train_loss,val_loss,grad_norm,step_ms,tokens_per_s,mfu,event\n";
  std::ofstream diag;
  std::vector<int32_t> probe_in, probe_tg;
  if (cfg.log.diag_every > 0) {
    diag.open(run_dir + "/diag.csv", std::ios::trunc);
    diag << "step,layer,q_rms,k_rms,max_abs_score,cos_o,cos_p,cos_ds,cos_dq,cos_dk,cos_dv,"
            "rel_o,rel_p,rel_ds,rel_dq,rel_dk,rel_dv\n";
    val_data.reset();
    val_data.next(probe_in, probe_tg);  // the fixed probe batch: the first val batch
  }

  TrainResult result;
  auto evaluate = [&](int64_t step) {
    result.last_val_loss = mean_val_loss(backend, val_data, cfg.eval.batches, B, T);
    return result.last_val_loss;
  };
  // Step 0: the untrained model.
  const double val0 = evaluate(0);
  metrics << "0,0,,," << fmt::format("{:.6f}", val0) << ",,,,,\n";
  log.info("step 0 | val loss {:.4f}", val0);
  if (diag.is_open())
    write_diag(diag, 0, backend.diagnostics(probe_in.data(), probe_tg.data(), B, T));

  std::vector<int32_t> in, tg;
  double total_ms = 0;
  for (int64_t step = 1; step <= tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(tc, step - 1);
    backend.zero_grad();
    double loss = 0;
    for (int micro = 0; micro < tc.grad_accum; ++micro) {
      train_data.next(in, tg);
      loss += backend.forward_backward(in.data(), tg.data(), B, T, 1.0f / tc.grad_accum);
    }
    loss /= tc.grad_accum;
    const double norm = backend.grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      result.diverged = true;
      result.reason = !std::isfinite(loss) ? fmt::format("non-finite train loss ({}) at step {}", loss, step)
                                           : fmt::format("non-finite grad norm ({}) at step {}", norm, step);
      metrics << step << ',' << step * tc.tokens_per_step << ',' << lr << ',' << loss << ",," << norm
              << ",,,,diverged: " << result.reason << '\n';
      metrics.flush();
      log.error("diverged: {}; stopping (no update applied at step {})", result.reason, step);
      result.steps_done = step - 1;
      return result;
    }
    const float grad_mult = (tc.grad_clip > 0 && norm > tc.grad_clip) ? static_cast<float>(tc.grad_clip / norm) : 1.0f;
    backend.adamw_step({static_cast<float>(lr), static_cast<float>(tc.beta1), static_cast<float>(tc.beta2),
                        static_cast<float>(tc.eps), static_cast<float>(tc.weight_decay)},
                       grad_mult, step);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    total_ms += ms;
    const double tok_s = tc.tokens_per_step / (ms / 1000.0);
    const double mfu = backend.peak_flops() > 0 ? fpt * tok_s / backend.peak_flops() : 0.0;

    const bool eval_now = (cfg.eval.every > 0 && step % cfg.eval.every == 0) || step == tc.steps;
    const double val = eval_now ? evaluate(step) : 0.0;
    metrics << step << ',' << step * tc.tokens_per_step << ',' << fmt::format("{:.6g}", lr) << ','
            << fmt::format("{:.6f}", loss) << ',' << fmt_or_empty(eval_now, val) << ','
            << fmt::format("{:.6f}", norm) << ',' << fmt::format("{:.2f}", ms) << ','
            << fmt::format("{:.0f}", tok_s) << ',' << fmt_or_empty(mfu > 0, mfu, "{:.4f}") << ",\n";
    metrics.flush();
    if (diag.is_open() && step % cfg.log.diag_every == 0)
      write_diag(diag, step, backend.diagnostics(probe_in.data(), probe_tg.data(), B, T));
    if (step % cfg.log.every == 0 || eval_now || step == tc.steps) {
      const double left_s = total_ms / step * (tc.steps - step) / 1000.0;
      log.info("step {:>6}/{} | loss {:.4f}{} | norm {:.3f} | lr {:.2e} | {:.1f} ms | {:.0f} tok/s{} | {:.0f}s left",
               step, tc.steps, loss, eval_now ? fmt::format(" | val {:.4f}", val) : "", norm, lr, ms,
               tok_s, mfu > 0 ? fmt::format(" | MFU {:.1f}%", 100 * mfu) : "", left_s);
    }
    result.steps_done = step;
  }
  log.info("done: {} steps, final val loss {:.4f}, {:.1f} s", result.steps_done, result.last_val_loss, total_ms / 1000);
  return result;
}

}  // namespace qattn
