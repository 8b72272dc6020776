#include "reports/upstream_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gradfuzz::reports {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;
using ::testing::Not;

Json report() {
  return Json::parse(R"json({
    "tool": {"name": "gradfuzz", "version": "0.9", "git_sha": "abc1234"},
    "environment": {"torch_version": "2.11.0", "device": "cuda", "device_name": "NVIDIA H200", "backend": "te",
                    "backend_versions": {"transformer_engine": "2.20.2", "torch": "2.11.0+cu130"}}})json");
}

/// A new cluster of BackwardLinearAdd's weight gradient, confirmed fused-only.
Json fused_only() {
  return Json::parse(R"json({
    "signature": "mismatch|BackwardLinearAdd|grad_param", "kind": "mismatch", "known": null, "backend": "te",
    "dtype": "float32", "recipe": null, "case_file": "gradfuzz-out/corpus/findings/ab12.json", "count": 7,
    "confirmation": {"diagnosis": "fused-only",
      "variants": [{"variant": "unfused", "change": "the same run's unfused path (no fusion)", "verdict": "passes"},
                   {"variant": "in_place_off", "change": "every in_place=1 set to 0", "verdict": "passes"}],
      "first_divergence": {
  "path" : "fused",
           "pass" : "backward",
                    "op_index" : 1,
                    "op" : "Linear",
                           "group" : "BackwardLinearAdd",
                                     "fused" : true,
                                               "class" : "BackwardLinearAdd",
                                                         "method" : "fuser_backward",
                                                                    "role" : "grad_param",
                                                                             "tensor" : "grad_param[1].Linear[0]"
}
}
, "details" : [ {
  "path_pair" : "fused~reference",
  "tensor" : "grad_param[1].Linear[0]",
  "kind" : "mismatch",
  "role" : "grad_param",
  "max_abs_err" : 3.25,
  "max_rel_err" : 1.5,
  "atol" : 1e-05,
  "rtol" : 1.3e-06,
  "index" : [ 2, 0 ],
  "expected" : 2.0,
  "got" : -1.25,
  "norm_err" : 9.5,
  "norm_bound" : 0.001
} ]
})json");
}

TEST(UpstreamIssue, SaysWhatIsWrongWhereWithTheNumbersTheConfirmationAndTheTest) {
  const UpstreamIssue issue = upstream_issue(report(), fused_only(), "test_x.py", "def test_x():\n    assert False\n",
                                             "transformer_engine/pytorch/ops/fused/backward_linear_add.py");
  EXPECT_EQ(issue.folder, "fused-only-BackwardLinearAdd-grad_param");
  EXPECT_EQ(issue.title, "BackwardLinearAdd: wrong grad_param (float32, no FP8 recipe)");
  EXPECT_THAT(issue.readme, HasSubstr("TransformerEngine 2.20.2, PyTorch 2.11.0+cu130, NVIDIA H200"));
  EXPECT_THAT(issue.readme, HasSubstr("at [2, 0] it is -1.25 where the float64 reference gives 2"));
  EXPECT_THAT(issue.readme, HasSubstr("**fused-only**"));
  EXPECT_THAT(issue.readme, HasSubstr("computed by `BackwardLinearAdd.fuser_backward`"));
  EXPECT_THAT(issue.readme, HasSubstr("| in_place_off | every in_place=1 set to 0 | passes |"));
  EXPECT_THAT(issue.readme, HasSubstr("backward_linear_add.py"));
  EXPECT_THAT(issue.readme, HasSubstr("```python\ndef test_x():\n    assert False\n```"));
  EXPECT_THAT(issue.readme, HasSubstr("7 failing case(s)"));
}

TEST(UpstreamIssue, AnErrorIsTitledByWhatRaisesAndWhere) {
  Json f = fused_only();
  f["signature"] = "unexpected_error|BasicLinear|forward|c10-error|Attempting to generate quantized output";
  f["kind"] = "unexpected_error";
  f["recipe"] = Json::parse(R"json({"name": "Float8CurrentScaling", "fp8_format": "E4M3", "options": {}})json");
  f["confirmation"]["diagnosis"] = "crash";
  f["confirmation"].erase("first_divergence");
  f["details"] = Json::parse(R"json([{"path_pair": "fused~reference", "tensor": "error", "kind": "unexpected_error",
    "role": "error", "phase": "forward", "message": "RuntimeError: Attempting to generate quantized output tensor",
    "origin": "BasicLinear._functional_forward"}])json");
  const UpstreamIssue issue = upstream_issue(report(), f, "t.py", "", "");
  EXPECT_THAT(issue.title, HasSubstr("BasicLinear: raises in forward: RuntimeError: Attempting to generate"));
  EXPECT_THAT(issue.title, HasSubstr("Float8CurrentScaling (E4M3)"));
  EXPECT_THAT(issue.readme, HasSubstr("Raised in `BasicLinear._functional_forward`"));
  EXPECT_THAT(issue.readme, Not(HasSubstr("Suspected location")));
}

TEST(UpstreamCandidate, IsANewConfirmedClusterThatNoDocumentedCauseExplains) {
  EXPECT_TRUE(is_upstream_candidate(fused_only()));
  Json known = fused_only();
  known["known"] = Json{{"id", "te-x"}};
  EXPECT_FALSE(is_upstream_candidate(known));
  Json consequence = fused_only();
  consequence["confirmation"]["diagnosis"] = "known-consequence";
  EXPECT_FALSE(is_upstream_candidate(consequence));
  Json unconfirmed = fused_only();
  unconfirmed.erase("confirmation");
  EXPECT_FALSE(is_upstream_candidate(unconfirmed));
}

}  // namespace
}  // namespace gradfuzz::reports
