// Attention kinds and their options, as docs/attention-maths.md defines them.
// The model never looks inside: it hands (q, k, v) per (batch, head) to the
// backend's attention, which dispatches on AttentionConfig::kind.
#pragma once
#include <optional>
#include <string>

#include "qattn/value_names.hpp"

namespace qattn {

enum class AttentionKind { fpa, sage, kinterval };
enum class Calibration { minmax, fwm };      // §5.2: grid from [min, max] or [max - W, max]
enum class Rounding { nearest, lerp };       // §5.4: forward weights
enum class Ste { weight, prob };             // §5.8-5.9: surrogate gradient for nearest
enum class Precision { int8, bf16, fp8 };    // §4.7, §4.12: operand precision of one matmul
enum class BwdGranularity { rowcol, tile };  // §4.6: scales of P and dS in the backward

// The names configs use (value_names.hpp).
inline constexpr ValueName<AttentionKind> kAttentionKindNames[] = {
    {"fpa", AttentionKind::fpa}, {"sage", AttentionKind::sage}, {"kinterval", AttentionKind::kinterval}};
inline constexpr ValueName<Calibration> kCalibrationNames[] = {{"minmax", Calibration::minmax},
                                                               {"fwm", Calibration::fwm}};
inline constexpr ValueName<Rounding> kRoundingNames[] = {{"nearest", Rounding::nearest}, {"lerp", Rounding::lerp}};
inline constexpr ValueName<Ste> kSteNames[] = {{"weight", Ste::weight}, {"prob", Ste::prob}};
inline constexpr ValueName<Precision> kPrecisionNames[] = {
    {"int8", Precision::int8}, {"bf16", Precision::bf16}, {"fp8", Precision::fp8}};
inline constexpr ValueName<BwdGranularity> kBwdGranularityNames[] = {{"rowcol", BwdGranularity::rowcol},
                                                                     {"tile", BwdGranularity::tile}};

struct KIntervalOptions {
  int K = 4;                                   // intervals; K + 1 grid values
  Calibration calibration = Calibration::minmax;
  double window = 8.0;                         // fwm window W in nats
  Rounding rounding = Rounding::lerp;
  Ste ste = Ste::prob;                         // used by rounding "nearest" only
  bool ste_window_mask = false;                // weight-STE: zero entries below the fwm window
  bool detach_extrema = false;                 // drop every derivative through m and l
};

// Operand precision of the seven attention matmuls (qk covers forward + recompute).
struct SagePrecision {
  Precision qk = Precision::int8, pv = Precision::int8, dv = Precision::int8;
  Precision dp = Precision::bf16, dq = Precision::int8, dk = Precision::int8;
};

struct SageOptions {
  int block_q = 64, block_k = 64;              // quantisation block sizes (rows)
  bool smooth_k = true, smooth_q = false;
  SagePrecision precision;
  BwdGranularity bwd_granularity = BwdGranularity::rowcol;
  std::optional<KIntervalOptions> softmax;     // composition: quantised softmax inside sage
};

struct AttentionConfig {
  AttentionKind kind = AttentionKind::fpa;
  SageOptions sage;                            // used when kind == sage
  KIntervalOptions kinterval;                  // used when kind == kinterval
};

std::string to_string(AttentionKind);
std::string to_string(Calibration);
std::string to_string(Rounding);
std::string to_string(Ste);
std::string to_string(Precision);
std::string to_string(BwdGranularity);

}  // namespace qattn
