#pragma once

#include <ostream>

#include "reports/reporter.h"

namespace gradfuzz::reports {

/// Human-readable lines for a terminal or a log: one block per finding (kind, signature,
/// first detail, reproduce line) as it happens, and a one-line summary at finalize().
/// The stream must outlive the reporter.
class ConsoleReporter final : public Reporter {
 public:
  explicit ConsoleReporter(std::ostream& out) : out_(out) {}

  void report_context(const ReportContext& context) override;
  void report_case(const CaseRecord& record) override;
  void finalize(const RunSummary& summary) override;

 private:
  std::ostream& out_;
  std::string command_;
  int64_t cases_run_ = 0;
  int64_t failed_ = 0;
  int64_t findings_ = 0;
};

}  // namespace gradfuzz::reports
