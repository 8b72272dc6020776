#include "reports/report_document.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "harness/limits.h"
#include "reports/reporter.h"

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;

/// A value as an error message shows it: its type and, for scalars, a short rendering.
std::string describe(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string: {
      std::string s = j.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      return "string " + Json(s).dump();
    }
    case Json::value_t::boolean:
      return std::string("boolean ") + (j.get<bool>() ? "true" : "false");
    default:
      return "number " + j.dump();
  }
}

/// Walks a document and throws ReportError "<name>: <path>: expected ..., got ..." at the
/// first value of the wrong shape. Paths are JSON pointers, as in case-file errors.
class Checker {
 public:
  explicit Checker(std::string name) : name_(std::move(name)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw ReportError(name_ + ": " + (path.empty() ? "/" : path) + ": " + message);
  }
  [[noreturn]] void expected(const std::string& path, const std::string& what, const Json& got) const {
    fail(path, "expected " + what + ", got " + describe(got));
  }

  const Json& member(const Json& object, const std::string& path, const std::string& key,
                     const std::string& what) const {
    auto it = object.find(key);
    if (it == object.end()) fail(path + "/" + key, "missing (expected " + what + ")");
    return *it;
  }

  const Json& object(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "an object");
    if (!j.is_object()) expected(path + "/" + key, "an object", j);
    return j;
  }

  void string(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "a string");
    if (!j.is_string()) expected(path + "/" + key, "a string", j);
  }

  void string_or_null(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "a string or null");
    if (!j.is_string() && !j.is_null()) expected(path + "/" + key, "a string or null", j);
  }

  void optional_string(const Json& parent, const std::string& path, const std::string& key) const {
    if (parent.contains(key)) string(parent, path, key);
  }

  void boolean(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "true or false");
    if (!j.is_boolean()) expected(path + "/" + key, "true or false", j);
  }

  /// A non-negative integer that fits int64 (counts are summed in int64).
  void count_value(const Json& j, const std::string& path) const {
    const bool ok = (j.is_number_unsigned() && j.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())) ||
                    (j.is_number_integer() && !j.is_number_unsigned() && j.get<int64_t>() >= 0);
    if (!ok) expected(path, "a non-negative integer", j);
  }

  void count(const Json& parent, const std::string& path, const std::string& key) const {
    count_value(member(parent, path, key, "a non-negative integer"), path + "/" + key);
  }

  void count_or_null(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "a non-negative integer or null");
    if (!j.is_null()) count_value(j, path + "/" + key);
  }

  /// Non-negative seconds.
  void seconds(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "a number of seconds");
    if (!j.is_number() || j.get<double>() < 0) expected(path + "/" + key, "a non-negative number of seconds", j);
  }

  void seconds_or_null(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "a number of seconds or null");
    if (!j.is_null()) seconds(parent, path, key);
  }

  /// A number, or null (how NaN and infinities are written).
  void number_or_null(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "a number or null");
    if (!j.is_number() && !j.is_null()) expected(path + "/" + key, "a number or null", j);
  }

  void string_array(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = member(parent, path, key, "an array of strings");
    if (!j.is_array()) expected(path + "/" + key, "an array of strings", j);
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_string()) expected(path + "/" + key + "/" + std::to_string(i), "a string", j[i]);
    }
  }

  /// An object mapping names to non-negative integers.
  void counts(const Json& parent, const std::string& path, const std::string& key) const {
    const Json& j = object(parent, path, key);
    for (const auto& [name, value] : j.items()) count_value(value, path + "/" + key + "/" + pointer_escape(name));
  }

  static std::string pointer_escape(const std::string& key) {
    std::string out;
    for (char c : key) {
      if (c == '~') {
        out += "~0";
      } else if (c == '/') {
        out += "~1";
      } else {
        out += c;
      }
    }
    return out;
  }

  void report(const Json& doc) const {
    if (!doc.is_object()) expected("", "a report object", doc);
    const Json& version = member(doc, "", "schema_version", "the report schema version");
    if (!version.is_number_integer() || version.get<int64_t>() != kReportSchemaVersion) {
      fail("/schema_version", "expected " + std::to_string(kReportSchemaVersion) +
                                  " (the report schema this gradfuzz reads), got " + describe(version));
    }
    const Json& tool = object(doc, "", "tool");
    for (const char* key : {"name", "version", "git_sha"}) string(tool, "/tool", key);
    string(doc, "", "date");
    const Json& environment = object(doc, "", "environment");
    for (const char* key : {"torch_version", "device", "device_name", "backend"})
      string(environment, "/environment", key);
    const Json& versions = object(environment, "/environment", "backend_versions");
    for (const auto& [name, value] : versions.items()) {
      if (!value.is_string()) expected("/environment/backend_versions/" + pointer_escape(name), "a string", value);
    }
    campaign(object(doc, "", "campaign"));
    summary(object(doc, "", "summary"));
    coverage(object(doc, "", "coverage"));
    const Json& findings = member(doc, "", "findings", "an array of findings");
    if (!findings.is_array()) expected("/findings", "an array of findings", findings);
    for (size_t i = 0; i < findings.size(); ++i) finding(findings[i], "/findings/" + std::to_string(i));
    if (doc.contains("selftest")) {
      const Json& entries = doc["selftest"];
      if (!entries.is_array()) expected("/selftest", "an array of selftest entries", entries);
      for (size_t i = 0; i < entries.size(); ++i) {
        const std::string path = "/selftest/" + std::to_string(i);
        if (!entries[i].is_object()) expected(path, "an object", entries[i]);
        string(entries[i], path, "name");
        boolean(entries[i], path, "detected");
        boolean(entries[i], path, "ok");
      }
    }
  }

  void campaign(const Json& c) const {
    const std::string p = "/campaign";
    string(c, p, "command");
    count(c, p, "seed");
    count_or_null(c, p, "cases_requested");
    seconds_or_null(c, p, "time_budget_s");
    string_array(c, p, "dtypes");
    string_array(c, p, "devices");
    string_or_null(c, p, "fault");
    count(c, p, "workers");
    string_or_null(c, p, "shard");
    if (c["shard"].is_string()) shard(c["shard"].get<std::string>());
    string_or_null(c, p, "shapes");
  }

  void shard(const std::string& text) const {
    const auto slash = text.find('/');
    bool ok = slash != std::string::npos && slash > 0 && slash + 1 < text.size() && text.size() <= 15 &&
              text.find_first_not_of("0123456789/") == std::string::npos &&
              text.find('/', slash + 1) == std::string::npos;
    if (ok) {
      const long long i = std::stoll(text.substr(0, slash));
      const long long n = std::stoll(text.substr(slash + 1));
      ok = n >= 1 && i >= 1 && i <= n;
    }
    if (!ok) expected("/campaign/shard", "\"i/N\" with 1 <= i <= N", Json(text));
  }

  void summary(const Json& s) const {
    const std::string p = "/summary";
    for (const char* key : {"cases_run", "passed", "failed", "unsupported", "findings"}) count(s, p, key);
    seconds(s, p, "wall_s");
    const Json& rate = member(s, p, "cases_per_s", "a number");
    if (!rate.is_number() || rate.get<double>() < 0) expected(p + "/cases_per_s", "a non-negative number", rate);
    boolean(s, p, "complete");
  }

  void coverage(const Json& c) const {
    const std::string p = "/coverage";
    for (const char* key : {"ops", "fusions", "features"}) counts(c, p, key);
    const Json& fused = object(c, p, "fused_ops");
    counts(fused, p + "/fused_ops", "forward");
    counts(fused, p + "/fused_ops", "backward");
    if (c.contains("kernels")) {
      const Json& kernels = object(c, p, "kernels");
      for (const auto& [name, value] : kernels.items()) {
        const std::string path = p + "/kernels/" + pointer_escape(name);
        if (!value.is_object()) expected(path, "an object", value);
        count(value, path, "launches");
        count(value, path, "multi_block_launches");
      }
    }
  }

  void finding(const Json& f, const std::string& p) const {
    if (!f.is_object()) expected(p, "a finding object", f);
    for (const char* key : {"signature", "kind", "backend", "case_file", "reproduce"}) string(f, p, key);
    string_or_null(f, p, "fault");
    optional_string(f, p, "cluster");
    optional_string(f, p, "dtype");
    optional_string(f, p, "error");
    string_array(f, p, "ops");
    const Json& details = member(f, p, "details", "an array of details");
    if (!details.is_array()) expected(p + "/details", "an array of details", details);
    for (size_t i = 0; i < details.size(); ++i) {
      const std::string dp = p + "/details/" + std::to_string(i);
      const Json& d = details[i];
      if (!d.is_object()) expected(dp, "a detail object", d);
      for (const char* key : {"path_pair", "tensor", "kind"}) string(d, dp, key);
      for (const char* key : {"max_abs_err", "max_rel_err", "atol", "rtol", "expected", "got"})
        number_or_null(d, dp, key);
      const Json& index = member(d, dp, "index", "an array of integers");
      if (!index.is_array()) expected(dp + "/index", "an array of integers", index);
      for (size_t k = 0; k < index.size(); ++k) {
        if (!index[k].is_number_integer()) expected(dp + "/index/" + std::to_string(k), "an integer", index[k]);
      }
    }
    if (f.contains("count")) {
      count(f, p, "count");
      if (f["count"].get<int64_t>() < 1) expected(p + "/count", "a count of at least 1", f["count"]);
    }
    if (f.contains("examples")) string_array(f, p, "examples");
    if (f.contains("recipe") && !f["recipe"].is_null()) {
      const Json& r = object(f, p, "recipe");
      const std::string rp = p + "/recipe";
      string(r, rp, "name");
      string(r, rp, "fp8_format");
      const Json& options = object(r, rp, "options");
      for (const auto& [key, value] : options.items()) {
        if (!value.is_string()) expected(rp + "/options/" + pointer_escape(key), "a string", value);
      }
    }
    if (f.contains("recipes")) counts(f, p, "recipes");
  }

 private:
  std::string name_;
};

}  // namespace

void check_report(const Json& doc, const std::string& name) { Checker(name).report(doc); }

Json parse_report(const std::string& text, const std::string& name) {
  if (harness::json_nesting_depth(text) > kMaxReportDepth) {
    throw ReportError(name + ": not a gradfuzz report: JSON nested deeper than " + std::to_string(kMaxReportDepth) +
                      " levels");
  }
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's messages give the byte position ("at line 3, column 5") or the number that
    // does not fit ("number overflow parsing '1E400'").
    throw ReportError(name + ": not valid JSON: " + e.what());
  }
  check_report(doc, name);
  return doc;
}

Json load_report(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw ReportError(path + ": cannot read the report: " + std::strerror(errno));
  }
  if (S_ISDIR(info.st_mode)) throw ReportError(path + ": cannot read the report: it is a directory");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw ReportError(path + ": cannot read the report");
  return parse_report(text.str(), path);
}

std::string cluster_key(const Json& finding) {
  auto it = finding.find("cluster");
  if (it != finding.end() && it->is_string()) return it->get<std::string>();
  return finding.at("signature").get<std::string>();
}

std::optional<std::optional<harness::RecipeSpec>> finding_recipe(const Json& finding) {
  auto it = finding.find("recipe");
  if (it == finding.end()) return std::nullopt;
  if (it->is_null()) return std::optional<harness::RecipeSpec>();
  harness::RecipeSpec recipe;
  recipe.name = it->at("name").get<std::string>();
  recipe.fp8_format = it->at("fp8_format").get<std::string>();
  for (const auto& [key, value] : it->at("options").items()) recipe.options[key] = value.get<std::string>();
  return std::optional<harness::RecipeSpec>(std::move(recipe));
}

int64_t cluster_count(const Json& finding) {
  auto it = finding.find("count");
  return it != finding.end() && it->is_number_integer() ? it->get<int64_t>() : 1;
}

}  // namespace gradfuzz::reports
