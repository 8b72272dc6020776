#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "harness/builder.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "oracle/finite_difference.h"
#include "oracle/oracle.h"
#include "oracle/rounding.h"

namespace gradfuzz::runner {

// The case's value types (harness/), used throughout this folder.
using backends::Backend;
using harness::BackendCapabilities;
using harness::BuiltCase;
using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::Finding;
using harness::PathRequest;
using harness::PathRun;
using harness::PathStatus;
using harness::RepeatCall;
using harness::VerdictKind;

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

/// Whether the case asks for an error (invalid-configuration knobs or a static wiring
/// problem): only then is "every path raised the same error" a pass.
bool intends_error(const CaseSpec& spec);

/// Runs `spec` through `backend`'s paths (fused, unfused, and the single-pass ones when they
/// differ) and the float64 reference, and yields every finding (fuzzer.md "Paths and
/// oracle"), in named stages: prepare (plan, values, reference ops), run the paths, the
/// reference, judge (errors and locks, every path that ran against the reference, caller
/// tensors, repeat calls and their plans, the fused path against the unfused one; for a
/// non-float64 case that fails the first check, the low-precision rule's evidence: rounding
/// baseline, input sensitivity, kinks), finite differences (small float64 cases), confirm (a
/// note per low-precision finding on whether it persists in the widest dtype), signatures.
/// Value comparisons go on after another path raised or wrote a caller tensor. A backend
/// crash or time-out is a `crash` / `timeout` finding; a valid case the backend declines is
/// `unsupported`. Only internal assertion failures (std::logic_error, std::invalid_argument
/// for a CUDA case without CUDA) and BackendUnavailable propagate. Invalid configurations
/// that raise the same error kind in every path pass; one that raises nowhere is a finding.
CaseResult run_case(const CaseSpec& spec, Backend& backend, const RunOptions& options = {});
/// run_case on the model backend (one per thread).
CaseResult run_case(const CaseSpec& spec, const RunOptions& options = {});

/// The bounds the oracle holds every path of `spec` to (exported scripts carry them): the
/// static tolerances for float64, the low-precision rule with its evidence (rounding
/// baseline, input sensitivity, kinks) otherwise, for every tensor the reference computes.
/// nullopt when the case cannot be built or its reference raises.
std::optional<oracle::CaseBounds> judging_bounds(const CaseSpec& spec, const RunOptions& options = {});

/// What the oracle expects of one path whose fused ops quantize elsewhere than its basic ops
/// (runner/quantization_points.h): the bounds, expected tensors and repeat calls' expected
/// tensors of the reference with that path's quantization points (its ReferenceSet in
/// run_case), which it is judged against instead of the basic ops' reference.
struct PathExpectation {
  /// The quantization points, described (ops::QuantizationPoints::describe).
  std::string points;
  std::optional<oracle::CaseBounds> bounds;
  std::map<std::string, at::Tensor> expected;
  std::vector<std::map<std::string, at::Tensor>> repeat_expected;
};

/// What the oracle expects of every path of a case: its bounds and, where the reference
/// quantizes (an FP8 recipe, an activation caching its input in FP8), the float64
/// quantize-dequantize reference's own values, which a script cannot recompute from the
/// catalog's high-precision math (exported scripts ship them); for a distributed case the
/// reference's values too (its script judges the ranks' results put together with them).
struct Expectation {
  std::optional<oracle::CaseBounds> bounds;
  bool quantized = false;
  /// With `quantized`: the first call's expected tensors by name, then each repeat call's
  /// (delayed scaling: the scales the calls before it left), on the CPU.
  std::map<std::string, at::Tensor> expected;
  std::vector<std::map<std::string, at::Tensor>> repeat_expected;
  /// By path name: the paths of `paths` (judging_expectation) whose quantization points are
  /// not the basic ops' (absent: the path is held to the fields above).
  std::map<std::string, PathExpectation> paths;
};
/// `paths`: the paths a script runs (name, fusions of the target backend). Under a recipe,
/// each one's quantization points come from the fusion plans of the model's fuser (the
/// model of te.ops' fuser, ops/fuser.h) for its fusions: the export does not run the target,
/// so these are the plans the target is expected to report (the fused groups a path's plans
/// report are what replay reads, runner/quantization_points.h). A non-distributed case only.
/// `target`: the capabilities of the backend the script is for, of which the FP8 fields
/// (fp8_reference_exact, fp8_gemm_accumulation) decide the FP8 evidence as replay on that
/// backend does (an H200's TE: the tight rule with its GEMMs' accumulation term); null: the
/// model's (exact FP8 GEMMs).
Expectation judging_expectation(const CaseSpec& spec, const RunOptions& options = {},
                                const std::vector<PathRequest>& paths = {},
                                const BackendCapabilities* target = nullptr);

/// A case's plan, drawn values and float64 reference ops (holding those values), exactly as
/// run_case makes them.
struct PreparedCase {
  CasePlan plan;
  CaseTensors tensors;
  BuiltCase reference_ops;
  /// The case's generator, positioned after the last value drawn (finite differences go on
  /// drawing from it).
  at::Generator generator;
};
/// Throws what plan_case and create_ops throw (gradfuzz::Error for an op that cannot be
/// made for its shape: every path's error).
PreparedCase prepare_case(const CaseSpec& spec);

/// What the float64 reference does with `spec`: nullopt when it runs, else the error kind
/// it raises (building or running).
std::optional<std::string> reference_error_kind(const CaseSpec& spec);

/// Coverage features that `spec` exercises statically (fuzzer.md coverage.features names,
/// all but same_fusion_channel, which needs the fused plans).
std::vector<std::string> static_features(const CaseSpec& spec, const CasePlan& plan);

}  // namespace gradfuzz::runner
