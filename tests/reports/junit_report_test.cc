// JUnit XML for CI dashboards: one failing testcase per cluster, a passing summary testcase
// without findings, one testcase per fault for selftest; well-formed whatever the strings.
#include "reports/junit_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "reports/report_document.h"
#include "reports/report_merge.h"
#include "tests/reports/report_test_util.h"

namespace gradfuzz::reports {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::ordered_json;
using test_util::data_report;

std::string junit_of(const Json& report) {
  std::ostringstream out;
  write_junit(report, out);
  return out.str();
}

/// Exit status of parsing `xml` with Python's XML parser (0: well-formed).
int xml_parse_status(const std::string& xml, std::string& output) {
  const std::string dir = test_util::make_temp_dir();
  const std::string path = dir + "/report.xml";
  std::ofstream(path, std::ios::binary) << xml;
  const int status = test_util::run_command(
      "python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' '" + path + "' 2>&1", output);
  test_util::remove_dir(dir);
  return status;
}

TEST(JunitReport, MergedShardsMatchGolden) {
  const Json merged =
      merge_reports({{"shard-1.json", data_report("shard-1.json")}, {"shard-2.json", data_report("shard-2.json")}});
  test_util::expect_golden("merged_report.junit.xml", junit_of(merged));
}

TEST(JunitReport, OneFailingTestcasePerClusterWithSignatureCountCaseFileAndReproduceLine) {
  const std::string xml = junit_of(data_report("shard-1.json"));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"gradfuzz.fuzz\" tests=\"2\" failures=\"2\""));
  EXPECT_THAT(
      xml, HasSubstr("<testcase classname=\"gradfuzz.fuzz.mismatch\" name=\"mismatch|Dispatch,Linear|grad_channel\""));
  EXPECT_THAT(xml, HasSubstr("count: 2 failing case(s)"));
  EXPECT_THAT(xml, HasSubstr("case file: corpus/findings/aaaa000000000001.json"));
  EXPECT_THAT(xml, HasSubstr("reproduce: gradfuzz replay corpus/findings/aaaa000000000001.json"));
  EXPECT_THAT(xml, HasSubstr("<property name=\"shard\" value=\"1/2\"/>"));
  std::string output;
  EXPECT_EQ(xml_parse_status(xml, output), 0) << output;
}

TEST(JunitReport, APassingSummaryTestcaseWhenThereIsNoFinding) {
  Json report = data_report("shard-1.json");
  report["findings"] = Json::array();
  const std::string xml = junit_of(report);
  EXPECT_THAT(xml, HasSubstr("tests=\"1\" failures=\"0\""));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"gradfuzz.fuzz\" name=\"no finding in 6 cases\""));
  EXPECT_THAT(xml, Not(HasSubstr("<failure")));
}

TEST(JunitReport, SelftestHasOneTestcasePerFaultFailingWhenNotDetected) {
  const std::string xml = junit_of(load_report(test_util::golden_path("selftest_report.json")));
  EXPECT_THAT(xml, HasSubstr("tests=\"2\" failures=\"1\""));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"gradfuzz.selftest\" name=\"slot-order\" time=\"0\"/>"));
  EXPECT_THAT(xml, HasSubstr("message=\"transient-lock: not detected within the case budget\""));
  EXPECT_THAT(xml, HasSubstr("<system-out>mismatch|ForwardLinearBiasAdd|grad_channel (1): gradfuzz replay"));
}

TEST(JunitReport, EscapesMarkupControlCharactersAndBrokenUtf8) {
  Json report = data_report("shard-1.json");
  report["findings"][0]["signature"] = "mismatch|<Linear>&\"'|grad";
  report["findings"][0]["error"] = std::string("raised \x01 at \xff\xfe ]]> end");
  report["findings"][0].erase("count");
  const std::string xml = junit_of(report);
  EXPECT_THAT(xml, HasSubstr("signature: mismatch|&lt;Linear&gt;&amp;&quot;&#39;|grad"));
  EXPECT_THAT(xml, HasSubstr("error: raised \xEF\xBF\xBD at \xEF\xBF\xBD\xEF\xBF\xBD ]]&gt; end"));
  EXPECT_THAT(xml, HasSubstr("count: 1 failing case(s)"));  // a finding without count is one case
  std::string output;
  EXPECT_EQ(xml_parse_status(xml, output), 0) << output;
}

}  // namespace
}  // namespace gradfuzz::reports
