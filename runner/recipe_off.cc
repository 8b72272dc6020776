#include "runner/recipe_off.h"

#include <algorithm>
#include <utility>

#include "runner/case_cost.h"

namespace gradfuzz::runner {

namespace {

/// `spec` without its recipe; its repeat calls only those with the recipe off, as plain
/// calls (their grad requirements: the set's evidence covers the input's gradient where one
/// of them takes it, ReferenceSet::run_references).
harness::CaseSpec without_recipe(const harness::CaseSpec& spec) {
  harness::CaseSpec out = spec;
  out.recipe.reset();
  out.repeat_calls.clear();
  for (const harness::RepeatCall& call : spec.repeat_calls) {
    if (!call.recipe_off) continue;
    harness::RepeatCall plain;
    plain.no_grad = call.no_grad;
    plain.input_requires_grad = call.input_requires_grad;
    out.repeat_calls.push_back(plain);
  }
  return out;
}

}  // namespace

bool RecipeOffBounds::wanted(const harness::CaseSpec& spec) {
  return spec.recipe.has_value() && std::any_of(spec.repeat_calls.begin(), spec.repeat_calls.end(),
                                                [](const harness::RepeatCall& c) { return c.recipe_off; });
}

RecipeOffBounds::RecipeOffBounds(const harness::CaseSpec& spec, const PreparedCase& prepared,
                                 const harness::BackendCapabilities& caps, Trace trace,
                                 EvidenceSampler::Options options)
    : spec_(without_recipe(spec)),
      case_(reference_case(spec_, prepared, std::nullopt, caps, trace)),
      references_(case_),
      evidence_(references_, std::move(options)) {}

std::optional<oracle::CaseBounds> RecipeOffBounds::bounds(int round) {
  if (failed_) return std::nullopt;
  if (rounds_ < 0) {
    count_cost("recipe_off_evidence");
    references_.run_references_alone();
    if (!references_.reference().ok() || !evidence_.gather()) {
      failed_ = true;
      return std::nullopt;
    }
    rounds_ = 0;
  }
  for (; rounds_ < std::min(round, kEvidenceRounds - 1); ++rounds_) evidence_.add_round(rounds_ + 1);
  return evidence_.bounds();
}

}  // namespace gradfuzz::runner
