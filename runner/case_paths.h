#pragma once

// The paths one case runs on the backend under test (fuzzer.md "Paths and oracle"): what is
// requested, as RunOptions asks, and what ran.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "runner/run_options.h"

namespace gradfuzz::runner {

/// The paths of one case: fused, unfused (skipped when nothing fused), and each pass's fusions
/// alone ("forward_fused", "backward_fused") when the fused path ran forward-only and
/// backward-only fused ops together, requested as RunOptions says (how writers and expected
/// plans are found, one request or two); their runs, and which of them ran.
class CasePaths {
 public:
  /// What the worker does while a remote backend runs the first request (RunOptions::overlap).
  using WhileWaiting = std::function<void(backends::PendingPaths&)>;

  /// The paths of `spec` (both outlive this); with `trace`, each records its first call's
  /// trace (PathRequest::trace).
  CasePaths(const harness::CaseSpec& spec, const RunOptions& options, bool trace);
  CasePaths(const CasePaths&) = delete;
  CasePaths& operator=(const CasePaths&) = delete;

  /// Runs the paths on `backend` with the case's values, waiting for the first request's
  /// answer with `while_waiting` where options ask for an overlap. The backend's crash or
  /// time-out is returned as every path's finding (kind crash or timeout), nullopt otherwise.
  std::optional<harness::Finding> run(backends::Backend& backend, const harness::CasePlan& plan,
                                      const harness::CaseTensors& tensors, const WhileWaiting& while_waiting);
  /// The first call of each of `paths` that has fusions (their plans, unrecorded writers and
  /// plans); nothing where the backend crashes or times out.
  void run_first_calls(backends::Backend& backend, const harness::CasePlan& plan, const harness::CaseTensors& tensors,
                       const std::vector<harness::PathRequest>& paths);
  /// The same requests again on `spec` (the case in another dtype), with the same values: the
  /// first request's paths, then the single-pass ones where they ran. Throws what the backend
  /// throws.
  std::vector<harness::PathRun> rerun(backends::Backend& backend, const harness::CaseSpec& spec,
                                      const harness::CasePlan& plan, const harness::CaseTensors& tensors) const;

  /// The runs that were not skipped, in order of request.
  const std::vector<const harness::PathRun*>& active() const { return active_; }
  /// The active run named `name`, or nullptr.
  const harness::PathRun* named(const std::string& name) const;
  /// The first path's run (the fused path's, after run): its plans are the case's coverage.
  const harness::PathRun& first() const { return runs_.front(); }

  /// A path of the case as the options ask for it. Watching a path's own first call for the
  /// writer of a changed caller tensor costs every plan group a comparison of the caller's
  /// tensors; a second run costs a path's time, but only where a tensor changed: ops that
  /// write in place (in_place=1) make that likely, so those cases are watched.
  harness::PathRequest request(std::string name, std::vector<std::string> fusions, bool skip_if_nothing_fused) const;

 private:
  bool send(backends::Backend& backend, const harness::CaseSpec& spec, const harness::CasePlan& plan,
            const harness::CaseTensors& tensors, const std::vector<harness::PathRequest>& requests,
            const WhileWaiting* while_waiting);
  void count_request(const std::vector<harness::PathRequest>& requests,
                     const std::vector<harness::PathRun>& runs) const;

  const harness::CaseSpec& spec_;
  const RunOptions& options_;
  const bool trace_;
  std::vector<harness::PathRequest> requests_;
  std::vector<harness::PathRequest> single_pass_;
  std::vector<harness::PathRun> runs_;
  std::vector<const harness::PathRun*> active_;
  std::optional<harness::Finding> failure_;
};

}  // namespace gradfuzz::runner
