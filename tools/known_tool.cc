#include "tools/known_tool.h"

#include <CLI/CLI.hpp>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "campaign/exit_codes.h"
#include "campaign/known_issues.h"
#include "reports/report_document.h"
#include "reports/reporter.h"
#include "tools/report_tool.h"

namespace gradfuzz::tools {

namespace {

using Json = nlohmann::ordered_json;

/// A short stable id for a signature (FNV-1a, 32 bits, hex).
std::string short_hash(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  std::ostringstream os;
  os << std::hex << std::setw(8) << std::setfill('0') << h;
  return os.str();
}

/// The one recipe (its name, reports::kNoRecipe for none) every case of a report's cluster
/// ran under, or empty when they differ or the report does not say: its `recipes` counts,
/// else the recipe its saved case records (a replay's finding is that one case).
std::string sole_recipe(const Json& finding) {
  if (finding.contains("recipes")) {
    const Json& recipes = finding["recipes"];
    return recipes.size() == 1 ? recipes.begin().key() : std::string();
  }
  const auto recorded = reports::finding_recipe(finding);
  if (!recorded) return "";
  return *recorded ? (*recorded)->name : std::string(reports::kNoRecipe);
}

}  // namespace

KnownCommand::KnownCommand(CLI::App& app) {
  known_ = app.add_subcommand("known", "keep a known-issues file (docs/KNOWN.md)");
  known_->require_subcommand(1);
  accept_ = known_->add_subcommand("accept", "write known-issue entries for a report's new finding clusters");
  accept_->add_option("report", report_, "the report whose findings to accept (REPORT.json)")->required();
  accept_->add_option("-o,--output", output_, "the known-issues file to write")->required();
  accept_->add_option("--known", previous_, "an existing known-issues file whose entries are kept");
}

bool KnownCommand::parsed() const { return known_->parsed(); }

int KnownCommand::run(std::ostream& out) const {
  Json report;
  try {
    report = reports::load_report(report_);
  } catch (const reports::ReportError& e) {
    throw campaign::InputError(e.what());
  }
  campaign::KnownIssues known;
  if (!previous_.empty()) known = campaign::load_known_issues(previous_);
  // The report as the existing entries judge it: only what they do not cover is accepted.
  apply_known(report, known);
  const std::string backend = report["environment"]["backend"].get<std::string>();
  const Json& versions = report["environment"]["backend_versions"];
  std::string version;
  for (const char* key : {"transformer_engine", "torch"}) {
    if (backend != "model" && versions.contains(key) && versions[key].is_string()) {
      version = versions[key].get<std::string>();
      break;
    }
  }
  // A night that ran cases under a recipe tells which recipe a cluster needs: an entry for a
  // cluster seen under one recipe only (or only without one) names it, so that the same
  // signature under another stays new (a Linear's weight gradient wrong under DelayedScaling
  // must not hide one wrong without a recipe). Widening it is the maintainer's call.
  const Json& features = report["coverage"]["features"];
  const bool ran_recipes = features.contains("recipe") && features["recipe"].get<int64_t>() > 0;
  std::set<std::string> ids;
  for (const auto& e : known.entries) ids.insert(e.id);
  int64_t added = 0;
  for (const auto& finding : report["findings"]) {
    if (finding.contains("known") && finding["known"].is_object()) continue;
    campaign::KnownIssue e;
    const std::string signature = finding["signature"].get<std::string>();
    e.id = backend + "-" + short_hash(signature);
    if (!ids.insert(e.id).second) continue;  // the same cluster twice (a replay lists each file)
    e.status = "open-defect";
    const std::string recipe = ran_recipes ? sole_recipe(finding) : std::string();
    e.note = "accepted from " + report_ + ": " + finding["kind"].get<std::string>() + " in " +
             finding["case_file"].get<std::string>() +
             (recipe.empty()                 ? std::string()
              : recipe == reports::kNoRecipe ? std::string(", seen only in cases without a recipe")
                                             : ", seen only under " + recipe) +
             "; say what it is, link the issue, set the status, and widen the match if it is one cause";
    // A defect until someone has read the backend and says otherwise (the status above goes
    // with that kind); the evidence says that nobody has yet.
    e.basis = campaign::KnownBasis{
        "defect",
        std::string(campaign::kUnestablishedEvidence) + ": accepted from " + report_ + " (cluster " + signature +
            "); read the backend's source, docs and tests, then say whether it is documented, a defect or a "
            "stricter rule of gradfuzz's, with the file:line, doc string or test that shows it",
        "", ""};
    e.signature = signature;
    if (!recipe.empty()) e.recipe = recipe;
    e.backend = backend;
    if (!version.empty()) e.versions = "==" + version;
    known.entries.push_back(std::move(e));
    ++added;
  }
  if (known.description.empty()) known.description = "known issues of the " + backend + " backend";
  write_file_atomically(output_, campaign::known_issues_to_json(known).dump(2) + "\n", "known accept");
  out << "known accept: wrote " << output_ << ": " << known.entries.size() << " entries (" << added << " new from "
      << report_ << ")\n";
  return static_cast<int>(campaign::ExitCode::kOk);
}

}  // namespace gradfuzz::tools
