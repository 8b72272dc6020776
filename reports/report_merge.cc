#include "reports/report_merge.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "reports/report_document.h"

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;

std::string short_dump(const Json& j) {
  std::string s = j.dump();
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

/// Shard "i/N" of a checked report as {i, N}; {0, 0} for an unsharded one.
std::pair<int64_t, int64_t> shard_of(const Json& doc) {
  const Json& shard = doc["campaign"]["shard"];
  if (!shard.is_string()) return {0, 0};
  const std::string text = shard.get<std::string>();
  const auto slash = text.find('/');
  return {std::stoll(text.substr(0, slash)), std::stoll(text.substr(slash + 1))};
}

class Merger {
 public:
  explicit Merger(std::vector<NamedReport> inputs) : inputs_(std::move(inputs)) {}

  Json run() {
    if (inputs_.empty()) throw ReportError("report merge: no input report");
    check_shards();
    const NamedReport& first = inputs_.front();
    for (const auto& in : inputs_) {
      if (in.doc.contains("selftest")) {
        throw ReportError(in.name + ": /selftest: a selftest report; merge joins the reports of fuzz shards");
      }
      for (const char* key : {"name", "version", "git_sha"}) same(in, first, "/tool/" + std::string(key));
      for (const char* key : {"torch_version", "device", "backend", "backend_versions"}) {
        same(in, first, "/environment/" + std::string(key));
      }
      for (const char* key : {"command", "seed", "dtypes", "fault", "shapes", "time_budget_s"}) {
        same(in, first, "/campaign/" + std::string(key));
      }
    }
    Json out;
    out["schema_version"] = first.doc["schema_version"];
    out["tool"] = first.doc["tool"];
    out["date"] = earliest_date();
    out["environment"] = environment();
    out["campaign"] = campaign();
    Json findings = merged_findings();
    out["summary"] = summary(findings.size());
    out["coverage"] = coverage();
    out["findings"] = std::move(findings);
    out["merge"] = merge_block();
    return out;
  }

 private:
  /// Throws unless `in` has the value of `first` at `path`.
  void same(const NamedReport& in, const NamedReport& first, const std::string& path) const {
    const Json::json_pointer pointer(path);
    const Json& a = first.doc.at(pointer);
    const Json& b = in.doc.at(pointer);
    if (a != b) {
      throw ReportError(in.name + ": " + path + ": " + short_dump(b) + " differs from " + short_dump(a) + " in " +
                        first.name + "; merge joins the shards of one campaign (same build, backend and seed)");
    }
  }

  /// One N, distinct i's; inputs put in shard order; missing shards noted.
  void check_shards() {
    if (inputs_.size() == 1 && shard_of(inputs_.front().doc).second == 0) return;
    std::map<int64_t, const NamedReport*> seen;
    int64_t n = 0;
    const NamedReport* n_from = nullptr;
    for (const auto& in : inputs_) {
      const auto [i, count] = shard_of(in.doc);
      if (count == 0) {
        throw ReportError(in.name +
                          ": /campaign/shard: null: not a shard of a campaign (gradfuzz fuzz --shard i/N); "
                          "merge joins shards (an unsharded report only alone)");
      }
      if (n_from && count != n) {
        throw ReportError(in.name + ": /campaign/shard: " + std::to_string(i) + "/" + std::to_string(count) +
                          " is of " + std::to_string(count) + " shards, but " + n_from->name + " is of " +
                          std::to_string(n));
      }
      n = count;
      n_from = &in;
      auto [it, fresh] = seen.emplace(i, &in);
      if (!fresh) {
        throw ReportError(in.name + ": /campaign/shard: " + std::to_string(i) + "/" + std::to_string(n) +
                          " is also the shard of " + it->second->name + "; give each shard's report once");
      }
    }
    shard_count_ = n;
    for (int64_t i = 1; i <= n; ++i) {
      if (!seen.count(i)) missing_.push_back(std::to_string(i) + "/" + std::to_string(n));
    }
    std::stable_sort(inputs_.begin(), inputs_.end(), [](const NamedReport& a, const NamedReport& b) {
      return shard_of(a.doc).first < shard_of(b.doc).first;
    });
  }

  int64_t add(int64_t a, int64_t b, const NamedReport& in, const std::string& path) const {
    int64_t sum = 0;
    if (__builtin_add_overflow(a, b, &sum)) {
      throw ReportError(in.name + ": " + path + ": the sum over the inputs overflows a 64-bit count");
    }
    return sum;
  }

  std::string earliest_date() const {
    std::string date;
    for (const auto& in : inputs_) {
      const std::string d = in.doc["date"].get<std::string>();
      // ISO 8601 UTC stamps of one format order as strings do.
      if (!d.empty() && (date.empty() || d < date)) date = d;
    }
    return date;
  }

  Json environment() const {
    Json env = inputs_.front().doc["environment"];
    std::vector<std::string> names;
    for (const auto& in : inputs_) {
      const std::string name = in.doc["environment"]["device_name"].get<std::string>();
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    std::string joined;
    for (const auto& name : names) joined += (joined.empty() ? "" : ", ") + name;
    env["device_name"] = joined;
    return env;
  }

  Json campaign() const {
    Json c = inputs_.front().doc["campaign"];
    bool all_counted = true;
    int64_t cases = 0;
    int64_t workers = 0;
    Json devices = Json::array();
    for (const auto& in : inputs_) {
      const Json& ic = in.doc["campaign"];
      if (ic["cases_requested"].is_null()) {
        all_counted = false;
      } else {
        cases = add(cases, ic["cases_requested"].get<int64_t>(), in, "/campaign/cases_requested");
      }
      workers = add(workers, ic["workers"].get<int64_t>(), in, "/campaign/workers");
      for (const auto& d : ic["devices"]) {
        if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
      }
    }
    c["cases_requested"] = all_counted ? Json(cases) : Json(nullptr);
    c["devices"] = std::move(devices);
    c["workers"] = workers;
    c["shard"] = nullptr;
    return c;
  }

  Json summary(size_t clusters) const {
    int64_t totals[4] = {0, 0, 0, 0};
    const char* keys[4] = {"cases_run", "passed", "failed", "unsupported"};
    double wall_s = 0;
    bool complete = missing_.empty();
    for (const auto& in : inputs_) {
      const Json& s = in.doc["summary"];
      for (int k = 0; k < 4; ++k)
        totals[k] = add(totals[k], s[keys[k]].get<int64_t>(), in, std::string("/summary/") + keys[k]);
      wall_s = std::max(wall_s, s["wall_s"].get<double>());
      complete = complete && s["complete"].get<bool>();
    }
    Json out;
    for (int k = 0; k < 4; ++k) out[keys[k]] = totals[k];
    out["findings"] = clusters;
    out["wall_s"] = wall_s;
    // As JsonReporter: no measurable time gives 0 cases/s rather than infinity.
    out["cases_per_s"] = wall_s > 0 ? static_cast<double>(totals[0]) / wall_s : 0.0;
    out["complete"] = complete;
    return out;
  }

  /// Sums the name -> count object at `path` over the inputs, names in first-seen order.
  Json summed_counts(const std::string& path) const {
    Json out = Json::object();
    const Json::json_pointer pointer(path);
    for (const auto& in : inputs_) {
      for (const auto& [name, value] : in.doc.at(pointer).items()) {
        const int64_t before = out.contains(name) ? out[name].get<int64_t>() : 0;
        out[name] = add(before, value.get<int64_t>(), in, path + "/" + name);
      }
    }
    return out;
  }

  Json coverage() const {
    Json c;
    for (const char* key : {"ops", "fusions", "features"}) c[key] = summed_counts("/coverage/" + std::string(key));
    c["fused_ops"] = Json{{"forward", summed_counts("/coverage/fused_ops/forward")},
                          {"backward", summed_counts("/coverage/fused_ops/backward")}};
    bool any_kernels = false;
    Json kernels = Json::object();
    for (const auto& in : inputs_) {
      if (!in.doc["coverage"].contains("kernels")) continue;
      any_kernels = true;
      for (const auto& [name, value] : in.doc["coverage"]["kernels"].items()) {
        Json& k = kernels[name];
        for (const char* field : {"launches", "multi_block_launches"}) {
          const int64_t before = k.contains(field) ? k[field].get<int64_t>() : 0;
          k[field] = add(before, value[field].get<int64_t>(), in, "/coverage/kernels/" + name + "/" + field);
        }
      }
    }
    if (any_kernels) c["kernels"] = std::move(kernels);
    // Usage counts (reports written before them have none).
    const bool any_usage = std::any_of(inputs_.begin(), inputs_.end(),
                                       [](const auto& in) { return in.doc["coverage"].contains("usage"); });
    if (any_usage) {
      Json usage = Json::object();
      Json by_recipe = Json::object();
      Json checked = Json::object();
      Json tensors = Json::object();
      for (const auto& in : inputs_) {
        const Json& cov = in.doc["coverage"];
        // Held for the loops (items() of a temporary would dangle).
        const Json counts = cov.value("usage", Json::object());
        const Json recipes = cov.value("usage_by_recipe", Json::object());
        const Json states = cov.value("fp8_states_checked", Json::object());
        for (const auto& [recipe, value] : states.items()) {
          checked[recipe] = add(checked.value(recipe, int64_t{0}), value.get<int64_t>(), in,
                                "/coverage/fp8_states_checked/" + recipe);
        }
        const Json quantized = cov.value("fp8_tensors_checked", Json::object());
        for (const auto& [recipe, value] : quantized.items()) {
          tensors[recipe] = add(tensors.value(recipe, int64_t{0}), value.get<int64_t>(), in,
                                "/coverage/fp8_tensors_checked/" + recipe);
        }
        for (const auto& [name, value] : counts.items()) {
          usage[name] = add(usage.value(name, int64_t{0}), value.get<int64_t>(), in, "/coverage/usage/" + name);
        }
        for (const auto& [recipe, per_recipe] : recipes.items()) {
          for (const auto& [name, value] : per_recipe.items()) {
            Json& r = by_recipe[recipe];
            if (!r.is_object()) r = Json::object();
            r[name] = add(r.value(name, int64_t{0}), value.get<int64_t>(), in,
                          "/coverage/usage_by_recipe/" + recipe + "/" + name);
          }
        }
      }
      c["usage"] = std::move(usage);
      c["usage_by_recipe"] = std::move(by_recipe);
      c["fp8_states_checked"] = std::move(checked);
      c["fp8_tensors_checked"] = std::move(tensors);
    }
    return c;
  }

  Json merged_findings() const {
    Json out = Json::array();
    std::map<std::string, size_t> position;
    for (const auto& in : inputs_) {
      const Json& findings = in.doc["findings"];
      for (size_t i = 0; i < findings.size(); ++i) {
        const Json& f = findings[i];
        const std::string key = cluster_key(f);
        auto it = position.find(key);
        if (it == position.end()) {
          position.emplace(key, out.size());
          Json kept = f;
          kept["count"] = cluster_count(f);
          if (!kept.contains("examples")) kept["examples"] = Json::array();
          trim_examples(kept["examples"]);
          out.push_back(std::move(kept));
          continue;
        }
        Json& kept = out[it->second];
        kept["count"] =
            add(kept["count"].get<int64_t>(), cluster_count(f), in, "/findings/" + std::to_string(i) + "/count");
        if (f.contains("examples")) {
          for (const auto& e : f["examples"]) kept["examples"].push_back(e);
        }
        trim_examples(kept["examples"]);
        // The cluster's cases per recipe: summed where both shards count them; a shard that
        // does not (an older gradfuzz) leaves the merged counts partial, so they are dropped.
        if (kept.contains("recipes") && f.contains("recipes")) {
          for (const auto& [name, value] : f["recipes"].items()) {
            const int64_t before = kept["recipes"].contains(name) ? kept["recipes"][name].get<int64_t>() : 0;
            kept["recipes"][name] =
                add(before, value.get<int64_t>(), in, "/findings/" + std::to_string(i) + "/recipes/" + name);
          }
        } else {
          kept.erase("recipes");
        }
      }
    }
    return out;
  }

  static void trim_examples(Json& examples) {
    while (examples.size() > kMergedExamplesPerCluster) examples.erase(examples.size() - 1);
  }

  Json merge_block() const {
    Json inputs = Json::array();
    for (const auto& in : inputs_) {
      inputs.push_back(
          Json{{"file", in.name}, {"shard", in.doc["campaign"]["shard"]}, {"complete", in.doc["summary"]["complete"]}});
    }
    Json missing = Json::array();
    for (const auto& m : missing_) missing.push_back(m);
    return Json{{"inputs", std::move(inputs)},
                {"shards", shard_count_ > 0 ? Json(shard_count_) : Json(nullptr)},
                {"missing_shards", std::move(missing)}};
  }

  std::vector<NamedReport> inputs_;
  int64_t shard_count_ = 0;
  std::vector<std::string> missing_;
};

}  // namespace

Json merge_reports(std::vector<NamedReport> inputs) { return Merger(std::move(inputs)).run(); }

}  // namespace gradfuzz::reports
