#include "reports/json_reporter.h"

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;

template <typename T>
Json optional_json(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

/// Every listed name (zero included), then names only seen in cases, each sorted block
/// keeping the catalog's order for listed names.
Json counts_json(const std::vector<std::string>& listed, const std::map<std::string, int64_t>& counts) {
  Json out = Json::object();
  for (const auto& name : listed) {
    auto it = counts.find(name);
    out[name] = it == counts.end() ? 0 : it->second;
  }
  for (const auto& [name, count] : counts) {
    if (!out.contains(name)) out[name] = count;
  }
  return out;
}

void count_all(std::map<std::string, int64_t>& counts, const std::vector<std::string>& names) {
  for (const auto& name : names) ++counts[name];
}

}  // namespace

Json detail_to_json(const harness::Finding& d) {
  Json j{{"path_pair", d.path_pair},
         {"tensor", d.tensor},
         {"kind", harness::verdict_name(d.kind)},
         {"role", d.role},
         {"max_abs_err", d.max_abs_err},
         {"max_rel_err", d.max_rel_err},
         {"atol", d.atol},
         {"rtol", d.rtol},
         {"index", d.index},
         {"expected", d.expected},
         {"got", d.got}};
  if (d.rounding != 0) j["rounding"] = d.rounding;
  if (d.norm_bound != 0) {
    j["norm_err"] = d.norm_err;
    j["norm_bound"] = d.norm_bound;
  }
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"error_kind", &d.error_kind},
                                   {"error_type", &d.error_type},
                                   {"phase", &d.phase},
                                   {"message", &d.message},
                                   {"origin", &d.origin},
                                   {"op", &d.op},
                                   {"option", &d.option},
                                   {"note", &d.note},
                                   {"known", &d.known}}) {
    if (!value->empty()) j[key] = *value;
  }
  return j;
}

Json recipe_to_json(const harness::RecipeSpec& recipe) {
  Json options = Json::object();
  for (const auto& [key, value] : recipe.options) options[key] = value;
  return Json{{"name", recipe.name}, {"fp8_format", recipe.fp8_format}, {"options", std::move(options)}};
}

Json confirmation_to_json(const Confirmation& c) {
  Json variants = Json::array();
  for (const auto& v : c.variants) {
    Json row{{"variant", v.name}, {"change", v.change}, {"verdict", v.verdict}};
    if (!v.signatures.empty()) row["signatures"] = v.signatures;
    variants.push_back(std::move(row));
  }
  Json j{{"diagnosis", c.diagnosis}, {"variants", std::move(variants)}};
  if (c.first_divergence) {
    nlohmann::json d = *c.first_divergence;
    j["first_divergence"] = Json::parse(d.dump());
  } else {
    j["first_divergence"] = nullptr;
  }
  if (!c.explained_by.empty()) j["explained_by"] = c.explained_by;
  return j;
}

Json finding_to_json(const Finding& finding, int64_t count, const std::vector<std::string>& examples,
                     const std::map<std::string, int64_t>& recipes) {
  const harness::CaseResult& r = finding.result;
  Json details = Json::array();
  Json others = Json::array();
  std::string kind = harness::verdict_name(r.verdict);
  bool first = true;
  for (const auto& d : r.findings) {
    if (d.signature == finding.signature) {
      details.push_back(detail_to_json(d));
      if (first) kind = harness::verdict_name(d.kind);
      first = false;
    }
  }
  for (const auto& sig : r.signatures()) {
    if (sig != finding.signature) others.push_back(sig);
  }
  Json j;
  j["signature"] = finding.signature;
  // Only a key the signature does not already say (report merge and diff key clusters by it).
  if (!finding.cluster.empty() && finding.cluster != finding.signature) j["cluster"] = finding.cluster;
  j["kind"] = kind;
  j["known"] = finding.known ? Json{{"id", finding.known->id},
                                    {"status", finding.known->status},
                                    {"link", finding.known->link},
                                    {"note", finding.known->note}}
                             : Json(nullptr);
  j["fault"] = optional_json(finding.fault);
  j["backend"] = r.backend;
  if (!finding.dtype.empty()) {
    j["dtype"] = finding.dtype;
    j["recipe"] = finding.recipe ? recipe_to_json(*finding.recipe) : Json(nullptr);
  }
  j["case_file"] = finding.case_file;
  if (finding.confirmation) j["confirmation"] = confirmation_to_json(*finding.confirmation);
  j["ops"] = r.op_types;
  j["details"] = std::move(details);
  if (!others.empty()) j["other_signatures"] = std::move(others);
  if (!r.notes.empty()) j["error"] = r.notes;
  j["seed"] = r.seed;
  j["reproduce"] = finding.reproduce;
  if (count > 0) {
    j["count"] = count;
    j["examples"] = examples;
    if (!recipes.empty()) j["recipes"] = recipes;
  }
  return j;
}

Json selftest_entry_to_json(const SelftestEntry& e) {
  return Json{{"name", e.name},
              {"detected", e.detected},
              {"cases_to_detect", optional_json(e.cases_to_detect)},
              {"seconds_to_detect", optional_json(e.seconds_to_detect)},
              {"shrunk_ops", optional_json(e.shrunk_ops)},
              {"case_file", optional_json(e.case_file)},
              {"replay_with_fault_exit", optional_json(e.replay_with_fault_exit)},
              {"replay_without_fault_exit", optional_json(e.replay_without_fault_exit)},
              {"unattributed_findings", e.unattributed_findings},
              {"known_findings", e.known_findings},
              {"ok", e.ok()}};
}

void JsonReporter::report_context(const ReportContext& context) { context_ = context; }

void JsonReporter::report_case(const CaseRecord& record) {
  ++cases_run_;
  if (record.result.passed()) {
    ++passed_;
  } else if (record.result.verdict == harness::VerdictKind::kUnsupported) {
    ++unsupported_;
  } else {
    ++failed_;
  }
  for (const auto& [name, counts] : record.result.kernels) {
    kernel_counts_[name][0] += counts[0];
    kernel_counts_[name][1] += counts[1];
  }
  count_all(fused_forward_counts_, record.result.fused_forward);
  count_all(fused_backward_counts_, record.result.fused_backward);
  count_all(op_counts_, record.result.op_types);
  count_all(fusion_counts_, record.result.fusions_fired);
  count_all(feature_counts_, record.result.features);
  count_all(fused_compared_counts_, record.result.fused_compared);
  count_all(usage_counts_, record.usage);
  if (!record.recipe.empty()) {
    auto& per_recipe = usage_by_recipe_[record.recipe];
    count_all(per_recipe, record.usage);
    per_recipe["cases"] += 1;
    per_recipe["calls"] += record.calls;
    if (record.result.fp8_states_checked > 0) fp8_states_by_recipe_[record.recipe] += record.result.fp8_states_checked;
    if (record.result.fp8_tensors_checked > 0) {
      fp8_tensors_by_recipe_[record.recipe] += record.result.fp8_tensors_checked;
    }
  }
  kink_elements_ += record.result.kink_elements;
  cancellation_tensors_ += record.result.cancellation_tensors;
  if (record.result.failed() && !record.result.has_new_findings()) ++known_failed_;
  std::set<std::string> entries;
  for (const auto& f : record.result.findings) {
    if (!f.is_known()) continue;
    known_tallies_[f.known].signatures.insert(f.signature);
    entries.insert(f.known);
  }
  for (const auto& id : entries) ++known_tallies_[id].cases;
  if (!record.regime.empty()) {
    auto& [count, seconds] = regimes_[record.regime];
    ++count;
    seconds += record.seconds;
  }
  for (const auto& f : record.new_findings) findings_.push_back(f);
  for (const auto& key : record.clusters) {
    ++cluster_counts_[key];
    if (!record.recipe.empty()) ++cluster_recipes_[key][record.recipe];
  }
  for (const auto& [key, file] : record.example_files) cluster_examples_[key].push_back(file);
}

Json JsonReporter::document(const RunSummary& summary) const {
  const ReportContext& c = context_;
  Json doc;
  doc["schema_version"] = kReportSchemaVersion;
  doc["tool"] = Json{{"name", c.tool.name}, {"version", c.tool.version}, {"git_sha", c.tool.git_sha}};
  doc["date"] = c.date;
  doc["environment"] = Json{{"torch_version", c.environment.torch_version},
                            {"device", c.environment.device},
                            {"device_name", c.environment.device_name},
                            {"backend", c.environment.backend},
                            {"backend_versions", c.environment.backend_versions}};
  doc["campaign"] = Json{{"command", c.campaign.command},
                         {"seed", c.campaign.seed},
                         {"cases_requested", optional_json(c.campaign.cases_requested)},
                         {"time_budget_s", optional_json(c.campaign.time_budget_s)},
                         {"dtypes", c.campaign.dtypes},
                         {"devices", c.campaign.devices},
                         {"fault", optional_json(c.campaign.fault)},
                         {"workers", c.campaign.workers},
                         {"shard", c.campaign.shard.empty() ? Json(nullptr) : Json(c.campaign.shard)},
                         {"shapes", c.campaign.shapes.empty() ? Json(nullptr) : Json(c.campaign.shapes)},
                         {"known_file", c.campaign.known_file.empty() ? Json(nullptr) : Json(c.campaign.known_file)},
                         {"feature_weights", c.campaign.feature_weights},
                         {"recipe", c.campaign.recipe.empty() ? Json(nullptr) : Json(c.campaign.recipe)}};
  // A run that finished in no measurable time reports 0 cases/s rather than infinity.
  double cases_per_s = summary.wall_s > 0 ? static_cast<double>(cases_run_) / summary.wall_s : 0.0;
  int64_t known_clusters = 0;
  for (const auto& f : findings_) known_clusters += f.known ? 1 : 0;
  doc["summary"] = Json{{"cases_run", cases_run_},
                        {"passed", passed_},
                        {"failed", failed_},
                        {"known_failed", known_failed_},
                        {"unsupported", unsupported_},
                        {"findings", findings_.size()},
                        {"new_findings", static_cast<int64_t>(findings_.size()) - known_clusters},
                        {"known_findings", known_clusters},
                        {"known_causes", static_cast<int64_t>(known_tallies_.size())},
                        {"wall_s", summary.wall_s},
                        {"cases_per_s", cases_per_s},
                        {"complete", summary.complete}};
  doc["coverage"] =
      Json{{"ops", counts_json(c.coverage_names.ops, op_counts_)},
           {"fusions", counts_json(c.coverage_names.fusions, fusion_counts_)},
           {"features", counts_json(c.coverage_names.features, feature_counts_)},
           {"fused_ops", Json{{"forward", counts_json({}, fused_forward_counts_)},
                              {"backward", counts_json({}, fused_backward_counts_)},
                              {"compared", counts_json({}, fused_compared_counts_)}}},
           {"low_precision", Json{{"kink_elements", kink_elements_}, {"cancellation_tensors", cancellation_tensors_}}},
           {"usage", counts_json(harness::usage_coverage_names(), usage_counts_)}};
  Json by_recipe = Json::object();
  for (const auto& [recipe, counts] : usage_by_recipe_) by_recipe[recipe] = counts_json({}, counts);
  doc["coverage"]["usage_by_recipe"] = std::move(by_recipe);
  doc["coverage"]["fp8_states_checked"] = counts_json({}, fp8_states_by_recipe_);
  doc["coverage"]["fp8_tensors_checked"] = counts_json({}, fp8_tensors_by_recipe_);
  if (!regimes_.empty()) {
    Json regimes = Json::object();
    for (const auto& [name, cs] : regimes_) {
      regimes[name] = Json{{"cases", cs.first}, {"seconds", cs.second}};
    }
    doc["summary"]["regimes"] = std::move(regimes);
  }
  if (!kernel_counts_.empty()) {
    Json kernels = Json::object();
    for (const auto& [name, counts] : kernel_counts_) {
      kernels[name] = Json{{"launches", counts[0]}, {"multi_block_launches", counts[1]}};
    }
    doc["coverage"]["kernels"] = std::move(kernels);
  }
  Json findings = Json::array();
  for (const auto& f : findings_) {
    const std::string& key = f.key();
    auto count = cluster_counts_.find(key);
    auto examples = cluster_examples_.find(key);
    auto recipes = cluster_recipes_.find(key);
    findings.push_back(
        finding_to_json(f, count == cluster_counts_.end() ? 0 : count->second,
                        examples == cluster_examples_.end() ? std::vector<std::string>{} : examples->second,
                        recipes == cluster_recipes_.end() ? std::map<std::string, int64_t>{} : recipes->second));
  }
  doc["findings"] = std::move(findings);
  // The known findings by cause: one row per known-issue entry that matched.
  Json known = Json::array();
  for (const auto& [id, tally] : known_tallies_) {
    known.push_back(
        Json{{"id", id}, {"cases", tally.cases}, {"signatures", static_cast<int64_t>(tally.signatures.size())}});
  }
  doc["known"] = std::move(known);
  if (summary.selftest) {
    Json entries = Json::array();
    for (const auto& e : *summary.selftest) entries.push_back(selftest_entry_to_json(e));
    doc["selftest"] = std::move(entries);
  }
  return doc;
}

void JsonReporter::finalize(const RunSummary& summary) {
  out_ << document(summary).dump(2) << '\n';
  out_.flush();
}

}  // namespace gradfuzz::reports
