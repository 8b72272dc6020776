#include "reports/html_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "reports/markup.h"
#include "reports/report_document.h"

namespace gradfuzz::reports {

namespace {

using Json = nlohmann::ordered_json;
using detail::escape_markup;
using detail::format_number;

/// Decades a histogram spans at most; ratios beyond fall into its edge bins.
constexpr int kMaxDecades = 24;

std::string text_of(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "none";
  if (j.is_boolean()) return j.get<bool>() ? "yes" : "no";
  if (j.is_number_float()) return format_number(j.get<double>());
  return j.dump();
}

std::string cell(const Json& j) { return escape_markup(text_of(j)); }

/// An id fragment from any name: letters, digits, '-' and '_' kept, the rest '_'.
std::string id_fragment(const std::string& name) {
  std::string out;
  for (unsigned char c : name) out += std::isalnum(c) || c == '-' || c == '_' ? static_cast<char>(c) : '_';
  return out;
}

const char kStyle[] = R"css(
:root { --fail: #b3261e; --ok: #1e7b34; --muted: #5f6368; --line: #dadce0; --bar: #3b6fb6; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 16px 24px 48px; color: #202124; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 16px 0 6px; }
nav a { margin-right: 12px; }
.meta { color: var(--muted); margin: 0 0 8px; }
.status { display: inline-block; padding: 2px 10px; border-radius: 10px; color: #fff; font-weight: 600; }
.status.ok { background: var(--ok); } .status.fail { background: var(--fail); } .status.incomplete { background: #b06000; }
table { border-collapse: collapse; margin: 4px 0 12px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.zero td { color: var(--fail); }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th::after { content: " \2195"; color: var(--muted); font-size: 11px; }
.tables { display: flex; flex-wrap: wrap; gap: 24px; }
.cluster { border: 1px solid var(--line); border-left: 4px solid var(--fail); border-radius: 4px; padding: 8px 12px;
           margin: 10px 0; }
.cluster h3 { margin: 0 0 6px; font-family: ui-monospace, monospace; font-size: 13px; word-break: break-all; }
.cluster dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 0 0 6px; }
.cluster dt { color: var(--muted); } .cluster dd { margin: 0; word-break: break-all; }
pre.reproduce { background: #f1f3f4; padding: 6px 8px; margin: 4px 0; white-space: pre-wrap; word-break: break-all; }
pre.error { background: #fce8e6; padding: 6px 8px; white-space: pre-wrap; }
button.copy { font-size: 12px; }
#cluster-filter { width: 360px; padding: 4px 6px; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
svg.hist { border: 1px solid var(--line); background: #fff; }
svg.hist text { font: 10px sans-serif; fill: #202124; }
svg.hist .title { font-size: 11px; font-weight: 600; }
svg.hist rect.bar { fill: var(--bar); } svg.hist rect.nonfinite { fill: var(--fail); }
svg.hist line { stroke: #9aa0a6; }
.none { color: var(--muted); font-style: italic; }
)css";

/// Filters clusters by text, sorts tables by a clicked header, copies reproduce lines; marks
/// the page ready. The page reads fully without it.
const char kScript[] = R"js(
(function () {
  'use strict';
  var clusters = Array.prototype.slice.call(document.querySelectorAll('.cluster'));
  var filter = document.getElementById('cluster-filter');
  var status = document.getElementById('cluster-filter-status');
  function applyFilter() {
    var query = filter ? filter.value.trim().toLowerCase() : '';
    var shown = 0;
    clusters.forEach(function (c) {
      var hit = query === '' || c.getAttribute('data-search').indexOf(query) >= 0;
      c.hidden = !hit;
      if (hit) shown += 1;
    });
    if (status) status.textContent = 'showing ' + shown + ' of ' + clusters.length + ' clusters';
  }
  if (filter) filter.addEventListener('input', applyFilter);
  applyFilter();
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'), function (table) {
    Array.prototype.forEach.call(table.querySelectorAll('th'), function (th, column) {
      th.addEventListener('click', function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var descending = th.getAttribute('data-order') !== 'desc';
        th.setAttribute('data-order', descending ? 'desc' : 'asc');
        rows.sort(function (a, b) {
          var x = a.cells[column].textContent, y = b.cells[column].textContent;
          var nx = parseFloat(x), ny = parseFloat(y);
          var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return descending ? -order : order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll('button.copy'), function (button) {
    button.addEventListener('click', function () {
      var text = button.getAttribute('data-copy');
      if (navigator.clipboard) {
        navigator.clipboard.writeText(text).then(function () { button.textContent = 'copied'; });
      }
    });
  });
  document.body.setAttribute('data-ready', '1');
})();
)js";

/// A name -> count table; rows with a zero count are marked (not covered).
void counts_table(std::ostream& out, const std::string& id, const std::string& caption, const Json& counts) {
  out << "<div><h3>" << escape_markup(caption) << "</h3>";
  if (counts.empty()) {
    out << "<p class=\"none\">none</p></div>\n";
    return;
  }
  out << "<table class=\"sortable\" id=\"" << id
      << "\"><thead><tr><th>name</th><th class=\"num\">count</th></tr></thead><tbody>";
  for (const auto& [name, value] : counts.items()) {
    out << "<tr" << (value.get<int64_t>() == 0 ? " class=\"zero\"" : "") << "><td>" << escape_markup(name)
        << "</td><td class=\"num\">" << value.get<int64_t>() << "</td></tr>";
  }
  out << "</tbody></table></div>\n";
}

void header(std::ostream& out, const Json& report) {
  const Json& tool = report["tool"];
  const Json& env = report["environment"];
  const Json& campaign = report["campaign"];
  const Json& summary = report["summary"];
  const std::string command = campaign["command"].get<std::string>();
  const bool merged = report.contains("merge");
  out << "<header><h1>gradfuzz " << escape_markup(command) << (merged ? " (merged shards)" : "") << " report</h1>\n";
  out << "<p class=\"meta\">" << cell(tool["name"]) << ' ' << cell(tool["version"]) << " (" << cell(tool["git_sha"])
      << ") &middot; torch " << cell(env["torch_version"]) << " &middot; backend " << cell(env["backend"])
      << " &middot; device " << cell(env["device"]) << " (" << cell(env["device_name"]) << ") &middot; seed "
      << cell(campaign["seed"]);
  if (campaign["shard"].is_string()) out << " &middot; shard " << cell(campaign["shard"]);
  if (campaign["fault"].is_string()) out << " &middot; fault " << cell(campaign["fault"]);
  out << " &middot; started " << cell(report["date"]) << "</p>\n";
  const bool complete = summary["complete"].get<bool>();
  const int64_t clusters = static_cast<int64_t>(report["findings"].size());
  std::string status_class = clusters > 0 ? "fail" : "ok";
  std::string status = clusters > 0 ? std::to_string(clusters) + " finding cluster(s)" : "no finding";
  if (report.contains("selftest")) {
    // Selftest expects findings (the faults'): its verdict is whether each fault was caught.
    int64_t ok = 0;
    for (const auto& e : report["selftest"]) ok += e["ok"].get<bool>() ? 1 : 0;
    const auto faults = static_cast<int64_t>(report["selftest"].size());
    status_class = ok == faults ? "ok" : "fail";
    status = "selftest: " + std::to_string(ok) + " of " + std::to_string(faults) + " faults caught";
  }
  if (!complete) {
    status_class = "incomplete";
    status += ", stopped before its budget";
  }
  out << "<p><span id=\"status\" class=\"status " << status_class << "\">" << escape_markup(status) << "</span></p>\n";
  out << "<nav><a href=\"#summary\">summary</a><a href=\"#clusters\">clusters</a><a href=\"#errors\">error "
         "distribution</a><a href=\"#coverage\">coverage</a>";
  if (report.contains("selftest")) out << "<a href=\"#selftest\">selftest</a>";
  if (merged) out << "<a href=\"#merge\">merged inputs</a>";
  out << "</nav></header>\n";
}

void summary_section(std::ostream& out, const Json& report) {
  const Json& s = report["summary"];
  const Json& c = report["campaign"];
  out << "<section id=\"summary\"><h2>Summary</h2><table><tbody>\n";
  const std::pair<const char*, const char*> rows[] = {{"cases_run", "cases run"},
                                                      {"passed", "passed"},
                                                      {"failed", "failed"},
                                                      {"unsupported", "unsupported"},
                                                      {"findings", "finding clusters"},
                                                      {"wall_s", "wall time (s)"},
                                                      {"cases_per_s", "cases per second"},
                                                      {"complete", "complete"}};
  for (const auto& [key, label] : rows) {
    out << "<tr><th>" << label << "</th><td class=\"num\" id=\"summary-" << key << "\">" << cell(s[key])
        << "</td></tr>\n";
  }
  out << "</tbody></table>\n<table><tbody>\n";
  for (const char* key : {"command", "cases_requested", "time_budget_s", "dtypes", "devices", "workers", "shapes"}) {
    if (!c.contains(key)) continue;
    std::string value = text_of(c[key]);
    if (c[key].is_array()) {
      value.clear();
      for (const auto& v : c[key]) value += (value.empty() ? "" : ", ") + text_of(v);
    }
    out << "<tr><th>" << key << "</th><td>" << escape_markup(value) << "</td></tr>\n";
  }
  out << "</tbody></table></section>\n";
}

void details_table(std::ostream& out, const Json& details) {
  if (details.empty()) return;
  out << "<table class=\"details\"><thead><tr><th>paths</th><th>tensor</th><th>kind</th><th class=\"num\">max abs "
         "err</th><th class=\"num\">max rel err</th><th class=\"num\">atol</th><th "
         "class=\"num\">rtol</th><th>index</th><th "
         "class=\"num\">expected</th><th class=\"num\">got</th></tr></thead><tbody>\n";
  for (const auto& d : details) {
    out << "<tr><td>" << cell(d["path_pair"]) << "</td><td>" << cell(d["tensor"]) << "</td><td>" << cell(d["kind"])
        << "</td>";
    for (const char* key : {"max_abs_err", "max_rel_err", "atol", "rtol"}) {
      out << "<td class=\"num\">" << (d[key].is_number() ? format_number(d[key].get<double>()) : "NaN/inf") << "</td>";
    }
    out << "<td>" << escape_markup(d["index"].dump()) << "</td>";
    for (const char* key : {"expected", "got"}) {
      out << "<td class=\"num\">" << (d[key].is_number() ? format_number(d[key].get<double>()) : "NaN/inf") << "</td>";
    }
    out << "</tr>\n";
  }
  out << "</tbody></table>\n";
}

void clusters_section(std::ostream& out, const Json& report) {
  const Json& findings = report["findings"];
  out << "<section id=\"clusters\"><h2>Finding clusters (" << findings.size() << ")</h2>\n";
  if (findings.empty()) {
    out << "<p class=\"none\" id=\"no-clusters\">No finding.</p>\n";
  } else {
    out << "<p><input id=\"cluster-filter\" type=\"search\" placeholder=\"filter by signature, kind, op, tensor, "
           "file\" "
           "aria-label=\"filter clusters\"> <span id=\"cluster-filter-status\"></span></p>\n";
  }
  int index = 0;
  for (const auto& f : findings) {
    ++index;
    const std::string key = cluster_key(f);
    std::string search = key + ' ' + f["kind"].get<std::string>() + ' ' + f["case_file"].get<std::string>();
    for (const auto& op : f["ops"]) search += ' ' + op.get<std::string>();
    for (const auto& d : f["details"]) search += ' ' + d["tensor"].get<std::string>();
    std::transform(search.begin(), search.end(), search.begin(), [](unsigned char c) { return std::tolower(c); });
    out << "<div class=\"cluster\" id=\"cluster-" << index << "\" data-search=\"" << escape_markup(search) << "\">\n";
    out << "<h3>" << escape_markup(key) << "</h3>\n<dl>";
    out << "<dt>kind</dt><dd>" << cell(f["kind"]) << "</dd>";
    out << "<dt>failing cases</dt><dd class=\"count\">" << cluster_count(f) << "</dd>";
    std::string ops;
    for (const auto& op : f["ops"]) ops += (ops.empty() ? "" : ", ") + op.get<std::string>();
    out << "<dt>ops</dt><dd>" << escape_markup(ops) << "</dd>";
    if (f.contains("dtype")) out << "<dt>dtype</dt><dd>" << cell(f["dtype"]) << "</dd>";
    out << "<dt>backend</dt><dd>" << cell(f["backend"]) << "</dd>";
    if (f["fault"].is_string()) out << "<dt>fault</dt><dd>" << cell(f["fault"]) << "</dd>";
    out << "<dt>case file</dt><dd><code>" << cell(f["case_file"]) << "</code></dd>";
    if (f.contains("examples") && !f["examples"].empty()) {
      out << "<dt>examples</dt><dd>";
      for (const auto& e : f["examples"]) out << "<code>" << cell(e) << "</code><br>";
      out << "</dd>";
    }
    if (f.contains("seed")) out << "<dt>value seed</dt><dd>" << cell(f["seed"]) << "</dd>";
    out << "</dl>\n";
    out << "<pre class=\"reproduce\">" << cell(f["reproduce"])
        << "</pre><button class=\"copy\" type=\"button\" data-copy=\"" << cell(f["reproduce"])
        << "\">copy reproduce line</button>\n";
    if (f.contains("error")) out << "<pre class=\"error\">" << cell(f["error"]) << "</pre>\n";
    details_table(out, f["details"]);
    out << "</div>\n";
  }
  out << "</section>\n";
}

/// Histogram bin of a log10 ratio: decades [k, k+1) for lo <= k <= hi, edge bins catch the rest.
int bin_of(double value, int lo, int hi) {
  const double k = std::floor(value);
  if (k <= lo) return 0;
  if (k >= hi) return hi - lo;
  return static_cast<int>(k) - lo;
}

/// One group's histogram over the shared decades [lo, hi] plus a NaN/inf bin when `nonfinite`.
void svg_histogram(std::ostream& out, const std::string& id, const std::string& title,
                   const std::vector<double>& values, int lo, int hi, bool nonfinite) {
  const int finite_bins = hi - lo + 1;
  const int bins = finite_bins + (nonfinite ? 1 : 0);
  std::vector<int64_t> counts(static_cast<size_t>(bins), 0);
  for (double v : values) {
    ++counts[static_cast<size_t>(std::isfinite(v) ? bin_of(v, lo, hi) : finite_bins)];
  }
  const int64_t top = std::max<int64_t>(1, *std::max_element(counts.begin(), counts.end()));
  constexpr int kBarWidth = 30, kLeft = 30, kTop = 22, kPlotHeight = 90, kBottom = 34;
  const int width = kLeft + bins * kBarWidth + 10;
  const int height = kTop + kPlotHeight + kBottom;
  out << "<svg class=\"hist\" id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width
      << "\" height=\"" << height << "\" viewBox=\"0 0 " << width << ' ' << height << "\" role=\"img\" aria-label=\""
      << escape_markup(title) << "\">\n";
  out << "<text class=\"title\" x=\"" << kLeft << "\" y=\"14\">" << escape_markup(title) << " (" << values.size()
      << ")</text>\n";
  out << "<line x1=\"" << kLeft << "\" y1=\"" << kTop + kPlotHeight << "\" x2=\"" << width - 10 << "\" y2=\""
      << kTop + kPlotHeight << "\"/>\n";
  out << "<text x=\"2\" y=\"" << kTop + 8 << "\">" << top << "</text><text x=\"2\" y=\"" << kTop + kPlotHeight
      << "\">0</text>\n";
  for (int b = 0; b < bins; ++b) {
    const bool is_nonfinite = nonfinite && b == finite_bins;
    std::string label;
    std::string range;
    if (is_nonfinite) {
      label = "NaN";
      range = "NaN or infinite error";
    } else {
      const int k = lo + b;
      label = "1e" + std::to_string(k);
      // Edge bins also hold the ratios beyond the plotted decades.
      if (b == 0 && b == finite_bins - 1) {
        range = "any finite ratio";
      } else if (b == 0) {
        range = "below 1e" + std::to_string(k + 1) + " x atol";
      } else if (b == finite_bins - 1) {
        range = "1e" + std::to_string(k) + " x atol or more";
      } else {
        range = "1e" + std::to_string(k) + " to 1e" + std::to_string(k + 1) + " x atol";
      }
    }
    const int64_t n = counts[static_cast<size_t>(b)];
    const int bar = static_cast<int>(std::lround(static_cast<double>(n) * kPlotHeight / static_cast<double>(top)));
    const int x = kLeft + b * kBarWidth;
    out << "<rect class=\"" << (is_nonfinite ? "nonfinite" : "bar") << "\" x=\"" << x + 2 << "\" y=\""
        << kTop + kPlotHeight - bar << "\" width=\"" << kBarWidth - 4 << "\" height=\"" << bar << "\" data-count=\""
        << n << "\"><title>" << escape_markup(range) << ": " << n << " tensor(s)</title></rect>\n";
    out << "<text x=\"" << x + 2 << "\" y=\"" << kTop + kPlotHeight + 13 << "\">" << escape_markup(label)
        << "</text>\n";
  }
  out << "<text x=\"" << kLeft << "\" y=\"" << height - 4 << "\">max_abs_err / atol</text>\n</svg>\n";
}

void histograms(std::ostream& out, const std::string& kind, const std::map<std::string, std::vector<double>>& groups,
                int lo, int hi, bool nonfinite) {
  out << "<h3>By " << kind << "</h3><div class=\"plots\" id=\"plots-" << kind << "\">\n";
  for (const auto& [name, values] : groups) {
    svg_histogram(out, "hist-" + kind + "-" + id_fragment(name), name, values, lo, hi, nonfinite);
  }
  out << "</div>\n";
}

void errors_section(std::ostream& out, const Json& report) {
  const ErrorDistribution dist = error_distribution(report);
  out << "<section id=\"errors\"><h2>Error distribution</h2>\n";
  out << "<p class=\"meta\">Histograms of log10(max_abs_err / atol) of every mismatching tensor of the clusters' "
         "representative cases (one value per compared tensor, not weighted by the cluster's count), bins of one "
         "decade. A finding counts under each of its op types.";
  if (dist.left_out > 0)
    out << ' ' << dist.left_out << " detail(s) that are not mismatches or have no tolerance are left out.";
  out << "</p>\n";
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  bool nonfinite = false;
  for (const auto& [name, values] : dist.by_dtype) {
    for (double v : values) {
      if (std::isfinite(v)) {
        min = std::min(min, v);
        max = std::max(max, v);
      } else {
        nonfinite = true;
      }
    }
  }
  if (dist.by_dtype.empty()) {
    out << "<p class=\"none\" id=\"no-errors\">No mismatch to plot.</p></section>\n";
    return;
  }
  // Shared decades for every plot, so the plots compare at a glance.
  int lo = std::isfinite(min) ? static_cast<int>(std::floor(min)) : 0;
  int hi = std::isfinite(max) ? static_cast<int>(std::floor(max)) : 0;
  lo = std::max(lo, -kMaxDecades / 2);
  hi = std::min(std::max(hi, lo), lo + kMaxDecades - 1);
  histograms(out, "op", dist.by_op, lo, hi, nonfinite);
  histograms(out, "dtype", dist.by_dtype, lo, hi, nonfinite);
  out << "</section>\n";
}

void coverage_section(std::ostream& out, const Json& report) {
  const Json& c = report["coverage"];
  out << "<section id=\"coverage\"><h2>Coverage</h2>\n<p class=\"meta\">Cases that exercised each name; zero counts "
         "in red.</p><div class=\"tables\">\n";
  counts_table(out, "coverage-ops", "Ops", c["ops"]);
  counts_table(out, "coverage-fusions", "Fusions", c["fusions"]);
  counts_table(out, "coverage-features", "Features", c["features"]);
  counts_table(out, "coverage-fused-forward", "Fused ops, forward pass", c["fused_ops"]["forward"]);
  counts_table(out, "coverage-fused-backward", "Fused ops, backward pass", c["fused_ops"]["backward"]);
  if (c.contains("kernels")) {
    out << "<div><h3>CUDA kernels</h3><table class=\"sortable\" id=\"coverage-kernels\"><thead><tr><th>kernel</th><th "
           "class=\"num\">launches</th><th class=\"num\">multi-block launches</th></tr></thead><tbody>";
    for (const auto& [name, k] : c["kernels"].items()) {
      out << "<tr><td>" << escape_markup(name) << "</td><td class=\"num\">" << cell(k["launches"])
          << "</td><td class=\"num\">" << cell(k["multi_block_launches"]) << "</td></tr>";
    }
    out << "</tbody></table></div>\n";
  }
  out << "</div></section>\n";
}

void selftest_section(std::ostream& out, const Json& report) {
  if (!report.contains("selftest")) return;
  out << "<section id=\"selftest\"><h2>Selftest</h2><table class=\"sortable\"><thead><tr><th>fault</th><th>ok</th>"
         "<th>detected</th><th class=\"num\">cases to detect</th><th class=\"num\">seconds</th><th "
         "class=\"num\">shrunk "
         "ops</th><th>case file</th></tr></thead><tbody>\n";
  for (const auto& e : report["selftest"]) {
    out << "<tr" << (e["ok"].get<bool>() ? "" : " class=\"zero\"") << "><td>" << cell(e["name"]) << "</td><td>"
        << cell(e["ok"]) << "</td><td>" << cell(e["detected"]) << "</td>";
    for (const char* key : {"cases_to_detect", "seconds_to_detect", "shrunk_ops"}) {
      out << "<td class=\"num\">" << cell(e.value(key, Json())) << "</td>";
    }
    out << "<td><code>" << cell(e.value("case_file", Json())) << "</code></td></tr>\n";
  }
  out << "</tbody></table></section>\n";
}

void merge_section(std::ostream& out, const Json& report) {
  if (!report.contains("merge") || !report["merge"].is_object()) return;
  const Json& merge = report["merge"];
  out << "<section id=\"merge\"><h2>Merged inputs</h2>\n";
  if (merge.contains("missing_shards") && merge["missing_shards"].is_array() && !merge["missing_shards"].empty()) {
    std::string missing;
    for (const auto& m : merge["missing_shards"]) missing += (missing.empty() ? "" : ", ") + text_of(m);
    out << "<p class=\"status incomplete\" id=\"missing-shards\">missing shards: " << escape_markup(missing)
        << "</p>\n";
  }
  out << "<table><thead><tr><th>shard</th><th>file</th><th>complete</th></tr></thead><tbody>\n";
  if (merge.contains("inputs") && merge["inputs"].is_array()) {
    for (const auto& in : merge["inputs"]) {
      if (!in.is_object()) continue;
      out << "<tr><td>" << cell(in.value("shard", Json())) << "</td><td><code>" << cell(in.value("file", Json()))
          << "</code></td><td>" << cell(in.value("complete", Json())) << "</td></tr>\n";
    }
  }
  out << "</tbody></table></section>\n";
}

}  // namespace

ErrorDistribution error_distribution(const Json& report) {
  ErrorDistribution dist;
  for (const auto& f : report["findings"]) {
    const std::set<std::string> ops = f["ops"].get<std::set<std::string>>();
    const std::string dtype = f.contains("dtype") ? f["dtype"].get<std::string>() : "unknown";
    for (const auto& d : f["details"]) {
      const Json& abs = d["max_abs_err"];
      const Json& atol = d["atol"];
      const bool mismatch = d["kind"].get<std::string>() == "mismatch";
      const bool has_tolerance = atol.is_number() && atol.get<double>() > 0;
      if (!mismatch || !has_tolerance || (abs.is_number() && !(abs.get<double>() > 0))) {
        ++dist.left_out;
        continue;
      }
      // A null error is a NaN or infinite one.
      const double value = abs.is_number() ? std::log10(abs.get<double>() / atol.get<double>())
                                           : std::numeric_limits<double>::infinity();
      for (const auto& op : ops) dist.by_op[op].push_back(value);
      dist.by_dtype[dtype].push_back(value);
    }
  }
  return dist;
}

void write_html(const Json& report, std::ostream& out) {
  const std::string command = report["campaign"]["command"].get<std::string>();
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>gradfuzz "
      << escape_markup(command) << " report, seed " << cell(report["campaign"]["seed"]) << ", "
      << report["findings"].size() << " cluster(s)</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  header(out, report);
  summary_section(out, report);
  clusters_section(out, report);
  errors_section(out, report);
  coverage_section(out, report);
  selftest_section(out, report);
  merge_section(out, report);
  out << "<footer class=\"meta\">Written by gradfuzz from the report document (schema "
      << cell(report["schema_version"]) << ").</footer>\n<script>" << kScript << "</script>\n</body>\n</html>\n";
}

}  // namespace gradfuzz::reports
