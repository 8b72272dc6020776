#include "harness/case_result.h"

#include <algorithm>
#include <ostream>
#include <set>
#include <stdexcept>

namespace gradfuzz::harness {

namespace {
constexpr VerdictKind kAllKinds[] = {VerdictKind::kPass,            VerdictKind::kMismatch,
                                     VerdictKind::kMissingGradient, VerdictKind::kUnexpectedError,
                                     VerdictKind::kCrash,           VerdictKind::kTimeout};
}  // namespace

const char* verdict_name(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::kPass:
      return "pass";
    case VerdictKind::kMismatch:
      return "mismatch";
    case VerdictKind::kMissingGradient:
      return "missing_gradient";
    case VerdictKind::kUnexpectedError:
      return "unexpected_error";
    case VerdictKind::kCrash:
      return "crash";
    case VerdictKind::kTimeout:
      return "timeout";
  }
  return "unknown";
}

VerdictKind verdict_from_name(const std::string& name) {
  std::string known;
  for (VerdictKind kind : kAllKinds) {
    if (name == verdict_name(kind)) return kind;
    known += (known.empty() ? "" : ", ") + std::string(verdict_name(kind));
  }
  throw std::invalid_argument("unknown verdict '" + name + "'; known verdicts: " + known);
}

std::string CaseResult::signature() const {
  std::set<std::string> unique_ops(op_types.begin(), op_types.end());
  std::string ops_text;
  for (const auto& op : unique_ops) ops_text += (ops_text.empty() ? "" : ",") + op;
  // The first detail of the verdict's own kind names the tensor role; an unexpected error
  // has no tensor, so its per-path error kinds take that place.
  std::string role;
  auto it = std::find_if(details.begin(), details.end(), [&](const TensorMismatch& d) { return d.kind == verdict; });
  if (it != details.end()) {
    role = it->role;
  } else if (!details.empty()) {
    role = details.front().role;
  } else {
    role = error_kinds;
  }
  return std::string(verdict_name(verdict)) + "|" + ops_text + "|" + role;
}

std::ostream& operator<<(std::ostream& os, const CaseResult& result) {
  os << verdict_name(result.verdict) << " (seed " << result.seed << ", ops";
  for (const auto& op : result.op_types) os << ' ' << op;
  os << ")";
  if (!result.error_detail.empty()) os << "\n  " << result.error_detail;
  for (const auto& d : result.details) {
    os << "\n  " << verdict_name(d.kind) << ' ' << d.path_pair << ' ' << d.tensor << " at [";
    for (size_t i = 0; i < d.index.size(); ++i) os << (i ? "," : "") << d.index[i];
    os << "]: expected " << d.expected << ", got " << d.got << " (max abs err " << d.max_abs_err
       << ", max rel err " << d.max_rel_err << ", atol " << d.atol << ", rtol " << d.rtol << ")";
  }
  return os;
}

}  // namespace gradfuzz::harness
