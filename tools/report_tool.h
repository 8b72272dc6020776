#pragma once

#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace gradfuzz::campaign {
struct KnownIssues;
}  // namespace gradfuzz::campaign

namespace gradfuzz::tools {

/// Writes `text` to `path` so that a reader never sees half a file: a temporary file beside
/// it (same directory, so the rename cannot cross file systems), flushed to disk, then
/// renamed over it. Throws InputError "<flag>: cannot write '<path>' (<reason>)".
void write_file_atomically(const std::string& path, const std::string& text, const std::string& flag);

/// The --junit FILE and --html FILE outputs of a command that ends with a report document
/// (fuzz, replay, selftest, report merge). Empty: not asked for.
struct CiOutputs {
  std::string junit;
  std::string html;

  bool any() const { return !junit.empty() || !html.empty(); }
  /// Throws InputError naming the flag and the file when a given path cannot be written
  /// (missing directory, no permission, a directory): checked before a run starts, so a
  /// typo does not cost the run.
  void check_writable() const;
  /// Writes the JUnit XML and HTML documents of `report` (each atomically). Throws
  /// InternalError when `report` is not a valid report document (gradfuzz's own bug) and
  /// InputError when a file cannot be written.
  void write(const nlohmann::ordered_json& report) const;
};

/// A CLI11 check: an empty file name is a usage error ("expected a file name, got an empty
/// one"); any other passes.
std::string empty_name_error(const std::string& value);

/// Registers --junit FILE and --html FILE on `sub` (an empty name is a usage error).
void add_ci_output_flags(CLI::App& sub, CiOutputs& outputs);

/// An upstream test written by `gradfuzz export --upstream`: its text, the export's notes and
/// where in the framework the first divergence's class is (empty: unknown).
struct UpstreamTest {
  std::string text;
  std::vector<std::string> notes;
  std::string source;
};
/// Writes the upstream test of `cluster` (a finding of a report: its case file, signature,
/// details and confirmation) for `target` ("te", "torch") to `test_path`.
using UpstreamExporter = std::function<UpstreamTest(const nlohmann::ordered_json& cluster, const std::string& target,
                                                    const std::string& test_path)>;

/// `gradfuzz report merge OUT.json IN.json... [--junit FILE] [--html FILE]`,
/// `gradfuzz report upstream REPORT.json -o DIR [--backend te|torch]` (per new, confirmed cluster
/// a folder with README.md and its upstream test, reports/upstream_report.h) and
/// `gradfuzz report diff LAST.json NEW.json [--json FILE]`, registered on the app by the
/// constructor; the object must outlive parsing (CLI11 writes into its members).
/// Exit statuses: merge 0 when the merged report has no finding (with --known: no new one),
/// 1 when it has; diff 1 when NEW has a cluster LAST has not (with --known: one no entry
/// matches), else 0; 2 for an unreadable or invalid report (the
/// message names the file and the JSON path), reports of different campaigns, or an output
/// that cannot be written.
class ReportCommand {
 public:
  explicit ReportCommand(CLI::App& app);
  ReportCommand(const ReportCommand&) = delete;
  ReportCommand& operator=(const ReportCommand&) = delete;

  /// Whether the command line chose `report`.
  bool parsed() const;
  /// How `report upstream` writes each cluster's test (the command line's export).
  void set_upstream_exporter(UpstreamExporter exporter) { exporter_ = std::move(exporter); }
  /// Runs the chosen subcommand, human output to `out`. Throws InputError for the usage
  /// and input errors above.
  int run(std::ostream& out) const;

 private:
  int merge(std::ostream& out) const;
  int diff(std::ostream& out) const;
  int upstream(std::ostream& out) const;

  CLI::App* report_ = nullptr;
  CLI::App* merge_ = nullptr;
  CLI::App* diff_ = nullptr;
  std::string merge_output_;
  std::vector<std::string> merge_inputs_;
  CiOutputs merge_ci_;
  std::string diff_last_;
  std::string diff_new_;
  std::string diff_json_;
  std::string known_;
  bool fail_on_known_ = false;
  CLI::App* upstream_ = nullptr;
  std::string upstream_report_;
  std::string upstream_dir_;
  std::string upstream_backend_;
  UpstreamExporter exporter_;
};

/// Marks each finding cluster of a report document as known (its `known` set to the matching
/// entry, matched on the cluster's signature and first detail, and for case-level fields on
/// the dtype and recipe its saved case records: none recorded, no match; a `recipe` entry
/// also needs every case the cluster counts under that recipe) or new (null), and updates
/// summary.known_findings / new_findings and campaign.known_file.
void apply_known(nlohmann::ordered_json& report, const campaign::KnownIssues& known);

}  // namespace gradfuzz::tools
