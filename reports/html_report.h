#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

namespace gradfuzz::reports {

/// log10(max_abs_err / atol) of the mismatch details of a report's findings (one value per
/// compared tensor of each cluster's representative case), grouped two ways. A value of
/// +infinity stands for an error the report holds as null (NaN or infinite).
struct ErrorDistribution {
  /// Op type -> values: a finding's details count once under each of its distinct op types.
  std::map<std::string, std::vector<double>> by_op;
  /// dtype -> values; "unknown" for findings of reports that do not record their dtype.
  std::map<std::string, std::vector<double>> by_dtype;
  /// Details not plotted: not a mismatch, or no positive atol or error to take a ratio of.
  int64_t left_out = 0;
};

/// The error distribution of a checked report (check_report).
ErrorDistribution error_distribution(const nlohmann::ordered_json& report);

/// Writes one self-contained HTML page of a checked report: no external asset (inline CSS,
/// SVG and script only), readable without the script. Sections: run context and summary
/// (ids `summary-<key>`), finding clusters with details and reproduce lines (a filter box,
/// `cluster-filter`; the script writes `cluster-filter-status` and marks the body
/// `data-ready="1"`), error distribution histograms by op and by dtype (inline SVG, ids
/// `hist-op-<name>` and `hist-dtype-<name>`), coverage tables (ops, fusions, features, fused
/// ops per pass, kernels), and selftest and merge tables when the report has them.
void write_html(const nlohmann::ordered_json& report, std::ostream& out);

}  // namespace gradfuzz::reports
