// The launches of one attention call, timed one by one (`qattn bench attention
// --phases`). Every launcher of the attention kinds runs each of its launches
// through in_phase, naming it and the work it does; a caller that hands the
// call a PhaseRecorder gets a CUDA event recorded before and after each
// launch. Without one (training, the tests) in_phase only launches.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "attention/attention.cuh"

namespace qattn::cuda {

// The work of one launch where it is known (0: not known): the bytes it must
// move through device memory (each array it reads or writes counted once), or
// the FLOPs of its matrix products.
struct PhaseWork {
  double bytes = 0, flops = 0;
};

// FLOPs of `products` causal products over a (T, T) score matrix and d, each
// counted over the causal half as FlashAttention counts it: B·H·T²·d (the
// forward's two make the bench's 2·B·H·T²·d).
double causal_product_flops(const AttentionShape& s, int products);

struct TimedPhase {
  std::string name;
  PhaseWork work;
  float ms;
};

// Events around each launch of the calls it is handed, in launch order. The
// events are reused from one take() to the next.
class PhaseRecorder {
 public:
  PhaseRecorder() = default;
  ~PhaseRecorder();
  PhaseRecorder(const PhaseRecorder&) = delete;
  PhaseRecorder& operator=(const PhaseRecorder&) = delete;

  // One phase is one launch: begin inside an open phase, or end outside one,
  // is a launcher's bug (std::logic_error).
  void begin(const char* name, PhaseWork work, cudaStream_t stream);
  void end(cudaStream_t stream);
  // The phases recorded since the last take(), with their times (waits for
  // the last to finish).
  std::vector<TimedPhase> take();

 private:
  struct Recorded {
    std::string name;
    PhaseWork work;
    cudaEvent_t start, stop;
  };
  cudaEvent_t event();  // a free one, or a new one
  std::vector<Recorded> recorded_;
  std::vector<cudaEvent_t> free_;
  bool open_ = false;
};

// Runs launch(), one kernel launch, as phase `name` of `phases` (null: just launch()).
template <class Launch>
void in_phase(PhaseRecorder* phases, const char* name, PhaseWork work, cudaStream_t stream,
              Launch&& launch) {
  if (phases == nullptr) return launch();
  phases->begin(name, work, stream);
  launch();
  phases->end(stream);
}

}  // namespace qattn::cuda
