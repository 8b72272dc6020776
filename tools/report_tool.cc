#include "tools/report_tool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include "campaign/exit_codes.h"
#include "campaign/files.h"
#include "campaign/known_issues.h"
#include "reports/html_report.h"
#include "reports/junit_report.h"
#include "reports/report_diff.h"
#include "reports/report_document.h"
#include "reports/report_merge.h"
#include "reports/upstream_report.h"

namespace gradfuzz::tools {

using campaign::ExitCode;
using campaign::InputError;
using campaign::InternalError;

namespace {

using Json = nlohmann::ordered_json;

std::string temp_name(const std::string& path) { return path + ".tmp-" + std::to_string(::getpid()); }

/// Writes all of `text` to `fd`; false (errno set) when the system refuses.
bool write_all(int fd, const std::string& text) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    written += static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void cannot_write(const std::string& flag, const std::string& path, const std::string& why) {
  throw InputError(flag + ": cannot write '" + path + "' (" + why + ")");
}

void check_path_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) throw InputError(flag + ": expected a file name, got an empty one");
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) cannot_write(flag, path, "it is a directory");
  const std::string tmp = temp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) cannot_write(flag, path, std::strerror(errno));
  ::close(fd);
  ::unlink(tmp.c_str());
}

Json load(const std::string& path) {
  try {
    return reports::load_report(path);
  } catch (const reports::ReportError& e) {
    throw InputError(e.what());
  }
}

/// Whether `a` and `b` name one existing file (same device and inode).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text, const std::string& flag) {
  if (path.empty()) throw InputError(flag + ": expected a file name, got an empty one");
  const std::string tmp = temp_name(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) cannot_write(flag, path, std::string("cannot create ") + tmp + ": " + std::strerror(errno));
  const bool ok = write_all(fd, text) && ::fsync(fd) == 0;
  const std::string why = ok ? "" : std::strerror(errno);
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    cannot_write(flag, path, why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string rename_error = std::strerror(errno);
    ::unlink(tmp.c_str());
    cannot_write(flag, path, "rename failed: " + rename_error);
  }
}

void CiOutputs::check_writable() const {
  if (!junit.empty()) check_path_writable(junit, "--junit");
  if (!html.empty()) check_path_writable(html, "--html");
}

void CiOutputs::write(const Json& report) const {
  if (!any()) return;
  try {
    reports::check_report(report, "the run's report");
  } catch (const reports::ReportError& e) {
    throw InternalError(std::string("writing --junit/--html: ") + e.what(), "");
  }
  if (!junit.empty()) {
    std::ostringstream xml;
    reports::write_junit(report, xml);
    write_file_atomically(junit, xml.str(), "--junit");
  }
  if (!html.empty()) {
    std::ostringstream page;
    reports::write_html(report, page);
    write_file_atomically(html, page.str(), "--html");
  }
}

void apply_known(Json& report, const campaign::KnownIssues& known) {
  const std::string backend = report["environment"]["backend"].get<std::string>();
  const Json& versions = report["environment"]["backend_versions"];
  std::string version = report["tool"]["version"].get<std::string>();
  for (const char* key : {"transformer_engine", "torch"}) {
    if (backend != "model" && versions.contains(key) && versions[key].is_string()) {
      version = versions[key].get<std::string>();
      break;
    }
  }
  int64_t known_count = 0;
  for (auto& finding : report["findings"]) {
    // A cluster is matched on its first detail, the finding that gave it its signature, and
    // on the dtype and recipe its saved case records (case-level entries: a report without
    // them leaves those entries unmatched, so the cluster stays new).
    campaign::CaseFacts facts;
    facts.dtype = finding.value("dtype", "");
    const auto recipe = reports::finding_recipe(finding);
    facts.recipe_recorded = recipe.has_value();
    if (recipe) facts.recipe = *recipe;
    // The ops of the cluster's saved case (case_ops entries); absent in older reports.
    facts.ops_recorded = finding.contains("ops") && finding["ops"].is_array();
    if (facts.ops_recorded) {
      for (const auto& op : finding["ops"]) {
        if (op.is_string() && op.get<std::string>() != harness::kBoundaryOp) facts.ops.push_back(op.get<std::string>());
      }
    }
    // A recipe entry covers a cluster only if every case counted in it ran under that recipe
    // (a campaign run with that entry clusters the others apart; one run without may not).
    auto covers_recipes = [&finding](const campaign::KnownIssue& e) {
      if (!e.recipe || !finding.contains("recipes")) return true;
      for (const auto& item : finding["recipes"].items()) {
        if (item.key() != *e.recipe) return false;
      }
      return true;
    };
    harness::Finding f;
    f.signature = finding["signature"].get<std::string>();
    f.kind = harness::verdict_from_name(finding["kind"].get<std::string>());
    if (!finding["details"].empty()) {
      const Json& d = finding["details"][0];
      f.role = d.value("role", "");
      f.op = d.value("op", "");
      f.option = d.value("option", "");
      f.error_kind = d.value("error_kind", "");
      f.message = d.value("message", "");
      f.phase = d.value("phase", "");
    }
    const campaign::KnownIssue* e = nullptr;
    for (const auto& entry : known.entries) {
      if (entry.matches(f, facts, backend, version) && covers_recipes(entry)) {
        e = &entry;
        break;
      }
    }
    finding["known"] =
        e ? Json{{"id", e->id}, {"status", e->status}, {"link", e->link}, {"note", e->note}} : Json(nullptr);
    known_count += e ? 1 : 0;
  }
  Json& summary = report["summary"];
  summary["known_findings"] = known_count;
  summary["new_findings"] = static_cast<int64_t>(report["findings"].size()) - known_count;
  report["campaign"]["known_file"] = known.path.string();
}

std::string empty_name_error(const std::string& value) {
  return value.empty() ? std::string("expected a file name, got an empty one") : std::string();
}

void add_ci_output_flags(CLI::App& sub, CiOutputs& outputs) {
  sub.add_option("--junit", outputs.junit, "also write a JUnit XML document of the findings here (for CI dashboards)")
      ->check(empty_name_error, "FILE");
  sub.add_option("--html", outputs.html, "also write a self-contained HTML page of the report here")
      ->check(empty_name_error, "FILE");
}

ReportCommand::ReportCommand(CLI::App& app) {
  report_ = app.add_subcommand("report", "join and compare report documents (nightly CI)");
  report_->require_subcommand(1);
  merge_ = report_->add_subcommand(
      "merge",
      "join the reports of the shards of one campaign (fuzz --shard i/N) into OUT; exit 1 when it has findings");
  merge_->add_option("output", merge_output_, "the merged report to write (OUT.json)")->required();
  merge_->add_option("inputs", merge_inputs_, "the shards' reports (IN.json...)")->required();
  add_ci_output_flags(*merge_, merge_ci_);
  merge_->add_option("--known", known_, "known-issues file: mark the merged clusters it matches as known");
  merge_->add_flag("--fail-on-known", fail_on_known_, "with --known: known clusters make exit status 1 too");
  diff_ = report_->add_subcommand(
      "diff", "list clusters new in NEW, fixed since LAST and still failing; exit 1 when one is new");
  diff_->add_option("last", diff_last_, "the earlier report (LAST.json)")->required();
  diff_->add_option("new", diff_new_, "the later report (NEW.json)")->required();
  diff_->add_option("--json", diff_json_, "also write the diff as JSON here")->check(empty_name_error, "FILE");
  diff_->add_option("--known", known_, "known-issues file: new clusters it matches do not make exit status 1");
  diff_->add_flag("--fail-on-known", fail_on_known_, "with --known: known new clusters make exit status 1 too");
  upstream_ = report_->add_subcommand(
      "upstream", "per new confirmed cluster of REPORT, a folder in DIR with README.md and its upstream test");
  upstream_->add_option("report", upstream_report_, "the report (REPORT.json)")->required();
  upstream_->add_option("--output,-o", upstream_dir_, "the directory to write the folders into")->required();
  upstream_->add_option("--backend", upstream_backend_, "te or torch (default: the report's backend)");
}

bool ReportCommand::parsed() const { return report_->parsed(); }

int ReportCommand::run(std::ostream& out) const {
  if (merge_->parsed()) return merge(out);
  if (diff_->parsed()) return diff(out);
  if (upstream_->parsed()) return upstream(out);
  throw InputError("report: choose merge, diff or upstream");
}

namespace {

/// `test` without its first docstring: two clusters' tests that differ only there are one test.
std::string without_docstring(const std::string& test) {
  const size_t open = test.find("\"\"\"");
  if (open == std::string::npos) return test;
  const size_t close = test.find("\"\"\"", open + 3);
  if (close == std::string::npos) return test;
  return test.substr(0, open) + test.substr(close + 3);
}

}  // namespace

int ReportCommand::upstream(std::ostream& out) const {
  const Json report = reports::load_report(upstream_report_);
  const std::string target =
      upstream_backend_.empty() ? report.at("environment").value("backend", std::string("te")) : upstream_backend_;
  if (target != "te" && target != "torch") {
    throw InputError("report upstream: --backend: upstream tests are written for te or torch, got '" + target + "'");
  }
  if (!exporter_) throw std::logic_error("report upstream: no exporter set");
  const std::filesystem::path dir(upstream_dir_);
  try {
    campaign::make_directories(dir);
  } catch (const std::exception& e) {
    throw InputError("report upstream: -o: cannot create '" + upstream_dir_ + "' (" + e.what() + ")");
  }
  // A folder written: its README is written last, with the clusters whose test came out the
  // same (one defect signed several ways: one folder to file, naming them all).
  struct Written {
    std::filesystem::path folder;
    std::string readme;
    std::vector<std::string> also;
  };
  std::vector<Written> written;
  std::map<std::string, size_t> by_test;  // a test without its docstring -> its folder in `written`
  std::set<std::string> folders;
  for (const auto& finding : report.at("findings")) {
    if (!reports::is_upstream_candidate(finding)) continue;
    // The folder name first: the test's name follows it.
    reports::UpstreamIssue issue = reports::upstream_issue(report, finding, "", "", "");
    std::string folder = issue.folder;
    for (int k = 2; !folders.insert(folder).second; ++k) folder = issue.folder + "-" + std::to_string(k);
    std::string test_name = "test_" + folder + ".py";
    for (char& c : test_name) c = c == '-' ? '_' : c;
    const std::filesystem::path test_path = dir / folder / test_name;
    try {
      campaign::make_directories(dir / folder);
    } catch (const std::exception& e) {
      throw InputError("report upstream: cannot create '" + (dir / folder).string() + "' (" + e.what() + ")");
    }
    UpstreamTest test;
    try {
      test = exporter_(finding, target, test_path.string());
    } catch (const std::exception& e) {
      // A cluster the writer declines (a documented write, an op the framework lacks): said,
      // and the others written.
      campaign::remove_tree(dir / folder);
      out << (dir / folder).string() << ": no test (" << e.what() << ")\n";
      continue;
    }
    const std::string signature = finding.value("signature", std::string());
    const auto [same, fresh] = by_test.emplace(without_docstring(test.text), written.size());
    if (!fresh) {
      campaign::remove_tree(dir / folder);
      written[same->second].also.push_back(signature);
      out << (dir / folder).string() << ": the same test as " << written[same->second].folder.string() << " ("
          << signature << ")\n";
      continue;
    }
    issue = reports::upstream_issue(report, finding, test_name, test.text, test.source);
    written.push_back({dir / folder, issue.readme, {}});
    out << (dir / folder).string() << ": " << issue.title << '\n';
    for (const auto& note : test.notes) out << "  note: " << note << '\n';
  }
  for (const auto& w : written) {
    std::string readme = w.readme;
    if (!w.also.empty()) {
      readme +=
          "\n## The same test, other clusters\n\nThe test above is also the test of these clusters of the "
          "report (the same case, one first divergence, signed by where else it shows):\n\n";
      for (const auto& signature : w.also) readme += "- `" + signature + "`\n";
    }
    write_file_atomically((w.folder / "README.md").string(), readme, "report upstream -o");
  }
  out << written.size() << " cluster(s) to file in " << upstream_dir_ << '\n';
  return 0;
}

int ReportCommand::merge(std::ostream& out) const {
  if (merge_output_.empty()) throw InputError("report merge: expected the output file name first, got an empty one");
  for (const auto& in : merge_inputs_) {
    if (in == merge_output_ || same_file(in, merge_output_)) {
      throw InputError("report merge: " + merge_output_ +
                       " is both the output and an input; the first argument is the merged report to write");
    }
  }
  // A forgotten OUT makes the first shard's report the output: refuse to overwrite a shard.
  struct stat info {};
  if (::stat(merge_output_.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
    Json existing;
    bool is_report = true;
    try {
      existing = reports::load_report(merge_output_);
    } catch (const reports::ReportError&) {
      is_report = false;  // anything else (an older merge of another format, junk) is replaced
    }
    if (is_report && existing["campaign"]["shard"].is_string()) {
      throw InputError("report merge: " + merge_output_ + " is the report of shard " +
                       existing["campaign"]["shard"].get<std::string>() +
                       "; the first argument is the merged report to write (report merge OUT.json IN.json...)");
    }
  }
  merge_ci_.check_writable();
  std::vector<reports::NamedReport> inputs;
  for (const auto& path : merge_inputs_) inputs.push_back({path, load(path)});
  Json merged;
  try {
    merged = reports::merge_reports(std::move(inputs));
  } catch (const reports::ReportError& e) {
    throw InputError(e.what());
  }
  if (!known_.empty()) apply_known(merged, campaign::load_known_issues(known_));
  write_file_atomically(merge_output_, merged.dump(2) + "\n", "report merge");
  merge_ci_.write(merged);
  const Json& summary = merged["summary"];
  out << "report merge: " << merge_inputs_.size() << " report(s) -> " << merge_output_ << ": "
      << summary["cases_run"].get<int64_t>() << " cases, " << summary["failed"].get<int64_t>() << " failed, "
      << merged["findings"].size() << " cluster(s)";
  if (!merged["merge"]["missing_shards"].empty()) {
    out << ", missing shards";
    for (const auto& m : merged["merge"]["missing_shards"]) out << ' ' << m.get<std::string>();
  }
  out << (summary["complete"].get<bool>() ? "" : ", incomplete") << '\n';
  int64_t counted = 0;
  for (const auto& finding : merged["findings"]) {
    const bool known = finding.contains("known") && finding["known"].is_object();
    counted += fail_on_known_ || !known ? 1 : 0;
  }
  return static_cast<int>(counted == 0 ? ExitCode::kOk : ExitCode::kFindings);
}

int ReportCommand::diff(std::ostream& out) const {
  Json last = load(diff_last_);
  Json next = load(diff_new_);
  if (!known_.empty()) {
    const campaign::KnownIssues known = campaign::load_known_issues(known_);
    apply_known(last, known);
    apply_known(next, known);
  }
  const reports::ReportDiff result = reports::diff_reports(last, next);
  if (!diff_json_.empty()) {
    write_file_atomically(diff_json_, reports::diff_to_json(result, diff_last_, diff_new_).dump(2) + "\n", "--json");
  }
  reports::print_diff(result, diff_last_, diff_new_, out);
  const int64_t counted = fail_on_known_ ? static_cast<int64_t>(result.added.size()) : result.added_unknown();
  return static_cast<int>(counted == 0 ? ExitCode::kOk : ExitCode::kFindings);
}

}  // namespace gradfuzz::tools
