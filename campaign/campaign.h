#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "campaign/case_runner.h"
#include "campaign/known_issues.h"
#include "generators/case_gen.h"
#include "ops/faults.h"
#include "reports/reporter.h"
#include "runner/run_case.h"

namespace gradfuzz::campaign {

/// Cases run when neither a count nor a time budget is given.
inline constexpr int64_t kDefaultCampaignCases = 100;
/// Default corpus of `gradfuzz fuzz`: visible to the user, never the checked-in corpus.
inline constexpr const char* kDefaultCorpusDir = "gradfuzz-out/corpus";
/// Sub-directories of a campaign corpus.
inline constexpr const char* kInflightDir = "inflight";
inline constexpr const char* kFindingsDir = "findings";
/// Under findings/: a few unshrunk members of each cluster.
inline constexpr const char* kExamplesDir = "examples";
/// Under findings/: the case that first showed each known cluster, as generated.
inline constexpr const char* kKnownDir = "known";
inline constexpr int64_t kExamplesPerCluster = 3;

/// One campaign (`gradfuzz fuzz`, and each fault of `gradfuzz selftest`).
struct CampaignOptions {
  /// Budget by count; when both are empty kDefaultCampaignCases. When both are set, the
  /// campaign stops at whichever comes first.
  std::optional<int64_t> cases;
  std::optional<double> time_s;
  uint64_t seed = 0;
  /// Resolved device ("cpu" or "cuda").
  std::string device = "cpu";
  std::vector<std::string> dtypes{"float64", "float32"};
  int max_ops = 8;
  /// Shape regime of the generated cases (generators/case_gen.h); nullopt: mix on CUDA,
  /// tiny on the CPU.
  std::optional<generators::ShapeRegime> shapes;
  /// With shapes kMix: the share of the campaign's wall time each regime gets (tiny, edge,
  /// large). Each case takes the regime furthest below its share of the time spent so far,
  /// so slow large cases cannot eat the night: a mix keeps most of tiny's case rate while
  /// large cases keep coming (docs/BENCHMARKS.md). The regime of a case then depends on
  /// measured time; the case files and the case log say what ran.
  std::map<generators::ShapeRegime, double> regime_time_shares{{generators::ShapeRegime::kTiny, 0.80},
                                                               {generators::ShapeRegime::kEdge, 0.12},
                                                               {generators::ShapeRegime::kLarge, 0.08}};
  /// Seconds one shrink may take (large cases: each candidate is a large case).
  double max_shrink_seconds = 120;
  /// Element budget of one tensor in edge and large cases.
  int64_t max_tensor_elements = int64_t{1} << 24;
  /// Fault switched on for every case and for shrinking: a model fault (ops/faults.h) or one
  /// of the backend's planted faults (capabilities().faults).
  std::optional<std::string> fault;
  /// Known issues: findings that match an entry are reported as known, counted, and not
  /// shrunk; the entries' steering weights go to the generator (feature_weights).
  std::shared_ptr<const KnownIssues> known;
  /// Case feature -> share of cases that may draw it (generators/case_gen.h); merged with
  /// the known issues' weights (the smaller wins).
  std::map<std::string, double> feature_weights;
  /// generators::GenOptions::recipe: "any", "none" or a recipe's name.
  std::string recipe = "any";
  /// generators::GenOptions::usage: whether cases draw the usage script's elements.
  bool usage = true;
  /// generators::GenOptions::world_size: distributed cases of this many ranks (nullopt:
  /// one-process cases).
  std::optional<int64_t> world_size;
  std::filesystem::path corpus_dir = kDefaultCorpusDir;
  /// Stop after the first finding (selftest); with require_fault_attributable, after the
  /// first finding the fault is responsible for.
  bool stop_at_first_finding = false;
  /// With a fault on: a failing case counts as the fault's finding only when it passes with
  /// the fault switched off (one extra run), and its shrink keeps that property. Failures
  /// that persist without the fault are real runtime bugs: still shrunk, saved and reported,
  /// deduplicated separately, but never taken as the fault's detection (selftest).
  bool require_fault_attributable = false;
  /// Shrink each new finding before saving it.
  bool shrink = true;
  /// Predicate-call cap of each shrink (crash and timeout findings get fewer: each
  /// candidate that still fails costs a worker restart or a whole case time limit).
  int64_t max_shrink_calls = 2000;
  int64_t max_crash_shrink_calls = 64;
  int64_t max_timeout_shrink_calls = 4;
  runner::RunOptions run_options;
  /// Backend the cases run on (recorded in case files).
  std::string backend = "model";
  /// This run is shard `shard_index` (0-based) of `shard_count`: its k-th case is the
  /// unsharded campaign's case k * shard_count + shard_index, so shards never repeat each
  /// other and together run exactly the unsharded campaign's cases.
  int64_t shard_index = 0;
  int64_t shard_count = 1;
  /// Set (by a signal handler) to end the run cleanly: no new case starts, the cases in
  /// flight are dropped, findings saved so far stay.
  const std::atomic<bool>* stop = nullptr;
  /// Seconds the cases in flight may still take after the time budget ran out.
  double time_grace_s = 2;
  /// Called after every case (the campaign's outcome so far), e.g. to rewrite the report.
  std::function<void(double wall_s)> on_case;
  /// Generate cases for these capabilities instead of the runner's backend's (the same
  /// cases on two backends: `--generate-as te` on the model).
  std::shared_ptr<const harness::BackendCapabilities> generate_as;
  /// When set, one JSON line per case: {number, verdict, signature, backend, spec}.
  std::ostream* case_log = nullptr;
};

/// One new finding of a campaign, shrunk and saved.
struct CampaignFinding {
  reports::Finding finding;
  /// Catalog op count of the shrunk case.
  int64_t shrunk_ops = 0;
  /// 1-based index of the case that found it, and seconds from the campaign start to the end
  /// of that case (shrinking not included).
  int64_t case_number = 0;
  double seconds = 0;
  /// The case passes with the campaign's fault off (always true without a fault or without
  /// require_fault_attributable).
  bool fault_attributable = true;
  bool known() const { return finding.known.has_value(); }
};

/// What a campaign did.
struct CampaignOutcome {
  int64_t cases_run = 0;
  int64_t passed = 0;
  int64_t failed = 0;
  /// Valid cases the backend declined (not findings).
  int64_t unsupported = 0;
  /// Failed cases whose every finding matched a known issue.
  int64_t known_failed = 0;
  /// One per cluster (a finding signature, oracle/signature.h), in the order found: new
  /// clusters with their shrunk case, known ones with the case that showed them first.
  std::vector<CampaignFinding> findings;
  double wall_s = 0;
  /// The feature weights the generator used.
  std::map<std::string, double> feature_weights;
  /// Per shape regime: cases run and their seconds (measured from hand-out to result).
  std::map<std::string, std::pair<int64_t, double>> regimes;
  /// The first new (not known) finding with fault_attributable set, if any.
  const CampaignFinding* first_attributable() const;
  /// Clusters that are not known.
  int64_t new_findings() const;
};

/// The case file (verdict pass, provenance of this build) of `spec`, as written to the
/// in-flight file before the case runs.
std::string inflight_case_text(const harness::CaseSpec& spec, uint64_t campaign_seed,
                               const std::optional<std::string>& fault, const std::string& backend = "model");

/// A case left in <corpus>/inflight by a run that ended abruptly (killed, or killed by a
/// case when it ran cases in process).
struct LeftoverCase {
  std::filesystem::path path;
  harness::CaseSpec spec;
  std::optional<std::string> fault;
};

/// In-flight files of <corpus>/inflight whose owner is gone (each owner holds an exclusive
/// lock on its files while it lives, so a concurrent campaign's files are left alone). A
/// leftover that cannot be read is moved to <corpus>/crashing/unreadable-<name> and reported
/// in `problems`. run_campaign runs the leftovers first and deletes each once its outcome
/// is recorded.
std::vector<LeftoverCase> find_leftover_cases(const std::filesystem::path& corpus_dir,
                                              std::vector<std::string>& problems);

/// Seed of case `index` of a campaign: a SplitMix64 mix of (campaign_seed, index), so every
/// case of a run can be regenerated alone and `--seed` reproduces the whole run.
uint64_t case_seed(uint64_t campaign_seed, int64_t index);

/// Generator size of case `index`: grows linearly from 10 to 100 over the first 90 cases,
/// then stays at 100 (case_gen.h: the op budget scales with min(size, 100)).
int case_size(int64_t index);

/// Generator options of a campaign (max_ops, dtypes, device, the backend's capabilities).
generators::GenOptions campaign_gen_options(const CampaignOptions& options,
                                            std::shared_ptr<const harness::BackendCapabilities> capabilities = nullptr);

/// One case in this many is an invalid configuration (generators/invalid_gen.h).
inline constexpr int64_t kInvalidCaseEvery = 10;

/// The spec of case `index`, exactly as run_campaign generates it (for `capabilities`'
/// backend; null: the model), in `regime` when given (a mix campaign's scheduled regime),
/// else in the options' regime.
harness::CaseSpec campaign_case(const CampaignOptions& options, int64_t index,
                                const std::shared_ptr<const harness::BackendCapabilities>& capabilities = nullptr,
                                std::optional<generators::ShapeRegime> regime = std::nullopt);

/// The regime a mix campaign runs next: the one furthest below its share of the time spent
/// (spent: seconds per regime so far); ties go to the first in tiny, edge, large order.
/// `skip`: regimes not to choose now (tiny is never skipped).
generators::ShapeRegime next_regime(const std::map<generators::ShapeRegime, double>& shares,
                                    const std::map<generators::ShapeRegime, double>& spent,
                                    const std::set<generators::ShapeRegime>& skip = {});

/// A case of a mix campaign that is still running: its regime and its seconds so far.
struct RegimeInFlight {
  generators::ShapeRegime regime;
  double elapsed_s = 0;
};

/// The seconds a mix campaign has spent per regime, counting the cases still running: each
/// is charged the larger of its seconds so far and the mean of its regime's finished cases
/// (`finished`: count per regime), so that one slow case handed out is charged its expected
/// cost at once. Without that, the cases handed out while a large case runs all see its
/// regime below its share, and a short campaign with many workers overshoots the edge and
/// large shares (measured: edge 21% of the worker time where 12% was asked, 12 te workers,
/// docs/BENCHMARKS.md).
std::map<generators::ShapeRegime, double> charged_regime_seconds(
    const std::map<generators::ShapeRegime, double>& spent, const std::map<generators::ShapeRegime, int64_t>& finished,
    const std::vector<RegimeInFlight>& in_flight);

/// The regime a mix campaign with cases still running hands out next: next_regime on
/// charged_regime_seconds, where an edge or large regime whose first case is still running
/// waits for it (its cost is not known yet: a short campaign with 12 workers otherwise hands
/// out a large case to each worker that asks while the first one runs).
generators::ShapeRegime next_mix_regime(const std::map<generators::ShapeRegime, double>& shares,
                                        const std::map<generators::ShapeRegime, double>& spent,
                                        const std::map<generators::ShapeRegime, int64_t>& finished,
                                        const std::vector<RegimeInFlight>& in_flight);

/// Runs a seeded, budgeted campaign on `runner`, `leftovers` first. Each case is written to
/// one of this process's in-flight files in <corpus>/inflight before it is handed out, so a
/// crash of the whole run leaves its repro; a failing case whose signature is new is shrunk
/// (predicate: still fails with the same verdict kind, same fault on) and saved to
/// <corpus>/findings, or <corpus>/crashing for crash and timeout verdicts, with its verdict
/// and fault. Every case goes to `reporter` (report_case only: the caller reports the
/// context and finalizes). `progress`, when not null, receives a carriage-return progress
/// line (cases, findings, cases/s) a few times a second. Throws InternalError (the in-flight
/// file kept) when a case trips an internal assertion, and InputError or
/// corpus::CorpusError when the corpus cannot be written.
CampaignOutcome run_campaign(const CampaignOptions& options, CaseRunner& runner, reports::Reporter& reporter,
                             std::ostream* progress, std::vector<LeftoverCase> leftovers = {});
/// run_campaign in this process on the model backend (selftest, bench, tests).
CampaignOutcome run_campaign(const CampaignOptions& options, reports::Reporter& reporter, std::ostream* progress);

/// Shrinks a failing `spec` on `runner`, with `fault` on for every candidate, to a locally
/// minimal case that still has a finding with `signature` (oracle/signature.h), so that a
/// channel-gradient finding does not shrink into some other problem its smaller cases happen
/// to show. With `require_passes_without`, every candidate must also pass with the fault off.
/// Candidates whose run raises count as "does not fail the same way". `keep_going` (when set)
/// ends the shrink early when it returns false (the best case so far is returned). `traced`:
/// the signature is a traced run's (CaseRunner::run_traced), and so is each candidate's run.
harness::CaseSpec shrink_failure(CaseRunner& runner, const harness::CaseSpec& spec, const std::string& signature,
                                 const std::string& fault, bool require_passes_without, int64_t max_calls,
                                 const std::function<bool()>& keep_going = {}, bool traced = false);

/// The feature weights a campaign's generator uses: `options.feature_weights` and the known
/// issues' steering weights for `backend`, the smaller per feature.
std::map<std::string, double> campaign_feature_weights(const CampaignOptions& options, const std::string& backend);

/// The version a known-issue entry's range is compared with: the backend's own
/// (transformer_engine for te, torch for torch), gradfuzz's for the model.
std::string backend_version(const harness::BackendCapabilities& caps);

}  // namespace gradfuzz::campaign
