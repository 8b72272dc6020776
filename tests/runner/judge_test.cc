#include "runner/judge.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/harness/test_specs.h"

namespace gradfuzz::runner {
namespace {

using harness::CaseSpec;
using harness::Finding;
using harness::PathRun;
using harness::PathStatus;
using harness::VerdictKind;
using harness::testing::op;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

CaseSpec two_ops() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 4}}), op("ReLU")};
  return spec;
}

PathRun ran(const std::string& name) {
  PathRun run;
  run.name = name;
  run.status = PathStatus::kOk;
  return run;
}

PathRun raised(const std::string& name, const std::string& kind, const std::string& stage = "forward") {
  PathRun run;
  run.name = name;
  run.status = PathStatus::kError;
  run.error_kind = kind;
  run.error_stage = stage;
  run.error_message = kind + " in " + name;
  return run;
}

Finding value_finding(const std::string& path_pair, const std::string& tensor,
                      VerdictKind kind = VerdictKind::kMismatch) {
  Finding f;
  f.kind = kind;
  f.path_pair = path_pair;
  f.tensor = tensor;
  f.role = "output";
  return f;
}

TEST(JudgeErrors, PathsThatRanLikeTheReferencePass) {
  const PathRun fused = ran("fused");
  const PathRun unfused = ran("unfused");
  const ErrorJudgement judged = judge_errors(two_ops(), {&fused, &unfused}, ran("reference"), false);
  EXPECT_THAT(judged.findings, IsEmpty());
  EXPECT_EQ(judged.outcomes, "");
}

TEST(JudgeErrors, TheSameErrorEverywherePassesAndIsNoted) {
  const PathRun fused = raised("fused", "shape-mismatch");
  const ErrorJudgement judged = judge_errors(two_ops(), {&fused}, raised("reference", "shape-mismatch"), true);
  EXPECT_THAT(judged.findings, IsEmpty());
  EXPECT_THAT(judged.outcomes, HasSubstr("fused raised shape-mismatch"));
}

TEST(JudgeErrors, APathRaisingWhereTheReferenceRanIsAFinding) {
  PathRun fused = ran("fused");
  fused.repeats = {raised("fused.call[1]", "lock-violation")};
  const ErrorJudgement judged = judge_errors(two_ops(), {&fused}, ran("reference"), false);
  ASSERT_EQ(judged.findings.size(), 1u);
  EXPECT_EQ(judged.findings[0].path_pair, "fused.call[1]~reference");
  EXPECT_EQ(judged.findings[0].role, "error");
  EXPECT_EQ(judged.findings[0].note, "the reference ran");
}

TEST(JudgeErrors, AValidCaseRaisingInTheReferenceAndALockedOpAreFindings) {
  const PathRun fused = ran("fused");
  PathRun reference = raised("reference", "invalid-argument", "op construction");
  reference.left_locked = {1};
  const ErrorJudgement judged = judge_errors(two_ops(), {&fused}, reference, false);
  ASSERT_EQ(judged.findings.size(), 3u);
  EXPECT_EQ(judged.findings[0].note, "a valid case raised in the reference");
  EXPECT_EQ(judged.findings[1].role, "no_error");
  EXPECT_EQ(judged.findings[2].role, "left_locked");
  EXPECT_EQ(judged.findings[2].op, "ReLU");
}

TEST(JudgeErrors, AnInvalidConfigurationThatRaisesNowhereIsAFinding) {
  const PathRun fused = ran("fused");
  const ErrorJudgement judged = judge_errors(two_ops(), {&fused}, ran("reference"), true);
  ASSERT_EQ(judged.findings.size(), 1u);
  EXPECT_EQ(judged.findings[0].path_pair, "every path");
}

TEST(JudgeErrors, AnUnrecognizedRemoteErrorAgreesWithAnyKind) {
  const PathRun fused = raised("fused", "unrecognized");
  EXPECT_THAT(judge_errors(two_ops(), {&fused}, raised("reference", "shape-mismatch"), true).findings, IsEmpty());
}

TEST(NoteWideDtype, EachValueFindingSaysWhetherItPersists) {
  std::vector<Finding> findings = {value_finding("fused~reference", "output"),
                                   value_finding("unfused~reference", "grad_input"),
                                   value_finding("forward_fused~reference", "output")};
  const std::vector<Finding> wide = {value_finding("unfused~reference", "grad_input")};
  EXPECT_FALSE(note_wide_dtype(findings, wide, {"fused", "unfused"}, "float32"));
  EXPECT_EQ(findings[0].note, "passes in float32 on the same values");
  EXPECT_EQ(findings[1].note, "also wrong in float32 on the same values");
  EXPECT_EQ(findings[2].note, "");  // did not run in float32
  EXPECT_TRUE(note_wide_dtype(findings, {}, {"fused"}, "float32"));
}

TEST(InPlaceAblation, AsksAboutFindingsNotSpecificToAFusion) {
  CaseSpec spec = two_ops();
  spec.ops.push_back(op("AddExtraInput", {{"in_place", 1}}));
  spec.ops.push_back(op("Bias", {{"in_place", 1}}));
  const std::vector<Finding> findings = {value_finding("fused~reference", "output"),
                                         value_finding("fused~reference", "grad_input"),
                                         value_finding("unfused~reference", "grad_input"),
                                         value_finding("fused~unfused", "output", VerdictKind::kUnexpectedError)};
  harness::PathRun unfused;
  unfused.name = "unfused";
  const auto ablation = in_place_ablation(spec, findings, &unfused);
  ASSERT_TRUE(ablation.has_value());
  EXPECT_EQ(ablation->writers, "AddExtraInput,Bias");
  EXPECT_EQ(ablation->ablated.ops[2].attrs.at("in_place"), 0);
  EXPECT_EQ(ablation->ablated.ops[3].attrs.at("in_place"), 0);
  // fused's output is the fusion's own (unfused got it right); grad_input is wrong in both.
  EXPECT_THAT(ablation->candidates, ElementsAre(1u, 2u));
  const std::vector<Finding> without = {value_finding("unfused~reference", "grad_input")};
  EXPECT_THAT(gone_without(*ablation, findings, without), IsEmpty());
  EXPECT_THAT(gone_without(*ablation, findings, {}), ElementsAre(1u, 2u));
  // Without an unfused run nothing is specific to a fusion.
  EXPECT_THAT(in_place_ablation(spec, findings, nullptr)->candidates, ElementsAre(0u, 1u, 2u));
  EXPECT_FALSE(in_place_ablation(two_ops(), findings, &unfused).has_value());
  // A repeat call's finding: specific to a fusion only where the unfused path's same call
  // ran (TE, H100 2026-12-07: the unfused recompute call raised, and a held output the fused
  // path's in-place op wrote under recompute went unattributed).
  const std::vector<Finding> second = {value_finding("fused.call[2]~caller", "held_output[1]")};
  unfused.repeats.resize(2);
  EXPECT_FALSE(in_place_ablation(spec, second, &unfused).has_value());
  unfused.repeats[1].status = harness::PathStatus::kError;
  ASSERT_TRUE(in_place_ablation(spec, second, &unfused).has_value());
  EXPECT_THAT(in_place_ablation(spec, second, &unfused)->candidates, ElementsAre(0u));
  EXPECT_THAT(in_place_ablation(spec, {value_finding("fused.call[3]~reference", "output")}, &unfused)->candidates,
              ElementsAre(0u));
}

}  // namespace
}  // namespace gradfuzz::runner
