#pragma once

// The judgements of a case's runs that need no low-precision evidence (fuzzer.md "Paths and
// oracle"): errors and locks against the reference, the ranks' copies of a replicated tensor,
// float64 paths of two reference sets against each other, the wide-dtype confirmation's notes
// and the in-place ablation's question. Pure functions of runs and findings.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "harness/sharding.h"
#include "oracle/oracle.h"
#include "oracle/tolerances.h"

namespace gradfuzz::runner {

/// What judge_errors finds, in order.
struct ErrorJudgement {
  std::vector<harness::Finding> findings;
  /// Where any run (the reference's included) raised, each run's outcome ("fused ran; unfused
  /// raised <kind> during <stage>: ..."), for the case's notes; empty otherwise.
  std::string outcomes;
};
/// Every run of `paths` (their repeat calls included) must agree with `reference` (the basic
/// ops') on whether and what it raised, and a failed construction must leave no op locked: a
/// valid case raising in the reference, each disagreement, each op left locked, and, where the
/// case `intends_error`, an invalid configuration that raised nowhere are findings.
ErrorJudgement judge_errors(const harness::CaseSpec& spec, const std::vector<const harness::PathRun*>& paths,
                            const harness::PathRun& reference, bool intends_error);

/// A tensor every rank holds whole (the output of an AllReduce, a gradient every rank computes
/// alike) must be the same on every rank: each other rank's copy in each run of `paths` (and
/// of their repeat calls) against rank 0's, within `tolerance` (the ranks run the same kernels
/// on the same values, so they differ at most by a reduction's order).
std::vector<harness::Finding> judge_replicas(const harness::CaseSpec& spec,
                                             const std::vector<const harness::PathRun*>& paths,
                                             const harness::ShardingPlan& sharding, const oracle::Tolerance& tolerance);

/// float64, paths of two reference sets: `fused` against `unfused` moved by the difference of
/// their references (what the quantization points alone change), within `bound`, as the pair
/// "fused~unfused".
void compare_shifted(const harness::CaseSpec& spec, const harness::PathRun& fused_reference,
                     const harness::PathRun& unfused_reference, const harness::PathRun& fused,
                     const harness::PathRun& unfused, const oracle::TensorBound& bound, bool all_channels,
                     oracle::Comparer& comparer);

/// The wide-dtype confirmation's note on each value finding of a path in `ran` (the paths that
/// ran in dtype `wide` on the same values): whether `wide_findings` (those runs against the
/// reference) has it too. True where none persists (a precision-only finding).
bool note_wide_dtype(std::vector<harness::Finding>& findings, const std::vector<harness::Finding>& wide_findings,
                     const std::set<std::string>& ran, const std::string& wide);

/// The in-place ablation's question (RunOptions::attribute_in_place): the case with every
/// in_place=1 op at in_place=0, the types of those ops (sorted, joined by ','), and the value
/// findings it may put down to them: every one not specific to a fusion (a tensor the unfused
/// path gets right in the same call, where that call ran).
struct InPlaceAblation {
  harness::CaseSpec ablated;
  std::string writers;
  /// Indices into the findings.
  std::vector<size_t> candidates;
};
/// nullopt where no op writes in place or no finding is a candidate. `unfused`: the unfused
/// path's run (null where it has none); a finding of call k is specific to a fusion only where
/// the unfused path's call k ran (a call of it that raised got nothing right or wrong).
std::optional<InPlaceAblation> in_place_ablation(const harness::CaseSpec& spec,
                                                 const std::vector<harness::Finding>& findings,
                                                 const harness::PathRun* unfused);
/// The candidates of `ablation` whose kind and tensor the ablated run's `without` lacks.
std::vector<size_t> gone_without(const InPlaceAblation& ablation, const std::vector<harness::Finding>& findings,
                                 const std::vector<harness::Finding>& without);

}  // namespace gradfuzz::runner
