#include "oracle/divergence.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "oracle/signature.h"
#include "tests/harness/test_specs.h"

namespace gradfuzz::oracle {
namespace {

using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::Finding;
using harness::PathRun;
using harness::PlanGroup;
using harness::TraceEntry;
using harness::VerdictKind;
using harness::testing::op;

/// RMSNorm -> Linear -> Linear, one fuser, every op its own group (a torch-like path).
CaseSpec three_ops() {
  CaseSpec spec;
  spec.ops = {op("RMSNorm"), op("Linear", {{"out", 4}}), op("Linear", {{"out", 4}})};
  return spec;
}

CasePlan plan_of(const CaseSpec& spec) {
  CasePlan plan;
  plan.ops.resize(spec.ops.size());
  for (auto& o : plan.ops) o.fuser = 0;
  plan.num_fusers = 1;
  return plan;
}

TraceEntry entry(const char* pass, PlanGroup group, at::Tensor t, std::string cls = "", std::string method = "") {
  TraceEntry e;
  e.pass = pass;
  e.group = std::move(group);
  e.impl_class = std::move(cls);
  e.method = std::move(method);
  e.tensor = std::move(t);
  return e;
}

/// The reference's trace: op k's output is k+1 everywhere, the gradient of op k's input 10+k.
PathRun reference() {
  PathRun run;
  run.name = "reference";
  for (int64_t k = 0; k < 3; ++k) {
    run.trace.push_back(entry("forward", {"op", k, k + 1, false}, at::full({2, 4}, 1.0 + k, at::kDouble)));
  }
  for (int64_t k = 2; k >= 0; --k) {
    run.trace.push_back(entry("backward", {"op", k, k + 1, false}, at::full({2, 4}, 10.0 + k, at::kDouble)));
  }
  return run;
}

/// A path that agrees with reference() except where `wrong` says ("backward[1]" scales that
/// gradient by 2^-7, and every gradient upstream of it with it).
PathRun path(const std::string& wrong) {
  PathRun run = reference();
  run.name = "unfused";
  run.plans.resize(1);
  for (int64_t k = 0; k < 3; ++k) {
    run.plans[0].forward.push_back({k == 0 ? "RMSNorm" : "Linear", k, k + 1, false});
    run.plans[0].backward.push_back({k == 0 ? "RMSNorm" : "Linear", k, k + 1, false});
  }
  for (auto& e : run.trace) {
    e.group.name = e.group.begin == 0 ? "RMSNorm" : "Linear";
    e.impl_class = e.group.begin == 0 ? "RMSNormOp" : "LinearOp";
    e.method = e.pass == "forward" ? "op_forward" : "op_backward";
    e.tensor = e.tensor.to(at::kFloat);
    if (wrong == "backward[1]" && e.pass == "backward" && e.group.begin <= 1) e.tensor = e.tensor / 128;
  }
  return run;
}

CaseBounds tight() {
  CaseBounds b;
  b.fallback = {1e-5, 1e-6};
  return b;
}

TEST(FirstDivergence, IsTheLatestOpInBackwardWhoseGradientIsWrongNotTheTensorThatShowedIt) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  // The compared tensors downstream of op 1's wrong input gradient: RMSNorm's weight gradient
  // and the main input's gradient (both at op 0).
  std::vector<Finding> findings(2);
  findings[0].kind = VerdictKind::kMismatch;
  findings[0].path_pair = "unfused~reference";
  findings[0].tensor = "grad_param[0].RMSNorm[0]";
  findings[0].role = "grad_param";
  findings[1] = findings[0];
  findings[1].tensor = "grad_input";
  findings[1].role = "grad_input";
  const auto d = first_divergence(spec, plan, reference(), path("backward[1]"), tight(), findings);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->pass, "backward");
  EXPECT_EQ(d->op_index, 1);
  EXPECT_EQ(d->op, "Linear");
  EXPECT_EQ(d->role, "grad_input");
  EXPECT_EQ(d->tensor, "trace.backward[1]");
  EXPECT_EQ(d->impl_class, "LinearOp");
  EXPECT_EQ(d->method, "op_backward");
  EXPECT_NEAR(d->max_rel_err, 1 - 1.0 / 128, 1e-6);
}

TEST(FirstDivergence, AComparedTensorComesBeforeTheTraceAtTheSameOp) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  std::vector<Finding> findings(1);
  findings[0].kind = VerdictKind::kMismatch;
  findings[0].path_pair = "unfused~reference";
  findings[0].tensor = "grad_param[1].Linear[0]";
  findings[0].role = "grad_param";
  const auto d = first_divergence(spec, plan, reference(), path("backward[1]"), tight(), findings);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->role, "grad_param");
  EXPECT_EQ(d->op_index, 1);
  EXPECT_EQ(d->group, "Linear");
}

// A defect of op 0 shows in its weight gradient and in the case's input gradient, as one of op
// k shows in op k's weight gradient and its traced input gradient: signed the same way, by
// the weight gradient, whichever the comparison listed first (a one-op case shrunk from a
// two-op one keeps its cluster).
TEST(FirstDivergence, AtOpZeroTheWeightGradientSignsBeforeTheInputGradientAsAtOpK) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  std::vector<Finding> findings(2);
  findings[0].kind = VerdictKind::kMismatch;
  findings[0].path_pair = "unfused~reference";
  findings[0].tensor = "grad_input";
  findings[0].role = "grad_input";
  findings[1] = findings[0];
  findings[1].tensor = "grad_param[0].RMSNorm[0]";
  findings[1].role = "grad_param";
  const auto d = first_divergence(spec, plan, reference(), path("backward[0]"), tight(), findings);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->op_index, 0);
  EXPECT_EQ(d->role, "grad_param");
  EXPECT_EQ(d->tensor, "grad_param[0].RMSNorm[0]");
}

TEST(FirstDivergence, NothingWhenThePathAgreesAndQuantizedEntriesAreNotCompared) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  EXPECT_FALSE(first_divergence(spec, plan, reference(), path(""), tight(), {}).has_value());
  PathRun quantized = path("backward[1]");
  for (auto& e : quantized.trace) e.quantized = true;
  EXPECT_FALSE(first_divergence(spec, plan, reference(), quantized, tight(), {}).has_value());
  // Findings of another path are not this path's.
  Finding other;
  other.kind = VerdictKind::kMismatch;
  other.path_pair = "fused~reference";
  other.tensor = "grad_input";
  other.role = "grad_input";
  EXPECT_FALSE(first_divergence(spec, plan, reference(), path(""), tight(), {other}).has_value());
}

TEST(FirstDivergence, AFusedGroupIsNamedByItsGroupAndItsBoundaryOps) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  PathRun fused;
  fused.name = "fused";
  fused.plans.resize(1);
  fused.plans[0].forward = {{"RMSNorm", 0, 1, false}, {"LinearLinear", 1, 3, true}};
  fused.plans[0].backward = fused.plans[0].forward;
  fused.trace = {entry("forward", {"RMSNorm", 0, 1, false}, at::full({2, 4}, 1.0)),
                 entry("forward", {"LinearLinear", 1, 3, true}, at::full({2, 4}, 5.0), "FusedLL", "fuser_forward")};
  const auto d = first_divergence(spec, plan, reference(), fused, tight(), {});
  ASSERT_TRUE(d.has_value());
  // The group hands on op 2's output; the reference's op 2 output is 3.
  EXPECT_EQ(d->tensor, "trace.forward[2]");
  EXPECT_EQ(d->pass, "forward");
  EXPECT_EQ(d->group, "LinearLinear");
  EXPECT_TRUE(d->fused);
  EXPECT_EQ(d->impl_class, "FusedLL");
  EXPECT_EQ(d->method, "fuser_forward");
}

TEST(TensorNames, IndexInReadsTheBracketedNumberAfterItsPrefix) {
  EXPECT_EQ(index_in("grad_param[12].Linear[0]", "grad_param["), 12);
  EXPECT_EQ(index_in("extra_input[2]", "extra_input["), 2);
  EXPECT_EQ(index_in("grad_extra_input[2]", "extra_input["), -1);
  EXPECT_EQ(index_in("extra_input[x]", "extra_input["), -1);
  EXPECT_EQ(index_in("extra_input[3", "extra_input["), -1);
  EXPECT_EQ(last_op(three_ops()), 2);
  EXPECT_EQ(last_op(CaseSpec{}), 0);
}

TEST(TensorPosition, PlacesTraceAndComparedTensors) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  const auto forward = tensor_position("trace.forward[1]", spec, plan);
  ASSERT_TRUE(forward);
  EXPECT_TRUE(forward->forward);
  EXPECT_EQ(forward->op, 1);
  const auto backward = tensor_position("trace.backward[2]", spec, plan);
  ASSERT_TRUE(backward);
  EXPECT_FALSE(backward->forward);
  EXPECT_EQ(backward->op, 2);
  EXPECT_EQ(tensor_position("output", spec, plan)->op, 2);
  EXPECT_FALSE(tensor_position("error", spec, plan).has_value());
}

TEST(AssignSignatures, ATracedDivergenceSignsEveryValueFindingOfItsPath) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  CaseResult result;
  Finding f;
  f.kind = VerdictKind::kMismatch;
  f.path_pair = "unfused~reference";
  f.tensor = "grad_param[0].RMSNorm[0]";
  f.role = "grad_param";
  result.findings = {f};
  const PathRun run = path("backward[1]");
  assign_signatures(spec, plan, {&run}, result);
  EXPECT_EQ(result.findings[0].signature, "mismatch|RMSNorm|grad_param");
  result.divergences = {*first_divergence(spec, plan, reference(), run, tight(), result.findings)};
  assign_signatures(spec, plan, {&run}, result);
  EXPECT_EQ(result.findings[0].signature, "mismatch|Linear|grad_input");
  // A path whose findings the in-place ablation partly explains keeps its compared tensors.
  assign_signatures(spec, plan, {&run}, result, {0});
  EXPECT_NE(result.findings[0].signature, "mismatch|Linear|grad_input");
}

// With a finding set apart (the in-place write's), the path's recorded divergence becomes the
// compared tensor that signs its other findings: a report and an upstream test take the tensor
// the signature names, not the trace's, which may be the other cause's write.
TEST(AssignSignatures, APathWithAFindingSetApartRecordsTheTensorThatSignsTheOthers) {
  const CaseSpec spec = three_ops();
  const CasePlan plan = plan_of(spec);
  CaseResult result;
  Finding written;  // the in-place write's consequence
  written.kind = VerdictKind::kMismatch;
  written.path_pair = "unfused~reference";
  written.tensor = "grad_input";
  written.role = "grad_input";
  Finding other = written;
  other.tensor = "grad_param[0].RMSNorm[0]";
  other.role = "grad_param";
  result.findings = {written, other};
  const PathRun run = path("backward[1]");
  result.divergences = {*first_divergence(spec, plan, reference(), run, tight(), result.findings)};
  ASSERT_EQ(result.divergences[0].tensor, "trace.backward[1]");
  assign_signatures(spec, plan, {&run}, result, {0});
  EXPECT_EQ(result.findings[1].signature, "mismatch|RMSNorm|grad_param");
  const harness::Divergence* d = result.divergence_of("unfused~reference");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->tensor, "grad_param[0].RMSNorm[0]");
  EXPECT_EQ(d->role, "grad_param");
  EXPECT_EQ(d->op_index, 0);
  EXPECT_EQ(d->op, "RMSNorm");
  EXPECT_EQ(result.divergences.size(), 1u);
}

TEST(DivergenceJson, RoundTrips) {
  harness::Divergence d;
  d.path = "fused";
  d.pass = "backward";
  d.op_index = 3;
  d.op = "Linear";
  d.group = "BackwardLinearAdd";
  d.fused = true;
  d.impl_class = "BackwardLinearAdd";
  d.method = "fuser_backward";
  d.role = "grad_param";
  d.tensor = "grad_param[3].Linear[0]";
  d.max_abs_err = 2.5;
  d.max_rel_err = 1;
  d.norm_err = 3;
  d.norm_bound = 0.1;
  CaseResult r;
  r.divergences = {d};
  nlohmann::json j = r;
  const CaseResult back = j.get<CaseResult>();
  ASSERT_EQ(back.divergences.size(), 1u);
  EXPECT_EQ(back.divergences[0], d);
  EXPECT_EQ(back.divergence_of("fused~reference"), &back.divergences[0]);
  EXPECT_EQ(back.divergence_of("unfused~reference"), nullptr);
}

}  // namespace
}  // namespace gradfuzz::oracle
