#pragma once

// The bounds of a quantizing case's calls with the recipe off (harness::RepeatCall::
// recipe_off; TE: a call outside te.autocast). Such a call computes in high precision, on
// call 1's values where no optimizer step came before it, so the coarse FP8 evidence every
// other repeat call of a quantizing case is held to (EvidenceSampler::repeat_call_bounds)
// would let an error of FP8's size through: a call that reads a stale FP8 weight cache
// passed unseen (te-usage-recipe-off-call-computes-with-fp8-weight, H100 2026-12-07). They
// are the low-precision rule's bounds of the same case without its recipe instead, with
// evidence of their own.

#include <optional>

#include "harness/capabilities.h"
#include "harness/case_spec.h"
#include "oracle/rounding.h"
#include "runner/evidence.h"
#include "runner/reference_set.h"

namespace gradfuzz::runner {

/// A reference set of the case without its recipe (its values; the input requiring grad
/// where a call with the recipe off takes its gradient) and the evidence its sampler draws:
/// the same computation, from the same seed, as a case that never had the recipe, so a
/// correct high-precision call passes where such a case would.
class RecipeOffBounds {
 public:
  /// Whether `spec` has a recipe and a call with it off.
  static bool wanted(const harness::CaseSpec& spec);

  /// Nothing evaluated yet. `prepared` is the case's (it outlives this); `caps` and `trace`
  /// as the case's reference (reference_case); `options` its samplers'.
  RecipeOffBounds(const harness::CaseSpec& spec, const PreparedCase& prepared, const harness::BackendCapabilities& caps,
                  Trace trace, EvidenceSampler::Options options);
  RecipeOffBounds(const RecipeOffBounds&) = delete;
  RecipeOffBounds& operator=(const RecipeOffBounds&) = delete;

  /// The rule's bounds with the evidence through round `round` (0: the gathering's; as the
  /// case's other sets at that round), the reference and the gathering on the first ask;
  /// nullopt where the reference or the rounding baseline raised (the caller keeps the
  /// bounds it had).
  std::optional<oracle::CaseBounds> bounds(int round);

  /// The case without its recipe, as this set evaluates it.
  const harness::CaseSpec& spec() const { return spec_; }

 private:
  harness::CaseSpec spec_;
  ReferenceCase case_;
  ReferenceSet references_;
  EvidenceSampler evidence_;
  /// The last round drawn (-1: none yet); whether the reference or the gathering failed.
  int rounds_ = -1;
  bool failed_ = false;
};

}  // namespace gradfuzz::runner
