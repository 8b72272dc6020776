#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <vector>

#include "generators/case_gen.h"
#include "harness/case_spec.h"

// The draws every generator of this folder makes inside rc::gen::exec (internal to
// generators/: RapidCheck stays out of the other folders' headers).
namespace gradfuzz::generators::detail {

/// Uniform in [lo, hi] whatever the generation size; shrinks towards lo.
inline int64_t pick(int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return *rc::gen::resize(rc::kNominalSize, rc::gen::inRange<int64_t>(lo, hi + 1));
}

/// Yes with probability num/den; shrinks towards no.
inline bool chance(int64_t num, int64_t den) { return pick(0, den - 1) >= den - num; }

template <class T>
T pick_of(const std::vector<T>& v) {
  return v[static_cast<size_t>(pick(0, static_cast<int64_t>(v.size()) - 1))];
}

/// The settings of a case beside its ops, drawn in this order: whether the input requires
/// grad, the enabled fusion registrations (all, a random subset, or one pass's), dtype,
/// device, the value seed, and repeat calls where the backend runs them.
void draw_case_settings(harness::CaseSpec& spec, const GenOptions& options);

/// The case's usage script (the last draws of draw_case_settings): what a training loop does
/// around its calls, for the elements options.capabilities lists (none without them).
void draw_usage_script(harness::CaseSpec& spec, const GenOptions& options);

}  // namespace gradfuzz::generators::detail
