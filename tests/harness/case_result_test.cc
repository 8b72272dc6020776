#include "harness/case_result.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace gradfuzz::harness {
namespace {

using ::testing::HasSubstr;

TEST(Verdict, NamesRoundTrip) {
  for (VerdictKind kind : {VerdictKind::kPass, VerdictKind::kMismatch, VerdictKind::kMissingGradient,
                           VerdictKind::kUnexpectedError, VerdictKind::kCrash, VerdictKind::kTimeout}) {
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

TEST(CaseResult, SignatureUsesKindSortedUniqueOpsAndRole) {
  CaseResult a;
  a.verdict = VerdictKind::kMismatch;
  a.op_types = {"Linear", "Bias", "Linear"};
  TensorMismatch d;
  d.role = "grad_param";
  d.tensor = "grad_param[0].Linear[0]";
  a.details = {d};
  EXPECT_EQ(a.signature(), "mismatch|Bias,Linear|grad_param");

  CaseResult b = a;
  b.op_types = {"Bias", "Linear"};
  b.details[0].tensor = "grad_param[1].Linear[0]";
  b.seed = 99;
  EXPECT_EQ(a.signature(), b.signature());

  b.details[0].role = "grad_input";
  EXPECT_NE(a.signature(), b.signature());
}

TEST(CaseResult, SignaturePrefersDetailOfVerdictKind) {
  CaseResult r;
  r.verdict = VerdictKind::kMissingGradient;
  r.op_types = {"Dispatch"};
  TensorMismatch m;
  m.role = "output";
  TensorMismatch g;
  g.kind = VerdictKind::kMissingGradient;
  g.role = "grad_channel";
  r.details = {m, g};
  EXPECT_EQ(r.signature(), "missing_gradient|Dispatch|grad_channel");
}

TEST(CaseResult, UnexpectedErrorSignatureUsesErrorKinds) {
  CaseResult r;
  r.verdict = VerdictKind::kUnexpectedError;
  r.op_types = {"RowStat"};
  r.error_kinds = "fused=locked unfused=locked reference=none";
  EXPECT_EQ(r.signature(), "unexpected_error|RowStat|fused=locked unfused=locked reference=none");
}

TEST(CaseResult, PrintsEveryDetailField) {
  CaseResult r;
  r.verdict = VerdictKind::kMismatch;
  r.seed = 5;
  TensorMismatch d;
  d.path_pair = "fused~reference";
  d.tensor = "grad_input";
  d.index = {1, 2};
  d.expected = 1.5;
  d.got = 2.5;
  r.details = {d};
  std::ostringstream os;
  os << r;
  EXPECT_THAT(os.str(), HasSubstr("fused~reference grad_input at [1,2]: expected 1.5, got 2.5"));
  EXPECT_THAT(os.str(), HasSubstr("seed 5"));
}

}  // namespace
}  // namespace gradfuzz::harness

namespace gradfuzz::harness {
namespace {

TEST(TensorMismatchJson, RoundTripsEveryFieldAndTheOptionalRounding) {
  TensorMismatch d;
  d.kind = VerdictKind::kMissingGradient;
  d.path_pair = "fused~unfused";
  d.tensor = "grad_channel[probs]";
  d.role = "grad_channel";
  d.index = {3, 1};
  d.expected = -0.25;
  d.got = 0.5;
  d.max_abs_err = 0.75;
  d.max_rel_err = 3;
  d.atol = 1e-5;
  d.rtol = 1.6e-2;
  d.scale = 0.9;
  nlohmann::json j = d;
  EXPECT_FALSE(j.contains("rounding"));  // none without a baseline: old files stay as they were
  d.rounding = 0.125;
  j = d;
  const TensorMismatch back = j.get<TensorMismatch>();
  EXPECT_EQ(back.kind, d.kind);
  EXPECT_EQ(back.path_pair, d.path_pair);
  EXPECT_EQ(back.tensor, d.tensor);
  EXPECT_EQ(back.role, d.role);
  EXPECT_EQ(back.index, d.index);
  EXPECT_DOUBLE_EQ(back.expected, d.expected);
  EXPECT_DOUBLE_EQ(back.got, d.got);
  EXPECT_DOUBLE_EQ(back.max_abs_err, d.max_abs_err);
  EXPECT_DOUBLE_EQ(back.max_rel_err, d.max_rel_err);
  EXPECT_DOUBLE_EQ(back.atol, d.atol);
  EXPECT_DOUBLE_EQ(back.rtol, d.rtol);
  EXPECT_DOUBLE_EQ(back.scale, d.scale);
  EXPECT_DOUBLE_EQ(back.rounding, d.rounding);
}

}  // namespace
}  // namespace gradfuzz::harness
