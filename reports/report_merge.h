#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gradfuzz::reports {

/// Examples kept per merged cluster (what a campaign keeps: tools' kExamplesPerCluster).
inline constexpr size_t kMergedExamplesPerCluster = 3;

/// One input of merge_reports: a checked report document (check_report) and the name of its
/// file, which error messages and the merged report's `merge.inputs` use.
struct NamedReport {
  std::string name;
  nlohmann::ordered_json doc;
};

/// Joins the reports of the shards of one campaign (`gradfuzz fuzz --shard i/N`, same seed)
/// into the report the unsharded campaign would have written, plus a `merge` block listing
/// the inputs and the shards that are missing. Inputs are taken in shard order (i), whatever
/// their order in `inputs`. How each field joins:
/// - tool, environment (but device_name: the distinct names joined by ", "), campaign.command,
///   seed, dtypes, fault, shapes and time_budget_s must be equal; campaign.shard must be i/N
///   with one N and distinct i's (an unsharded report can only be merged alone);
/// - date: the earliest; campaign.cases_requested and workers: summed (each shard ran its own
///   count: shard i of N runs the unsharded campaign's cases i-1, i-1+N, ...); devices: union;
///   campaign.shard: null;
/// - summary: cases_run, passed, failed and unsupported summed; wall_s the longest shard's
///   (the shards run side by side, so the campaign took as long as its slowest shard);
///   cases_per_s recomputed as summed cases over that wall time (the campaign's throughput;
///   the mean of the shards' rates would hide a straggler); findings the number of merged
///   clusters; complete only when every input is and no shard of the N is missing;
/// - coverage: every count summed (names in first-seen order);
/// - findings: merged by cluster key (cluster_key()): the first shard's finding is kept as
///   the cluster's representative, counts are summed and examples concatenated, at most
///   kMergedExamplesPerCluster kept.
/// Throws ReportError naming the input file and the JSON path of a field that does not
/// match (`b.json: /campaign/seed: 8 differs from 7 in a.json`), for no input, for a
/// selftest report, and for a count that overflows when summed.
nlohmann::ordered_json merge_reports(std::vector<NamedReport> inputs);

}  // namespace gradfuzz::reports
