#include "oracle/signature.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "oracle/divergence.h"

namespace gradfuzz::oracle {

namespace {

using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::Finding;
using harness::PathRun;
using harness::PlanGroup;
using harness::VerdictKind;

/// The path a finding's path pair names first ("fused" of "fused~unfused").
std::string path_of(const Finding& f) { return f.path_pair.substr(0, f.path_pair.find('~')); }

const PathRun* find_run(const std::vector<const PathRun*>& runs, const std::string& name) {
  for (const PathRun* r : runs) {
    if (!r) continue;
    if (r->name == name) return r;
    for (const auto& repeat : r->repeats) {
      if (repeat.name == name) return &repeat;
    }
  }
  return nullptr;
}

std::vector<PlanGroup> groups_of(const PathRun* run, bool forward) {
  std::vector<PlanGroup> out;
  if (!run) return out;
  for (const auto& fuser : run->plans) {
    const auto& pass = forward ? fuser.forward : fuser.backward;
    out.insert(out.end(), pass.begin(), pass.end());
  }
  return out;
}

/// The fused op covering `pos` in `run`'s plan, else the nearest fused op on the side the
/// error comes from (upstream in forward, downstream in backward), else the basic op there.
std::string attribute(const CaseSpec& spec, const PathRun* run, const TensorPosition& pos, bool basic_only) {
  const std::string basic =
      pos.op >= 0 && pos.op < static_cast<int64_t>(spec.ops.size()) ? spec.ops[pos.op].name : std::string();
  if (basic_only) return basic;
  const auto groups = groups_of(run, pos.forward);
  for (const auto& g : groups) {
    if (g.begin <= pos.op && pos.op < g.end) {
      if (g.fused) return g.name;
      break;
    }
  }
  const PlanGroup* nearest = nullptr;
  for (const auto& g : groups) {
    if (!g.fused) continue;
    if (pos.forward && g.end <= pos.op && (!nearest || g.end > nearest->end)) nearest = &g;
    if (!pos.forward && g.begin > pos.op && (!nearest || g.begin < nearest->begin)) nearest = &g;
  }
  return nearest ? nearest->name : basic;
}

bool is_value_finding(const Finding& f) {
  return (f.kind == VerdictKind::kMismatch || f.kind == VerdictKind::kMissingGradient) && f.role != "plan" &&
         f.path_pair.find("finite_difference") == std::string::npos;
}

/// "in_place=1 scale_bias=1": the op's attrs set to a non-zero value whose catalog default is
/// 0 (the flags that change what an op does beyond its shape).
std::string flags_of(const harness::OpSpec& op) {
  std::string out;
  ops::OpAttrs defaults;
  try {
    defaults = ops::OpRegistry::catalog().info(op.name).defaults;
  } catch (const std::exception&) {
    return out;
  }
  for (const auto& [name, value] : op.attrs) {
    auto d = defaults.find(name);
    const double def = d == defaults.end() ? 0.0 : d->second;
    if (def == 0 && value == 1) out += (out.empty() ? "" : " ") + name + "=1";
  }
  return out;
}

/// The spec op that owns caller tensor `tensor` ("input", "extra_input[k]", "cotangent[k]").
int64_t owner_of(const std::string& tensor, const CaseSpec& spec, const CasePlan& plan) {
  if (int64_t k = index_in(tensor, "extra_input["); k >= 0) {
    return k < static_cast<int64_t>(plan.public_inputs.size()) ? plan.public_inputs[k].op : -1;
  }
  if (int64_t k = index_in(tensor, "cotangent["); k >= 0) {
    if (k == 0) return last_op(spec);
    return k - 1 < static_cast<int64_t>(plan.public_outputs.size()) ? plan.public_outputs[k - 1].op : -1;
  }
  return tensor == "input" ? 0 : -1;
}

void sign_modified(Finding& f, const CaseSpec& spec, const CasePlan& plan, const PathRun* run) {
  const int64_t owner = owner_of(f.tensor, spec, plan);
  std::vector<int64_t> candidates;
  auto writer = run ? run->modified_by.find(f.tensor) : decltype(run->modified_by.end()){};
  if (run && writer != run->modified_by.end()) {
    for (int64_t i = writer->second.group.begin; i < writer->second.group.end; ++i) candidates.push_back(i);
  }
  int64_t chosen = -1;
  if (!candidates.empty()) {
    // In a fused writer, the covered op whose own tensor it is, else the one with a flag set.
    if (std::find(candidates.begin(), candidates.end(), owner) != candidates.end()) chosen = owner;
    for (int64_t i : candidates) {
      if (chosen < 0 && i < static_cast<int64_t>(spec.ops.size()) && !flags_of(spec.ops[i]).empty()) chosen = i;
    }
    if (chosen < 0) chosen = candidates.front();
  } else {
    chosen = owner;
  }
  if (chosen >= 0 && chosen < static_cast<int64_t>(spec.ops.size())) {
    f.op = spec.ops[chosen].name;
    f.option = flags_of(spec.ops[chosen]);
  }
  f.signature = std::string("modified_input|") + f.op + "|" + f.option + "|" + f.role;
}

/// A catalog op or fusion named at the start of a runtime message ("GroupedLinear slot 0: ...").
std::string op_named_in(const std::string& message) {
  static const std::regex leading(R"(^(?:reference: )?([A-Z][A-Za-z0-9]*)\b)");
  std::smatch m;
  if (!std::regex_search(message, m, leading)) return "";
  const std::string name = m[1];
  for (const auto& known : {ops::OpRegistry::catalog().names(), ops::FusionRegistry::catalog().names()}) {
    if (std::find(known.begin(), known.end(), name) != known.end()) return name;
  }
  return "";
}

}  // namespace

std::string process_signature(const Finding& f, const std::vector<std::string>& op_types) {
  if (f.kind == VerdictKind::kSanitizer) return "sanitizer|" + f.op;
  std::set<std::string> types(op_types.begin(), op_types.end());
  std::string text;
  for (const auto& t : types) text += (text.empty() ? "" : ",") + t;
  return std::string(harness::verdict_name(f.kind)) + "|" + text;
}

std::string origin_class(const std::string& origin) {
  // Drop nested function parts ("<locals>"), keep the defining class of the method.
  std::string s = origin;
  if (auto locals = s.find(".<locals>"); locals != std::string::npos) s = s.substr(0, locals);
  const auto dot = s.rfind('.');
  return dot == std::string::npos ? std::string() : s.substr(0, dot);
}

std::string normalize_message(const std::string& message) {
  static const std::regex quoted(R"('[^']*'|"[^"]*"|`[^`]*`)");
  static const std::regex hex(R"(0x[0-9a-fA-F]+)");
  static const std::regex number(R"([-+]?\b[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?\b)");
  static const std::regex list(R"(\[[#,\s]*\]|\([#,\s]*\))");
  static const std::regex path(R"((/[^\s:]+)+)");
  static const std::regex space(R"(\s+)");
  std::string s = std::regex_replace(message, quoted, "'*'");
  s = std::regex_replace(s, path, "<path>");
  s = std::regex_replace(s, hex, "#");
  s = std::regex_replace(s, number, "#");
  s = std::regex_replace(s, list, "[#]");
  s = std::regex_replace(s, space, " ");
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  if (s.size() > 160) s = s.substr(0, 160);
  return s;
}

void assign_signatures(const CaseSpec& spec, const CasePlan& plan, const std::vector<const PathRun*>& runs,
                       CaseResult& result, const std::vector<size_t>& set_apart) {
  // Per path: the first divergence of its value findings (forward before backward; the
  // earliest forward op, the latest backward op).
  struct First {
    TensorPosition pos;
    std::string role;
    std::string tensor;
    /// From a traced run's divergence (harness::Divergence), which also gives the kind of
    /// every value finding's signature (a dropped gradient and the wrong values it causes
    /// downstream are one cause).
    bool traced = false;
    std::string kind;
  };
  std::map<std::string, First> first;
  for (size_t k = 0; k < result.findings.size(); ++k) {
    const Finding& f = result.findings[k];
    if (!is_value_finding(f)) continue;
    if (std::find(set_apart.begin(), set_apart.end(), k) != set_apart.end()) continue;
    const auto pos = tensor_position(f.tensor, spec, plan);
    if (!pos) continue;
    auto [it, inserted] = first.emplace(path_of(f), First{*pos, f.role, f.tensor, false, ""});
    if (inserted) continue;
    First& d = it->second;
    const bool earlier = pos->forward != d.pos.forward ? pos->forward
                         : pos->forward                ? pos->op < d.pos.op
                                                       : pos->op > d.pos.op;
    if (earlier) d = {*pos, f.role, f.tensor, false, ""};
  }
  // A traced run's divergence of a path (oracle/divergence.h) is where its values first leave
  // the reference, among the tensors between every plan group too: it replaces the earliest
  // compared tensor, so a defect's downstream symptoms are one cluster. Not for a path whose
  // findings another cause partly accounts for (set_apart): there the trace may show the
  // other cause's write.
  std::set<std::string> paths_set_apart;
  for (size_t k : set_apart) {
    if (k < result.findings.size()) paths_set_apart.insert(path_of(result.findings[k]));
  }
  for (const harness::Divergence& d : result.divergences) {
    if (paths_set_apart.count(d.path) || !first.count(d.path)) continue;
    first[d.path] = First{TensorPosition{d.pass == "forward", d.op_index}, d.role, d.tensor, true, d.kind};
  }
  // Such a path's recorded divergence is the compared tensor that signs its other findings, not
  // the trace's (which may be the other cause's write): what a report and an upstream test
  // take as the cluster's first divergence is the tensor its signature names.
  for (const std::string& path : paths_set_apart) {
    auto& ds = result.divergences;
    ds.erase(std::remove_if(ds.begin(), ds.end(), [&](const harness::Divergence& d) { return d.path == path; }),
             ds.end());
    const auto it = first.find(path);
    if (it == first.end()) continue;
    harness::Divergence d;
    d.path = path;
    d.pass = it->second.pos.forward ? "forward" : "backward";
    d.op_index = it->second.pos.op;
    if (d.op_index >= 0 && d.op_index < static_cast<int64_t>(spec.ops.size())) d.op = spec.ops[d.op_index].name;
    d.group = d.op;
    d.role = it->second.role;
    d.tensor = it->second.tensor;
    ds.push_back(std::move(d));
  }
  // Tensors the unfused path gets wrong too: not a fusion's defect.
  std::set<std::string> unfused_wrong;
  for (const auto& f : result.findings) {
    if (is_value_finding(f) && path_of(f) == "unfused") unfused_wrong.insert(f.tensor);
  }
  // A traced divergence inside a fused group is the fusion's only where the unfused path does
  // not diverge first inside the same ops in the same pass.
  auto unfused_diverges_in = [&](const std::string& path, const First& d) {
    const auto unfused = first.find("unfused");
    if (unfused == first.end() || unfused->second.pos.forward != d.pos.forward) return false;
    for (const PathRun* run : runs) {
      if (!run || run->name != path) continue;
      for (const auto& fuser : run->plans) {
        for (const auto& g : d.pos.forward ? fuser.forward : fuser.backward) {
          if (g.begin <= d.pos.op && d.pos.op < g.end) {
            return g.begin <= unfused->second.pos.op && unfused->second.pos.op < g.end;
          }
        }
      }
    }
    return unfused->second.pos.op == d.pos.op;
  };
  for (auto& f : result.findings) {
    const std::string kind = harness::verdict_name(f.kind);
    if (f.kind == VerdictKind::kCrash || f.kind == VerdictKind::kTimeout || f.kind == VerdictKind::kSanitizer) {
      f.signature = process_signature(f, result.op_types);
      continue;
    }
    if (f.kind == VerdictKind::kModifiedInput) {
      sign_modified(f, spec, plan, find_run(runs, path_of(f)));
      continue;
    }
    if (f.kind == VerdictKind::kUnexpectedError) {
      if (f.role == "left_locked" || f.role == "no_error") {
        f.signature = kind + "|" + f.role + "|" + f.phase + (f.role == "no_error" ? "|" + f.error_kind : "");
        continue;
      }
      if (f.op.empty()) f.op = origin_class(f.origin);
      if (f.op.empty()) f.op = op_named_in(f.message);
      f.signature = kind + "|" + f.op + "|" + f.phase + "|" + f.error_kind + "|" + normalize_message(f.message);
      continue;
    }
    if (f.role == "fp8_state" || f.role == "eval_graph") {
      // Checks of their own (delayed scaling's rule, an eval pass's graph): signed by the op
      // they name and what broke (fp8_state: the quantizer's role and the rule's part).
      f.signature = kind + "|" + f.op + "|" + f.role + (f.option.empty() ? "" : "|" + f.option);
      continue;
    }
    if (f.role == "plan") {
      if (f.op.empty()) {
        // The fused ops of the plan the call ran, in order.
        f.op = "plan";
        if (const PathRun* run = find_run(runs, path_of(f))) {
          for (const auto& fuser : run->plans) {
            for (const auto* pass : {&fuser.forward, &fuser.backward}) {
              for (const auto& g : *pass) {
                if (g.fused) {
                  f.op = g.name;
                  break;
                }
              }
              if (f.op != "plan") break;
            }
            if (f.op != "plan") break;
          }
        }
      }
      f.signature = kind + "|" + f.op + "|plan";
      continue;
    }
    if (f.path_pair.find("finite_difference") != std::string::npos) {
      f.op = "reference";
      f.signature = kind + "|reference|" + f.role;
      continue;
    }
    // A repeat call's finding, or a comparison of two paths, where a path of it diverged from
    // the reference in a traced run: that divergence's cause (the first call's, else the
    // path that is wrong against the reference).
    std::string path = path_of(f);
    if (!first.count(path) || !first.at(path).traced) {
      const std::string base = path.substr(0, path.find('.'));
      std::string other = f.path_pair.substr(f.path_pair.find('~') + 1);
      other = other.substr(0, other.find('.'));
      for (const std::string& p : {base, other}) {
        const auto traced = first.find(p);
        if (p != "reference" && traced != first.end() && traced->second.traced) {
          path = p;
          break;
        }
      }
    }
    auto it = first.find(path);
    if (it == first.end()) {
      f.signature = kind + "|" + f.op + "|" + f.role;
      continue;
    }
    const First& d = it->second;
    const bool basic_only =
        path == "unfused" || unfused_wrong.count(d.tensor) > 0 || (d.traced && unfused_diverges_in(path, d));
    f.op = attribute(spec, find_run(runs, path), d.pos, basic_only);
    f.signature = (d.traced ? d.kind : kind) + "|" + f.op + "|" + d.role;
  }
}

}  // namespace gradfuzz::oracle
