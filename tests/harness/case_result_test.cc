#include "harness/case_result.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gradfuzz::harness {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

Finding finding(VerdictKind kind, std::string signature, std::string tensor = "grad_input") {
  Finding f;
  f.kind = kind;
  f.signature = std::move(signature);
  f.tensor = tensor;
  f.role = tensor;
  f.path_pair = "fused~reference";
  return f;
}

TEST(Verdict, NamesRoundTrip) {
  for (VerdictKind kind : {VerdictKind::kPass, VerdictKind::kMismatch, VerdictKind::kMissingGradient,
                           VerdictKind::kUnexpectedError, VerdictKind::kCrash, VerdictKind::kTimeout,
                           VerdictKind::kModifiedInput, VerdictKind::kUnsupported, VerdictKind::kSanitizer}) {
    EXPECT_EQ(verdict_from_name(verdict_name(kind)), kind);
  }
  EXPECT_STREQ(verdict_name(VerdictKind::kMissingGradient), "missing_gradient");
}

TEST(Verdict, UnknownNameListsKnownOnes) {
  try {
    verdict_from_name("mismatched");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'mismatched'"));
    EXPECT_THAT(e.what(), HasSubstr("unexpected_error"));
  }
}

TEST(CaseResult, SummarizeTakesTheMostTellingKind) {
  CaseResult r;
  r.summarize();
  EXPECT_EQ(r.verdict, VerdictKind::kPass);
  r.findings = {finding(VerdictKind::kMismatch, "m"), finding(VerdictKind::kModifiedInput, "w"),
                finding(VerdictKind::kMissingGradient, "g")};
  r.summarize();
  EXPECT_EQ(r.verdict, VerdictKind::kMissingGradient);
  r.findings.push_back(finding(VerdictKind::kCrash, "c"));
  r.summarize();
  EXPECT_EQ(r.verdict, VerdictKind::kCrash);
  r.findings = {finding(VerdictKind::kMismatch, "m"), finding(VerdictKind::kModifiedInput, "w")};
  r.summarize();
  EXPECT_EQ(r.verdict, VerdictKind::kModifiedInput);
}

TEST(CaseResult, UnsupportedWithoutFindingsStaysUnsupported) {
  CaseResult r;
  r.verdict = VerdictKind::kUnsupported;
  r.summarize();
  EXPECT_EQ(r.verdict, VerdictKind::kUnsupported);
  EXPECT_FALSE(r.failed());
}

TEST(CaseResult, SignaturesAreDistinctInOrderOfFirstAppearance) {
  CaseResult r;
  r.findings = {finding(VerdictKind::kMismatch, "b", "output"), finding(VerdictKind::kMismatch, "a"),
                finding(VerdictKind::kMismatch, "b", "grad_input")};
  EXPECT_THAT(r.signatures(), ElementsAre("b", "a"));
  ASSERT_NE(r.finding("b"), nullptr);
  EXPECT_EQ(r.finding("b")->tensor, "output");
  EXPECT_EQ(r.finding("c"), nullptr);
}

TEST(CaseResult, NewFindingsAreThoseWithoutAKnownIssue) {
  CaseResult r;
  r.findings = {finding(VerdictKind::kMismatch, "a"), finding(VerdictKind::kUnexpectedError, "b")};
  EXPECT_TRUE(r.has_new_findings());
  r.findings[0].known = "issue-1";
  EXPECT_TRUE(r.has_new_findings());
  r.findings[1].known = "issue-2";
  EXPECT_FALSE(r.has_new_findings());
}

TEST(CaseResult, PrintsEveryFinding) {
  CaseResult r;
  r.verdict = VerdictKind::kMismatch;
  r.seed = 5;
  Finding d = finding(VerdictKind::kMismatch, "s");
  d.index = {1, 2};
  d.expected = 1.5;
  d.got = 2.5;
  d.op = "ForwardLinearBiasAdd";
  Finding e = finding(VerdictKind::kUnexpectedError, "e", "error");
  e.error_kind = "locked";
  e.phase = "binding";
  e.message = "cannot change channels";
  e.known = "te-finding-3";
  r.findings = {d, e};
  std::ostringstream os;
  os << r;
  EXPECT_THAT(os.str(), HasSubstr("fused~reference grad_input at [1,2]: expected 1.5, got 2.5"));
  EXPECT_THAT(os.str(), HasSubstr("[ForwardLinearBiasAdd]"));
  EXPECT_THAT(os.str(), HasSubstr("error: locked during binding: cannot change channels"));
  EXPECT_THAT(os.str(), HasSubstr("(known: te-finding-3)"));
  EXPECT_THAT(os.str(), HasSubstr("seed 5"));
}

TEST(FindingJson, RoundTripsEveryField) {
  Finding d = finding(VerdictKind::kMissingGradient, "missing_gradient|Dispatch|grad_channel", "grad_channel[probs]");
  d.path_pair = "fused~unfused";
  d.role = "grad_channel";
  d.index = {3, 1};
  d.expected = -0.25;
  d.got = 0.5;
  d.max_abs_err = 0.75;
  d.max_rel_err = std::numeric_limits<double>::infinity();  // JSON has no infinity: a string
  d.atol = 1e-5;
  d.rtol = 1.6e-2;
  d.scale = 0.9;
  d.rounding = 0.125;
  d.norm_err = 0.8;
  d.norm_bound = 0.4;
  d.error_kind = "locked";
  d.error_type = "RuntimeError";
  d.phase = "forward";
  d.message = "m";
  d.origin = "BasicOperation.set_extra_input_channel";
  d.op = "Dispatch";
  d.option = "in_place=1";
  d.note = "n";
  d.known = "k";
  const nlohmann::json j = d;
  const Finding back = j.get<Finding>();
  EXPECT_EQ(back.kind, d.kind);
  EXPECT_EQ(back.path_pair, d.path_pair);
  EXPECT_EQ(back.tensor, d.tensor);
  EXPECT_EQ(back.role, d.role);
  EXPECT_EQ(back.signature, d.signature);
  EXPECT_EQ(back.index, d.index);
  EXPECT_DOUBLE_EQ(back.expected, d.expected);
  EXPECT_DOUBLE_EQ(back.got, d.got);
  EXPECT_DOUBLE_EQ(back.max_abs_err, d.max_abs_err);
  EXPECT_EQ(back.max_rel_err, d.max_rel_err);
  EXPECT_DOUBLE_EQ(back.atol, d.atol);
  EXPECT_DOUBLE_EQ(back.rtol, d.rtol);
  EXPECT_DOUBLE_EQ(back.scale, d.scale);
  EXPECT_DOUBLE_EQ(back.rounding, d.rounding);
  EXPECT_DOUBLE_EQ(back.norm_err, d.norm_err);
  EXPECT_DOUBLE_EQ(back.norm_bound, d.norm_bound);
  for (auto [a, b] : {std::pair{back.error_kind, d.error_kind},
                      {back.error_type, d.error_type},
                      {back.phase, d.phase},
                      {back.message, d.message},
                      {back.origin, d.origin},
                      {back.op, d.op},
                      {back.option, d.option},
                      {back.note, d.note},
                      {back.known, d.known}}) {
    EXPECT_EQ(a, b);
  }
}

TEST(FindingJson, AnErrorCarriesNoNumbers) {
  Finding e = finding(VerdictKind::kUnexpectedError, "e", "error");
  e.error_kind = "locked";
  const nlohmann::json j = e;
  EXPECT_FALSE(j.contains("max_abs_err"));
  EXPECT_FALSE(j.contains("rounding"));
  EXPECT_EQ(j.at("error_kind"), "locked");
  EXPECT_EQ(j.get<Finding>().error_kind, "locked");
}

TEST(CaseResultJson, RoundTripsFindingsAndBookkeeping) {
  CaseResult r;
  r.findings = {finding(VerdictKind::kMismatch, "a"), finding(VerdictKind::kModifiedInput, "b", "cotangent[0]")};
  r.summarize();
  r.notes = "fused raised";
  r.seed = 7;
  r.op_types = {"Linear"};
  r.fused_compared = {"ForwardLinearBiasAdd"};
  r.kink_elements = 3;
  r.cancellation_tensors = 2;
  const CaseResult back = nlohmann::json(r).get<CaseResult>();
  EXPECT_EQ(back.verdict, VerdictKind::kModifiedInput);
  ASSERT_EQ(back.findings.size(), 2u);
  EXPECT_EQ(back.findings[1].tensor, "cotangent[0]");
  EXPECT_EQ(back.notes, r.notes);
  EXPECT_EQ(back.fused_compared, r.fused_compared);
  EXPECT_EQ(back.kink_elements, 3);
  EXPECT_EQ(back.cancellation_tensors, 2);
  EXPECT_THAT(back.signatures(), ElementsAre("a", "b"));
  EXPECT_THAT(nlohmann::json(r).dump(), Not(HasSubstr("error_kinds")));
}

}  // namespace
}  // namespace gradfuzz::harness
