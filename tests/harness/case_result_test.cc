#include "harness/case_result.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
