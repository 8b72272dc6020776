#pragma once

#include <string>

#include "campaign/case_runner.h"
#include "campaign/known_issues.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "reports/reporter.h"

namespace gradfuzz::campaign {

/// What the confirmation of a cluster needs besides its case.
struct ConfirmationContext {
  /// The campaign's fault (empty: none), on in every variant as in the case.
  std::string fault;
  /// The known issues (may be null) and the backend and version they are matched for: a
  /// documented cause (an entry of status documented-behaviour matching the in-place ops'
  /// findings) explains a cluster that goes away without it.
  const KnownIssues* known = nullptr;
  std::string backend;
  std::string version;
  /// Variants removing one op are run for cases of at most this many ops.
  int64_t max_ops_removed = 8;
};

/// Before a cluster is called new, its case is rerun as variants on the same values (as
/// TTrace localises against a reference run and C-Reduce keeps a reduction only while the
/// failure keeps its reason), each traced so that its findings are signed as the cluster's:
/// - `unfused`: the case's own unfused path (from `result`; `not_run` where nothing fused);
/// - `in_place_off`: every in_place=1 set to 0 (cases with in-place ops);
/// - `no_recipe`: without the FP8 recipe (cases with one);
/// - `float32`: a half-precision case in float32 (where the backend runs float32);
/// - `without_op[k]`: op k removed, where the case stays valid (cases of at most
///   ConfirmationContext::max_ops_removed ops).
/// A variant "fails" when it still has a finding with `signature`; each variant's findings are
/// matched against the known issues. The diagnosis, first that holds: `known-consequence` (the
/// known file's documented in-place entry matches the cluster's findings signed as the in-place
/// ablation signs them, the unfused path does not pass, and with in_place=0 the finding is gone
/// (`explained_by` names the documented entry) or all that is left, on the same tensor, is known
/// (`explained_by` names that entry: two known causes in one case)), `crash` (an error, crash
/// or time-out finding), `fused-only` (the unfused path passes), `quantized-only` (passes without the
/// recipe), `half-only` (passes in float32), `all-paths`. `result` is the case's traced
/// result (run_traced), whose divergence in the cluster's path is the first_divergence.
reports::Confirmation confirm_cluster(CaseRunner& runner, const harness::CaseSpec& spec,
                                      const harness::CaseResult& result, const std::string& signature,
                                      const ConfirmationContext& context);

/// Whether the documented cause a known-consequence confirmation names is present in `spec`
/// (an op with in_place=1): only such cases of the cluster's signature are its consequence.
bool has_documented_cause(const harness::CaseSpec& spec);

}  // namespace gradfuzz::campaign
