#include "campaign/case_feed.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "campaign/exit_codes.h"

namespace gradfuzz::campaign {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

/// The in-flight files of one campaign: one per case it may have out at once, each locked by
/// this process, named <pid>-<n>.json.
class CaseFeed::InflightFiles {
 public:
  InflightFiles(const std::filesystem::path& dir, int count) {
    for (int i = 0; i < count; ++i) {
      try {
        files_.push_back(
            std::make_unique<InflightFile>(dir / (std::to_string(::getpid()) + "-" + std::to_string(i) + ".json")));
      } catch (const std::runtime_error& e) {
        throw InputError(std::string("--corpus: ") + e.what());
      }
      free_.push_back(i);
    }
  }
  void remove_all() {
    for (auto& f : files_) f->remove();
  }
  /// Writes `text` to a free file and returns its number.
  int take(const std::string& text) {
    if (free_.empty()) throw std::logic_error("CaseFeed: no free in-flight file");
    const int i = free_.back();
    free_.pop_back();
    try {
      files_[static_cast<size_t>(i)]->write(text);
    } catch (const std::runtime_error& e) {
      throw InputError(std::string("--corpus: ") + e.what());
    }
    return i;
  }
  void give_back(int i) { free_.push_back(i); }
  const std::filesystem::path& path(int i) const { return files_[static_cast<size_t>(i)]->path(); }

 private:
  std::vector<std::unique_ptr<InflightFile>> files_;
  std::vector<int> free_;
};

CaseFeed::CaseFeed(const CampaignOptions& options, std::shared_ptr<const harness::BackendCapabilities> generation,
                   std::vector<LeftoverCase> leftovers, int slots)
    : options_(options),
      generation_(std::move(generation)),
      leftovers_(std::move(leftovers)),
      inflight_(std::make_unique<InflightFiles>(options.corpus_dir / kInflightDir, std::max(1, slots))),
      // A time-only budget leaves the count unbounded.
      max_cases_(options.cases.value_or(options.time_s ? std::numeric_limits<int64_t>::max() : kDefaultCampaignCases)),
      // A mix is scheduled by time: seconds spent per regime so far.
      mix_(campaign_gen_options(options).shapes == generators::ShapeRegime::kMix) {}

CaseFeed::~CaseFeed() = default;

std::optional<FedCase> CaseFeed::next(bool more) {
  FedCase c;
  if (!leftovers_.empty()) {
    LeftoverCase left = std::move(leftovers_.front());
    leftovers_.erase(leftovers_.begin());
    c.spec = std::move(left.spec);
    c.leftover = left.path;
    c.fault = left.fault.value_or("");
  } else {
    if (!more || next_index_ >= max_cases_) return std::nullopt;
    const int64_t global = next_index_ * options_.shard_count + options_.shard_index;
    if (mix_) {
      std::vector<RegimeInFlight> running;
      for (const auto& [id, q] : pending_) {
        if (!q.regime.empty()) {
          running.push_back({generators::shape_regime_from_name(q.regime), seconds_since(q.handed_out)});
        }
      }
      const generators::ShapeRegime regime = next_mix_regime(options_.regime_time_shares, spent_, finished_, running);
      c.spec = campaign_case(options_, global, generation_, regime);
      c.regime = generators::shape_regime_name(regime);
    } else {
      c.spec = campaign_case(options_, global, generation_);
      c.regime = generators::shape_regime_name(campaign_gen_options(options_).shapes);
    }
    ++next_index_;
    c.number = global + 1;
    c.fault = options_.fault.value_or("");
  }
  // Written before the case is handed out: if it kills the whole run, the repro is on disk.
  c.file = inflight_->take(inflight_case_text(
      c.spec, options_.seed, c.fault.empty() ? std::nullopt : std::optional<std::string>(c.fault), options_.backend));
  c.id = next_id_++;
  c.handed_out = Clock::now();
  pending_.emplace(c.id, c);
  return c;
}

FedCase CaseFeed::finish(uint64_t id, CampaignOutcome& outcome) {
  const auto it = pending_.find(id);
  if (it == pending_.end()) throw std::logic_error("CaseFeed::finish: case " + std::to_string(id) + " is not pending");
  FedCase c = std::move(it->second);
  pending_.erase(it);
  c.seconds = seconds_since(c.handed_out);
  const double seconds = c.seconds;
  if (!c.regime.empty()) {
    const generators::ShapeRegime regime = generators::shape_regime_from_name(c.regime);
    spent_[regime] += seconds;
    ++finished_[regime];
    auto& [count, total] = outcome.regimes[c.regime];
    ++count;
    total += seconds;
  }
  inflight_->give_back(c.file);
  if (c.leftover) remove_file(*c.leftover);  // its outcome is recorded now
  return c;
}

void CaseFeed::close() { inflight_->remove_all(); }

std::string CaseFeed::inflight_path(uint64_t id) const {
  const auto it = pending_.find(id);
  return it == pending_.end() ? std::string() : inflight_->path(it->second.file).string();
}

void write_case_log_line(std::ostream& log, const FedCase& fed, const reports::CaseRecord& record) {
  const harness::CaseResult& r = record.result;
  nlohmann::json entry{{"number", fed.number},
                       {"verdict", harness::verdict_name(r.verdict)},
                       {"signatures", r.signatures()},
                       {"new", r.failed() && r.has_new_findings()},
                       {"backend", r.backend},
                       {"fused_forward", r.fused_forward},
                       {"fused_backward", r.fused_backward},
                       {"fused_compared", r.fused_compared},
                       {"spec", fed.spec}};
  log << entry.dump() << '\n';
}

}  // namespace gradfuzz::campaign
