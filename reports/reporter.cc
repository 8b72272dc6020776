#include "reports/reporter.h"

namespace gradfuzz::reports {

std::string reproduce_line(const std::string& case_file, const std::optional<std::string>& fault) {
  std::string line = "gradfuzz replay " + case_file;
  if (fault) line += " --fault " + *fault;
  return line;
}

void MultiReporter::report_context(const ReportContext& context) {
  for (Reporter* r : reporters_) {
    if (r) r->report_context(context);
  }
}

void MultiReporter::report_case(const CaseRecord& record) {
  for (Reporter* r : reporters_) {
    if (r) r->report_case(record);
  }
}

void MultiReporter::finalize(const RunSummary& summary) {
  for (Reporter* r : reporters_) {
    if (r) r->finalize(summary);
  }
}

}  // namespace gradfuzz::reports
