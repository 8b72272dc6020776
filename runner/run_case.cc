#include "runner/run_case.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "backends/model_backend.h"
#include "harness/dtype.h"
#include "harness/sharding.h"
#include "ops/cuda/launch_stats.h"
#include "ops/errors.h"
#include "oracle/divergence.h"
#include "oracle/rounding.h"
#include "oracle/signature.h"
#include "oracle/tolerances.h"
#include "runner/case_cost.h"
#include "runner/case_paths.h"
#include "runner/evidence.h"
#include "runner/features.h"
#include "runner/judge.h"
#include "runner/quantization_points.h"
#include "runner/recipe_off.h"

namespace gradfuzz::runner {

using backends::ModelBackend;
using oracle::case_tolerance;
using oracle::check_caller_tensors;
using oracle::check_finite_differences;
using oracle::compare_paths;
using oracle::compare_plans;
using oracle::disable_tf32;
using oracle::path_pair_tolerance;
using oracle::ToleranceContext;

using harness::check_static_wiring;
using harness::describe_error;
using harness::OpSpec;
using harness::plan_case;

namespace {

/// The widest dtype the backend runs (float64, else float32), or nullopt when it has neither.
std::optional<std::string> widest_dtype(const BackendCapabilities& caps) {
  for (const char* d : {"float64", "float32"}) {
    if (std::find(caps.dtypes.begin(), caps.dtypes.end(), d) != caps.dtypes.end()) return std::string(d);
  }
  return std::nullopt;
}

int dtype_rank(const std::string& dtype) {
  if (dtype == "float64") return 3;
  if (dtype == "float32") return 2;
  return 1;
}

/// Why `backend` cannot run `spec` (its world, its repeat calls, its recipe), or nullopt.
std::optional<std::string> unsupported_by(Backend& backend, const CaseSpec& spec) {
  const BackendCapabilities& caps = backend.capabilities();
  if (spec.world_size > caps.max_world_size) {
    return "the " + backend.name() + " backend runs at most " + std::to_string(caps.max_world_size) +
           " rank(s) here; the case has " + std::to_string(spec.world_size);
  }
  if (!spec.repeat_calls.empty() && !caps.repeat_calls) {
    return "the " + backend.name() + " backend does not run repeat_calls";
  }
  for (const std::string& element : spec.usage_elements()) {
    if (!caps.runs_usage(element)) return "the " + backend.name() + " backend does not run the usage step " + element;
    if (spec.world_size > 1) return "the usage step " + element + " runs on one rank; the case has ranks";
  }
  if (spec.recipe) {
    const auto recipes = caps.available_recipes();
    const bool runs = std::any_of(recipes.begin(), recipes.end(),
                                  [&](const harness::RecipeCapability* r) { return r->name == spec.recipe->name; });
    if (!runs) return "the " + backend.name() + " backend runs no " + spec.recipe->name + " recipe here";
  }
  return std::nullopt;
}

bool is_value_finding(const Finding& f) {
  return (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient) && f.role != "plan";
}

bool has_value_findings(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(), is_value_finding);
}

}  // namespace

bool intends_error(const CaseSpec& spec) {
  if (spec.extra_input_count_delta != 0 || spec.corrupt_split_sizes || !spec.late_binds.empty() ||
      check_static_wiring(spec).has_value()) {
    return true;
  }
  if (spec.world_size <= 1) return false;
  try {
    return harness::parallel_config_error(spec, plan_case(spec)).has_value();
  } catch (const std::exception&) {
    return false;  // shapes that do not propagate: every path's op-creation error
  }
}

CaseResult run_case(const CaseSpec& spec, const RunOptions& options) {
  thread_local ModelBackend model;
  return run_case(spec, model, options);
}

namespace {
CaseResult run_case_impl(const CaseSpec& spec, Backend& backend, const RunOptions& options,
                         const EvidenceCarry* carried_evidence = nullptr);
}  // namespace

CaseResult run_case(const CaseSpec& spec, Backend& backend, const RunOptions& options) {
  const auto before = ops::cuda::kernel_launches();
  CaseCostRecorder cost(case_cost_enabled());
  CaseResult result = run_case_impl(spec, backend, options);
  if (case_cost_enabled()) log_case_cost(spec, result, cost.finish());
  for (const auto& [name, after] : ops::cuda::kernel_launches()) {
    auto it = before.find(name);
    const int64_t launches = after.launches - (it == before.end() ? 0 : it->second.launches);
    const int64_t multi = after.multi_block - (it == before.end() ? 0 : it->second.multi_block);
    if (launches > 0) result.kernels[name] = {launches, multi};
  }
  return result;
}

namespace {

/// One case through its stages (run_case's contract): prepare, run the paths, the reference,
/// judge, finite differences, confirm, the in-place ablation, localise, signatures. Each stage
/// adds its findings to result_ and takes the reference set it works on.
class CaseRun {
 public:
  CaseRun(const CaseSpec& spec, Backend& backend, const RunOptions& options,
          const EvidenceCarry* carried_evidence = nullptr)
      : spec_(spec),
        backend_(backend),
        options_(options),
        dtype_(harness::scalar_type_from_name(spec.dtype)),
        trace_(options.trace && !harness::is_distributed(spec)),
        carried_evidence_(carried_evidence),
        paths_(spec, options, trace_) {
    result_.seed = spec.seed;
    result_.backend = backend.name();
    for (const auto& op : spec.ops) {
      if (op.name != harness::kBoundaryOp) result_.op_types.push_back(op.name);
    }
  }

  /// The bounds judge_values would hold the paths to once the first check failed, and the
  /// reference's values where a script needs them; for each path of `paths` with quantization
  /// points of its own, the same of its reference set (set_expectation).
  Expectation expectation(const std::vector<PathRequest>& paths) {
    disable_tf32();
    Expectation out;
    if (!prepare()) return out;
    plan_path_sets(paths);
    run_reference();
    PathSet& basic = *sets_.front();
    if (!basic.references.reference().ok()) return out;
    out.quantized = reference_case_.quantizes;
    // The reference's own values go with a quantizing case (a script cannot recompute the FP8
    // reference) and with a distributed one (its script compares the ranks' results, put
    // together, with them).
    PathExpectation own = set_expectation(basic, reference_case_.quantizes || harness::is_distributed(spec_));
    out.bounds = std::move(own.bounds);
    out.expected = std::move(own.expected);
    out.repeat_expected = std::move(own.repeat_expected);
    for (const PathRequest& path : paths) {
      PathSet& set = set_of(path.name);
      if (&set == &basic || !set.references.reference().ok()) continue;
      PathExpectation theirs = set_expectation(set, /*values=*/true);
      theirs.points = set.references.points().describe();
      if (theirs.bounds) out.paths[path.name] = std::move(theirs);
    }
    return out;
  }

  CaseResult run() {
    disable_tf32();
    if (spec_.device == "cuda" && backend_.name() == "model" && !at::hasCUDA()) {
      throw std::invalid_argument("case needs device cuda, but this process has no CUDA device");
    }
    if (!prepare()) return std::move(result_);
    if (const auto why = unsupported_by(backend_, spec_)) return unsupported(*why);
    bool ran = false;
    {
      CostStage stage("paths");
      ran = run_paths();
    }
    if (!ran) return finish();
    for (const PathRun* run : paths_.active()) {
      if (run->status == PathStatus::kUnsupported) {
        return unsupported(run->name + " declined the case: " + run->error_message);
      }
    }
    {
      CostStage stage("reference");
      run_reference();
    }
    const PathSet& basic = *sets_.front();
    {
      CostStage stage("judge");
      judge_errors(basic.references);
      if (basic.references.reference().ok()) judge_values();
      judge_replicas();
    }
    {
      CostStage stage("finite_differences");
      check_finite_differences_stage(basic.references);
    }
    {
      CostStage stage("confirm");
      confirm_in_wide_dtype();
    }
    {
      CostStage stage("ablation");
      attribute_in_place_stage();
    }
    {
      CostStage stage("localise");
      localise_stage();
    }
    CostStage stage("signatures");
    return finish();
  }

 private:
  /// One reference set of the case and the evidence drawn around it: the paths with its
  /// quantization points are judged against them.
  struct PathSet {
    PathSet(const ReferenceCase& reference_case, ops::QuantizationPoints points, EvidenceSampler::Options options)
        : references(reference_case, std::move(points)), evidence(references, std::move(options)) {}
    ReferenceSet references;
    EvidenceSampler evidence;
  };

  CaseResult unsupported(std::string why) {
    result_.verdict = VerdictKind::kUnsupported;
    result_.notes = std::move(why);
    return std::move(result_);
  }

  // ---- prepare: shapes, op creation and values are the same computation in every path (the
  // catalog's signatures and factories), so an error there is every path's error.
  bool prepare() {
    PathRun probe;
    probe.name = "every path";
    run_guarded(probe, [&] {
      probe.error_stage = "op creation";
      prepared_ = prepare_case(spec_);
    });
    if (!probe.ok()) {
      result_.notes = "every path raised " + probe.error_kind + " during op creation: " + probe.error_message;
      return false;
    }
    result_.features = static_features(spec_, prepared_.plan);
    context_ = {spec_.num_ops(), prepared_.plan.max_reduction_length};
    if (harness::is_distributed(spec_)) {
      // A case whose layouts do not compose is not a distributed case at all: the caller's
      // input error (case files are checked when loaded, generated cases are built valid).
      try {
        sharding_ = harness::plan_sharding(spec_, prepared_.plan);
      } catch (const harness::SpecError& e) {
        throw std::invalid_argument(std::string("not a valid distributed case: ") + e.what());
      }
      result_.features.emplace_back("distributed");
      result_.features.emplace_back("world_size_" + std::to_string(spec_.world_size));
    }
    std::optional<ops::QuantRecipe> recipe;
    if (spec_.recipe) {
      PathRun parse;
      run_guarded(parse, [&] {
        recipe = ops::QuantRecipe::parse(spec_.recipe->name, spec_.recipe->fp8_format, spec_.recipe->options);
      });
      if (!parse.ok()) {
        result_.notes = "every path raised " + parse.error_kind + " reading the recipe: " + parse.error_message;
        return false;
      }
      result_.features.emplace_back("recipe");
    }
    reference_case_ =
        reference_case(spec_, prepared_, std::move(recipe), backend_.capabilities(), trace_ ? Trace::kOn : Trace::kOff);
    sets_.push_back(new_set({}));
    if (RecipeOffBounds::wanted(spec_)) {
      recipe_off_ = std::make_unique<RecipeOffBounds>(spec_, prepared_, backend_.capabilities(), reference_case_.trace,
                                                      sampler_options());
    }
    return true;
  }

  EvidenceSampler::Options sampler_options() const {
    EvidenceSampler::Options o;
    o.dtype = dtype_;
    o.context = context_;
    o.rule = options_.rounding;
    o.fp8_reference_exact = backend_.capabilities().fp8_reference_exact;
    return o;
  }
  std::unique_ptr<PathSet> new_set(ops::QuantizationPoints points) const {
    return std::make_unique<PathSet>(reference_case_, std::move(points), sampler_options());
  }

  // ---- run the paths (CasePaths), the basic ops' reference and evidence drawn meanwhile.
  bool run_paths() {
    const auto failure = paths_.run(backend_, prepared_.plan, prepared_.tensors,
                                    [this](backends::PendingPaths& pending) { overlap_with_paths(pending); });
    if (failure) {
      result_.findings.push_back(*failure);
      result_.notes = failure->message;
      return false;
    }
    add_plan_coverage(spec_, paths_.first(), result_);
    assign_reference_sets();
    return true;
  }

  /// While a remote backend runs the case's first request (RunOptions::overlap): the basic
  /// ops' float64 reference, which does not depend on the paths, and then the low-precision
  /// evidence judge_values would draw for it, piece by piece until the answer is there
  /// (EvidenceSampler::advance). Nothing where the backend ran the paths when asked.
  void overlap_with_paths(backends::PendingPaths& pending) {
    if (pending.ready()) return;
    CostStage stage("overlap");
    const auto start = std::chrono::steady_clock::now();
    PathSet& basic = *sets_.front();
    run_references(basic);
    // A piece costs about what the reference did: where that is more than a piece may
    // overrun the answer by (a large case), nothing is drawn ahead.
    const double piece_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options_.overlap != RunOptions::Overlap::kEvidence || dtype_ == at::kDouble || carried_evidence_ != nullptr ||
        !basic.references.reference().ok() || harness::is_distributed(spec_) ||
        piece_s > options_.overlap_piece_limit_s) {
      return;
    }
    while (!pending.ready() && basic.evidence.advance()) {
    }
  }

  /// The reference sets of the paths a script runs, without running the target
  /// (judging_expectation): under a recipe, each path with fusions runs its first call on
  /// backend_ (the model: its fuser plans as te.ops' does, unquantized), and its fused groups
  /// give its quantization points as a run's do in replay (assign_reference_sets). A path
  /// the model cannot run keeps the basic ops' reference.
  void plan_path_sets(const std::vector<PathRequest>& paths) {
    if (!reference_case_.recipe || harness::is_distributed(spec_)) return;
    paths_.run_first_calls(backend_, prepared_.plan, prepared_.tensors, paths);
    assign_reference_sets();
  }

  /// The reference sets of the paths that ran: a path whose plans show a fused op quantizing
  /// elsewhere than its basic ops (runner/quantization_points.h) under the case's recipe is
  /// judged against a reference with those quantization points; paths with the same points
  /// share one. Only such cases pay for a second reference.
  void assign_reference_sets() {
    if (!reference_case_.recipe) return;
    for (const PathRun* run : paths_.active()) {
      ops::QuantizationPoints points = quantization_points(spec_, *run);
      if (points.empty()) continue;
      size_t index = 0;
      while (index < sets_.size() && sets_[index]->references.points() != points) ++index;
      if (index == sets_.size()) {
        set_notes_.push_back(run->name + " judged against a reference with its fused ops' quantization points (" +
                             points.describe() + ")");
        sets_.push_back(new_set(std::move(points)));
      }
      path_sets_[run->name] = index;
    }
    if (sets_.size() > 1) result_.features.emplace_back("fused_quantization_points");
  }

  /// The index into sets_ of a path's reference set (of one of its repeat calls too,
  /// "<path>.call[k]"), and the set.
  size_t set_index(const std::string& path) const {
    const auto it = path_sets_.find(path.substr(0, path.find('.')));
    return it == path_sets_.end() ? 0 : it->second;
  }
  PathSet& set_of(const std::string& path) const { return *sets_.at(set_index(path)); }

  // ---- the float64 reference (recording its kinks for the low-precision rule): one per
  // set of quantization points the paths have, the basic ops' first.
  void run_reference() {
    for (size_t k = 0; k < sets_.size(); ++k) {
      const ReferenceSet& refs = run_references(*sets_[k]);
      if (k > 0 && !refs.reference().ok() && sets_.front()->references.reference().ok()) {
        // The same math as the basic ops' reference, which ran: its paths fall back to it.
        set_notes_.push_back("the reference with quantization points (" + refs.points().describe() + ") raised " +
                             refs.reference().error_kind + ": " + refs.reference().error_message);
        for (auto& [path, index] : path_sets_) {
          if (index == k) index = 0;
        }
      }
    }
  }

  /// The references of `set`, once (the basic ops' may have run during the overlap): the
  /// basic ops' on the prepared ops, a further set's on ops of its own.
  const ReferenceSet& run_references(PathSet& set) {
    ReferenceSet& refs = set.references;
    if (refs.ran()) return refs;
    if (&set == sets_.front().get()) {
      refs.run_references(prepared_.reference_ops);
    } else {
      refs.run_references(sets_.front()->references);
    }
    return refs;
  }

  /// The expectation of `set`: its bounds (the first check's for float64 or where the
  /// evidence cannot be gathered, else the low-precision rule's with its evidence) and, with
  /// `values`, exactly the tensors judge_values compares each call with, on the CPU.
  PathExpectation set_expectation(PathSet& set, bool values) {
    PathExpectation out;
    const ReferenceSet& refs = set.references;
    out.bounds = dtype_ == at::kDouble || !set.evidence.gather() ? first_bounds(refs) : set.evidence.bounds();
    if (!values) return out;
    auto on_cpu = [](std::map<std::string, at::Tensor> tensors) {
      for (auto& [name, t] : tensors) {
        if (t.defined()) t = t.detach().cpu();
      }
      return tensors;
    };
    out.expected = on_cpu(oracle::tensors_by_name(spec_, refs.reference()));
    for (size_t k = 0; k < spec_.repeat_calls.size(); ++k) {
      out.repeat_expected.push_back(on_cpu(oracle::tensors_by_name(spec_, refs.expected_for_call(k))));
    }
    return out;
  }

  // ---- judge errors (runner/judge.h): against the basic ops' reference.
  void judge_errors(const ReferenceSet& basic) {
    ErrorJudgement judged = runner::judge_errors(spec_, paths_.active(), basic.reference(), intends_error(spec_));
    for (auto& f : judged.findings) result_.findings.push_back(std::move(f));
    if (!judged.outcomes.empty()) result_.notes = judged.outcomes;
  }

  // ---- judge values: every path that ran against its reference set's reference, its repeat
  // calls and their plans, the caller's tensors, and the fused path against the unfused one.
  // A non-float64 case that fails the first check is judged again with the low-precision
  // rule's evidence, each set's drawn by its sampler (more rounds while findings remain).
  bool all_channels() const { return backend_.capabilities().exposes_all_channels; }

  void judge_values() {
    std::vector<Finding> values = compare_all(Check::kFirst);
    if (has_value_findings(values) && dtype_ != at::kDouble) {
      // What the dtype itself costs this case: only cases that fail the first check pay for
      // the evidence's extra reference runs, and only those that still fail pay for more
      // rounding samples (one sample per element is a weak estimate of its rounding noise:
      // a value that fails 8x the largest of 16 samples is not noise).
      CostStage stage("evidence");
      const int first_round = begin_evidence();
      for (int round = first_round; round >= 0 && round < kEvidenceRounds; ++round) {
        if (round > first_round) {
          if (!has_value_findings(values)) break;
          for (size_t k = 0; k < sets_.size(); ++k) drawing(k).add_round(round);
        }
        evidence_rounds_ = round;
        notes_.clear();
        int64_t cancellation = 0;
        values = compare_all(Check::kEvidence, &cancellation);
        result_.cancellation_tensors = cancellation;
      }
      if (first_round >= 0) result_.kink_elements = sets_.front()->evidence.evidence().kink_elements;
    }
    for (const PathRun* run : paths_.active()) {
      check_caller_tensors(*run, values);
      for (const auto& repeat : run->repeats) check_caller_tensors(repeat, values);
    }
    for (auto& f : values) result_.findings.push_back(std::move(f));
    const PathRun* fused = paths_.named("fused");
    if (fused && fused->ok()) add_compared_fusions(result_);
  }

  /// The evidence's first round: the parent run's carried evidence (its last round), or each
  /// set's gathering (round 0); -1 where a set's rounding baseline raised.
  int begin_evidence() {
    if (take_carried_evidence()) {
      count_cost("evidence_carried");
      return carried_evidence_->rounds;
    }
    for (auto& set : sets_) {
      if (!set->evidence.gather()) return -1;
    }
    return 0;
  }

  /// The sampler of set `k`, ready to draw: the samples of a case's sets are one stream in
  /// judging's order, set k going on from where the set before it (the last set, for the
  /// first) left the generators; each set's gathering starts the stream afresh.
  EvidenceSampler& drawing(size_t k) {
    EvidenceSampler& sampler = sets_.at(k)->evidence;
    sampler.continue_from(sets_.at((k + sets_.size() - 1) % sets_.size())->evidence);
    return sampler;
  }

  /// The first check's bounds of a set's paths (oracle::first_bounds).
  oracle::CaseBounds first_bounds(const ReferenceSet& refs) const {
    return oracle::first_bounds(dtype_, context_, refs.evidence_values(), options_.rounding);
  }

  /// The bounds one reference set holds its paths to: the first check's, or with the
  /// evidence its rule's (and its repeat calls' coarse ones).
  enum class Check { kFirst, kEvidence };
  struct SetBounds {
    oracle::CaseBounds bounds;
    std::optional<oracle::CaseBounds> repeats;
  };
  SetBounds set_bounds(size_t k, Check check, int64_t* cancellation) {
    if (check == Check::kFirst) return {first_bounds(sets_.at(k)->references), std::nullopt};
    EvidenceSampler& sampler = drawing(k);
    SetBounds out;
    out.bounds = sampler.bounds(cancellation);
    out.repeats = sampler.repeat_call_bounds();
    return out;
  }

  /// Every path that ran against its reference set's reference under `check`, its repeat
  /// calls and their plans, and the fused path against the unfused one. `cancellation`: the
  /// tensors the basic ops' set counts as cancellation-widened.
  std::vector<Finding> compare_all(Check check, int64_t* cancellation = nullptr) {
    std::vector<Finding> findings;
    std::vector<std::string> notes;
    oracle::Comparer comparer(findings, notes);
    std::vector<SetBounds> bounds;
    for (size_t k = 0; k < sets_.size(); ++k) bounds.push_back(set_bounds(k, check, k == 0 ? cancellation : nullptr));
    // A call with the recipe off computes in high precision (runner/recipe_off.h).
    std::optional<oracle::CaseBounds> off;
    if (check == Check::kEvidence && recipe_off_) off = recipe_off_->bounds(evidence_rounds_);
    for (const PathRun* run : paths_.active()) {
      const ReferenceSet& refs = set_of(run->name).references;
      const SetBounds& b = bounds.at(set_index(run->name));
      if (run->ok()) {
        compare_paths(run->name + "~reference", spec_, refs.reference(), *run, b.bounds, comparer, all_channels());
      }
      oracle::check_fp8_state(spec_, *run, findings);
      // A repeat call of a quantizing case rounds other values than call 1, whose evidence the
      // bounds hold, near other FP8 rounding boundaries: its elements get the largest allowance
      // of their tensor, and with evidence the repeat bounds hold the coarse FP8 estimate
      // (every element jittered, EvidenceSampler::repeat_call_bounds).
      const oracle::CaseBounds repeat_bounds = b.repeats                   ? *b.repeats
                                               : reference_case_.quantizes ? uniform_allowance(b.bounds)
                                                                           : b.bounds;
      // After an optimizer step the call runs on other values than the evidence's: each
      // element gets the largest allowance of its tensor (the step halves every parameter),
      // and call 1's norm bound, evidence of call 1's rounding, does not apply.
      const oracle::CaseBounds stepped_bounds = stepped_allowance(repeat_bounds);
      const std::optional<oracle::CaseBounds> stepped_off = off ? std::optional(stepped_allowance(*off)) : std::nullopt;
      bool stepped = false;
      for (size_t k = 0; k < run->repeats.size() && k < spec_.repeat_calls.size(); ++k) {
        const PathRun& repeat = run->repeats[k];
        stepped = stepped || spec_.repeat_calls[k].update;
        if (!repeat.ok()) continue;
        const bool high_precision = off && spec_.repeat_calls[k].recipe_off;
        const oracle::CaseBounds& call_bounds = high_precision ? (stepped ? *stepped_off : *off)
                                                : stepped      ? stepped_bounds
                                                               : repeat_bounds;
        compare_paths(repeat.name + "~reference", spec_, refs.expected_for_call(k), repeat, call_bounds, comparer,
                      all_channels());
        compare_plans(repeat, findings);
        if (spec_.repeat_calls[k].no_grad) oracle::check_eval_graph(spec_, repeat, findings);
        oracle::check_fp8_state(spec_, repeat, findings);
      }
    }
    const PathRun* fused = paths_.named("fused");
    const PathRun* unfused = paths_.named("unfused");
    if (options_.compare_fused_unfused && fused && unfused && fused->ok() && unfused->ok()) {
      const PathSet& fused_set = set_of(fused->name);
      const PathSet& unfused_set = set_of(unfused->name);
      if (dtype_ == at::kDouble && &fused_set == &unfused_set) {
        compare_paths("fused~unfused", spec_, *unfused, *fused, {path_pair_tolerance(dtype_, context_), {}}, comparer,
                      all_channels());
      } else if (dtype_ == at::kDouble) {
        compare_shifted(spec_, fused_set.references.reference(), unfused_set.references.reference(), *fused, *unfused,
                        oracle::CaseBounds{path_pair_tolerance(dtype_, context_), {}}.bound(""), all_channels(),
                        comparer);
      } else {
        oracle::compare_fused_unfused(spec_, fused_set.references.reference(), *fused, *unfused, dtype_, context_,
                                      check == Check::kEvidence ? &fused_set.evidence.evidence() : nullptr, findings,
                                      options_.rounding, all_channels(), &unfused_set.references.reference());
      }
    }
    for (auto& note : notes) notes_.push_back(std::move(note));
    return findings;
  }

  /// The evidence stage's state for the in-place ablation's rerun (EvidenceCarry); none
  /// when this run gathered no evidence.
  std::optional<EvidenceCarry> carry_evidence() const {
    if (evidence_rounds_ < 0) return std::nullopt;
    EvidenceCarry carry;
    for (const auto& set : sets_) carry.sets.push_back(set->evidence.carry());
    carry.rounds = evidence_rounds_;
    return carry;
  }

  /// Takes the parent run's evidence (EvidenceCarry) where it was measured on this run's
  /// reference sets: same quantization points in the same order, same reference values
  /// (bit for bit); false otherwise (the rerun gathers its own).
  bool take_carried_evidence() {
    const EvidenceCarry* carry = carried_evidence_;
    if (carry == nullptr || carry->rounds < 0 || carry->sets.size() != sets_.size()) return false;
    for (size_t k = 0; k < sets_.size(); ++k) {
      if (!sets_[k]->evidence.matches(carry->sets[k])) return false;
    }
    for (size_t k = 0; k < sets_.size(); ++k) sets_[k]->evidence.take(carry->sets[k]);
    return true;
  }

  // ---- replicas (runner/judge.h): the ranks' copies of a replicated tensor, within the
  // static tolerance of two paths.
  void judge_replicas() {
    if (!sharding_) return;
    for (auto& f : runner::judge_replicas(spec_, paths_.active(), *sharding_, path_pair_tolerance(dtype_, context_))) {
      result_.findings.push_back(std::move(f));
    }
  }

  // ---- finite differences: the basic ops' reference itself against central differences
  // (float64).
  void check_finite_differences_stage(const ReferenceSet& basic) {
    // A quantizing case's gradient is deliberately not the derivative of its value (the
    // quantizers pass gradients straight through): nothing for central differences to check.
    if (!options_.finite_differences || dtype_ != at::kDouble || !basic.reference().ok() || reference_case_.quantizes) {
      return;
    }
    try {
      check_finite_differences(spec_, prepared_.tensors, basic.reference(), prepared_.reference_ops,
                               options_.finite_difference, prepared_.generator, result_.findings, notes_);
    } catch (const gradfuzz::Error& e) {
      notes_.push_back(std::string("finite differences: reference forward raised ") + e.what());
    } catch (const c10::Error& e) {
      notes_.push_back(std::string("finite differences: reference forward raised ") + e.what_without_backtrace());
    }
  }

  // ---- confirm: evidence, never an excuse. A low-precision value finding is rerun in the
  // widest dtype on the same values, and each finding says whether it persists there.
  void confirm_in_wide_dtype() {
    if (!options_.confirm_in_wide_dtype || dtype_ == at::kDouble) return;
    if (!has_value_findings(result_.findings)) return;
    const auto wide = widest_dtype(backend_.capabilities());
    if (!wide || dtype_rank(*wide) <= dtype_rank(spec_.dtype)) return;
    CaseSpec wide_spec = spec_;
    wide_spec.dtype = *wide;
    std::vector<PathRun> wide_runs;
    try {
      wide_runs = paths_.rerun(backend_, wide_spec, prepared_.plan, prepared_.tensors);
    } catch (const std::runtime_error& e) {
      notes_.push_back("the " + *wide + " confirmation did not run: " + e.what());
      return;
    }
    const at::ScalarType wide_type = harness::scalar_type_from_name(*wide);
    std::vector<Finding> wide_findings;
    std::vector<std::string> ignored;
    oracle::Comparer comparer(wide_findings, ignored);
    std::set<std::string> ran;
    for (const auto& r : wide_runs) {
      if (!r.ok()) continue;
      ran.insert(r.name);
      compare_paths(r.name + "~reference", spec_, set_of(r.name).references.reference(), r,
                    {case_tolerance(wide_type, context_), {}}, comparer, all_channels());
    }
    if (note_wide_dtype(result_.findings, wide_findings, ran, *wide)) {
      result_.features.emplace_back("precision_only_finding");
    }
  }

  // ---- root cause by ablation (RunOptions::attribute_in_place, runner/judge.h): the case
  // again with every in_place=0 on the same values.
  void attribute_in_place_stage() {
    if (!options_.attribute_in_place) return;
    const PathRun* unfused = paths_.named("unfused");
    const auto ablation = in_place_ablation(spec_, result_.findings, unfused);
    if (!ablation) return;
    RunOptions o = options_;
    o.attribute_in_place = false;
    o.confirm_in_wide_dtype = false;
    o.finite_differences = false;
    // The rerun's findings are read by kind and tensor only: no writer is needed, nor the
    // repeat calls' plan checks unless a finding to attribute is a plan's.
    o.find_writers = options_.find_writers && !options_.shared_runs;
    o.check_plans = options_.check_plans && (!options_.shared_runs ||
                                             std::any_of(ablation->candidates.begin(), ablation->candidates.end(),
                                                         [&](size_t k) { return result_.findings[k].role == "plan"; }));
    // The rerun's reference is this run's (the reference ignores in_place): with shared runs
    // it starts from this run's evidence where its reference sets match (EvidenceCarry).
    const std::optional<EvidenceCarry> carry = options_.shared_runs ? carry_evidence() : std::nullopt;
    CaseResult without;
    try {
      without = run_case_impl(ablation->ablated, backend_, o, carry ? &*carry : nullptr);
    } catch (const std::exception& e) {
      notes_.push_back(std::string("in-place ablation not run: ") + e.what());
      return;
    }
    if (without.verdict == VerdictKind::kUnsupported) return;
    in_place_caused_ = gone_without(*ablation, result_.findings, without.findings);
    in_place_writers_ = ablation->writers;
  }

  // ---- localise (RunOptions::trace): where each path with value findings first leaves its
  // reference set's reference, among its plan groups' tensors and its compared tensors, each
  // under the bound judge_values held it to (oracle/divergence.h).
  void localise_stage() {
    if (!trace_) return;
    for (const PathRun* run : paths_.active()) {
      if (!run->ok() || run->trace.empty()) continue;
      const std::string pair = run->name + "~reference";
      if (std::none_of(result_.findings.begin(), result_.findings.end(), [&](const Finding& f) {
            return f.path_pair == pair && (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient);
          })) {
        continue;
      }
      localise(*run, set_of(run->name));
    }
    localise_repeat_calls();
  }

  /// The first divergence of `run` from `set`'s reference.
  void localise(const PathRun& run, const PathSet& set) {
    const ReferenceSet& refs = set.references;
    if (!refs.reference().ok()) return;
    const oracle::CaseBounds bounds =
        dtype_ == at::kDouble || evidence_rounds_ < 0 ? first_bounds(refs) : set.evidence.bounds();
    if (auto d = oracle::first_divergence(spec_, prepared_.plan, refs.reference(), run, bounds, result_.findings)) {
      result_.divergences.push_back(std::move(*d));
    }
  }

  /// A repeat call's value findings whose path's first call did not diverge (the call takes a
  /// gradient the first does not, or its recipe state differs): the case run once more, traced,
  /// with that call's grad requirements as its first call, on the same values. Its path's
  /// divergence stands for the repeat call's (a defect the call reaches, its values aside).
  void localise_repeat_calls() {
    for (const PathRun* run : paths_.active()) {
      const bool diverged = std::any_of(result_.divergences.begin(), result_.divergences.end(),
                                        [&](const harness::Divergence& d) { return d.path == run->name; });
      for (size_t k = 0; !diverged && k < run->repeats.size() && k < spec_.repeat_calls.size(); ++k) {
        const std::string pair = run->repeats[k].name + "~reference";
        const bool fails = std::any_of(result_.findings.begin(), result_.findings.end(), [&](const Finding& f) {
          return f.path_pair == pair && (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient);
        });
        const RepeatCall& call = spec_.repeat_calls[k];
        if (!fails || call.no_grad) continue;
        // A call after a step of the usage script is run as a first call without the steps
        // (the case's own values): where its defect needs a step, that run passes and the
        // finding's own tensor signs it.
        CaseSpec as_first = spec_;
        as_first.input_requires_grad = call.input_requires_grad;
        as_first.repeat_calls.clear();
        if (call.recipe_off) as_first.recipe.reset();  // the call ran in high precision
        as_first.drop_unmet_usage();
        RunOptions o = options_;
        o.attribute_in_place = false;
        o.confirm_in_wide_dtype = false;
        o.finite_differences = false;
        o.find_writers = false;
        o.check_plans = false;
        CaseResult first_call;
        try {
          first_call = run_case_impl(as_first, backend_, o);
        } catch (const std::exception& e) {
          notes_.push_back("the traced run of " + run->repeats[k].name + " as a first call did not run: " + e.what());
          continue;
        }
        for (harness::Divergence d : first_call.divergences) {
          if (d.path != run->name) continue;
          d.path = run->repeats[k].name;
          result_.divergences.push_back(std::move(d));
          break;
        }
      }
    }
  }

  CaseResult finish() {
    std::vector<const PathRun*> runs = paths_.active();
    for (const PathRun* run : runs) {
      result_.fp8_states_checked += run->fp8_states_checked;
      result_.fp8_tensors_checked += run->fp8_tensors_checked;
      for (const auto& repeat : run->repeats) {
        result_.fp8_states_checked += repeat.fp8_states_checked;
        result_.fp8_tensors_checked += repeat.fp8_tensors_checked;
      }
    }
    // The findings the ablation puts down to writing in place are set apart: the others are
    // signed by their own first divergence (a weight gradient 3.6x off with the write and one
    // FP8 rounding off without it was signed by the in-place op's tensor, H200 2026-12-02d).
    oracle::assign_signatures(spec_, prepared_.plan, runs, result_, in_place_caused_);
    for (size_t k : in_place_caused_) {
      Finding& f = result_.findings[k];
      f.op = "in_place:" + in_place_writers_;
      f.option = "in_place=1";
      f.signature = std::string(harness::verdict_name(f.kind)) + "|" + f.op + "|in_place=1|" + f.role;
      const std::string why = "gone when every op runs with in_place=0 on the same values: caused by writing in place";
      f.note = f.note.empty() ? why : f.note + "; " + why;
    }
    for (const auto& note : set_notes_) notes_.push_back(note);
    for (const auto& note : notes_) result_.notes += (result_.notes.empty() ? "" : "; ") + note;
    result_.summarize();
    return std::move(result_);
  }

  const CaseSpec& spec_;
  Backend& backend_;
  const RunOptions& options_;
  const at::ScalarType dtype_;
  /// RunOptions::trace, where the case can be traced (one process).
  const bool trace_;
  /// The parent run's evidence, for the in-place ablation's rerun (EvidenceCarry).
  const EvidenceCarry* carried_evidence_ = nullptr;
  CaseResult result_;
  PreparedCase prepared_;
  ToleranceContext context_;
  /// What the case's reference evaluations share (device, recipe, quantization, trace).
  ReferenceCase reference_case_;
  CasePaths paths_;
  /// The case's reference sets, one per set of quantization points its paths have: sets_[0]
  /// the basic ops' (the unfused path's, and every path's where no fused op quantizes
  /// elsewhere), then one per other set a path's plans give.
  std::vector<std::unique_ptr<PathSet>> sets_;
  /// The bounds of the case's calls with the recipe off (null: it has none).
  std::unique_ptr<RecipeOffBounds> recipe_off_;
  /// Path name -> index into sets_ (absent: 0).
  std::map<std::string, size_t> path_sets_;
  /// What each further reference set is, for the case's notes.
  std::vector<std::string> set_notes_;
  /// The last evidence round judge_values compared with (-1: no evidence gathered).
  int evidence_rounds_ = -1;
  /// Findings the in-place ablation attributes to the in-place ops (their types, joined).
  std::vector<size_t> in_place_caused_;
  std::string in_place_writers_;
  /// A distributed case's layouts (harness/sharding.h); the paths come back assembled.
  std::optional<harness::ShardingPlan> sharding_;
  std::vector<std::string> notes_;
};

CaseResult run_case_impl(const CaseSpec& spec, Backend& backend, const RunOptions& options,
                         const EvidenceCarry* carried_evidence) {
  return CaseRun(spec, backend, options, carried_evidence).run();
}

}  // namespace

namespace {
/// The model backend (its fuser's plans) with the FP8 capabilities of the backend a script
/// is written for: the evidence then holds the paths to that backend's FP8 rounding and
/// GEMM accumulation, as replay there does.
class WithTargetFp8 final : public Backend {
 public:
  WithTargetFp8(Backend& inner, const BackendCapabilities& target) : inner_(inner), caps_(inner.capabilities()) {
    caps_.fp8_reference_exact = target.fp8_reference_exact;
    caps_.fp8_gemm_accumulation = target.fp8_gemm_accumulation;
  }
  std::string name() const override { return inner_.name(); }
  const BackendCapabilities& capabilities() override { return caps_; }
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths) override {
    return inner_.run_paths(spec, plan, tensors, paths);
  }

 private:
  Backend& inner_;
  BackendCapabilities caps_;
};
}  // namespace

Expectation judging_expectation(const CaseSpec& spec, const RunOptions& options, const std::vector<PathRequest>& paths,
                                const BackendCapabilities* target) {
  // Runs only the first call of `paths` under a recipe, for their plans (plan_path_sets).
  thread_local ModelBackend model;
  if (target == nullptr) return CaseRun(spec, model, options).expectation(paths);
  WithTargetFp8 backend(model, *target);
  return CaseRun(spec, backend, options).expectation(paths);
}

std::optional<oracle::CaseBounds> judging_bounds(const CaseSpec& spec, const RunOptions& options) {
  return judging_expectation(spec, options).bounds;
}

}  // namespace gradfuzz::runner
