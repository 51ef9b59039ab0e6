// `qattn train` across processes (docs/distributed.md): --nproc N starts the
// workers on this node; a worker, or a process started by torchrun, Slurm or
// mpirun, joins the job and builds the data-parallel backend on its GPU.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qattn/backend.hpp"
#include "qattn/dist.hpp"

namespace qattn::cli {

// The job this process belongs to, per its environment (nullopt: a single
// process). Tags this process's console messages with its rank.
std::optional<DistEnv> distributed_env();

// Runs `qattn <worker_args>` as nproc workers on this node, one per GPU, for
// a config already validated with world size nproc; returns the launcher's
// exit code (0, or the first failing worker's).
int launch_train_workers(const Config& cfg, int nproc, const std::vector<std::string>& worker_args);

// This rank's backend: the data-parallel CUDA backend when env is set (and the
// CUDA backend is in use), else make_backend(cfg).
std::unique_ptr<Backend> make_rank_backend(const Config& cfg, const std::optional<DistEnv>& env);

}  // namespace qattn::cli
