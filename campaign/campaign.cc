#include "campaign/campaign.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <stdexcept>

#include "campaign/case_feed.h"
#include "campaign/exit_codes.h"
#include "campaign/files.h"
#include "campaign/finding_recorder.h"
#include "campaign/worker_pool.h"
#include "corpus/case_file.h"
#include "generators/invalid_gen.h"
#include "generators/shrink.h"
#include "reports/build_info.h"

namespace gradfuzz::campaign {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class ProgressLine {
 public:
  explicit ProgressLine(std::ostream* out) : out_(out), start_(Clock::now()), last_(start_) {}

  void update(int64_t cases, int64_t findings, bool force = false) {
    if (!out_) return;
    const auto now = Clock::now();
    // A few updates a second keep a terminal readable without slowing fast campaigns.
    if (!force && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    *out_ << "\r[gradfuzz] cases " << cases << "  findings " << findings << "  "
          << (elapsed > 0 ? static_cast<double>(cases) / elapsed : 0.0) << " cases/s   " << std::flush;
  }

  void finish() {
    if (out_) *out_ << '\n' << std::flush;
  }

 private:
  std::ostream* out_;
  Clock::time_point start_;
  Clock::time_point last_;
};

}  // namespace

std::string inflight_case_text(const harness::CaseSpec& spec, uint64_t campaign_seed,
                               const std::optional<std::string>& fault, const std::string& backend) {
  corpus::CaseFile file =
      corpus::make_case_file(spec, corpus::ExpectedVerdict{}, campaign_seed, reports::build_tool_info().version, fault);
  file.backend = backend;
  return corpus::case_file_to_json(file).dump(2) + "\n";
}

std::vector<LeftoverCase> find_leftover_cases(const std::filesystem::path& corpus_dir,
                                              std::vector<std::string>& problems) {
  std::vector<LeftoverCase> found;
  for (const auto& path : regular_files(corpus_dir / kInflightDir)) {
    if (path.extension() != ".json" || !owner_is_gone(path)) continue;  // a live campaign's file
    try {
      corpus::CaseFile file = corpus::load_case_file(path);
      found.push_back({path, std::move(file.spec), file.provenance.fault});
    } catch (const std::exception& e) {
      // Kept for a person to read, out of the way of the next runs.
      const std::filesystem::path dest = corpus_dir / corpus::kCrashingDir / ("unreadable-" + path.filename().string());
      make_directories(dest.parent_path());
      if (::rename(path.c_str(), dest.c_str()) == 0) {
        problems.push_back(path.string() + ": unreadable in-flight case moved to " + dest.string() + ": " + e.what());
      } else {
        problems.push_back(path.string() + ": unreadable in-flight case left in place: " + e.what());
      }
    }
  }
  return found;
}

uint64_t case_seed(uint64_t campaign_seed, int64_t index) {
  return splitmix64(splitmix64(campaign_seed) ^ static_cast<uint64_t>(index));
}

int case_size(int64_t index) { return static_cast<int>(std::min<int64_t>(100, 10 + std::max<int64_t>(0, index))); }

generators::GenOptions campaign_gen_options(const CampaignOptions& options,
                                            std::shared_ptr<const harness::BackendCapabilities> capabilities) {
  generators::GenOptions gen;
  gen.set_max_ops(options.max_ops).set_dtypes(options.dtypes).set_device(options.device);
  gen.set_capabilities(std::move(capabilities));
  gen.set_shapes(options.shapes.value_or(options.device == "cuda" ? generators::ShapeRegime::kMix
                                                                  : generators::ShapeRegime::kTiny));
  gen.set_max_tensor_elements(options.max_tensor_elements);
  gen.set_feature_weights(campaign_feature_weights(options, options.backend));
  gen.set_recipe(options.recipe);
  gen.set_usage(options.usage);
  gen.set_world_size(options.world_size);
  return gen;
}

generators::ShapeRegime next_regime(const std::map<generators::ShapeRegime, double>& shares,
                                    const std::map<generators::ShapeRegime, double>& spent,
                                    const std::set<generators::ShapeRegime>& skip) {
  double total = 0;
  for (const auto& [regime, seconds] : spent) total += seconds;
  generators::ShapeRegime best = generators::ShapeRegime::kTiny;
  double best_deficit = -std::numeric_limits<double>::infinity();
  for (auto regime :
       {generators::ShapeRegime::kTiny, generators::ShapeRegime::kEdge, generators::ShapeRegime::kLarge}) {
    auto share = shares.find(regime);
    if (share == shares.end() || share->second <= 0) continue;
    if (regime != generators::ShapeRegime::kTiny && skip.count(regime) != 0) continue;
    auto it = spent.find(regime);
    const double deficit = share->second * total - (it == spent.end() ? 0.0 : it->second);
    if (deficit > best_deficit) {
      best_deficit = deficit;
      best = regime;
    }
  }
  return best;
}

std::map<generators::ShapeRegime, double> charged_regime_seconds(
    const std::map<generators::ShapeRegime, double>& spent, const std::map<generators::ShapeRegime, int64_t>& finished,
    const std::vector<RegimeInFlight>& in_flight) {
  std::map<generators::ShapeRegime, double> charged = spent;
  for (const RegimeInFlight& running : in_flight) {
    double expected = 0;
    const auto count = finished.find(running.regime);
    const auto seconds = spent.find(running.regime);
    if (count != finished.end() && count->second > 0 && seconds != spent.end()) {
      expected = seconds->second / static_cast<double>(count->second);
    }
    charged[running.regime] += std::max(running.elapsed_s, expected);
  }
  return charged;
}

generators::ShapeRegime next_mix_regime(const std::map<generators::ShapeRegime, double>& shares,
                                        const std::map<generators::ShapeRegime, double>& spent,
                                        const std::map<generators::ShapeRegime, int64_t>& finished,
                                        const std::vector<RegimeInFlight>& in_flight) {
  std::set<generators::ShapeRegime> unknown_cost;
  for (const RegimeInFlight& running : in_flight) {
    const auto count = finished.find(running.regime);
    if (count == finished.end() || count->second == 0) unknown_cost.insert(running.regime);
  }
  return next_regime(shares, charged_regime_seconds(spent, finished, in_flight), unknown_cost);
}

harness::CaseSpec campaign_case(const CampaignOptions& options, int64_t index,
                                const std::shared_ptr<const harness::BackendCapabilities>& capabilities,
                                std::optional<generators::ShapeRegime> regime) {
  if (regime) {
    CampaignOptions fixed = options;
    fixed.shapes = *regime;
    return campaign_case(fixed, index, capabilities);
  }
  const uint64_t seed = case_seed(options.seed, index);
  if (index % kInvalidCaseEvery == kInvalidCaseEvery - 1) {
    // Invalid configurations: every path must raise the same error and lock nothing.
    return generators::generate_invalid_case(seed, case_size(index), campaign_gen_options(options, capabilities)).spec;
  }
  return generators::generate_case(seed, case_size(index), campaign_gen_options(options, capabilities));
}

const CampaignFinding* CampaignOutcome::first_attributable() const {
  for (const auto& f : findings) {
    if (f.fault_attributable && !f.known()) return &f;
  }
  return nullptr;
}

int64_t CampaignOutcome::new_findings() const {
  return std::count_if(findings.begin(), findings.end(), [](const CampaignFinding& f) { return !f.known(); });
}

std::map<std::string, double> campaign_feature_weights(const CampaignOptions& options, const std::string& backend) {
  std::map<std::string, double> weights = options.feature_weights;
  if (options.known) {
    for (const auto& [feature, weight] : options.known->feature_weights(backend)) {
      auto it = weights.find(feature);
      weights[feature] = it == weights.end() ? weight : std::min(it->second, weight);
    }
  }
  return weights;
}

std::string backend_version(const harness::BackendCapabilities& caps) {
  for (const char* key : {"transformer_engine", "torch"}) {
    auto it = caps.versions.find(key);
    if (caps.backend != "model" && it != caps.versions.end()) return it->second;
  }
  return reports::build_tool_info().version;
}

harness::CaseSpec shrink_failure(CaseRunner& runner, const harness::CaseSpec& spec, const std::string& signature,
                                 const std::string& fault, bool require_passes_without, int64_t max_calls,
                                 const std::function<bool()>& keep_going, bool traced) {
  auto still_fails = [&](const harness::CaseSpec& candidate) {
    if (keep_going && !keep_going()) return false;
    try {
      const harness::CaseResult result =
          traced ? runner.run_traced(candidate, fault) : runner.run_now(candidate, fault);
      if (!result.finding(signature)) return false;
      return !require_passes_without || runner.run_now(candidate, "").passed();
    } catch (const WorkerInternalError&) {
      return false;  // a different problem than the one being shrunk
    } catch (const InternalError&) {
      return false;
    }
  };
  generators::ShrinkOptions shrink_options;
  shrink_options.set_max_predicate_calls(max_calls);
  return generators::shrink(spec, still_fails, shrink_options).minimal;
}

CampaignOutcome run_campaign(const CampaignOptions& options, reports::Reporter& reporter, std::ostream* progress) {
  InProcessRunner runner(backends::make_backend({}), options.run_options);
  return run_campaign(options, runner, reporter, progress);
}

CampaignOutcome run_campaign(const CampaignOptions& options, CaseRunner& runner, reports::Reporter& reporter,
                             std::ostream* progress, std::vector<LeftoverCase> leftovers) {
  // Generation follows the backend under test (its ops, options, fusions, deviations); the
  // model's catalog is the null default, so model campaigns generate exactly as before.
  std::shared_ptr<const harness::BackendCapabilities> generation = options.generate_as;
  if (!generation && options.backend != "model") {
    generation = std::make_shared<const harness::BackendCapabilities>(runner.capabilities());
  }
  CampaignOutcome outcome;
  outcome.feature_weights = campaign_feature_weights(options, options.backend);
  CaseFeed feed(options, generation, std::move(leftovers), runner.slots());
  ProgressLine line(progress);
  const auto start = Clock::now();
  const std::optional<Clock::time_point> budget_end =
      options.time_s ? std::optional<Clock::time_point>(start + std::chrono::duration_cast<Clock::duration>(
                                                                    std::chrono::duration<double>(*options.time_s)))
                     : std::nullopt;
  const auto grace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.time_grace_s));
  auto stopped = [&] { return options.stop && options.stop->load(); };
  auto time_up = [&] { return budget_end && Clock::now() >= *budget_end; };
  // Shrinking stops with the run: the best case so far is saved.
  auto keep_going = [&] { return !stopped() && !(budget_end && Clock::now() >= *budget_end + grace); };
  FindingRecorder recorder(options, runner, backend_version(runner.capabilities()), keep_going);
  bool stop_now = false;

  auto submit_next = [&]() -> bool {
    const std::optional<FedCase> c = feed.next(!time_up() && !stopped() && !stop_now);
    if (!c) return false;
    try {
      runner.submit(Job{c->id, c->spec, c->fault});
    } catch (const backends::BackendUnavailable&) {
      throw;  // the backend broke (its workers cannot start): not gradfuzz's bug, exit 2
    } catch (const std::exception& e) {
      throw InternalError(std::string("running a case raised: ") + e.what(), feed.inflight_path(c->id));
    }
    return true;
  };
  auto handle = [&](JobResult done) {
    reports::CaseRecord record;
    record.result = std::move(done.result);
    const FedCase c = feed.finish(done.id, outcome);
    record.seconds = c.seconds;
    record.regime = c.regime.empty() ? "leftover" : c.regime;
    recorder.mark(record.result, c.spec);
    record.recipe = c.spec.recipe ? c.spec.recipe->name : reports::kNoRecipe;
    record.usage = c.spec.usage_coverage();
    record.calls = 1 + static_cast<int64_t>(c.spec.repeat_calls.size());
    ++outcome.cases_run;
    if (record.result.passed()) {
      ++outcome.passed;
    } else if (record.result.verdict == harness::VerdictKind::kUnsupported) {
      ++outcome.unsupported;
    } else {
      ++outcome.failed;
      if (recorder.record(c.spec, c.fault, c.number, seconds_since(start), record, outcome)) stop_now = true;
      if (!record.result.has_new_findings()) ++outcome.known_failed;
    }
    reporter.report_case(record);
    if (options.case_log) write_case_log_line(*options.case_log, c, record);
    line.update(outcome.cases_run, outcome.new_findings());
    if (options.on_case) options.on_case(seconds_since(start));
  };

  const size_t max_pending = static_cast<size_t>(std::max(1, runner.slots()));
  bool exhausted = false;
  while (true) {
    // Results of cases that finished while a shrink ran wait in the runner: the feed's pending
    // cases (not the runner's busy workers) say what is still owed.
    while (!exhausted && feed.pending() < max_pending && runner.idle() > 0) {
      if (!submit_next()) {
        exhausted = true;
        break;
      }
      // An in-process runner has the result at once: collect it before the next case.
      if (auto r = runner.wait(Clock::now())) handle(std::move(*r));
    }
    // Stop, budget or count reached: no new case will start (a restarting worker does not
    // end the run).
    if (stopped() || time_up() || stop_now) exhausted = true;
    if (feed.pending() == 0 && exhausted) break;
    if (stopped() || (budget_end && Clock::now() >= *budget_end + grace)) {
      runner.cancel_in_flight();  // their cases are not counted; nothing was found in them
      feed.drop_pending();
      break;
    }
    // Wake up a few times a second to honour a stop or the time budget.
    std::optional<JobResult> r;
    try {
      r = runner.wait(Clock::now() + std::chrono::milliseconds(250));
    } catch (const WorkerInternalError& e) {
      throw InternalError(std::string("a worker raised: ") + e.what(), feed.inflight_path(e.job()));
    }
    if (r) handle(std::move(*r));
  }
  feed.close();
  outcome.wall_s = seconds_since(start);
  line.update(outcome.cases_run, outcome.new_findings(), /*force=*/true);
  line.finish();
  return outcome;
}

}  // namespace gradfuzz::campaign
