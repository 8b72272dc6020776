#pragma once

// The knobs of one case's run (run_case, runner/run_case.h): which paths run, what is
// compared, what the worker does while a remote backend runs the paths.

#include <string>

#include "oracle/finite_difference.h"
#include "oracle/rounding.h"

namespace gradfuzz::runner {

/// Knobs of run_case; the defaults are what the fuzzer uses.
struct RunOptions {
  /// Run the unfused path (runtime without fusions) and compare it too. Skipped, as a repeat,
  /// for a case whose fused path ran without error and without any fused group.
  bool run_unfused = true;
  /// Compare the fused path with the unfused one when both ran without error: directly
  /// for float64, by error norms in the same dtype otherwise (oracle/rounding.h).
  bool compare_fused_unfused = true;
  /// When the fused path ran forward-only and backward-only fused ops together, also run
  /// each pass's fusions alone ("forward_fused", "backward_fused").
  bool single_pass_paths = true;
  /// Check the reference gradient against central finite differences for small float64
  /// cases ("reference~finite_difference").
  bool finite_differences = true;
  oracle::FiniteDifferenceOptions finite_difference;
  /// The low-precision rule (oracle/rounding.h).
  oracle::RoundingRule rounding;
  /// Rerun a case whose non-float64 values fail in the backend's widest dtype on the same
  /// values, and note on each finding whether it persists there: evidence for the reader,
  /// never an excuse (a kernel or a fusion chosen by dtype runs other code there).
  bool confirm_in_wide_dtype = true;
  /// Root cause by ablation: a case with in-place ops (in_place=1) that has findings not
  /// specific to a fusion is run again with every in_place=0 on the same values; a finding
  /// that is then gone is signed as caused by the in-place writes ("<kind>|in_place:<ops>|
  /// in_place=1|<role>"), so aliasing's many symptoms are one cluster and a fused kernel's
  /// own defect (fused path wrong, unfused right) stays its own.
  bool attribute_in_place = true;
  /// One run answers several questions where that yields the same findings (docs/
  /// BENCHMARKS.md "The te worker: where a case's time goes"): a path's own first call names
  /// the writer of a changed caller tensor, the repeat calls are planned against one fresh
  /// Sequential per requires-grad pattern, the single-pass paths go in the case's one request.
  /// false: each its own run, as before (slower; for comparing, `--no-shared-runs`).
  bool shared_runs = true;
  /// Name the writer of each changed caller tensor (PathRun::modified_by: signatures, notes).
  /// The ablation's rerun, which reads only the kinds and tensors of its findings, does not.
  bool find_writers = true;
  /// Check repeat calls' plans against fresh Sequentials. The ablation's rerun does only when
  /// a finding it may attribute is a plan's.
  bool check_plans = true;
  /// What the worker does while a remote backend runs a case's first request (a te case's
  /// TE paths take most of its time, the worker waiting): kNone nothing; kReference the
  /// basic ops' float64 reference (needed by every case); kEvidence that and then the
  /// low-precision evidence the first check would ask for if it failed, drawn until the
  /// answer comes and used only if asked for (same findings: the same draws in the same
  /// order). Where the backend runs the paths in process (the model) there is nothing to
  /// overlap. kEvidence costs CPU the case may not need: one core per worker and one per
  /// adapter (`--overlap auto`).
  enum class Overlap { kNone, kReference, kEvidence };
  Overlap overlap = Overlap::kEvidence;
  /// Localise each failing path (oracle/divergence.h): every path records the tensors at
  /// its plan groups' boundaries, every reference evaluation those at every basic op, and a
  /// path with value findings gets CaseResult::divergences, whose op, role and pass then sign
  /// its value findings (a defect's downstream symptoms one cluster). Off in a campaign's
  /// first run of a case (it costs a trace of every path); the campaign reruns a case with a
  /// new value finding traced, and replay traces.
  bool trace = false;
  /// kEvidence draws nothing ahead for a case whose float64 reference took longer than this
  /// (seconds): a piece costs about as much, and the answer waits for the piece under way.
  double overlap_piece_limit_s = 0.05;
};

/// "none", "reference", "evidence"; overlap_from_name throws std::invalid_argument for
/// another name.
const char* overlap_name(RunOptions::Overlap overlap);
RunOptions::Overlap overlap_from_name(const std::string& name);

}  // namespace gradfuzz::runner
