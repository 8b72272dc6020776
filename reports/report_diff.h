#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace gradfuzz::reports {

/// One cluster as the diff lists it. Counts are 0 where the cluster is absent; case_file
/// and reproduce come from NEW when the cluster is there, else from LAST.
struct ClusterChange {
  std::string key;
  std::string kind;
  std::vector<std::string> ops;
  int64_t last_count = 0;
  int64_t new_count = 0;
  std::string case_file;
  std::string reproduce;
  /// The known issue the cluster matches (its `known.id` in NEW), empty when new.
  std::string known;
};

/// The clusters of two reports, by cluster key (cluster_key()).
struct ReportDiff {
  /// In NEW and not in LAST, in NEW's order.
  std::vector<ClusterChange> added;
  /// Added clusters that match no known issue (what makes `report diff` exit 1).
  int64_t added_unknown() const;
  /// In LAST and not in NEW, in LAST's order.
  std::vector<ClusterChange> fixed;
  /// In both, in NEW's order.
  std::vector<ClusterChange> still_failing;
  /// Whether each run reached its budget: a cluster missing from an incomplete NEW may
  /// only not have been reached.
  bool last_complete = true;
  bool new_complete = true;
  /// Notes on runs that differ in ways that make the comparison weaker (backend, device,
  /// dtypes, fault), one sentence each.
  std::vector<std::string> notes;
};

/// Compares two checked reports (check_report). Counts of findings sharing a key within one
/// report are added up.
ReportDiff diff_reports(const nlohmann::ordered_json& last, const nlohmann::ordered_json& next);

/// Machine form: {last, new, last_complete, new_complete, notes, new_clusters[...],
/// fixed[...], still_failing[...]}; each cluster {cluster, kind, ops, last_count, new_count,
/// case_file, reproduce}.
nlohmann::ordered_json diff_to_json(const ReportDiff& diff, const std::string& last_name, const std::string& new_name);

/// Human form: a heading line, then the new, fixed and still-failing clusters, one line
/// each (with both counts where both exist), and the reproduce line of each new one.
void print_diff(const ReportDiff& diff, const std::string& last_name, const std::string& new_name, std::ostream& out);

}  // namespace gradfuzz::reports
