#include "reports/report_diff.h"

#include <algorithm>
#include <map>

#include "reports/report_document.h"

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;

/// Clusters of one report in document order, counts of repeated keys added up.
struct Clusters {
  std::vector<std::string> order;
  std::map<std::string, ClusterChange> by_key;
};

Clusters clusters_of(const Json& report, bool is_new) {
  Clusters out;
  for (const auto& f : report["findings"]) {
    const std::string key = cluster_key(f);
    auto [it, fresh] = out.by_key.emplace(key, ClusterChange{});
    ClusterChange& c = it->second;
    if (fresh) {
      out.order.push_back(key);
      c.key = key;
      c.kind = f["kind"].get<std::string>();
      c.ops = f["ops"].get<std::vector<std::string>>();
      c.case_file = f["case_file"].get<std::string>();
      c.reproduce = f["reproduce"].get<std::string>();
      if (f.contains("known") && f["known"].is_object()) c.known = f["known"].value("id", "");
    }
    (is_new ? c.new_count : c.last_count) += cluster_count(f);
  }
  return out;
}

void note_difference(const Json& last, const Json& next, const std::string& path, const std::string& what,
                     std::vector<std::string>& notes) {
  const Json::json_pointer pointer(path);
  if (last.at(pointer) != next.at(pointer)) {
    notes.push_back("LAST and NEW ran different " + what + " (" + last.at(pointer).dump() + " vs " +
                    next.at(pointer).dump() + ")");
  }
}

Json change_json(const ClusterChange& c) {
  return Json{{"cluster", c.key},
              {"kind", c.kind},
              {"ops", c.ops},
              {"last_count", c.last_count},
              {"new_count", c.new_count},
              {"case_file", c.case_file},
              {"reproduce", c.reproduce},
              {"known", c.known.empty() ? Json(nullptr) : Json(c.known)}};
}

Json changes_json(const std::vector<ClusterChange>& changes) {
  Json out = Json::array();
  for (const auto& c : changes) out.push_back(change_json(c));
  return out;
}

}  // namespace

int64_t ReportDiff::added_unknown() const {
  return std::count_if(added.begin(), added.end(), [](const ClusterChange& c) { return c.known.empty(); });
}

ReportDiff diff_reports(const Json& last, const Json& next) {
  ReportDiff diff;
  diff.last_complete = last["summary"]["complete"].get<bool>();
  diff.new_complete = next["summary"]["complete"].get<bool>();
  note_difference(last, next, "/environment/backend", "backends", diff.notes);
  note_difference(last, next, "/environment/device", "devices", diff.notes);
  note_difference(last, next, "/campaign/dtypes", "dtypes", diff.notes);
  note_difference(last, next, "/campaign/fault", "faults", diff.notes);
  const Clusters before = clusters_of(last, /*is_new=*/false);
  const Clusters after = clusters_of(next, /*is_new=*/true);
  for (const auto& key : after.order) {
    ClusterChange c = after.by_key.at(key);
    auto it = before.by_key.find(key);
    if (it == before.by_key.end()) {
      diff.added.push_back(std::move(c));
    } else {
      c.last_count = it->second.last_count;
      diff.still_failing.push_back(std::move(c));
    }
  }
  for (const auto& key : before.order) {
    if (!after.by_key.count(key)) diff.fixed.push_back(before.by_key.at(key));
  }
  return diff;
}

Json diff_to_json(const ReportDiff& diff, const std::string& last_name, const std::string& new_name) {
  return Json{{"last", last_name},
              {"new", new_name},
              {"last_complete", diff.last_complete},
              {"new_complete", diff.new_complete},
              {"notes", diff.notes},
              {"new_clusters", changes_json(diff.added)},
              {"fixed", changes_json(diff.fixed)},
              {"still_failing", changes_json(diff.still_failing)}};
}

void print_diff(const ReportDiff& diff, const std::string& last_name, const std::string& new_name, std::ostream& out) {
  const size_t known = diff.added.size() - static_cast<size_t>(diff.added_unknown());
  out << "report diff: " << last_name << " -> " << new_name << ": " << diff.added.size() << " new"
      << (known > 0 ? " (" + std::to_string(known) + " of them known issues)" : std::string()) << ", "
      << diff.fixed.size() << " fixed, " << diff.still_failing.size() << " still failing\n";
  for (const auto& note : diff.notes) out << "note: " << note << '\n';
  if (!diff.new_complete) {
    out << "note: " << new_name << " is incomplete (stopped before its budget): a fixed cluster may only not have been "
        << "reached\n";
  }
  if (!diff.last_complete) out << "note: " << last_name << " is incomplete (stopped before its budget)\n";
  if (!diff.added.empty()) {
    out << "new:\n";
    for (const auto& c : diff.added) {
      out << "  + " << c.key << "  count " << c.new_count << (c.known.empty() ? "" : "  known: " + c.known)
          << "\n      " << c.reproduce << '\n';
    }
  }
  if (!diff.fixed.empty()) {
    out << "fixed:\n";
    for (const auto& c : diff.fixed) out << "  - " << c.key << "  count " << c.last_count << " in LAST\n";
  }
  if (!diff.still_failing.empty()) {
    out << "still failing:\n";
    for (const auto& c : diff.still_failing) {
      out << "  = " << c.key << "  count " << c.last_count << " -> " << c.new_count << '\n';
    }
  }
}

}  // namespace gradfuzz::reports
