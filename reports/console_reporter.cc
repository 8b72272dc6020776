#include "reports/console_reporter.h"

namespace gradfuzz::reports {

void ConsoleReporter::report_context(const ReportContext& context) { command_ = context.campaign.command; }

void ConsoleReporter::report_case(const CaseRecord& record) {
  ++cases_run_;
  if (!record.result.passed()) ++failed_;
  for (const auto& finding : record.new_findings) {
    ++findings_;
    out_ << (finding.known ? "known finding" : "finding") << ": [" << finding.signature << "]";
    if (const harness::Finding* d = finding.result.finding(finding.signature)) out_ << "\n  " << *d;
    if (finding.known) out_ << "\n  known issue " << finding.known->id << " (" << finding.known->status << ")";
    out_ << "\n  " << finding.reproduce << '\n';
  }
  out_.flush();
}

void ConsoleReporter::finalize(const RunSummary& summary) {
  out_ << command_ << ": " << cases_run_ << " cases, " << failed_ << " failed, " << findings_ << " findings";
  if (summary.wall_s > 0) out_ << ", " << summary.wall_s << " s, " << cases_run_ / summary.wall_s << " cases/s";
  out_ << '\n';
  if (summary.selftest) {
    for (const auto& e : *summary.selftest) {
      out_ << "  " << e.name << ": " << (e.ok() ? "ok" : "FAILED");
      if (e.detected) {
        out_ << " (detected after " << *e.cases_to_detect << " cases, " << *e.seconds_to_detect << " s, shrunk to "
             << e.shrunk_ops.value_or(-1) << " ops; replay with fault exit " << e.replay_with_fault_exit.value_or(-1)
             << ", without " << e.replay_without_fault_exit.value_or(-1) << "; " << e.case_file.value_or("") << ")";
      } else {
        out_ << " (not detected)";
      }
      if (e.unattributed_findings > 0) {
        out_ << " [" << e.unattributed_findings << " finding(s) that fail without the fault too]";
      }
      out_ << '\n';
    }
  }
  out_.flush();
}

}  // namespace gradfuzz::reports
