#include "oracle/signature.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/harness/test_specs.h"

namespace gradfuzz::oracle {
namespace {

using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::Finding;
using harness::PathRun;
using harness::PlanGroup;
using harness::VerdictKind;
using harness::testing::op;
using ::testing::HasSubstr;

Finding value(std::string path_pair, std::string tensor, std::string role) {
  Finding f;
  f.kind = VerdictKind::kMismatch;
  f.path_pair = std::move(path_pair);
  f.tensor = std::move(tensor);
  f.role = std::move(role);
  return f;
}

Finding error(std::string path, std::string kind, std::string phase, std::string message, std::string origin = "") {
  Finding f;
  f.kind = VerdictKind::kUnexpectedError;
  f.path_pair = path + "~reference";
  f.tensor = "error";
  f.role = "error";
  f.error_kind = std::move(kind);
  f.phase = std::move(phase);
  f.message = std::move(message);
  f.origin = std::move(origin);
  return f;
}

/// Linear -> Bias -> AddExtraInput (one public extra input) -> ReLU, its plan.
CaseSpec linear_bias_add_relu() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 4}}), op("Bias"), op("AddExtraInput", {{"in_place", 1}}), op("ReLU")};
  return spec;
}

CasePlan plan_of(const CaseSpec& spec) {
  CasePlan plan;
  plan.ops.resize(spec.ops.size());
  for (auto& o : plan.ops) o.fuser = 0;
  plan.public_inputs.push_back({2, 0, {}, true});
  plan.num_fusers = 1;
  return plan;
}

PathRun fused_run() {
  PathRun run;
  run.name = "fused";
  run.plans.resize(1);
  run.plans[0].forward = {PlanGroup{"ForwardLinearBiasAdd", 0, 3, true}, PlanGroup{"ReLU", 3, 4, false}};
  run.plans[0].backward = {PlanGroup{"Linear", 0, 1, false}, PlanGroup{"Bias", 1, 2, false},
                           PlanGroup{"AddExtraInput", 2, 3, false}, PlanGroup{"ReLU", 3, 4, false}};
  return run;
}

TEST(NormalizeMessage, TakesOutWhatVariesBetweenCasesOfOneCause) {
  EXPECT_EQ(normalize_message("op 3 ('c12') expects shape [4, 8], got [4, 6] at 0x7ffd12"),
            normalize_message("op 11 ('c0') expects shape [16, 2], got [1, 9] at 0x5500aa"));
  EXPECT_THAT(normalize_message("tensor of 17 elements"), HasSubstr("tensor of # elements"));
  EXPECT_EQ(normalize_message(std::string(400, 'x')).size(), 160u);
  EXPECT_NE(normalize_message("object of type 'generator' has no len()"),
            normalize_message("Cannot change extra tensor channels"));
}

TEST(OriginClass, IsTheDefiningClassOfTheMethod) {
  EXPECT_EQ(origin_class("BasicOperation.set_extra_input_channel"), "BasicOperation");
  EXPECT_EQ(origin_class("OperationFuser.__init__.<locals>.check"), "OperationFuser");
  EXPECT_EQ(origin_class("fuse_forward_ops"), "");
}

TEST(AssignSignatures, ErrorsOfOneCauseShareASignatureAcrossPathsAndOps) {
  // The same locked error raised for two different op subclasses in two paths: one cause.
  CaseSpec spec = linear_bias_add_relu();
  CaseResult r;
  r.findings = {error("fused", "locked", "binding", "Cannot change channels of op 2 ('c1')",
                      "BasicOperation.set_extra_input_channel"),
                error("unfused", "locked", "binding", "Cannot change channels of op 0 ('c7')",
                      "BasicOperation.set_extra_input_channel")};
  assign_signatures(spec, plan_of(spec), {}, r);
  EXPECT_EQ(r.signatures().size(), 1u);
  EXPECT_THAT(r.findings[0].signature, HasSubstr("unexpected_error|BasicOperation|binding|locked|"));
  // Another cause in the same op set is another cluster.
  CaseResult other;
  other.findings = {
      error("fused", "unrecognized", "forward", "object of type 'generator' has no len()", "OperationFuser.forward")};
  assign_signatures(spec, plan_of(spec), {}, other);
  EXPECT_NE(other.findings[0].signature, r.findings[0].signature);
}

TEST(AssignSignatures, AModelErrorIsAttributedToTheOpItsMessageNames) {
  CaseSpec spec = linear_bias_add_relu();
  CaseResult r;
  r.findings = {error("fused", "invalid-argument", "forward", "GroupedLinear slot 0: split sizes must sum to 12")};
  assign_signatures(spec, plan_of(spec), {}, r);
  EXPECT_EQ(r.findings[0].op, "GroupedLinear");
}

TEST(AssignSignatures, AWrongValueIsTheFusedOpNearestToWhereValuesFirstDiverge) {
  CaseSpec spec = linear_bias_add_relu();
  const PathRun fused = fused_run();
  CaseResult r;
  // The output is wrong and, as a consequence, gradients too: the earliest forward tensor
  // (the output, at ReLU) is downstream of the fused ForwardLinearBiasAdd.
  r.findings = {value("fused~reference", "grad_param[0].Linear[0]", "grad_param"),
                value("fused~reference", "output", "output"), value("fused~unfused", "output", "output")};
  assign_signatures(spec, plan_of(spec), {&fused}, r);
  for (const auto& f : r.findings) EXPECT_EQ(f.signature, "mismatch|ForwardLinearBiasAdd|output") << f.tensor;
}

TEST(AssignSignatures, AValueTheUnfusedPathGetsWrongTooIsTheBasicOpsDefect) {
  CaseSpec spec = linear_bias_add_relu();
  const PathRun fused = fused_run();
  PathRun unfused;
  unfused.name = "unfused";
  CaseResult r;
  r.findings = {value("fused~reference", "output", "output"), value("unfused~reference", "output", "output")};
  assign_signatures(spec, plan_of(spec), {&fused, &unfused}, r);
  EXPECT_EQ(r.findings[0].signature, "mismatch|ReLU|output");
  EXPECT_EQ(r.findings[1].signature, "mismatch|ReLU|output");
}

TEST(AssignSignatures, ABackwardOnlyDefectIsTheLatestOpWhereGradientsDiverge) {
  CaseSpec spec = linear_bias_add_relu();
  PathRun fused = fused_run();
  fused.plans[0].backward = {PlanGroup{"Linear", 0, 1, false}, PlanGroup{"BackwardActivationBias", 1, 4, true}};
  CaseResult r;
  r.findings = {value("fused~reference", "grad_input", "grad_input"),
                value("fused~reference", "grad_extra_input[0]", "grad_extra_input")};
  assign_signatures(spec, plan_of(spec), {&fused}, r);
  // grad_extra_input[0] belongs to op 2, inside BackwardActivationBias [1, 4): the latest.
  EXPECT_EQ(r.findings[0].signature, "mismatch|BackwardActivationBias|grad_extra_input");
}

// A finding another cause accounts for (the in-place ablation's) does not decide where the
// other findings' values first diverge: the TE case of 2026-12-02d whose in-place write made
// AddExtraInput's extra input gradient wrong, and the Linear's weight gradient wrong by a
// factor, but left the weight gradient one FP8 rounding off without the write.
TEST(AssignSignatures, FindingsSetApartDoNotDecideTheOthersFirstDivergence) {
  CaseSpec spec = linear_bias_add_relu();
  PathRun unfused;
  unfused.name = "unfused";
  CaseResult r;
  r.findings = {value("unfused~reference", "grad_extra_input[0]", "grad_extra_input"),
                value("unfused~reference", "grad_param[0].Linear[0]", "grad_param")};
  CaseResult together = r;
  assign_signatures(spec, plan_of(spec), {&unfused}, together);
  EXPECT_EQ(together.findings[1].signature, "mismatch|AddExtraInput|grad_extra_input");
  assign_signatures(spec, plan_of(spec), {&unfused}, r, /*set_apart=*/{0});
  EXPECT_EQ(r.findings[1].signature, "mismatch|Linear|grad_param");
}

TEST(AssignSignatures, AModifiedTensorIsTheWritingOpWithItsFlags) {
  CaseSpec spec = linear_bias_add_relu();
  PathRun fused = fused_run();
  // The fused forward op wrote the extra input: its covered AddExtraInput(in_place) owns it.
  fused.modified_by["extra_input[0]"] = {PlanGroup{"ForwardLinearBiasAdd", 0, 3, true}, "forward"};
  CaseResult r;
  Finding m;
  m.kind = VerdictKind::kModifiedInput;
  m.path_pair = "fused~caller";
  m.tensor = "extra_input[0]";
  m.role = "extra_input";
  r.findings = {m};
  assign_signatures(spec, plan_of(spec), {&fused}, r);
  EXPECT_EQ(r.findings[0].op, "AddExtraInput");
  EXPECT_EQ(r.findings[0].option, "in_place=1");
  EXPECT_EQ(r.findings[0].signature, "modified_input|AddExtraInput|in_place=1|extra_input");
}

TEST(AssignSignatures, LocksLeftByAFailedConstructionAreOneCauseWhateverTheOp) {
  CaseSpec spec = linear_bias_add_relu();
  CaseResult r;
  Finding a;
  a.kind = VerdictKind::kUnexpectedError;
  a.role = "left_locked";
  a.phase = "forward";
  a.op = "Linear";
  Finding b = a;
  b.op = "ReLU";
  r.findings = {a, b};
  assign_signatures(spec, plan_of(spec), {}, r);
  EXPECT_EQ(r.signatures().size(), 1u);
  EXPECT_EQ(r.findings[0].signature, "unexpected_error|left_locked|forward");
}

}  // namespace
}  // namespace gradfuzz::oracle
