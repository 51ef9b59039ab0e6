#include "qattn/attention.hpp"

namespace qattn {

std::string to_string(AttentionKind k) { return name_of(kAttentionKindNames, k); }
std::string to_string(Calibration c) { return name_of(kCalibrationNames, c); }
std::string to_string(Rounding r) { return name_of(kRoundingNames, r); }
std::string to_string(Ste s) { return name_of(kSteNames, s); }
std::string to_string(Precision p) { return name_of(kPrecisionNames, p); }
std::string to_string(BwdGranularity g) { return name_of(kBwdGranularityNames, g); }

}  // namespace qattn
