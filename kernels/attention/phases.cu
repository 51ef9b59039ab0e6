// PhaseRecorder (phases.cuh).
#include <stdexcept>
#include <string>

#include "attention/phases.cuh"
#include "common.cuh"

namespace qattn::cuda {

double causal_product_flops(const AttentionShape& s, int products) {
  return static_cast<double>(products) * s.B * s.H * static_cast<double>(s.T) * s.T * s.d;
}

PhaseRecorder::~PhaseRecorder() {
  for (const Recorded& r : recorded_) cudaEventDestroy(r.start), cudaEventDestroy(r.stop);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t PhaseRecorder::event() {
  if (!free_.empty()) {
    const cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void PhaseRecorder::begin(const char* name, PhaseWork work, cudaStream_t stream) {
  if (open_)
    throw std::logic_error(std::string("PhaseRecorder: phase '") + name + "' begun inside phase '" +
                           recorded_.back().name + "'");
  recorded_.push_back({name, work, event(), event()});
  open_ = true;
  CUDA_CHECK(cudaEventRecord(recorded_.back().start, stream));
}

void PhaseRecorder::end(cudaStream_t stream) {
  if (!open_) throw std::logic_error("PhaseRecorder: end() with no phase begun");
  open_ = false;
  CUDA_CHECK(cudaEventRecord(recorded_.back().stop, stream));
}

std::vector<TimedPhase> PhaseRecorder::take() {
  if (open_)
    throw std::logic_error("PhaseRecorder: take() inside phase '" + recorded_.back().name + "'");
  std::vector<TimedPhase> out;
  if (!recorded_.empty()) CUDA_CHECK(cudaEventSynchronize(recorded_.back().stop));
  for (const Recorded& r : recorded_) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    out.push_back({r.name, r.work, ms});
  }
  for (const Recorded& r : recorded_) free_.push_back(r.start), free_.push_back(r.stop);
  recorded_.clear();
  return out;
}

}  // namespace qattn::cuda
