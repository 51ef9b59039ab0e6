// SageBwd INT8 attention (SPEC §3).
#include <stdexcept>

#include "kinds.hpp"

namespace qattn::cpu {

template <typename F>
void sage_forward(const SageOptions&, int, int, const F*, const F*, const F*, F*) {
  throw std::runtime_error("attention.kind \"sage\": the CPU reference is not committed yet");
}
template <typename F>
void sage_backward(const SageOptions&, int, int, const F*, const F*, const F*, const F*,
                   const F*, F*, F*, F*, AttentionInternals<F>*) {
  throw std::runtime_error("attention.kind \"sage\": the CPU reference is not committed yet");
}
template void sage_forward<float>(const SageOptions&, int, int, const float*, const float*, const float*, float*);
template void sage_forward<double>(const SageOptions&, int, int, const double*, const double*, const double*, double*);
template void sage_backward<float>(const SageOptions&, int, int, const float*, const float*, const float*, const float*, const float*, float*, float*, float*, AttentionInternals<float>*);
template void sage_backward<double>(const SageOptions&, int, int, const double*, const double*, const double*, const double*, const double*, double*, double*, double*, AttentionInternals<double>*);
}  // namespace qattn::cpu
