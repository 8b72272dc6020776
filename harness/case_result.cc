#include "harness/case_result.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <stdexcept>

namespace gradfuzz::harness {

namespace {
constexpr VerdictKind kAllKinds[] = {
    VerdictKind::kPass,     VerdictKind::kMismatch, VerdictKind::kMissingGradient, VerdictKind::kUnexpectedError,
    VerdictKind::kCrash,    VerdictKind::kTimeout,  VerdictKind::kModifiedInput,   VerdictKind::kUnsupported,
    VerdictKind::kSanitizer};
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
    case VerdictKind::kModifiedInput:
      return "modified_input";
    case VerdictKind::kUnsupported:
      return "unsupported";
    case VerdictKind::kSanitizer:
      return "sanitizer";
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

std::string CaseResult::signature_role() const {
  // The first detail of the verdict's own kind names the tensor role; an unexpected error
  // has no tensor, so its per-path error kinds take that place.
  auto it = std::find_if(details.begin(), details.end(), [&](const TensorMismatch& d) { return d.kind == verdict; });
  if (it != details.end()) return it->role;
  if (!details.empty()) return details.front().role;
  return error_kinds;
}

std::string CaseResult::signature() const {
  std::set<std::string> unique_ops(op_types.begin(), op_types.end());
  std::string ops_text;
  for (const auto& op : unique_ops) ops_text += (ops_text.empty() ? "" : ",") + op;
  return std::string(verdict_name(verdict)) + "|" + ops_text + "|" + signature_role();
}

std::ostream& operator<<(std::ostream& os, const CaseResult& result) {
  os << verdict_name(result.verdict) << " (seed " << result.seed << ", ops";
  for (const auto& op : result.op_types) os << ' ' << op;
  os << ")";
  if (!result.error_detail.empty()) os << "\n  " << result.error_detail;
  for (const auto& d : result.details) {
    os << "\n  " << verdict_name(d.kind) << ' ' << d.path_pair << ' ' << d.tensor << " at [";
    for (size_t i = 0; i < d.index.size(); ++i) os << (i ? "," : "") << d.index[i];
    os << "]: expected " << d.expected << ", got " << d.got << " (max abs err " << d.max_abs_err << ", max rel err "
       << d.max_rel_err << ", atol " << d.atol << ", rtol " << d.rtol << ")";
  }
  return os;
}

namespace {

// JSON has no infinity or NaN: errors can be both (a shape mismatch is +inf), so numbers
// travel as strings when they are not finite.
nlohmann::json number_json(double v) {
  if (std::isfinite(v)) return v;
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

double number_from(const nlohmann::json& j) {
  if (j.is_number()) return j.get<double>();
  const std::string s = j.get<std::string>();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  throw std::invalid_argument("expected a number, 'nan', 'inf' or '-inf', got '" + s + "'");
}

}  // namespace

void to_json(nlohmann::json& j, const TensorMismatch& d) {
  j = nlohmann::json{{"kind", verdict_name(d.kind)},
                     {"path_pair", d.path_pair},
                     {"tensor", d.tensor},
                     {"role", d.role},
                     {"index", d.index},
                     {"expected", number_json(d.expected)},
                     {"got", number_json(d.got)},
                     {"max_abs_err", number_json(d.max_abs_err)},
                     {"max_rel_err", number_json(d.max_rel_err)},
                     {"atol", number_json(d.atol)},
                     {"rtol", number_json(d.rtol)},
                     {"scale", number_json(d.scale)}};
  if (d.rounding != 0) j["rounding"] = number_json(d.rounding);  // only low-precision details have one
}

void from_json(const nlohmann::json& j, TensorMismatch& d) {
  d.kind = verdict_from_name(j.at("kind").get<std::string>());
  d.path_pair = j.at("path_pair").get<std::string>();
  d.tensor = j.at("tensor").get<std::string>();
  d.role = j.at("role").get<std::string>();
  d.index = j.at("index").get<std::vector<int64_t>>();
  d.expected = number_from(j.at("expected"));
  d.got = number_from(j.at("got"));
  d.max_abs_err = number_from(j.at("max_abs_err"));
  d.max_rel_err = number_from(j.at("max_rel_err"));
  d.atol = number_from(j.at("atol"));
  d.rtol = number_from(j.at("rtol"));
  d.scale = number_from(j.at("scale"));
  d.rounding = j.contains("rounding") ? number_from(j.at("rounding")) : 0.0;
}

void to_json(nlohmann::json& j, const CaseResult& r) {
  j = nlohmann::json{{"verdict", verdict_name(r.verdict)},
                     {"details", r.details},
                     {"error_detail", r.error_detail},
                     {"error_kinds", r.error_kinds},
                     {"seed", r.seed},
                     {"backend", r.backend},
                     {"op_types", r.op_types},
                     {"fusions_fired", r.fusions_fired},
                     {"fused_forward", r.fused_forward},
                     {"fused_backward", r.fused_backward},
                     {"features", r.features},
                     {"kernels", r.kernels}};
}

void from_json(const nlohmann::json& j, CaseResult& r) {
  r.verdict = verdict_from_name(j.at("verdict").get<std::string>());
  r.details = j.at("details").get<std::vector<TensorMismatch>>();
  r.error_detail = j.at("error_detail").get<std::string>();
  r.error_kinds = j.at("error_kinds").get<std::string>();
  r.seed = j.at("seed").get<uint64_t>();
  r.backend = j.at("backend").get<std::string>();
  r.op_types = j.at("op_types").get<std::vector<std::string>>();
  r.fusions_fired = j.at("fusions_fired").get<std::vector<std::string>>();
  r.fused_forward = j.at("fused_forward").get<std::vector<std::string>>();
  r.fused_backward = j.at("fused_backward").get<std::vector<std::string>>();
  r.features = j.at("features").get<std::vector<std::string>>();
  r.kernels = j.at("kernels").get<std::map<std::string, std::array<int64_t, 2>>>();
}

}  // namespace gradfuzz::harness
