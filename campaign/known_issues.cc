#include "campaign/known_issues.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "campaign/exit_codes.h"
#include "ops/errors.h"
#include "ops/op_registry.h"
#include "ops/quantization.h"
#include "reports/reporter.h"

namespace gradfuzz::campaign {

namespace {

using nlohmann::json;

std::vector<int64_t> version_parts(const std::string& v) {
  std::vector<int64_t> out;
  std::stringstream in(v);
  std::string part;
  while (std::getline(in, part, '.')) {
    size_t digits = 0;
    while (digits < part.size() && std::isdigit(static_cast<unsigned char>(part[digits]))) ++digits;
    if (digits == 0) break;  // "2.20.2+cu130": stop at the local part
    out.push_back(std::stoll(part.substr(0, digits)));
    if (digits < part.size()) break;
  }
  return out;
}

int compare_versions(const std::string& a, const std::string& b) {
  auto pa = version_parts(a);
  auto pb = version_parts(b);
  const size_t n = std::max(pa.size(), pb.size());
  pa.resize(n, 0);
  pb.resize(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (pa[i] != pb[i]) return pa[i] < pb[i] ? -1 : 1;
  }
  return 0;
}

bool has_flag(const std::string& options, const std::string& flag) {
  std::stringstream in(options);
  std::string word;
  while (in >> word) {
    if (word == flag) return true;
  }
  return false;
}

[[noreturn]] void fail(const std::string& where, const std::string& path, const std::string& message) {
  throw InputError(where + ": " + path + ": " + message);
}

std::string string_at(const json& j, const char* key, const std::string& where, const std::string& path) {
  const json& v = j.at(key);
  if (!v.is_string()) fail(where, path + "/" + key, "expected a string, got " + std::string(v.type_name()));
  return v.get<std::string>();
}

/// The recipes ops::QuantRecipe emulates: the ones whose options and values a file's
/// conditions can be checked against (QuantRecipe::parse is the one table of them).
const std::vector<std::string>& emulated_recipes() {
  static const std::vector<std::string> names{"DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"};
  return names;
}

/// An error's message without its kind prefix ("unknown-name: ").
std::string message_of(const Error& e) {
  const std::string what = e.what();
  const std::string prefix = e.kind() + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

/// Empty when `name` is a recipe gradfuzz knows (emulated, or known and refused: MXFP8,
/// NVFP4), else why not, listing the known ones.
std::string recipe_name_problem(const std::string& name) {
  try {
    ops::QuantRecipe::parse(name, "", {});
  } catch (const ops::UnsupportedRecipeError&) {
    return "";
  } catch (const ops::UnknownNameError& e) {
    return message_of(e) + " (or \"none\": a case without a recipe)";
  }
  return "";
}

/// Empty when recipe `name` (emulated) has option `key` with `value`, else QuantRecipe's
/// message naming the recipe, the option and its known options or allowed values.
std::string recipe_option_problem(const std::string& name, const std::string& key, const std::string& value) {
  try {
    ops::QuantRecipe::parse(name, "", {{key, value}});
  } catch (const ops::InvalidArgumentError& e) {
    return message_of(e);
  }
  return "";
}

/// Parses and checks one `recipe_options` item against `recipe` (the entry's recipe name,
/// when it gives one); InputError at `path`.
RecipeOptionCondition recipe_option_condition(const std::string& text, const std::optional<std::string>& recipe,
                                              const std::string& where, const std::string& path) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    fail(where, path,
         "expected \"option=value\" or \"option=value1|value2\" (e.g. \"backward_override=high_precision\", "
         "\"fp8_format=HYBRID\"), got '" +
             text + "'");
  }
  RecipeOptionCondition c;
  c.key = text.substr(0, eq);
  c.text = text;
  std::stringstream in(text.substr(eq + 1));
  std::string value;
  while (std::getline(in, value, '|')) {
    if (value.empty()) fail(where, path, "an empty value in '" + text + "'");
    c.values.push_back(value);
  }
  if (text.back() == '|') fail(where, path, "an empty value in '" + text + "'");
  for (const auto& v : c.values) {
    if (c.key == "fp8_format") {
      if (v != "E4M3" && v != "HYBRID") fail(where, path, "fp8_format is E4M3 or HYBRID, got '" + v + "'");
      continue;
    }
    if (recipe) {
      // MXFP8BlockScaling and NVFP4BlockScaling: gradfuzz has no table of their options.
      const auto& emulated = emulated_recipes();
      if (std::find(emulated.begin(), emulated.end(), *recipe) == emulated.end()) continue;
      const std::string problem = recipe_option_problem(*recipe, c.key, v);
      if (!problem.empty()) fail(where, path, problem);
      continue;
    }
    // No recipe named: some recipe must have the option with that value.
    std::string problems;
    bool valid = false;
    for (const auto& name : emulated_recipes()) {
      const std::string problem = recipe_option_problem(name, c.key, v);
      if (problem.empty()) {
        valid = true;
        break;
      }
      problems += (problems.empty() ? "" : "; ") + problem;
    }
    if (!valid) {
      fail(where, path, "no recipe has option '" + c.key + "' with value '" + v + "' (" + problems + ")");
    }
  }
  return c;
}

bool recipe_option_holds(const RecipeOptionCondition& c, const harness::RecipeSpec& recipe) {
  const std::string* value = &recipe.fp8_format;
  if (c.key != "fp8_format") {
    auto it = recipe.options.find(c.key);
    if (it == recipe.options.end()) return false;
    value = &it->second;
  }
  return std::find(c.values.begin(), c.values.end(), *value) != c.values.end();
}

/// Parses and checks an entry's `basis` at `path`; `status` is the entry's.
KnownBasis basis_of(const json& b, const std::string& status, const std::string& where, const std::string& path) {
  if (!b.is_object()) {
    fail(where, path,
         "expected an object {\"kind\": \"documented\" | \"defect\" | \"stricter-rule\", \"evidence\": ...}, got " +
             std::string(b.type_name()));
  }
  static const std::set<std::string> keys{"kind", "evidence", "upstream_test", "upstream"};
  for (const auto& [key, value] : b.items()) {
    if (!keys.count(key))
      fail(where, path + "/" + key, "unknown field (known: kind, evidence, upstream_test, upstream)");
  }
  KnownBasis basis;
  if (!b.contains("kind")) fail(where, path + "/kind", "missing (documented, defect or stricter-rule)");
  basis.kind = string_at(b, "kind", where, path);
  const std::string expected_status = status_for_basis(basis.kind);
  if (expected_status.empty()) {
    fail(where, path + "/kind",
         "expected documented (the backend documents it), defect (the backend is wrong) or stricter-rule "
         "(gradfuzz's runtime spec asks for more than the backend promises), got '" +
             basis.kind + "'");
  }
  if (!b.contains("evidence")) fail(where, path + "/evidence", "missing");
  basis.evidence = string_at(b, "evidence", where, path);
  if (basis.evidence.empty()) {
    fail(where, path + "/evidence",
         "expected a non-empty string: the backend's doc string, test or source lines (file:line) that show what "
         "the entry is");
  }
  if (b.contains("upstream_test")) {
    basis.upstream_test = string_at(b, "upstream_test", where, path);
    if (basis.kind != "defect") {
      fail(where, path + "/upstream_test",
           "only a defect has an upstream test (the failing test in the backend's style); this entry's kind is " +
               basis.kind);
    }
    if (basis.upstream_test.empty() || basis.upstream_test.front() == '/') {
      fail(where, path + "/upstream_test",
           "expected a path relative to the repository root, got '" + basis.upstream_test + "'");
    }
  }
  if (b.contains("upstream")) {
    basis.upstream = string_at(b, "upstream", where, path);
    if (basis.upstream.empty()) fail(where, path + "/upstream", "expected the upstream issue or pull request, got ''");
  }
  if (status != expected_status) {
    fail(where, path + "/kind",
         "kind '" + basis.kind + "' goes with status " + expected_status + ", but the entry's status is " + status +
             " (documented: documented-behaviour, defect: open-defect, stricter-rule: stricter-rule)");
  }
  return basis;
}

}  // namespace

CaseFacts CaseFacts::of(const harness::CaseSpec& spec) {
  CaseFacts facts;
  facts.dtype = spec.dtype;
  facts.recipe = spec.recipe;
  for (const auto& op : spec.ops) {
    if (op.name == harness::kBoundaryOp) continue;
    if (std::find(facts.ops.begin(), facts.ops.end(), op.name) == facts.ops.end()) facts.ops.push_back(op.name);
  }
  return facts;
}

bool version_in_range(const std::string& version, const std::string& range) {
  std::stringstream in(range);
  std::string bound;
  bool any = false;
  while (std::getline(in, bound, ',')) {
    bound.erase(std::remove_if(bound.begin(), bound.end(), [](unsigned char c) { return std::isspace(c); }),
                bound.end());
    if (bound.empty()) continue;
    std::string op;
    for (const char* candidate : {">=", "<=", "==", "!=", ">", "<"}) {
      if (bound.rfind(candidate, 0) == 0) {
        op = candidate;
        break;
      }
    }
    const std::string v = bound.substr(op.size());
    if (op.empty() || version_parts(v).empty()) {
      throw std::invalid_argument("bad version bound '" + bound + "' (expected >=, <=, ==, !=, > or < and a version)");
    }
    const int c = compare_versions(version, v);
    const bool ok = op == ">="   ? c >= 0
                    : op == "<=" ? c <= 0
                    : op == "==" ? c == 0
                    : op == "!=" ? c != 0
                    : op == ">"  ? c > 0
                                 : c < 0;
    if (!ok) return false;
    any = true;
  }
  if (!any) throw std::invalid_argument("empty version range '" + range + "'");
  return true;
}

const std::vector<std::string>& steerable_features() {
  static const std::vector<std::string> features{"generator_outputs", "call_then_bind", "in_place"};
  return features;
}

const std::vector<std::string>& known_basis_kinds() {
  static const std::vector<std::string> kinds{"documented", "defect", "stricter-rule"};
  return kinds;
}

std::string status_for_basis(const std::string& kind) {
  if (kind == "documented") return "documented-behaviour";
  if (kind == "defect") return "open-defect";
  if (kind == "stricter-rule") return "stricter-rule";
  return "";
}

bool KnownIssue::case_level() const { return recipe || !recipe_options.empty() || dtype || !case_ops.empty(); }

bool KnownIssue::matches(const harness::Finding& f, const CaseFacts& facts, const std::string& found_backend,
                         const std::string& backend_version) const {
  if (kind && f.kind != *kind) return false;
  if (op && f.op != *op) return false;
  for (const auto& flag : options) {
    if (!has_flag(f.option, flag)) return false;
  }
  if (error_kind && f.error_kind != *error_kind) return false;
  if (role && f.role != *role) return false;
  if (phase && f.phase != *phase) return false;
  if (signature && f.signature != *signature) return false;
  if (!signatures.empty() && std::find(signatures.begin(), signatures.end(), f.signature) == signatures.end()) {
    return false;
  }
  if (backend && found_backend != *backend) return false;
  if (versions && !version_in_range(backend_version, *versions)) return false;
  if ((recipe || !recipe_options.empty()) && !facts.recipe_recorded) return false;
  if (recipe && (facts.recipe ? facts.recipe->name : std::string(reports::kNoRecipe)) != *recipe) return false;
  if (!recipe_options.empty()) {
    if (!facts.recipe) return false;
    for (const auto& c : recipe_options) {
      if (!recipe_option_holds(c, *facts.recipe)) return false;
    }
  }
  if (dtype && facts.dtype != *dtype) return false;
  if (!case_ops.empty()) {
    if (!facts.ops_recorded) return false;
    for (const auto& name : case_ops) {
      if (std::find(facts.ops.begin(), facts.ops.end(), name) == facts.ops.end()) return false;
    }
  }
  if (message_pattern && !std::regex_search(f.message, *message_pattern)) return false;
  return true;
}

const KnownIssue* KnownIssues::match(const harness::Finding& finding, const CaseFacts& facts,
                                     const std::string& backend, const std::string& backend_version) const {
  for (const auto& e : entries) {
    if (e.matches(finding, facts, backend, backend_version)) return &e;
  }
  return nullptr;
}

void KnownIssues::mark(harness::CaseResult& result, const harness::CaseSpec& spec,
                       const std::string& backend_version) const {
  const CaseFacts facts = CaseFacts::of(spec);
  for (auto& f : result.findings) {
    const KnownIssue* e = match(f, facts, result.backend, backend_version);
    f.known = e ? e->id : std::string();
  }
}

const KnownIssue* KnownIssues::entry(const std::string& id) const {
  for (const auto& e : entries) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

std::map<std::string, double> KnownIssues::feature_weights(const std::string& backend) const {
  std::map<std::string, double> out;
  for (const auto& e : entries) {
    if (!e.steer_feature || (e.backend && *e.backend != backend)) continue;
    auto it = out.find(*e.steer_feature);
    out[*e.steer_feature] = it == out.end() ? e.steer_weight : std::min(it->second, e.steer_weight);
  }
  return out;
}

KnownIssues known_issues_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail(where, "", "expected an object with schema_version and entries");
  static const std::set<std::string> top{"schema_version", "description", "entries"};
  for (const auto& [key, value] : j.items()) {
    if (!top.count(key)) fail(where, "/" + key, "unknown field (known: schema_version, description, entries)");
  }
  if (!j.contains("schema_version") || !j["schema_version"].is_number_integer() ||
      j["schema_version"].get<int64_t>() != kKnownIssuesSchemaVersion) {
    fail(where, "/schema_version", "expected " + std::to_string(kKnownIssuesSchemaVersion));
  }
  KnownIssues known;
  if (j.contains("description")) known.description = string_at(j, "description", where, "");
  if (!j.contains("entries") || !j["entries"].is_array()) fail(where, "/entries", "expected an array of entries");
  std::set<std::string> ids;
  static const std::set<std::string> entry_keys{"id", "status", "link", "note", "basis", "match", "steer"};
  static const std::set<std::string> match_keys{"kind",       "op",     "options",        "error_kind", "message",
                                                "role",       "phase",  "backend",        "versions",   "signature",
                                                "signatures", "recipe", "recipe_options", "dtype",      "case_ops"};
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const json& e = j["entries"][i];
    const std::string path = "/entries/" + std::to_string(i);
    if (!e.is_object()) fail(where, path, "expected an object");
    for (const auto& [key, value] : e.items()) {
      if (!entry_keys.count(key))
        fail(where, path + "/" + key, "unknown field (known: id, status, link, note, basis, match, steer)");
    }
    KnownIssue k;
    if (!e.contains("id")) fail(where, path + "/id", "missing");
    k.id = string_at(e, "id", where, path);
    if (k.id.empty() || !ids.insert(k.id).second) fail(where, path + "/id", "empty or duplicate id '" + k.id + "'");
    if (!e.contains("status")) fail(where, path + "/status", "missing");
    k.status = string_at(e, "status", where, path);
    if (k.status != "open-defect" && k.status != "documented-behaviour" && k.status != "stricter-rule") {
      fail(where, path + "/status",
           "expected open-defect, documented-behaviour or stricter-rule, got '" + k.status + "'");
    }
    if (e.contains("link")) k.link = string_at(e, "link", where, path);
    if (e.contains("note")) k.note = string_at(e, "note", where, path);
    if (e.contains("basis")) k.basis = basis_of(e["basis"], k.status, where, path + "/basis");
    if (!e.contains("match") || !e["match"].is_object() || e["match"].empty()) {
      fail(where, path + "/match", "expected an object with at least one field");
    }
    const json& m = e["match"];
    const std::string mpath = path + "/match";
    for (const auto& [key, value] : m.items()) {
      if (!match_keys.count(key)) {
        fail(where, mpath + "/" + key,
             "unknown field (known: kind, op, options, error_kind, message, role, phase, backend, versions, signature, "
             "signatures, "
             "recipe, recipe_options, dtype, case_ops)");
      }
    }
    if (m.contains("kind")) {
      try {
        k.kind = harness::verdict_from_name(string_at(m, "kind", where, mpath));
      } catch (const std::invalid_argument& ex) {
        fail(where, mpath + "/kind", ex.what());
      }
    }
    for (const auto& [key, field] : {std::pair<const char*, std::optional<std::string>*>{"op", &k.op},
                                     {"error_kind", &k.error_kind},
                                     {"role", &k.role},
                                     {"phase", &k.phase},
                                     {"backend", &k.backend},
                                     {"signature", &k.signature},
                                     {"message", &k.message},
                                     {"versions", &k.versions},
                                     {"recipe", &k.recipe},
                                     {"dtype", &k.dtype}}) {
      if (m.contains(key)) *field = string_at(m, key, where, mpath);
    }
    if (k.recipe && *k.recipe != reports::kNoRecipe) {
      const std::string problem = recipe_name_problem(*k.recipe);
      if (!problem.empty()) fail(where, mpath + "/recipe", problem);
    }
    if (m.contains("recipe_options")) {
      const std::string opath = mpath + "/recipe_options";
      const json& list = m["recipe_options"];
      if (!list.is_array() || list.empty()) {
        fail(where, opath, "expected a non-empty array of \"option=value\" strings such as \"fp8_format=HYBRID\"");
      }
      if (k.recipe && *k.recipe == reports::kNoRecipe) {
        fail(where, opath, "a case without a recipe (recipe \"none\") has no recipe options");
      }
      std::set<std::string> keys;
      for (size_t o = 0; o < list.size(); ++o) {
        const std::string item_path = opath + "/" + std::to_string(o);
        if (!list[o].is_string()) fail(where, item_path, "expected a string, got " + std::string(list[o].type_name()));
        RecipeOptionCondition c = recipe_option_condition(list[o].get<std::string>(), k.recipe, where, item_path);
        if (!keys.insert(c.key).second) fail(where, item_path, "option '" + c.key + "' given twice");
        k.recipe_options.push_back(std::move(c));
      }
    }
    if (m.contains("signatures")) {
      const std::string spath = mpath + "/signatures";
      const json& list = m["signatures"];
      if (!list.is_array() || list.empty()) {
        fail(where, spath, "expected a non-empty array of finding signatures such as \"mismatch|Linear|grad_param\"");
      }
      if (k.signature) fail(where, spath, "give either signature or signatures, not both");
      for (size_t o = 0; o < list.size(); ++o) {
        const std::string item_path = spath + "/" + std::to_string(o);
        if (!list[o].is_string() || list[o].get<std::string>().empty()) {
          fail(where, item_path, "expected a non-empty signature string");
        }
        k.signatures.push_back(list[o].get<std::string>());
      }
    }
    if (m.contains("case_ops")) {
      const std::string opath = mpath + "/case_ops";
      const json& list = m["case_ops"];
      if (!list.is_array() || list.empty())
        fail(where, opath, "expected a non-empty array of op names such as \"GroupedLinear\"");
      const auto names = ops::OpRegistry::catalog().names();
      for (size_t o = 0; o < list.size(); ++o) {
        const std::string item_path = opath + "/" + std::to_string(o);
        if (!list[o].is_string()) fail(where, item_path, "expected a string, got " + std::string(list[o].type_name()));
        const std::string name = list[o].get<std::string>();
        if (std::find(names.begin(), names.end(), name) == names.end()) {
          std::string known_names;
          for (const auto& n : names) known_names += (known_names.empty() ? "" : ", ") + n;
          fail(where, item_path, "unknown op '" + name + "'; catalog ops: " + known_names);
        }
        k.case_ops.push_back(name);
      }
    }
    if (k.dtype && !harness::is_known_dtype(*k.dtype)) {
      fail(where, mpath + "/dtype",
           "unknown dtype '" + *k.dtype + "'; known dtypes: float64, float32, bfloat16, float16");
    }
    if (m.contains("options")) {
      if (!m["options"].is_array())
        fail(where, mpath + "/options", "expected an array of flags such as \"in_place=1\"");
      for (size_t o = 0; o < m["options"].size(); ++o) {
        if (!m["options"][o].is_string()) fail(where, mpath + "/options/" + std::to_string(o), "expected a string");
        k.options.push_back(m["options"][o].get<std::string>());
      }
    }
    if (k.message) {
      try {
        k.message_pattern = std::make_shared<const std::regex>(*k.message);
      } catch (const std::regex_error& ex) {
        fail(where, mpath + "/message", std::string("not a valid pattern: ") + ex.what());
      }
    }
    if (k.versions) {
      try {
        version_in_range("0", *k.versions);
      } catch (const std::invalid_argument& ex) {
        fail(where, mpath + "/versions", ex.what());
      }
    }
    if (e.contains("steer")) {
      const json& s = e["steer"];
      const std::string spath = path + "/steer";
      if (!s.is_object() || !s.contains("feature")) fail(where, spath, "expected {\"feature\": ..., \"weight\": ...}");
      k.steer_feature = string_at(s, "feature", where, spath);
      const auto& features = steerable_features();
      if (std::find(features.begin(), features.end(), *k.steer_feature) == features.end()) {
        fail(where, spath + "/feature",
             "unknown feature '" + *k.steer_feature + "' (steerable: generator_outputs, call_then_bind, in_place)");
      }
      if (s.contains("weight")) {
        if (!s["weight"].is_number()) fail(where, spath + "/weight", "expected a number in [0, 1]");
        k.steer_weight = s["weight"].get<double>();
      }
      if (!(k.steer_weight >= 0 && k.steer_weight <= 1)) fail(where, spath + "/weight", "expected a number in [0, 1]");
    }
    known.entries.push_back(std::move(k));
  }
  return known;
}

KnownIssues load_known_issues(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path.string() + ": cannot read the known-issues file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw InputError(path.string() + ": not valid JSON: " + e.what());
  }
  KnownIssues known = known_issues_from_json(j, path.string());
  known.path = path;
  return known;
}

json known_issues_to_json(const KnownIssues& known) {
  json entries = json::array();
  for (const auto& k : known.entries) {
    json m = json::object();
    if (k.kind) m["kind"] = harness::verdict_name(*k.kind);
    for (const auto& [key, field] : {std::pair<const char*, const std::optional<std::string>*>{"op", &k.op},
                                     {"error_kind", &k.error_kind},
                                     {"role", &k.role},
                                     {"phase", &k.phase},
                                     {"message", &k.message},
                                     {"backend", &k.backend},
                                     {"versions", &k.versions},
                                     {"signature", &k.signature},
                                     {"recipe", &k.recipe},
                                     {"dtype", &k.dtype}}) {
      if (*field) m[key] = **field;
    }
    if (!k.options.empty()) m["options"] = k.options;
    if (!k.signatures.empty()) m["signatures"] = k.signatures;
    if (!k.case_ops.empty()) m["case_ops"] = k.case_ops;
    if (!k.recipe_options.empty()) {
      json conditions = json::array();
      for (const auto& c : k.recipe_options) conditions.push_back(c.text);
      m["recipe_options"] = std::move(conditions);
    }
    json e{{"id", k.id}, {"status", k.status}};
    if (!k.link.empty()) e["link"] = k.link;
    if (!k.note.empty()) e["note"] = k.note;
    if (k.basis) {
      json b{{"kind", k.basis->kind}, {"evidence", k.basis->evidence}};
      if (!k.basis->upstream_test.empty()) b["upstream_test"] = k.basis->upstream_test;
      if (!k.basis->upstream.empty()) b["upstream"] = k.basis->upstream;
      e["basis"] = std::move(b);
    }
    e["match"] = std::move(m);
    if (k.steer_feature) e["steer"] = {{"feature", *k.steer_feature}, {"weight", k.steer_weight}};
    entries.push_back(std::move(e));
  }
  json j{{"schema_version", kKnownIssuesSchemaVersion}};
  if (!known.description.empty()) j["description"] = known.description;
  j["entries"] = std::move(entries);
  return j;
}

}  // namespace gradfuzz::campaign
