#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace gradfuzz::harness {

/// "float64" -> at::kDouble, "float32" -> at::kFloat, "bfloat16", "float16"; throws
/// std::invalid_argument for anything else.
at::ScalarType scalar_type_from_name(const std::string& dtype);

/// Unit roundoff of a floating dtype: half the distance from 1 to the next representable
/// value (float64 2^-53, float32 2^-24, bfloat16 2^-8, float16 2^-11; float8 e4m3 2^-4,
/// e5m2 2^-3). Throws std::invalid_argument for a non-floating dtype.
double unit_roundoff(at::ScalarType dtype);

}  // namespace gradfuzz::harness
