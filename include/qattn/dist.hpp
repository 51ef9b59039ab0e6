// Several processes, one per GPU (docs/distributed.md): who this process
// is (the launcher's environment), the TCP rendezvous that hands every rank the
// NCCL unique id, and the local launcher behind `qattn train --nproc N`.
// Everything here is plain POSIX and runs (and is tested) without a GPU; the
// NCCL communicator itself lives in the CUDA backend (src/cuda/nccl_comm.*).
#pragma once
#include <cstdlib>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace qattn {

// A rendezvous, environment or launch problem; the message names the rank.
struct DistError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// This process's place in a data-parallel job.
struct DistEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;                    // the GPU index on this node
  std::string master_addr = "127.0.0.1"; // where rank 0 listens for the rendezvous
  int master_port = 29500;
  std::string source;                    // "torchrun", "openmpi" or "slurm"
};

using EnvLookup = std::function<const char*(const char*)>;

// Reads the launcher's variables through `get` (std::getenv by default), first
// match wins: torchrun's RANK / WORLD_SIZE / LOCAL_RANK, OpenMPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, Slurm's SLURM_PROCID /
// SLURM_NTASKS / SLURM_LOCALID; MASTER_ADDR and MASTER_PORT with all of them
// (MASTER_ADDR is required when WORLD_SIZE > 1; MASTER_PORT defaults to 29500).
// nullopt when none of the rank variables is set: a single process.
// Throws DistError naming the variable, its value and what is allowed.
std::optional<DistEnv> dist_env_from(const EnvLookup& get = std::getenv);

// Seconds a rank waits for the others (rendezvous, NCCL set-up, every
// collective) before it gives up with an error naming itself:
// QATTN_DIST_TIMEOUT_S, default 600 (evaluations and checkpoint writes of large
// models run between collectives, so the default is generous).
double dist_timeout_seconds(const EnvLookup& get = std::getenv);

// Rank 0 listens on master_port and hands `payload` to every other rank; the
// others connect to master_addr:master_port, retrying until the deadline, and
// receive it. Returns when every rank has joined (the payload on every rank),
// so it doubles as a barrier. Throws DistError naming this rank, the address
// and what did not happen when timeout_s passes, a rank joins twice, or the
// ranks disagree on the world size.
std::string rendezvous(const DistEnv& env, const std::string& payload, double timeout_s);

// A TCP port on 127.0.0.1 that was free a moment ago (for MASTER_PORT).
int free_tcp_port();

struct LaunchOptions {
  int nproc = 1;
  std::vector<std::string> argv;   // the worker's command line; argv[0] is the program
  double grace_s = 10.0;           // SIGTERM to SIGKILL, once a worker failed
  std::string master_addr = "127.0.0.1";
  int master_port = 0;             // 0: free_tcp_port()
};

// Spawns nproc workers with RANK = LOCAL_RANK = i, WORLD_SIZE = LOCAL_WORLD_SIZE
// = nproc, MASTER_ADDR and MASTER_PORT set, each in its own process group (a
// terminal's Ctrl-C reaches only the launcher, which forwards SIGINT and
// SIGTERM to every worker once per signal). When a worker fails (non-zero exit
// or killed) before any such signal, the others get SIGTERM at once and
// SIGKILL after grace_s, so a crashed rank never leaves the rest waiting on a
// collective; after a forwarded signal the workers end on their own. Workers die with
// the launcher (PR_SET_PDEATHSIG). Returns 0 when every worker exits 0, else
// the code of the first failure (128 + signal number when it was killed).
int launch_workers(const LaunchOptions& options);

}  // namespace qattn
