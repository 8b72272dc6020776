#include "reports/upstream_report.h"

#include <cctype>
#include <cmath>
#include <sstream>

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;

std::string text_of(const Json& j, const char* key, const std::string& fallback = "") {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::string number(const Json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return "n/a";
  std::ostringstream os;
  os.precision(4);
  os << it->get<double>();
  return os.str();
}

std::string index_text(const Json& index) {
  if (!index.is_array() || index.empty()) return "";
  std::string out = "[";
  for (size_t k = 0; k < index.size(); ++k) out += (k ? ", " : "") + std::to_string(index[k].get<int64_t>());
  return out + "]";
}

/// "float32, Float8CurrentScaling (E4M3, backward_override=dequantized)", "bfloat16, no recipe".
std::string conditions(const Json& finding) {
  std::string out = text_of(finding, "dtype", "dtype unknown");
  const auto recipe = finding.find("recipe");
  if (recipe == finding.end() || recipe->is_null()) return out + ", no FP8 recipe";
  out += ", " + text_of(*recipe, "name") + " (" + text_of(*recipe, "fp8_format");
  if (const auto options = recipe->find("options"); options != recipe->end() && options->is_object()) {
    for (const auto& [key, value] : options->items()) {
      out += ", " + key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
  return out + ")";
}

const Json* first_detail(const Json& finding) {
  const auto details = finding.find("details");
  if (details == finding.end() || !details->is_array() || details->empty()) return nullptr;
  return &details->front();
}

const Json* first_divergence(const Json& finding) {
  const auto c = finding.find("confirmation");
  if (c == finding.end() || !c->is_object()) return nullptr;
  const auto d = c->find("first_divergence");
  return d != c->end() && d->is_object() ? &*d : nullptr;
}

std::string diagnosis_of(const Json& finding) {
  const auto c = finding.find("confirmation");
  return c != finding.end() && c->is_object() ? text_of(*c, "diagnosis") : "";
}

/// What each diagnosis says, for a reader who did not run gradfuzz.
std::string diagnosis_words(const std::string& diagnosis) {
  if (diagnosis == "fused-only") return "the fused path is wrong where the same ops unfused are right";
  if (diagnosis == "all-paths") return "the fused and the unfused paths are both wrong";
  if (diagnosis == "quantized-only") return "wrong under the FP8 recipe, right without it on the same values";
  if (diagnosis == "half-only") return "wrong in this half-precision dtype, right in float32 on the same values";
  if (diagnosis == "crash") return "the framework raises (or the process dies) where the reference computes";
  if (diagnosis == "known-consequence") return "a consequence of documented behaviour";
  return "not confirmed";
}

std::string safe(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ? c : '-';
  while (out.find("--") != std::string::npos) out.erase(out.find("--"), 1);
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

}  // namespace

bool is_upstream_candidate(const Json& finding) {
  const auto known = finding.find("known");
  if (known != finding.end() && !known->is_null()) return false;
  const std::string diagnosis = diagnosis_of(finding);
  return !diagnosis.empty() && diagnosis != "known-consequence";
}

UpstreamIssue upstream_issue(const Json& report, const Json& finding, const std::string& test_file,
                             const std::string& test_text, const std::string& source) {
  const Json* detail = first_detail(finding);
  const Json* divergence = first_divergence(finding);
  const std::string kind = text_of(finding, "kind");
  const std::string diagnosis = diagnosis_of(finding);
  const std::string signature = text_of(finding, "signature");
  // The op that computes the wrong tensor: the first divergence's group, else the signature's op.
  std::string where = divergence ? text_of(*divergence, "group") : "";
  if (where.empty()) {
    const size_t a = signature.find('|');
    const size_t b = signature.find('|', a + 1);
    where = a == std::string::npos ? signature : signature.substr(a + 1, b - a - 1);
  }
  const std::string role = divergence ? text_of(*divergence, "role") : (detail ? text_of(*detail, "role") : "");
  UpstreamIssue issue;
  issue.folder = safe(diagnosis + "-" + where + "-" + role);
  const bool error = kind == "unexpected_error" || kind == "crash" || kind == "timeout" || kind == "sanitizer";
  if (error) {
    const std::string message = detail ? text_of(*detail, "message", text_of(finding, "error")) : "";
    issue.title = where + ": " +
                  (kind == "unexpected_error" ? "raises in " + (detail ? text_of(*detail, "phase") : "") : kind) +
                  ": " + message.substr(0, message.find('\n')).substr(0, 120) + " (" + conditions(finding) + ")";
  } else {
    issue.title =
        where + ": " + (kind == "missing_gradient" ? "missing " : "wrong ") + role + " (" + conditions(finding) + ")";
  }

  std::ostringstream md;
  md << "# " << issue.title << "\n\n";
  const Json& env = report.contains("environment") ? report.at("environment") : Json::object();
  const Json& versions = env.contains("backend_versions") ? env.at("backend_versions") : Json::object();
  md << "- TransformerEngine " << text_of(versions, "transformer_engine", "n/a") << ", PyTorch "
     << text_of(versions, "torch", text_of(env, "torch_version", "n/a")) << ", " << text_of(env, "device_name", "")
     << "\n";
  const Json& tool = report.contains("tool") ? report.at("tool") : Json::object();
  md << "- Found by " << text_of(tool, "name", "gradfuzz") << " " << text_of(tool, "version") << " ("
     << text_of(tool, "git_sha") << ") on the " << text_of(finding, "backend", text_of(env, "backend"))
     << " backend; case file `" << text_of(finding, "case_file") << "`";
  if (finding.contains("count")) md << ", " << finding.at("count").dump() << " failing case(s) in the campaign";
  md << "\n\n## What is wrong\n\n";
  if (detail && error) {
    md << "The " << text_of(*detail, "path_pair").substr(0, text_of(*detail, "path_pair").find('~'))
       << " path raises during " << text_of(*detail, "phase") << " where the float64 reference computes:\n\n```\n"
       << text_of(*detail, "message", text_of(finding, "error")) << "\n```\n";
    if (!text_of(*detail, "origin").empty()) md << "\nRaised in `" << text_of(*detail, "origin") << "`.\n";
  } else if (detail) {
    const std::string path = text_of(*detail, "path_pair").substr(0, text_of(*detail, "path_pair").find('~'));
    md << "`" << text_of(*detail, "tensor") << "` of the " << path << " path";
    if (!index_text(detail->value("index", Json::array())).empty()) {
      md << ": at " << index_text(detail->at("index")) << " it is " << number(*detail, "got")
         << " where the float64 reference gives " << number(*detail, "expected");
    }
    md << " (largest error " << number(*detail, "max_abs_err") << ", relative " << number(*detail, "max_rel_err")
       << "; allowed atol " << number(*detail, "atol") << " + rtol " << number(*detail, "rtol") << " x |expected|";
    if (detail->contains("norm_bound")) {
      md << "; error norm " << number(*detail, "norm_err") << " against " << number(*detail, "norm_bound");
    }
    md << ").\n";
  }
  md << "\n## Diagnosis\n\n**" << (diagnosis.empty() ? "unconfirmed" : diagnosis)
     << "**: " << diagnosis_words(diagnosis) << ".";
  if (divergence) {
    md << " Values first diverge in the " << text_of(*divergence, "pass") << " pass at op "
       << divergence->value("op_index", -1) << " (" << text_of(*divergence, "op") << "), its "
       << text_of(*divergence, "role");
    if (!text_of(*divergence, "class").empty()) {
      md << ", computed by `" << text_of(*divergence, "class") << "." << text_of(*divergence, "method") << "`";
    }
    md << ".";
  }
  md << "\n";
  if (const auto c = finding.find("confirmation"); c != finding.end() && c->contains("variants")) {
    md << "\n## Confirmation (the same case, one thing changed)\n\n| variant | change | verdict |\n|---|---|---|\n";
    for (const auto& v : c->at("variants")) {
      md << "| " << text_of(v, "variant") << " | " << text_of(v, "change") << " | " << text_of(v, "verdict") << " |\n";
    }
  }
  if (!source.empty()) md << "\n## Suspected location\n\n" << source << "\n";
  md << "\n## Test\n\n`" << test_file << "` fails on the affected version for this reason and passes once it is "
     << "fixed:\n\n```python\n"
     << test_text << (test_text.empty() || test_text.back() == '\n' ? "" : "\n") << "```\n";
  issue.readme = md.str();
  return issue;
}

}  // namespace gradfuzz::reports
