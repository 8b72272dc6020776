#include "campaign/known_issues.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "campaign/clusters.h"
#include "campaign/exit_codes.h"

namespace gradfuzz::campaign {
namespace {

using harness::Finding;
using harness::VerdictKind;
using ::testing::HasSubstr;

Finding locked_error() {
  Finding f;
  f.kind = VerdictKind::kUnexpectedError;
  f.role = "error";
  f.op = "BasicOperation";
  f.phase = "binding";
  f.error_kind = "locked";
  f.message = "Cannot change extra tensor channels of op 2: an OperationFuser has already captured its routing";
  f.signature = "unexpected_error|BasicOperation|binding|locked|...";
  return f;
}

Finding in_place_write() {
  Finding f;
  f.kind = VerdictKind::kModifiedInput;
  f.role = "cotangent";
  f.op = "MakeExtraOutput";
  f.option = "in_place=1";
  f.signature = "modified_input|MakeExtraOutput|in_place=1|cotangent";
  return f;
}

KnownIssues parse(const std::string& text) { return known_issues_from_json(nlohmann::json::parse(text), "k.json"); }

const char* kFile = R"({
  "schema_version": 1,
  "description": "test",
  "entries": [
    {"id": "review-3", "status": "open-defect", "link": "https://example/3",
     "match": {"kind": "unexpected_error", "error_kind": "locked", "message": "already captured",
               "backend": "te", "versions": ">=2.20,<2.21"},
     "steer": {"feature": "call_then_bind", "weight": 0.05}},
    {"id": "in-place", "status": "documented-behaviour", "note": "TE documents in_place as advanced",
     "match": {"kind": "modified_input", "options": ["in_place=1"]}}
  ]
})";

TEST(KnownIssues, AnEntryMatchesWhenEveryGivenFieldHolds) {
  const KnownIssues known = parse(kFile);
  ASSERT_EQ(known.entries.size(), 2u);
  const KnownIssue* e = known.match(locked_error(), "te", "2.20.2");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->id, "review-3");
  // Another backend, another version, another message: not this issue.
  EXPECT_EQ(known.match(locked_error(), "torch", "2.20.2"), nullptr);
  EXPECT_EQ(known.match(locked_error(), "te", "2.21.0"), nullptr);
  Finding other = locked_error();
  other.message = "Cannot change channels after construction";
  EXPECT_EQ(known.match(other, "te", "2.20.2"), nullptr);
  // The in-place entry: any backend, the flag must be among the finding's options.
  EXPECT_EQ(known.match(in_place_write(), "model", "0.1.0")->id, "in-place");
  Finding plain = in_place_write();
  plain.option = "";
  EXPECT_EQ(known.match(plain, "te", "2.20.2"), nullptr);
}

TEST(KnownIssues, MarkSetsTheIdOfEveryMatchingFindingOnly) {
  const KnownIssues known = parse(kFile);
  harness::CaseResult r;
  r.backend = "te";
  Finding wrong_value;
  wrong_value.kind = VerdictKind::kMismatch;
  wrong_value.signature = "mismatch|ForwardLinearBiasAdd|output";
  r.findings = {locked_error(), wrong_value, in_place_write()};
  known.mark(r, "2.20.2");
  EXPECT_EQ(r.findings[0].known, "review-3");
  EXPECT_EQ(r.findings[1].known, "");
  EXPECT_EQ(r.findings[2].known, "in-place");
  EXPECT_TRUE(r.has_new_findings());  // the wrong value behind the known ones is new
}

TEST(KnownIssues, SteeringWeightsComeFromTheEntriesOfTheBackend) {
  const KnownIssues known = parse(kFile);
  EXPECT_EQ(known.feature_weights("te"), (std::map<std::string, double>{{"call_then_bind", 0.05}}));
  EXPECT_TRUE(known.feature_weights("torch").empty());
}

TEST(KnownIssues, RoundTripsThroughJson) {
  const KnownIssues known = parse(kFile);
  const KnownIssues back = known_issues_from_json(known_issues_to_json(known), "back");
  ASSERT_EQ(back.entries.size(), 2u);
  EXPECT_EQ(back.entries[0].id, "review-3");
  EXPECT_EQ(back.entries[0].versions, std::optional<std::string>(">=2.20,<2.21"));
  EXPECT_EQ(back.entries[0].steer_feature, std::optional<std::string>("call_then_bind"));
  EXPECT_DOUBLE_EQ(back.entries[0].steer_weight, 0.05);
  EXPECT_EQ(back.entries[1].options, (std::vector<std::string>{"in_place=1"}));
  EXPECT_EQ(back.match(locked_error(), "te", "2.20.2")->id, "review-3");
}

TEST(KnownIssues, MalformedFilesNameTheJsonPathOfTheProblem) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      known_issues_from_json(nlohmann::json::parse(text), "k.json");
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(error_of(R"({"schema_version": 2, "entries": []})"), HasSubstr("k.json: /schema_version"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "fixed", "match": {"op": "x"}}]})"),
              HasSubstr("/entries/0/status: expected open-defect or documented-behaviour"));
  EXPECT_THAT(
      error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect", "match": {"kind": "bad"}}]})"),
      HasSubstr("/entries/0/match/kind"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect",
                         "match": {"message": "("}}]})"),
              HasSubstr("/entries/0/match/message: not a valid pattern"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect",
                         "match": {"versions": "~2"}}]})"),
              HasSubstr("/entries/0/match/versions"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect", "match": {"op": "x"},
                         "steer": {"feature": "recipes", "weight": 0.5}}]})"),
              HasSubstr("/entries/0/steer/feature: unknown feature 'recipes'"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect", "match": {"op": "x"},
                         "steer": {"feature": "in_place", "weight": 2}}]})"),
              HasSubstr("/entries/0/steer/weight"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect", "match": {"op": "x"}},
                         {"id": "a", "status": "open-defect", "match": {"op": "y"}}]})"),
              HasSubstr("/entries/1/id: empty or duplicate id 'a'"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [{"id": "a", "status": "open-defect", "match": {}}]})"),
              HasSubstr("/entries/0/match: expected an object with at least one field"));
  EXPECT_THAT(error_of(R"({"schema_version": 1, "entries": [], "extra": 1})"), HasSubstr("/extra: unknown field"));
}

TEST(VersionRange, ComparesDottedVersionsNumerically) {
  EXPECT_TRUE(version_in_range("2.20.2", ">=2.20,<2.21"));
  EXPECT_TRUE(version_in_range("2.20.2+cu130", "==2.20.2"));
  EXPECT_FALSE(version_in_range("2.9.0", ">=2.20"));
  EXPECT_TRUE(version_in_range("2.100", ">2.99"));
  EXPECT_THROW(version_in_range("2.20", "2.20"), std::invalid_argument);
}

TEST(ClusterTable, KeysSeparateFindingsTheFaultIsNotResponsibleFor) {
  ClusterTable table;
  const std::string sig = "mismatch|BackwardAddRMSNorm|grad_input";
  EXPECT_EQ(ClusterTable::key(sig, true), sig);
  EXPECT_EQ(ClusterTable::key(sig, false), sig + "|persists-without-fault");
  ClusterTable::Cluster& c = table.add({ClusterTable::key(sig, true), sig, VerdictKind::kMismatch, true, ""});
  ++c.cases;
  EXPECT_EQ(table.find(sig)->cases, 1);
  EXPECT_EQ(table.find(ClusterTable::key(sig, false)), nullptr);
  EXPECT_THROW(table.add({sig, sig, VerdictKind::kMismatch, true, ""}), std::logic_error);
}

TEST(KnownIssues, TheShippedTeFileCoversTheThreeKnownCausesAndNothingElse) {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  const KnownIssues known = load_known_issues(std::string(root ? root : ".") + "/known/te-2.20.2.json");
  // The findings as the te adapter reports those causes (te/classify.py kinds, phases).
  Finding generator;
  generator.kind = VerdictKind::kUnexpectedError;
  generator.error_kind = "generator-misuse";
  generator.message = "TypeError: object of type 'generator' has no len()";
  Finding locked = locked_error();
  Finding left_locked;
  left_locked.kind = VerdictKind::kUnexpectedError;
  left_locked.role = "left_locked";
  Finding in_place = in_place_write();
  for (const Finding& f : {generator, locked, left_locked, in_place}) {
    EXPECT_NE(known.match(f, "te", "2.20.2"), nullptr) << f.signature << " " << f.role;
    EXPECT_EQ(known.match(f, "te", "2.21.0") != nullptr, f.kind == VerdictKind::kModifiedInput)
        << "only the documented in-place behaviour is version-independent";
  }
  // A wrong value in a fused kernel, a dropped gradient, a modified tensor without in_place:
  // new, whatever the op set they appear in.
  Finding value;
  value.kind = VerdictKind::kMismatch;
  value.op = "ForwardLinearBiasAdd";
  value.role = "output";
  Finding dropped;
  dropped.kind = VerdictKind::kMissingGradient;
  dropped.role = "grad_channel";
  Finding written = in_place_write();
  written.option = "";
  for (const Finding& f : {value, dropped, written}) EXPECT_EQ(known.match(f, "te", "2.20.2"), nullptr) << f.role;
  // Steering: the two features whose every case fails for a known reason.
  EXPECT_EQ(known.feature_weights("te"),
            (std::map<std::string, double>{{"call_then_bind", 0.05}, {"generator_outputs", 0.05}}));
}

}  // namespace
}  // namespace gradfuzz::campaign
