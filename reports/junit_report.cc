#include "reports/junit_report.h"

#include <sstream>
#include <string>

#include "reports/markup.h"
#include "reports/report_document.h"

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;
using detail::escape_markup;

std::string text_of(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "null";
  if (j.is_number_float()) return detail::format_number(j.get<double>(), 6);
  return j.dump();
}

/// A number or null (NaN and infinities are written as null) for a detail line.
std::string number_of(const Json& j) { return j.is_number() ? detail::format_number(j.get<double>(), 6) : "n/a"; }

void property(std::ostream& out, const std::string& name, const Json& value) {
  out << "      <property name=\"" << escape_markup(name) << "\" value=\"" << escape_markup(text_of(value)) << "\"/>\n";
}

/// The plain-text body of a cluster's failure.
std::string failure_body(const Json& f) {
  std::ostringstream body;
  body << "signature: " << f["signature"].get<std::string>() << '\n';
  body << "kind: " << f["kind"].get<std::string>() << '\n';
  body << "count: " << cluster_count(f) << " failing case(s)\n";
  body << "case file: " << f["case_file"].get<std::string>() << '\n';
  if (f.contains("examples") && !f["examples"].empty()) {
    body << "examples:";
    for (const auto& e : f["examples"]) body << ' ' << e.get<std::string>();
    body << '\n';
  }
  body << "ops:";
  for (const auto& op : f["ops"]) body << ' ' << op.get<std::string>();
  body << '\n';
  if (f.contains("dtype")) body << "dtype: " << f["dtype"].get<std::string>() << '\n';
  if (f["fault"].is_string()) body << "fault: " << f["fault"].get<std::string>() << '\n';
  for (const auto& d : f["details"]) {
    body << "detail: " << d["path_pair"].get<std::string>() << ' ' << d["tensor"].get<std::string>() << " ("
         << d["kind"].get<std::string>() << ") at " << d["index"].dump() << ": max_abs_err "
         << number_of(d["max_abs_err"]) << ", max_rel_err " << number_of(d["max_rel_err"]) << " (atol "
         << number_of(d["atol"]) << ", rtol " << number_of(d["rtol"]) << "), expected " << number_of(d["expected"])
         << ", got " << number_of(d["got"]) << '\n';
  }
  if (f.contains("error")) body << "error: " << f["error"].get<std::string>() << '\n';
  body << "reproduce: " << f["reproduce"].get<std::string>() << '\n';
  return body.str();
}

/// Why a selftest entry failed, or "" when it passed.
std::string selftest_failure(const Json& e) {
  if (e["ok"].get<bool>()) return "";
  if (!e["detected"].get<bool>()) return "not detected within the case budget";
  return "detected, but replaying its case exited " + text_of(e.value("replay_with_fault_exit", Json())) +
         " with the fault (expected 1) and " + text_of(e.value("replay_without_fault_exit", Json())) +
         " without it (expected 0)";
}

}  // namespace

void write_junit(const Json& report, std::ostream& out) {
  const std::string command = report["campaign"]["command"].get<std::string>();
  const std::string suite = "gradfuzz." + command;
  const Json& summary = report["summary"];
  const Json& findings = report["findings"];
  const bool selftest = report.contains("selftest");
  const std::string time = detail::format_number(summary["wall_s"].get<double>(), 6);
  size_t tests = 0;
  size_t failures = 0;
  std::ostringstream cases;
  if (selftest) {
    for (const auto& e : report["selftest"]) {
      ++tests;
      const std::string why = selftest_failure(e);
      cases << "    <testcase classname=\"" << escape_markup(suite) << "\" name=\""
            << escape_markup(e["name"].get<std::string>()) << "\" time=\"0\"";
      if (why.empty()) {
        cases << "/>\n";
        continue;
      }
      ++failures;
      cases << ">\n      <failure type=\"selftest\" message=\""
            << escape_markup(e["name"].get<std::string>() + ": " + why) << "\">" << escape_markup(e.dump(2))
            << "</failure>\n    </testcase>\n";
    }
  } else {
    for (const auto& f : findings) {
      ++tests;
      ++failures;
      const std::string key = cluster_key(f);
      const std::string kind = f["kind"].get<std::string>();
      const std::string message =
          key + ": " + std::to_string(cluster_count(f)) + " failing case(s); " + f["reproduce"].get<std::string>();
      cases << "    <testcase classname=\"" << escape_markup(suite + "." + kind) << "\" name=\"" << escape_markup(key)
            << "\" time=\"0\">\n      <failure type=\"" << escape_markup(kind) << "\" message=\""
            << escape_markup(message) << "\">" << escape_markup(failure_body(f)) << "</failure>\n    </testcase>\n";
    }
  }
  if (tests == 0) {
    ++tests;
    const std::string name = "no finding in " + text_of(summary["cases_run"]) + " cases" +
                             (summary["complete"].get<bool>() ? "" : " (stopped before its budget)");
    cases << "    <testcase classname=\"" << escape_markup(suite) << "\" name=\"" << escape_markup(name) << "\" time=\""
          << time << "\"/>\n";
  }
  std::string timestamp = report["date"].get<std::string>();
  // JUnit's schema takes a local date-time without zone designator.
  if (!timestamp.empty() && timestamp.back() == 'Z') timestamp.pop_back();

  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << "<testsuites name=\"gradfuzz\" tests=\"" << tests << "\" failures=\"" << failures << "\" errors=\"0\" time=\""
      << time << "\">\n";
  out << "  <testsuite name=\"" << escape_markup(suite) << "\" tests=\"" << tests << "\" failures=\"" << failures
      << "\" errors=\"0\" skipped=\"0\" time=\"" << time << "\" timestamp=\"" << escape_markup(timestamp) << "\">\n";
  out << "    <properties>\n";
  property(out, "tool_version", report["tool"]["version"]);
  property(out, "git_sha", report["tool"]["git_sha"]);
  property(out, "torch_version", report["environment"]["torch_version"]);
  property(out, "backend", report["environment"]["backend"]);
  property(out, "device", report["environment"]["device"]);
  property(out, "device_name", report["environment"]["device_name"]);
  property(out, "seed", report["campaign"]["seed"]);
  if (report["campaign"]["shard"].is_string()) property(out, "shard", report["campaign"]["shard"]);
  if (report["campaign"]["fault"].is_string()) property(out, "fault", report["campaign"]["fault"]);
  for (const char* key : {"cases_run", "passed", "failed", "unsupported", "findings", "cases_per_s", "complete"}) {
    property(out, key, summary[key]);
  }
  out << "    </properties>\n";
  out << cases.str();
  if (selftest && !findings.empty()) {
    std::ostringstream listed;
    for (const auto& f : findings) {
      listed << cluster_key(f) << " (" << cluster_count(f) << "): " << f["reproduce"].get<std::string>() << '\n';
    }
    out << "    <system-out>" << escape_markup(listed.str()) << "</system-out>\n";
  }
  out << "  </testsuite>\n</testsuites>\n";
}

}  // namespace gradfuzz::reports
