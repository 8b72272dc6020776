#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "campaign/campaign.h"
#include "campaign/files.h"
#include "harness/capabilities.h"
#include "harness/case_spec.h"
#include "reports/reporter.h"

namespace gradfuzz::campaign {

/// One case a campaign handed out (CaseFeed::next).
struct FedCase {
  /// The runner's job id.
  uint64_t id = 0;
  harness::CaseSpec spec;
  /// 1-based case number of the (unsharded) campaign; 0 for a leftover of an earlier run.
  int64_t number = 0;
  /// The fault it runs with (empty: none).
  std::string fault;
  /// Its shape regime ("tiny", ...); empty for a leftover.
  std::string regime;
  /// The in-flight file of the earlier run it came from, deleted once its outcome is recorded.
  std::optional<std::filesystem::path> leftover;
  /// Its in-flight file (CaseFeed's own) and when it was handed out.
  int file = 0;
  std::chrono::steady_clock::time_point handed_out;
  /// Seconds from hand-out to CaseFeed::finish.
  double seconds = 0;
};

/// The cases of one campaign, in the order it runs them: the leftovers of an earlier run
/// first, then the generated ones (case_seed, this shard's, up to the count), a mix campaign's
/// regime scheduled by the time each regime took so far (next_mix_regime). Each case is
/// written to one of this run's in-flight files before it is handed out, so a crash of the
/// whole run leaves its repro, and its file is freed when it finishes.
class CaseFeed {
 public:
  /// `generation`: the capabilities cases are generated for (null: the model's); `slots`: cases
  /// out at once (one in-flight file each). Throws InputError when the in-flight files cannot
  /// be made.
  CaseFeed(const CampaignOptions& options, std::shared_ptr<const harness::BackendCapabilities> generation,
           std::vector<LeftoverCase> leftovers, int slots);
  ~CaseFeed();
  CaseFeed(const CaseFeed&) = delete;
  CaseFeed& operator=(const CaseFeed&) = delete;

  /// The next case, written to a free in-flight file: a leftover whatever `more` says, else a
  /// generated case unless the count is reached or `more` is false (time up, stopped); nullopt
  /// then. Requires a free file (pending() below the slots).
  std::optional<FedCase> next(bool more);
  /// Case `id` finished now: its seconds since it was handed out are charged to its regime
  /// (the mix schedule and `outcome.regimes`), its file freed, its leftover file deleted;
  /// returns it.
  FedCase finish(uint64_t id, CampaignOutcome& outcome);
  /// Cases handed out and not finished.
  size_t pending() const { return pending_.size(); }
  /// Forgets the cases handed out (the runner cancelled them).
  void drop_pending() { pending_.clear(); }
  /// The in-flight file of pending case `id`, or "" for an unknown id.
  std::string inflight_path(uint64_t id) const;
  /// The run ended: its in-flight files go (a run that ends by an exception keeps them: the
  /// case that raised is in one).
  void close();

 private:
  class InflightFiles;
  const CampaignOptions& options_;
  std::shared_ptr<const harness::BackendCapabilities> generation_;
  std::vector<LeftoverCase> leftovers_;
  std::unique_ptr<InflightFiles> inflight_;
  const int64_t max_cases_;
  const bool mix_;
  std::map<generators::ShapeRegime, double> spent_;
  std::map<generators::ShapeRegime, int64_t> finished_;
  std::map<uint64_t, FedCase> pending_;
  uint64_t next_id_ = 1;
  int64_t next_index_ = 0;
};

/// One line of a campaign's case log (CampaignOptions::case_log): the case's number, verdict,
/// signatures, whether it is new, its backend, the fused ops that ran and were compared, and
/// its spec.
void write_case_log_line(std::ostream& log, const FedCase& fed, const reports::CaseRecord& record);

}  // namespace gradfuzz::campaign
