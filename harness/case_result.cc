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

void CaseResult::summarize() {
  if (findings.empty()) {
    if (verdict != VerdictKind::kUnsupported) verdict = VerdictKind::kPass;
    return;
  }
  // The most telling kind first: a dead process says nothing else, a dropped gradient is the
  // defect gradfuzz exists for, then errors, writes into caller tensors, wrong values.
  for (VerdictKind kind :
       {VerdictKind::kCrash, VerdictKind::kTimeout, VerdictKind::kSanitizer, VerdictKind::kMissingGradient,
        VerdictKind::kUnexpectedError, VerdictKind::kModifiedInput, VerdictKind::kMismatch}) {
    for (const auto& f : findings) {
      if (f.kind == kind) {
        verdict = kind;
        return;
      }
    }
  }
  verdict = findings.front().kind;
}

std::vector<std::string> CaseResult::signatures() const {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& f : findings) {
    if (seen.insert(f.signature).second) out.push_back(f.signature);
  }
  return out;
}

const Finding* CaseResult::finding(const std::string& signature) const {
  for (const auto& f : findings) {
    if (f.signature == signature) return &f;
  }
  return nullptr;
}

bool CaseResult::has_new_findings() const {
  return std::any_of(findings.begin(), findings.end(), [](const Finding& f) { return !f.is_known(); });
}

std::ostream& operator<<(std::ostream& os, const Finding& d) {
  os << verdict_name(d.kind) << ' ' << d.path_pair << ' ' << d.tensor;
  if (!d.error_kind.empty() || !d.message.empty()) {
    os << ": " << (d.error_kind.empty() ? "" : d.error_kind + " ") << (d.phase.empty() ? "" : "during " + d.phase)
       << (d.message.empty() ? "" : ": " + d.message);
  } else if (d.role != "plan" && d.kind != VerdictKind::kModifiedInput) {
    os << " at [";
    for (size_t i = 0; i < d.index.size(); ++i) os << (i ? "," : "") << d.index[i];
    os << "]: expected " << d.expected << ", got " << d.got << " (max abs err " << d.max_abs_err << ", max rel err "
       << d.max_rel_err << ", atol " << d.atol << ", rtol " << d.rtol;
    if (d.norm_bound > 0) os << ", norm err " << d.norm_err << " > " << d.norm_bound;
    os << ")";
  }
  if (!d.op.empty()) os << " [" << d.op << (d.option.empty() ? "" : " " + d.option) << "]";
  if (!d.note.empty()) os << "; " << d.note;
  if (d.is_known()) os << " (known: " << d.known << ")";
  return os;
}

std::ostream& operator<<(std::ostream& os, const CaseResult& result) {
  os << verdict_name(result.verdict) << " (seed " << result.seed << ", ops";
  for (const auto& op : result.op_types) os << ' ' << op;
  os << ")";
  if (!result.notes.empty()) os << "\n  " << result.notes;
  for (const auto& f : result.findings) os << "\n  " << f;
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

void to_json(nlohmann::json& j, const Finding& d) {
  j = nlohmann::json{{"kind", verdict_name(d.kind)},
                     {"path_pair", d.path_pair},
                     {"tensor", d.tensor},
                     {"role", d.role},
                     {"signature", d.signature}};
  // Only what the finding has: value checks carry numbers, errors their kind and message.
  if (!d.index.empty() || d.max_abs_err != 0 || d.atol != 0) {
    j["index"] = d.index;
    j["expected"] = number_json(d.expected);
    j["got"] = number_json(d.got);
    j["max_abs_err"] = number_json(d.max_abs_err);
    j["max_rel_err"] = number_json(d.max_rel_err);
    j["atol"] = number_json(d.atol);
    j["rtol"] = number_json(d.rtol);
    j["scale"] = number_json(d.scale);
  }
  if (d.rounding != 0) j["rounding"] = number_json(d.rounding);
  if (d.norm_bound != 0) {
    j["norm_err"] = number_json(d.norm_err);
    j["norm_bound"] = number_json(d.norm_bound);
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
}

void from_json(const nlohmann::json& j, Finding& d) {
  d = Finding{};
  d.kind = verdict_from_name(j.at("kind").get<std::string>());
  d.path_pair = j.at("path_pair").get<std::string>();
  d.tensor = j.at("tensor").get<std::string>();
  d.role = j.at("role").get<std::string>();
  d.signature = j.value("signature", "");
  if (j.contains("index")) d.index = j.at("index").get<std::vector<int64_t>>();
  auto number = [&](const char* key, double& out) {
    if (j.contains(key)) out = number_from(j.at(key));
  };
  number("expected", d.expected);
  number("got", d.got);
  number("max_abs_err", d.max_abs_err);
  number("max_rel_err", d.max_rel_err);
  number("atol", d.atol);
  number("rtol", d.rtol);
  number("scale", d.scale);
  number("rounding", d.rounding);
  number("norm_err", d.norm_err);
  number("norm_bound", d.norm_bound);
  d.error_kind = j.value("error_kind", "");
  d.error_type = j.value("error_type", "");
  d.phase = j.value("phase", "");
  d.message = j.value("message", "");
  d.origin = j.value("origin", "");
  d.op = j.value("op", "");
  d.option = j.value("option", "");
  d.note = j.value("note", "");
  d.known = j.value("known", "");
}

bool Divergence::operator==(const Divergence& o) const {
  return path == o.path && kind == o.kind && pass == o.pass && op_index == o.op_index && op == o.op &&
         group == o.group && fused == o.fused && impl_class == o.impl_class && method == o.method && role == o.role &&
         tensor == o.tensor && max_abs_err == o.max_abs_err && max_rel_err == o.max_rel_err && norm_err == o.norm_err &&
         norm_bound == o.norm_bound;
}

const Divergence* CaseResult::divergence_of(const std::string& path_pair) const {
  const std::string path = path_pair.substr(0, path_pair.find('~'));
  for (const auto& d : divergences) {
    if (d.path == path) return &d;
  }
  return nullptr;
}

void to_json(nlohmann::json& j, const Divergence& d) {
  j = nlohmann::json{{"path", d.path},
                     {"kind", d.kind},
                     {"pass", d.pass},
                     {"op_index", d.op_index},
                     {"op", d.op},
                     {"group", d.group},
                     {"fused", d.fused},
                     {"class", d.impl_class},
                     {"method", d.method},
                     {"role", d.role},
                     {"tensor", d.tensor},
                     {"max_abs_err", number_json(d.max_abs_err)},
                     {"max_rel_err", number_json(d.max_rel_err)},
                     {"norm_err", number_json(d.norm_err)},
                     {"norm_bound", number_json(d.norm_bound)}};
}

void from_json(const nlohmann::json& j, Divergence& d) {
  d = Divergence{};
  d.path = j.at("path").get<std::string>();
  d.kind = j.value("kind", "mismatch");
  d.pass = j.at("pass").get<std::string>();
  d.op_index = j.at("op_index").get<int64_t>();
  d.op = j.value("op", "");
  d.group = j.value("group", "");
  d.fused = j.value("fused", false);
  d.impl_class = j.value("class", "");
  d.method = j.value("method", "");
  d.role = j.at("role").get<std::string>();
  d.tensor = j.value("tensor", "");
  if (j.contains("max_abs_err")) d.max_abs_err = number_from(j.at("max_abs_err"));
  if (j.contains("max_rel_err")) d.max_rel_err = number_from(j.at("max_rel_err"));
  if (j.contains("norm_err")) d.norm_err = number_from(j.at("norm_err"));
  if (j.contains("norm_bound")) d.norm_bound = number_from(j.at("norm_bound"));
}

void to_json(nlohmann::json& j, const CaseResult& r) {
  j = nlohmann::json{{"verdict", verdict_name(r.verdict)},
                     {"findings", r.findings},
                     {"notes", r.notes},
                     {"seed", r.seed},
                     {"backend", r.backend},
                     {"op_types", r.op_types},
                     {"fusions_fired", r.fusions_fired},
                     {"fused_forward", r.fused_forward},
                     {"fused_backward", r.fused_backward},
                     {"fused_compared", r.fused_compared},
                     {"features", r.features},
                     {"kernels", r.kernels},
                     {"kink_elements", r.kink_elements},
                     {"cancellation_tensors", r.cancellation_tensors}};
  if (!r.divergences.empty()) j["divergences"] = r.divergences;
  if (r.fp8_states_checked > 0) j["fp8_states_checked"] = r.fp8_states_checked;
  if (r.fp8_tensors_checked > 0) j["fp8_tensors_checked"] = r.fp8_tensors_checked;
}

void from_json(const nlohmann::json& j, CaseResult& r) {
  r.verdict = verdict_from_name(j.at("verdict").get<std::string>());
  r.findings = j.at("findings").get<std::vector<Finding>>();
  r.notes = j.at("notes").get<std::string>();
  r.seed = j.at("seed").get<uint64_t>();
  r.backend = j.at("backend").get<std::string>();
  r.op_types = j.at("op_types").get<std::vector<std::string>>();
  r.fusions_fired = j.at("fusions_fired").get<std::vector<std::string>>();
  r.fused_forward = j.at("fused_forward").get<std::vector<std::string>>();
  r.fused_backward = j.at("fused_backward").get<std::vector<std::string>>();
  r.fused_compared = j.value("fused_compared", std::vector<std::string>{});
  r.features = j.at("features").get<std::vector<std::string>>();
  r.kernels = j.at("kernels").get<std::map<std::string, std::array<int64_t, 2>>>();
  r.kink_elements = j.value("kink_elements", int64_t{0});
  r.cancellation_tensors = j.value("cancellation_tensors", int64_t{0});
  r.fp8_states_checked = j.value("fp8_states_checked", int64_t{0});
  r.fp8_tensors_checked = j.value("fp8_tensors_checked", int64_t{0});
  r.divergences = j.value("divergences", std::vector<Divergence>{});
}

}  // namespace gradfuzz::harness
