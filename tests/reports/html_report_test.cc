// The HTML report: one self-contained page whose script runs in a real browser (headless
// Chromium), with the summary, clusters, coverage and error histograms of the report.
#include "reports/html_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "reports/report_document.h"
#include "reports/report_merge.h"
#include "tests/reports/report_test_util.h"

namespace gradfuzz::reports {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::ordered_json;
using test_util::data_report;

Json merged_night() {
  return merge_reports({{"shard-1.json", data_report("shard-1.json")}, {"shard-2.json", data_report("shard-2.json")}});
}

std::string html_of(const Json& report) {
  std::ostringstream out;
  write_html(report, out);
  return out.str();
}

/// The Chromium binary: $GRADFUZZ_CHROMIUM, else the first of chromium, chromium-browser,
/// google-chrome on PATH; "" when there is none.
std::string chromium() {
  if (const char* exe = std::getenv("GRADFUZZ_CHROMIUM"); exe && *exe) return exe;
  std::string path;
  test_util::run_command("command -v chromium || command -v chromium-browser || command -v google-chrome", path);
  while (!path.empty() && (path.back() == '\n' || path.back() == '\r')) path.pop_back();
  const auto newline = path.find('\n');
  return newline == std::string::npos ? path : path.substr(0, newline);
}

/// The DOM of `html` after its scripts ran in headless Chromium (`--dump-dom`).
std::string rendered_dom(const std::string& html, int& status) {
  const std::string browser = chromium();
  if (browser.empty()) {
    status = -1;
    ADD_FAILURE()
        << "no Chromium: install Debian's chromium package (scripts/ci-deps.sh does) or set GRADFUZZ_CHROMIUM";
    return "";
  }
  const std::string dir = test_util::make_temp_dir();
  std::ofstream(dir + "/report.html", std::ios::binary) << html;
  // --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; the page is ours.
  // A profile of its own keeps parallel tests and the user's profile apart.
  std::string dom;
  status = test_util::run_command("timeout 120 '" + browser +
                                      "' --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
                                      "--user-data-dir='" +
                                      dir + "/profile' --dump-dom 'file://" + dir + "/report.html' 2>/dev/null",
                                  dom);
  test_util::remove_dir(dir);
  return dom;
}

TEST(HtmlReport, RendersInHeadlessChromiumWithItsScriptRun) {
  int status = 0;
  const std::string dom = rendered_dom(html_of(merged_night()), status);
  ASSERT_EQ(status, 0) << "chromium --dump-dom failed";
  // Written by the page's script: it ran, and found every cluster.
  EXPECT_THAT(dom, HasSubstr("data-ready=\"1\""));
  EXPECT_THAT(dom, HasSubstr("<span id=\"cluster-filter-status\">showing 3 of 3 clusters</span>"));
  // The summary numbers of the merged report.
  EXPECT_THAT(dom, HasSubstr("id=\"summary-cases_run\">12</td>"));
  EXPECT_THAT(dom, HasSubstr("id=\"summary-failed\">7</td>"));
  EXPECT_THAT(dom, HasSubstr("id=\"summary-cases_per_s\">4</td>"));
  // Histograms per op and per dtype, clusters and coverage.
  EXPECT_THAT(dom, HasSubstr("id=\"hist-op-Linear\""));
  EXPECT_THAT(dom, HasSubstr("id=\"hist-dtype-float32\""));
  EXPECT_THAT(dom, HasSubstr("gradfuzz replay corpus/findings/cccc000000000001.json"));
  EXPECT_THAT(dom, HasSubstr("id=\"coverage-fused-backward\""));
  EXPECT_THAT(dom, Not(HasSubstr("id=\"missing-shards\"")));  // both shards are there
}

TEST(HtmlReport, RendersAReportWithoutFindingInChromium) {
  Json report = data_report("shard-1.json");
  report["findings"] = Json::array();
  int status = 0;
  const std::string dom = rendered_dom(html_of(report), status);
  ASSERT_EQ(status, 0);
  EXPECT_THAT(dom, HasSubstr("data-ready=\"1\""));
  EXPECT_THAT(dom, HasSubstr("id=\"no-clusters\""));
  EXPECT_THAT(dom, HasSubstr("id=\"no-errors\""));
  EXPECT_THAT(dom, HasSubstr("id=\"summary-cases_run\">6</td>"));
}

TEST(HtmlReport, IsSelfContained) {
  const std::string html = html_of(merged_night());
  // Nothing is fetched: no stylesheet link, no script or image source, no CSS import or url().
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr(" src=")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
  EXPECT_THAT(html, Not(HasSubstr("url(")));
  // The only URL is the SVG namespace name, which is never fetched.
  const std::regex url("https?://[^\"' )]*");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), url); it != std::sregex_iterator(); ++it) {
    EXPECT_EQ(it->str(), "http://www.w3.org/2000/svg");
  }
}

TEST(HtmlReport, EscapesStringsOfTheReport) {
  Json report = merged_night();
  report["findings"][0]["signature"] = "mismatch|<script>alert(1)</script>|x";
  report["findings"][0]["reproduce"] = "gradfuzz replay \"a&b\".json";
  const std::string html = html_of(report);
  EXPECT_THAT(html, Not(HasSubstr("<script>alert")));
  EXPECT_THAT(html, HasSubstr("mismatch|&lt;script&gt;alert(1)&lt;/script&gt;|x"));
  EXPECT_THAT(html, HasSubstr("data-copy=\"gradfuzz replay &quot;a&amp;b&quot;.json\""));
}

TEST(HtmlReport, ShowsMissingShardsOfAMergedReport) {
  Json shard = data_report("shard-1.json");
  shard["campaign"]["shard"] = "1/3";
  const std::string html = html_of(merge_reports({{"shard-1.json", shard}}));
  EXPECT_THAT(html, HasSubstr("id=\"missing-shards\">missing shards: 2/3, 3/3</p>"));
  EXPECT_THAT(html, HasSubstr("stopped before its budget"));
}

TEST(HtmlReport, SelftestStatusSaysWhichFaultsWereCaught) {
  const std::string html = html_of(load_report(test_util::golden_path("selftest_report.json")));
  EXPECT_THAT(html, HasSubstr("<span id=\"status\" class=\"status fail\">selftest: 1 of 2 faults caught</span>"));
  EXPECT_THAT(html, HasSubstr("<section id=\"selftest\">"));
}

TEST(ErrorDistribution, GroupsLogRatiosByOpAndDtype) {
  const ErrorDistribution dist = error_distribution(merged_night());
  // A: 0.25 / 1e-7 (float64); C: a null error (NaN) and 3e-3 / 1e-5 (float32).
  ASSERT_EQ(dist.by_dtype.at("float64").size(), 1u);
  EXPECT_NEAR(dist.by_dtype.at("float64")[0], std::log10(0.25 / 1e-7), 1e-12);
  ASSERT_EQ(dist.by_dtype.at("float32").size(), 2u);
  EXPECT_TRUE(std::isinf(dist.by_dtype.at("float32")[0]));
  EXPECT_NEAR(dist.by_dtype.at("float32")[1], std::log10(3e-3 / 1e-5), 1e-12);
  // Linear is in A and C; Dispatch only in A.
  EXPECT_EQ(dist.by_op.at("Linear").size(), 3u);
  EXPECT_EQ(dist.by_op.at("Dispatch").size(), 1u);
  // B's detail is a missing gradient: no error ratio to plot.
  EXPECT_EQ(dist.left_out, 1);
  EXPECT_EQ(dist.by_op.count("GroupedLinear"), 0u);
}

TEST(ErrorDistribution, PutsFindingsWithoutDtypeUnderUnknown) {
  Json report = merged_night();
  for (auto& f : report["findings"]) f.erase("dtype");
  const ErrorDistribution dist = error_distribution(report);
  EXPECT_THAT(dist.by_dtype, ::testing::SizeIs(1));
  EXPECT_EQ(dist.by_dtype.at("unknown").size(), 3u);
}

TEST(HtmlReport, DrawsOneBarPerDecadeWithTheCounts) {
  const std::string html = html_of(merged_night());
  // Ratios 10^6.4 (A) and 10^2.5 (C), one NaN: decades 1e2..1e6 and a NaN bin, shared by all plots.
  const auto start = html.find("id=\"hist-dtype-float32\"");
  ASSERT_NE(start, std::string::npos);
  const std::string svg = html.substr(start, html.find("</svg>", start) - start);
  std::vector<std::string> counts;
  const std::regex bar("data-count=\"([0-9]+)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), bar); it != std::sregex_iterator(); ++it) {
    counts.push_back((*it)[1]);
  }
  EXPECT_THAT(counts, ElementsAre("1", "0", "0", "0", "0", "1"));
  EXPECT_THAT(svg, HasSubstr(">1e2</text>"));
  EXPECT_THAT(svg, HasSubstr(">1e6</text>"));
  EXPECT_THAT(svg, HasSubstr(">NaN</text>"));
}

}  // namespace
}  // namespace gradfuzz::reports
