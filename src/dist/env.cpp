// The launcher's environment -> DistEnv (torchrun, OpenMPI and Slurm names).
#include <charconv>
#include <string>

#include "qattn/dist.hpp"

namespace qattn {

namespace {

// The three naming schemes, in the order they are tried.
struct Scheme {
  const char* source;
  const char* rank;
  const char* world;
  const char* local_rank;
};
constexpr Scheme kSchemes[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

// The integer value of `name`, or `fallback` when unset; an error when it is
// not an integer in [lo, hi].
long env_int(const EnvLookup& get, const char* name, long fallback, long lo, long hi,
             const std::string& allowed) {
  const char* text = get(name);
  if (!text) return fallback;
  const std::string s(text);
  long value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || value < lo || value > hi)
    throw DistError(std::string(name) + "=\"" + s + "\": allowed: " + allowed);
  return value;
}

}  // namespace

std::optional<DistEnv> dist_env_from(const EnvLookup& get) {
  for (const Scheme& s : kSchemes) {
    if (!get(s.rank)) continue;
    if (!get(s.world))
      throw DistError(std::string(s.rank) + " is set but " + s.world +
                      " is not; allowed: both (the " + s.source + " launcher sets both)");
    DistEnv env;
    env.source = s.source;
    env.world = static_cast<int>(env_int(get, s.world, 1, 1, 1 << 20, "an integer >= 1"));
    env.rank = static_cast<int>(env_int(get, s.rank, 0, 0, env.world - 1,
                                        "an integer in [0, " + std::string(s.world) + " = " +
                                            std::to_string(env.world) + ")"));
    env.local_rank = static_cast<int>(env_int(get, s.local_rank, 0, 0, 1 << 20, "an integer >= 0"));
    if (const char* addr = get("MASTER_ADDR")) {
      if (!*addr) throw DistError("MASTER_ADDR is empty; allowed: a host name or IP address");
      env.master_addr = addr;
    } else if (env.world > 1) {
      throw DistError(std::string("MASTER_ADDR is not set but ") + s.world + " = " +
                      std::to_string(env.world) +
                      "; allowed: the host name or IP address of rank 0's node");
    }
    env.master_port = static_cast<int>(
        env_int(get, "MASTER_PORT", env.master_port, 1, 65535, "an integer in [1, 65535]"));
    return env;
  }
  return std::nullopt;
}

double dist_timeout_seconds(const EnvLookup& get) {
  return static_cast<double>(
      env_int(get, "QATTN_DIST_TIMEOUT_S", 600, 1, 7 * 24 * 3600, "whole seconds in [1, 604800]"));
}

}  // namespace qattn
