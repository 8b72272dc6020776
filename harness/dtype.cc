#include "harness/dtype.h"

#include <stdexcept>

namespace gradfuzz::harness {

at::ScalarType scalar_type_from_name(const std::string& dtype) {
  if (dtype == "float64") return at::kDouble;
  if (dtype == "float32") return at::kFloat;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float16") return at::kHalf;
  throw std::invalid_argument("unknown dtype '" + dtype + "'; known dtypes: float64, float32, bfloat16, float16");
}

double unit_roundoff(at::ScalarType dtype) {
  // 2^-p for a significand of p bits (the implicit bit included).
  switch (dtype) {
    case at::kDouble:
      return 0x1p-53;
    case at::kFloat:
      return 0x1p-24;
    case at::kBFloat16:
      return 0x1p-8;
    case at::kHalf:
      return 0x1p-11;
    case at::kFloat8_e4m3fn:
      return 0x1p-4;
    case at::kFloat8_e5m2:
      return 0x1p-3;
    default:
      throw std::invalid_argument(std::string("no unit roundoff for dtype ") + c10::toString(dtype));
  }
}

}  // namespace gradfuzz::harness
