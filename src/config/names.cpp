#include "qattn/attention.hpp"

namespace qattn {

std::string to_string(AttentionKind k) {
  switch (k) {
    case AttentionKind::fpa: return "fpa";
    case AttentionKind::sage: return "sage";
    case AttentionKind::kinterval: return "kinterval";
  }
  return "?";
}
std::string to_string(Calibration c) { return c == Calibration::minmax ? "minmax" : "fwm"; }
std::string to_string(Rounding r) { return r == Rounding::nearest ? "nearest" : "lerp"; }
std::string to_string(Ste s) { return s == Ste::weight ? "weight" : "prob"; }
std::string to_string(Precision p) {
  switch (p) {
    case Precision::int8: return "int8";
    case Precision::bf16: return "bf16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}
std::string to_string(BwdGranularity g) { return g == BwdGranularity::rowcol ? "rowcol" : "tile"; }

}  // namespace qattn
