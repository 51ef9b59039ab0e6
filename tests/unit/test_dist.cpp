// Several processes on the CPU: the launcher's environment, the TCP rendezvous
// (threads and processes on loopback), its deadlines, the local launcher with
// dummy workers (4 and 8 ranks, a dying worker, one that ignores SIGTERM,
// forwarded signals), `qattn train`'s refusals, the trainer's rank handling
// (over a stand-in for a second rank) and the CUDA backend's shard arithmetic
// (src/cuda/device_layout.hpp is plain C++).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../../src/cuda/device_layout.hpp"
#include "qattn/backend.hpp"
#include "qattn/data.hpp"
#include "qattn/dist.hpp"
#include "qattn/trainer.hpp"
#include "run_helpers.hpp"

namespace {

using qattn::DistEnv;
using qattn::DistError;
using Clock = std::chrono::steady_clock;

qattn::EnvLookup lookup(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

DistEnv local_env(int rank, int world, int port) {
  DistEnv e;
  e.rank = rank;
  e.world = world;
  e.local_rank = rank;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

// The CPU backend presented as rank `rank` of `world` whose peers all hold the
// same values: sums over the ranks are world x the local value.
class RankStandIn final : public qattn::Backend {
 public:
  RankStandIn(const qattn::Config& cfg, int rank, int world)
      : inner_(qattn::make_cpu_backend(cfg)), rank_(rank), world_(world) {}
  std::string name() const override { return inner_->name(); }
  const qattn::ParamLayout& layout() const override { return inner_->layout(); }
  void get_params(std::vector<float>& out) override { inner_->get_params(out); }
  void set_params(const std::vector<float>& in) override { inner_->set_params(in); }
  void get_grads(std::vector<float>& out) override { inner_->get_grads(out); }
  void get_adam_state(std::vector<float>& m, std::vector<float>& v) override { inner_->get_adam_state(m, v); }
  void set_adam_state(const std::vector<float>& m, const std::vector<float>& v) override {
    inner_->set_adam_state(m, v);
  }
  void zero_grad() override { inner_->zero_grad(); }
  float forward_backward(const int32_t* in, const int32_t* tg, int B, int T, float scale) override {
    return inner_->forward_backward(in, tg, B, T, scale);
  }
  float forward_loss(const int32_t* in, const int32_t* tg, int B, int T) override {
    return inner_->forward_loss(in, tg, B, T);
  }
  float grad_norm() override { return inner_->grad_norm(); }
  void adamw_step(const qattn::AdamWHyper& h, float mult, int64_t t) override { inner_->adamw_step(h, mult, t); }
  std::vector<qattn::LayerDiag> diagnostics(const int32_t* in, const int32_t* tg, int B, int T) override {
    return inner_->diagnostics(in, tg, B, T);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void sum_over_ranks(double* values, int n) override {
    for (int i = 0; i < n; ++i) values[i] *= world_;
  }

 private:
  std::unique_ptr<qattn::Backend> inner_;
  int rank_, world_;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

qattn::LaunchOptions shell_workers(int nproc, const std::string& script, double grace_s = 10.0) {
  qattn::LaunchOptions o;
  o.nproc = nproc;
  o.argv = {"/bin/sh", "-c", script};
  o.grace_s = grace_s;
  return o;
}

}  // namespace

TEST_CASE("the launcher's environment maps to rank, world and rendezvous address", "[dist]") {
  CHECK_FALSE(qattn::dist_env_from(lookup({})).has_value());

  auto t = qattn::dist_env_from(lookup({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                        {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}}));
  REQUIRE(t);
  CHECK((t->rank == 3 && t->world == 8 && t->local_rank == 1 && t->master_addr == "node7" &&
         t->master_port == 1234 && t->source == "torchrun"));

  auto m = qattn::dist_env_from(lookup({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"MASTER_ADDR", "10.0.0.1"}}));
  REQUIRE(m);
  CHECK((m->rank == 2 && m->world == 4 && m->local_rank == 0 && m->master_port == 29500 &&
         m->source == "openmpi"));

  auto s = qattn::dist_env_from(lookup({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"},
                                        {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29400"}}));
  REQUIRE(s);
  CHECK((s->rank == 5 && s->world == 6 && s->local_rank == 1 && s->source == "slurm"));

  // torchrun's names win over Slurm's (torchrun started inside an allocation).
  auto both = qattn::dist_env_from(lookup({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "1"},
                                           {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "h"}}));
  REQUIRE(both);
  CHECK((both->source == "torchrun" && both->world == 2));

  // One process needs no address.
  auto single = qattn::dist_env_from(lookup({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  REQUIRE(single);
  CHECK(single->world == 1);
}

TEST_CASE("a bad launcher environment is an error naming the variable and what is allowed", "[dist]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(qattn::dist_env_from(lookup({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
                    Contains("RANK=\"x\"") && Contains("[0, WORLD_SIZE = 2)"));
  CHECK_THROWS_WITH(qattn::dist_env_from(lookup({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})),
                    Contains("RANK=\"2\""));
  CHECK_THROWS_WITH(qattn::dist_env_from(lookup({{"RANK", "0"}})), Contains("WORLD_SIZE is not"));
  CHECK_THROWS_WITH(qattn::dist_env_from(lookup({{"RANK", "0"}, {"WORLD_SIZE", "2"}})),
                    Contains("MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(
      qattn::dist_env_from(lookup({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})),
      Contains("MASTER_PORT=\"70000\"") && Contains("[1, 65535]"));
  CHECK_THROWS_WITH(qattn::dist_env_from(lookup({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}})),
                    Contains("SLURM_NTASKS=\"0\""));
  CHECK(qattn::dist_timeout_seconds(lookup({})) == 600);
  CHECK(qattn::dist_timeout_seconds(lookup({{"QATTN_DIST_TIMEOUT_S", "30"}})) == 30);
  CHECK_THROWS_WITH(qattn::dist_timeout_seconds(lookup({{"QATTN_DIST_TIMEOUT_S", "0"}})),
                    Contains("QATTN_DIST_TIMEOUT_S=\"0\""));
}

TEST_CASE("the rendezvous hands rank 0's payload to every rank (threads)", "[dist]") {
  for (int world : {1, 2, 8}) {
    const int port = qattn::free_tcp_port();
    std::vector<std::string> got(world);
    std::vector<std::string> errors(world);
    std::vector<std::thread> ranks;
    // Rank 0 starts last: the others retry until it listens.
    for (int r = world - 1; r >= 0; --r) {
      ranks.emplace_back([&, r] {
        try {
          got[r] = qattn::rendezvous(local_env(r, world, port), r == 0 ? std::string("nccl-id\0x", 9) : "", 20);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r << ": " << errors[r]);
      CHECK(got[r] == std::string("nccl-id\0x", 9));
    }
  }
}

TEST_CASE("the rendezvous works between processes", "[dist]") {
  const int world = 3, port = qattn::free_tcp_port();
  std::vector<pid_t> children;
  for (int r = 1; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = qattn::rendezvous(local_env(r, world, port), "", 20) == "id-from-0" ? 0 : 2;
      } catch (...) {
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  CHECK(qattn::rendezvous(local_env(0, world, port), "id-from-0", 20) == "id-from-0");
  for (pid_t p : children) {
    int status = 0;
    ::waitpid(p, &status, 0);
    CHECK(qattn::test::exit_code(status) == 0);
  }
}

TEST_CASE("the rendezvous gives up at its deadline with a clear error", "[dist]") {
  using Catch::Contains;
  const int port = qattn::free_tcp_port();
  auto t0 = Clock::now();
  // Nobody listens: a joining rank names the address and what to check.
  CHECK_THROWS_WITH(qattn::rendezvous(local_env(2, 4, port), "", 0.5),
                    Contains("rank 2") && Contains("127.0.0.1:" + std::to_string(port)) &&
                        Contains("could not reach rank 0"));
  CHECK(seconds_since(t0) < 5);
  // Rank 0 waits for ranks that never come and names them.
  t0 = Clock::now();
  std::string heard;
  std::thread one([&] {
    try {
      qattn::rendezvous(local_env(1, 3, port), "", 0.8);
    } catch (const DistError& e) {
      heard = e.what();
    }
  });
  CHECK_THROWS_WITH(qattn::rendezvous(local_env(0, 3, port), "id", 0.5),
                    Contains("rank 0") && Contains("rank(s) 2 did not join within 0.5 s"));
  one.join();
  CHECK_THAT(heard, Contains("rank 1: rendezvous failed"));  // rank 1 hears why
  CHECK(seconds_since(t0) < 5);
}

TEST_CASE("the rendezvous rejects mismatched world sizes and duplicate ranks", "[dist]") {
  using Catch::Contains;
  for (const auto& [rank_a, world_a, expected] :
       {std::tuple{1, 4, "world size is 4"}, std::tuple{1, 3, "a second process joined as rank 1"}}) {
    const int port = qattn::free_tcp_port();
    std::string error_b, error_a;
    std::thread a([&, rank_a = rank_a, world_a = world_a] {
      try {
        qattn::rendezvous(local_env(rank_a, world_a, port), "", 10);
      } catch (const DistError& e) {
        error_a = e.what();
      }
    });
    std::thread b([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      try {
        qattn::rendezvous(local_env(1, 3, port), "", 1);  // too late when rank 0 already failed
      } catch (const DistError& e) {
        error_b = e.what();
      }
    });
    CHECK_THROWS_WITH(qattn::rendezvous(local_env(0, 3, port), "id", 10), Contains(expected));
    a.join();
    b.join();
    CHECK((error_a + error_b).find("rendezvous failed") != std::string::npos);
  }
}

TEST_CASE("the launcher starts N workers with their rank variables (4 and 8 ranks)", "[dist]") {
  for (int n : {1, 4, 8}) {
    const std::string check = "test \"$RANK\" = \"$LOCAL_RANK\" && test \"$WORLD_SIZE\" = " + std::to_string(n) +
                              " && test \"$LOCAL_WORLD_SIZE\" = " + std::to_string(n) +
                              " && test \"$RANK\" -lt " + std::to_string(n) +
                              " && test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0";
    CHECK(qattn::launch_workers(shell_workers(n, check)) == 0);
  }
  CHECK(qattn::launch_workers(shell_workers(3, "exit 0")) == 0);
  CHECK_THROWS_WITH(qattn::launch_workers(shell_workers(0, "true")), Catch::Contains("--nproc 0"));
}

TEST_CASE("when a worker dies the launcher stops the rest and returns its code", "[dist]") {
  auto t0 = Clock::now();
  CHECK(qattn::launch_workers(shell_workers(4, "if [ \"$RANK\" = 2 ]; then sleep 0.2; exit 7; fi; exec sleep 60")) == 7);
  CHECK(seconds_since(t0) < 10);
  // A worker that ignores SIGTERM gets SIGKILL after the grace period.
  t0 = Clock::now();
  CHECK(qattn::launch_workers(shell_workers(
            2, "if [ \"$RANK\" = 1 ]; then sleep 0.2; kill -SEGV $$; fi; trap '' TERM; sleep 60", 0.5)) ==
        128 + SIGSEGV);
  CHECK(seconds_since(t0) < 10);
}

TEST_CASE("the launcher forwards SIGINT to every worker", "[dist]") {
  std::thread interrupt([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(::getpid(), SIGINT);
  });
  const int code = qattn::launch_workers(shell_workers(3, "trap 'exit 4' INT; while :; do sleep 0.05; done"));
  interrupt.join();
  CHECK(code == 4);
}

TEST_CASE("one step reads the same windows on 1 rank and on 2 ranks", "[dist]") {
  const auto d = qattn::test::scratch_dir("dist_data");
  std::vector<uint16_t> tokens(32 * 8 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  qattn::write_shard((d / "x_000000.bin").string(), tokens.data(), tokens.size());
  const std::string glob = (d / "x_*.bin").string();
  // 1 rank: micro-batch 2, 4 accumulation steps. 2 ranks: micro-batch 2, 2 steps each.
  qattn::DataLoader one(glob, 2, 8, true, 3), r0(glob, 2, 8, true, 3, 0, 2), r1(glob, 2, 8, true, 3, 1, 2);
  std::vector<int32_t> in, tg;
  for (int step = 0; step < 3; ++step) {
    std::multiset<int32_t> a, b;
    for (int micro = 0; micro < 4; ++micro) {
      one.next(in, tg);
      a.insert(in.begin(), in.end());
    }
    for (int micro = 0; micro < 2; ++micro)
      for (auto* l : {&r0, &r1}) {
        l->next(in, tg);
        b.insert(in.begin(), in.end());
      }
    CHECK(a == b);
  }
}

TEST_CASE("qattn train refuses several processes without the CUDA backend", "[dist]") {
  namespace t = qattn::test;
  const auto d = t::scratch_dir("dist_cli");
  t::make_corpus(d);
  const auto cfg = t::write_json(d / "tiny.json", t::tiny_config(d, "tiny", 2));
  const auto log = d / "log.txt";
  CHECK(t::exit_code(t::run_qattn({"train", cfg.string(), "--nproc", "2"}, {}, log)) == 1);
  CHECK(t::read_text(log).find("several processes need the CUDA backend") != std::string::npos);
  CHECK(t::exit_code(t::run_qattn({"train", cfg.string()},
                                  {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}}, log)) == 1);
  CHECK(t::read_text(log).find("rank 1 of 2: several processes") != std::string::npos);
  // One rank under a launcher on the CPU trains as a single process.
  CHECK(t::exit_code(t::run_qattn({"train", cfg.string()}, {{"RANK", "0"}, {"WORLD_SIZE", "1"}}, log)) == 0);
  CHECK(t::loss_columns(d / "runs" / "tiny" / "metrics.csv").size() == 3);  // step 0 and 2 steps
}

TEST_CASE("only rank 0 writes the run's files", "[dist]") {
  namespace t = qattn::test;
  namespace fs = std::filesystem;
  const auto d = t::scratch_dir("dist_ranks");
  t::make_corpus(d);
  auto j = t::tiny_config(d, "ranked", 4);
  j["log"]["diag_every"] = 2;
  const qattn::Config cfg = qattn::config_from_json(j, "", 2);  // 2 ranks: grad_accum 1
  REQUIRE(cfg.train.grad_accum == 1);
  std::map<int, qattn::TrainResult> results;
  for (int rank : {1, 0}) {
    RankStandIn be(cfg, rank, 2);
    const std::string dir = (d / ("rank" + std::to_string(rank))).string();
    results[rank] = qattn::train(cfg, be, dir);
    CHECK(results[rank].status == qattn::RunStatus::finished);
    for (const char* f : {"config.json", "metrics.csv", "diag.csv", "events.log", "status.json", "checkpoints"})
      CHECK(fs::exists(fs::path(dir) / f) == (rank == 0));
  }
  CHECK(results[1].steps_done == 4);  // the other rank trained all the same
}

TEST_CASE("ZeRO-1 shards partition every block, aligned, and cover every parameter", "[dist]") {
  using qattn::cuda::DeviceLayout;
  using qattn::QkNormForm;
  for (QkNormForm form : {QkNormForm::off, QkNormForm::gain, QkNormForm::logit_scale}) {
    qattn::ModelConfig m;
    m.vocab = 1000;
    m.layers = 3;
    m.heads = 2;
    m.dim = 64;
    m.seq_len = 32;
    m.qk_norm.form = form;
    const qattn::ParamLayout canonical(m);
    const size_t padded_wte = 1024 * 64;
    for (int world : {1, 2, 3, 8}) {
      INFO("world " << world << " qk_norm " << qattn::to_string(form));
      std::vector<DeviceLayout> ranks;
      for (int r = 0; r < world; ++r) ranks.emplace_back(canonical, m.layers, padded_wte, world, r);
      const DeviceLayout& L = ranks[0];
      CHECK(L.blocks() == m.layers + 1);
      CHECK(L.packed_total() * world == L.total());
      // Every element of the buffer is owned by exactly one rank, and every
      // rank's packed offsets are distinct and inside its packed state.
      std::vector<int> owner(L.total(), 0);
      for (const auto& R : ranks) {
        std::vector<int> packed_used(R.packed_total(), 0);
        for (const auto& o : R.owned()) {
          CHECK(o.begin % DeviceLayout::kAlign == 0);
          CHECK(o.packed % DeviceLayout::kAlign == 0);
          REQUIRE(o.packed + o.count <= R.packed_total());
          for (size_t i = 0; i < o.count; ++i) {
            ++owner[o.begin + i];
            ++packed_used[o.packed + i];
          }
        }
        CHECK(std::count(packed_used.begin(), packed_used.end(), 1) == static_cast<long>(R.packed_total()));
      }
      CHECK(std::count(owner.begin(), owner.end(), 1) == static_cast<long>(L.total()));
      // The slices: every canonical element once, each inside one block.
      size_t canonical_total = 0;
      for (const auto& s : L.slices()) {
        CHECK(s.offset % DeviceLayout::kAlign == 0);
        canonical_total += s.count;
        int block = 0;
        while (block + 1 < L.blocks() && L.block_begin(block + 1) <= s.offset) ++block;
        CHECK(s.offset + s.count <= L.block_begin(block) + L.block_size(block));
        CHECK((block == 0) == !qattn::ParamLayout::layered(s.tensor));
        CHECK(L.block_size(block) % (DeviceLayout::kAlign * world) == 0);
      }
      CHECK(canonical_total == canonical.total);
    }
  }
}
