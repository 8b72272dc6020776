#pragma once

// A hand-written case's basic ops' reference set and its samplers' options, as run_case
// makes them: what the tests of the runner's owners start from, without a backend.

#include <memory>
#include <optional>
#include <utility>

#include "harness/capabilities.h"
#include "harness/case_spec.h"
#include "harness/dtype.h"
#include "runner/evidence.h"
#include "runner/reference_set.h"

namespace gradfuzz::runner::testing {

struct PreparedSet {
  explicit PreparedSet(harness::CaseSpec s) : spec(std::move(s)), prepared(prepare_case(spec)) {
    std::optional<ops::QuantRecipe> recipe;
    if (spec.recipe) recipe = ops::QuantRecipe::parse(spec.recipe->name, spec.recipe->fp8_format, {});
    reference_case = runner::reference_case(spec, prepared, recipe, harness::BackendCapabilities{}, Trace::kOff);
    set = std::make_unique<ReferenceSet>(reference_case);
    set->run_references(prepared.reference_ops);
    options.dtype = harness::scalar_type_from_name(spec.dtype);
    options.context = {spec.num_ops(), prepared.plan.max_reduction_length};
    options.fp8_reference_exact = true;
  }
  harness::CaseSpec spec;
  PreparedCase prepared;
  ReferenceCase reference_case;
  std::unique_ptr<ReferenceSet> set;
  EvidenceSampler::Options options;
};

}  // namespace gradfuzz::runner::testing
