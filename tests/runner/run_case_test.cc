#include "runner/run_case.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "backends/model_backend.h"
#include "harness/builder.h"
#include "harness/dtype.h"
#include "ops/faults.h"
#include "ops/fusion_registry.h"
#include "ops/quantization.h"
#include "ops/reference.h"
#include "runner/case_cost.h"
#include "tests/harness/test_specs.h"

namespace gradfuzz::runner {

using backends::Backend;
using backends::ModelBackend;
using harness::BackendCapabilities;
using harness::CasePlan;
using harness::CaseResult;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::Finding;
using harness::kBoundaryOp;
using harness::model_capabilities;
using harness::OpSpec;
using harness::OutputBindingSpec;
using harness::PathRequest;
using harness::PathRun;
using harness::VerdictKind;
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

using harness::testing::op;

OutputBindingSpec hidden(std::string channel) { return {std::move(channel), false}; }

CaseSpec linear_bias_relu(const std::string& dtype = "float64") {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 6}}), op("Bias"), op("ReLU")};
  spec.fusions = {"ForwardLinearBiasActivation"};
  spec.dtype = dtype;
  spec.seed = 3;
  return spec;
}

/// MakeExtraOutput -> ConstantScale -> AddExtraInput through one hidden channel: the
/// FusedResidual pattern (the fused op owns both ends of the channel).
CaseSpec residual(const std::string& fusion) {
  CaseSpec spec;
  spec.ops = {op("MakeExtraOutput", {}, {}, {hidden("r")}), op("ConstantScale", {{"scale", 0.75}}),
              op("AddExtraInput", {}, {std::string("r")})};
  spec.fusions = {fusion};
  spec.seed = 5;
  return spec;
}

/// Dispatch's fresh probs feed ScaledSwiGLU's scales (review finding 1).
CaseSpec dispatch_probs() {
  CaseSpec spec;
  spec.input_shape = {6, 8};
  spec.ops = {op("Dispatch", {{"groups", 2}}, {}, {{std::nullopt, true}, hidden("probs")}),
              op("ScaledSwiGLU", {}, {std::string("probs")})};
  spec.seed = 9;
  return spec;
}

std::string describe(const CaseResult& r) {
  std::ostringstream os;
  os << r;
  return os.str();
}

TEST(RunCase, LinearBiasReluWithForwardFusionPasses) {
  const CaseResult r = run_case(linear_bias_relu());
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.fusions_fired, Contains("ForwardLinearBiasActivation"));
  EXPECT_EQ(r.op_types, (std::vector<std::string>{"Linear", "Bias", "ReLU"}));
  EXPECT_EQ(r.seed, 3u);
}

TEST(RunCase, LowPrecisionCasesPassWithinScaledTolerances) {
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    const CaseResult r = run_case(linear_bias_relu(dtype));
    EXPECT_EQ(r.verdict, VerdictKind::kPass) << dtype << ": " << describe(r);
  }
}

TEST(RunCase, ResidualFusionsPassAndReportTheSameFusionChannel) {
  for (const char* fusion : {"FusedResidual.joint", "FusedResidual.forward", "FusedResidual.backward"}) {
    const CaseResult r = run_case(residual(fusion));
    EXPECT_EQ(r.verdict, VerdictKind::kPass) << fusion << ": " << describe(r);
    EXPECT_THAT(r.fusions_fired, Contains(fusion));
    EXPECT_THAT(r.features, Contains("same_fusion_channel"));
    EXPECT_THAT(r.features, Contains("hidden_output"));
  }
}

TEST(RunCase, SameFusionGradDropFaultIsAMismatch) {
  ops::FaultScope fault(ops::Fault::kSameFusionGradDrop);
  const CaseResult r = run_case(residual("FusedResidual.joint"));
  EXPECT_EQ(r.verdict, VerdictKind::kMismatch) << describe(r);
  ASSERT_FALSE(r.findings.empty());
  const Finding& d = r.findings.front();
  EXPECT_EQ(d.path_pair, "fused~reference");
  EXPECT_FALSE(d.index.empty());
  EXPECT_GT(d.max_abs_err, d.atol);
  EXPECT_NE(d.expected, d.got);
  // Without the fault the same case passes.
  ops::FaultScope off(ops::Fault::kSameFusionGradDrop, false);
  EXPECT_EQ(run_case(residual("FusedResidual.joint")).verdict, VerdictKind::kPass);
}

TEST(RunCase, FreshProducerCasePassesAndInternalRequiresGradFaultLosesTheGradient) {
  const CaseResult ok = run_case(dispatch_probs());
  EXPECT_EQ(ok.verdict, VerdictKind::kPass) << describe(ok);
  EXPECT_THAT(ok.features, Contains("fresh_producer"));
  ops::FaultScope fault(ops::Fault::kInternalRequiresGrad);
  const CaseResult r = run_case(dispatch_probs());
  EXPECT_TRUE(r.verdict == VerdictKind::kMissingGradient || r.verdict == VerdictKind::kMismatch) << describe(r);
}

TEST(RunCase, TransientLockFaultBreaksCallThenBind) {
  CaseSpec spec = dispatch_probs();
  spec.call_then_bind = {{1, true}};
  const CaseResult ok = run_case(spec);
  EXPECT_EQ(ok.verdict, VerdictKind::kPass) << describe(ok);
  EXPECT_THAT(ok.features, Contains("call_then_bind"));
  ops::FaultScope fault(ops::Fault::kTransientLock);
  const CaseResult r = run_case(spec);
  EXPECT_EQ(r.verdict, VerdictKind::kUnexpectedError) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("fused raised locked"));
  EXPECT_THAT(r.notes, HasSubstr("reference ran"));
  // One cause: the fused and unfused paths' locked errors share one root-cause signature.
  ASSERT_EQ(r.signatures().size(), 1u) << describe(r);
  EXPECT_THAT(r.signatures().front(), HasSubstr("unexpected_error|"));
  EXPECT_THAT(r.signatures().front(), HasSubstr("|binding|locked|"));
}

TEST(RunCase, GeneratorOutputsFaultIsCaught) {
  CaseSpec spec = dispatch_probs();
  spec.ops[0].output_style = ops::OutputStyle::kGenerator;
  const CaseResult ok = run_case(spec);
  EXPECT_EQ(ok.verdict, VerdictKind::kPass) << describe(ok);
  EXPECT_THAT(ok.features, Contains("generator_outputs"));
  ops::FaultScope fault(ops::Fault::kGeneratorOutputs);
  const CaseResult broken = run_case(spec);
  // The fused path misuses the generator container: an error the reference does not raise.
  EXPECT_EQ(broken.verdict, VerdictKind::kUnexpectedError) << describe(broken);
  EXPECT_EQ(broken.findings.front().error_kind, "generator-misuse") << describe(broken);
}

TEST(RunCase, TheLowPrecisionOracleCatchesMisroutedAndDroppedGradients) {
  // The same defects as the float64 tests above, judged in every lower precision (the
  // rounding allowance must not excuse a gradient in the wrong slot or a dropped one).
  CaseSpec scale_bias;
  scale_bias.input_shape = {6, 4};
  scale_bias.ops = {
      op("RowStat", {}, {}, {hidden("s")}),
      op("GroupedLinear", {{"groups", 2}, {"out", 3}, {"scale_bias", 1}}, {std::nullopt, std::string("s")})};
  // scale-bias-grad leaves the scales' channel without a gradient (missing_gradient) and
  // puts it into the input's (a mismatch the per-element oracle must not excuse);
  // same-fusion-grad-drop loses the residual's gradient (a mismatch).
  struct Case {
    ops::Fault fault;
    CaseSpec spec;
    VerdictKind verdict;
  };
  const std::vector<Case> cases = {
      {ops::Fault::kScaleBiasGrad, scale_bias, VerdictKind::kMissingGradient},
      {ops::Fault::kSameFusionGradDrop, residual("FusedResidual.joint"), VerdictKind::kMismatch}};
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    for (auto [fault, spec, verdict] : cases) {
      spec.dtype = dtype;
      for (uint64_t seed : {21u, 22u, 23u}) {
        spec.seed = seed;
        SCOPED_TRACE(std::string(dtype) + " " + ops::fault_name(fault) + " seed " + std::to_string(seed));
        const CaseResult ok = run_case(spec);
        EXPECT_EQ(ok.verdict, VerdictKind::kPass) << describe(ok);
        ops::FaultScope on(fault);
        const CaseResult broken = run_case(spec);
        EXPECT_EQ(broken.verdict, verdict) << describe(broken);
        // Every low-precision case fails a value comparison too, not only a structural check.
        EXPECT_TRUE(std::any_of(broken.findings.begin(), broken.findings.end(), [](const Finding& d) {
          return d.kind == VerdictKind::kMismatch;
        })) << describe(broken);
      }
    }
  }
}

TEST(RunCase, RepeatCallsGiveTheFirstCallsValuesAndFreshPlans) {
  // FusedResidual.joint fuses only where all three ops need backward: a no_grad call plans
  // no fused op, a call whose input requires no grad neither (no parameters here).
  for (const char* dtype : {"float64", "float32", "bfloat16"}) {
    CaseSpec spec = residual("FusedResidual.joint");
    spec.dtype = dtype;
    spec.repeat_calls = {{true, true}, {false, false}, {false, true}};
    const CaseResult r = run_case(spec);
    EXPECT_EQ(r.verdict, VerdictKind::kPass) << dtype << ": " << describe(r);
    EXPECT_THAT(r.features, Contains("repeat_calls"));
    EXPECT_THAT(r.features, Contains("no_grad_call"));
  }
  // The first call without grad on the input, later calls with it.
  CaseSpec late = residual("FusedResidual.joint");
  late.input_requires_grad = false;
  late.repeat_calls = {{false, true}, {true, false}};
  const CaseResult r = run_case(late);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
}

TEST(RunCase, StalePlanFaultIsAPlanMismatchOnTheRepeatCall) {
  CaseSpec spec = residual("FusedResidual.joint");
  spec.repeat_calls = {{true, true}};
  ops::FaultScope fault(ops::Fault::kStalePlan);
  const CaseResult r = run_case(spec);
  EXPECT_EQ(r.verdict, VerdictKind::kMismatch) << describe(r);
  ASSERT_FALSE(r.findings.empty()) << describe(r);
  EXPECT_EQ(r.findings.front().role, "plan");
  EXPECT_EQ(r.findings.front().path_pair, "fused.call[1]~fresh_plans");
  EXPECT_EQ(r.findings.front().tensor, "plan[fuser 0].forward");
  // Only the plan differs: the values of every call are still right.
  for (const auto& d : r.findings) EXPECT_EQ(d.role, "plan") << d.tensor;
  // One call only: nothing to go stale.
  spec.repeat_calls.clear();
  EXPECT_EQ(run_case(spec).verdict, VerdictKind::kPass);
}

TEST(RunCase, RepeatCallsOnABackendWithoutThemAreUnsupported) {
  class NoRepeats final : public Backend {
   public:
    NoRepeats() : caps_(model_capabilities()) {
      caps_.repeat_calls = false;
      caps_.backend = "norepeats";
    }
    std::string name() const override { return "norepeats"; }
    const BackendCapabilities& capabilities() override { return caps_; }
    std::vector<PathRun> run_paths(const CaseSpec& s, const CasePlan& p, const CaseTensors& t,
                                   const std::vector<PathRequest>& r) override {
      return model_.run_paths(s, p, t, r);
    }

   private:
    BackendCapabilities caps_;
    ModelBackend model_;
  };
  CaseSpec spec = residual("FusedResidual.joint");
  spec.repeat_calls = {{true, true}};
  NoRepeats backend;
  const CaseResult r = run_case(spec, backend, RunOptions{});
  EXPECT_EQ(r.verdict, VerdictKind::kUnsupported) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("does not run repeat_calls"));
}

TEST(RunCase, SlotOrderAndScaleBiasFaultsAreCaught) {
  // RowStat's fresh statistic feeds GroupedLinear's scales (slot 1) while the split sizes
  // (slot 0) stay public: a public slot before a bound one in the same op.
  CaseSpec spec;
  spec.input_shape = {6, 4};
  spec.ops = {op("RowStat", {}, {}, {hidden("s")}),
              op("GroupedLinear", {{"groups", 2}, {"out", 3}, {"scale_bias", 1}}, {std::nullopt, std::string("s")})};
  spec.seed = 21;
  const CaseResult ok = run_case(spec);
  EXPECT_EQ(ok.verdict, VerdictKind::kPass) << describe(ok);
  EXPECT_THAT(ok.features, Contains("mixed_slot_order"));
  EXPECT_THAT(ok.features, Contains("scale_bias"));
  {
    ops::FaultScope fault(ops::Fault::kSlotOrder);
    const CaseResult broken = run_case(spec);
    // The public split sizes land in the scales' slot: the fused path raises, the reference not.
    EXPECT_EQ(broken.verdict, VerdictKind::kUnexpectedError) << describe(broken);
    EXPECT_EQ(broken.findings.front().error_kind, "invalid-argument") << describe(broken);
    EXPECT_EQ(broken.findings.front().path_pair, "fused~reference") << describe(broken);
  }
  {
    ops::FaultScope fault(ops::Fault::kScaleBiasGrad);
    const CaseResult broken = run_case(spec);
    // The scales' gradient goes elsewhere: the channel gets none.
    EXPECT_EQ(broken.verdict, VerdictKind::kMissingGradient) << describe(broken);
  }
}

TEST(RunCase, ConsumerBeforeProducerRaisesTheSameErrorEverywhereAndPasses) {
  CaseSpec spec;
  spec.ops = {op("ScaledSReLU", {}, {std::string("s")}), op("RowStat", {}, {}, {hidden("s")})};
  const CaseResult r = run_case(spec);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("fused raised producer-not-earlier during Sequential construction"));
  EXPECT_THAT(r.notes, HasSubstr("reference raised producer-not-earlier"));
}

TEST(RunCase, OtherInvalidConfigurationsPassWhenEveryPathAgrees) {
  CaseSpec surplus = dispatch_probs();
  surplus.extra_input_count_delta = 1;
  CaseResult r = run_case(surplus);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("extra-input-count"));

  CaseSpec late = dispatch_probs();
  late.late_binds = {{1, 0, "other"}};
  r = run_case(late);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("locked"));

  CaseSpec splits;
  splits.input_shape = {6, 4};
  splits.ops = {op("GroupedLinear", {{"groups", 3}, {"out", 2}})};
  splits.corrupt_split_sizes = true;
  r = run_case(splits);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("invalid-argument"));

  CaseSpec crossing = dispatch_probs();
  crossing.ops.insert(crossing.ops.begin() + 1, op(kBoundaryOp));
  r = run_case(crossing);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.notes, HasSubstr("missing-producer"));
}

TEST(RunCase, EveryCatalogOpPassesInEveryDtypeWithoutFalseFindings) {
  // One small chain per op family; finite differences run on all of them (float64, small).
  std::vector<CaseSpec> specs;
  auto add = [&](std::vector<OpSpec> op_list, std::vector<int64_t> shape = {4, 6}) {
    CaseSpec s;
    s.ops = std::move(op_list);
    s.input_shape = std::move(shape);
    s.seed = 100 + specs.size();
    specs.push_back(std::move(s));
  };
  add({op("Linear", {{"out", 4}}), op("GELU"), op("SReLU"), op("ConstantScale", {{"scale", -2}})});
  add({op("SwiGLU"), op("Identity"), op("Reshape", {{"features", 3}})});
  add({op("ScaledSwiGLU", {{"interleave", 1}}), op("ScaledSReLU")});
  add({op("RMSNorm"), op("LayerNorm")});
  add({op("DualExtraOutput", {}, {}, {hidden("a"), {std::string("b"), true}}),
       op("AddExtraInput", {}, {std::string("a")}), op("AddExtraInput", {}, {std::string("b")}),
       op("AddExtraInput", {}, {std::string("a")})});
  add({op("Dispatch", {{"groups", 3}}, {}, {{std::string("splits"), false}, {std::nullopt, true}, hidden("map")}),
       op("GroupedLinear", {{"groups", 3}, {"out", 4}}, {std::string("splits")}),
       op("Combine", {}, {std::string("map")})});
  for (const auto& spec : specs) {
    const CaseResult r = run_case(spec);
    EXPECT_EQ(r.verdict, VerdictKind::kPass) << spec << "\n" << describe(r);
  }
  // The same chains in every lower precision and several seeds: the scaled tolerances must
  // not produce false findings.
  for (const char* dtype : {"float32", "bfloat16", "float16"}) {
    for (CaseSpec spec : specs) {
      spec.dtype = dtype;
      spec.fusions = ops::FusionRegistry::catalog().names();
      for (uint64_t seed = 0; seed < 5; ++seed) {
        spec.seed = seed;
        const CaseResult r = run_case(spec);
        EXPECT_EQ(r.verdict, VerdictKind::kPass) << spec << "\n" << describe(r);
      }
    }
  }
}

TEST(RunCase, ParametersAndInputsWithoutGradStillCompare) {
  CaseSpec spec = linear_bias_relu();
  spec.input_requires_grad = false;
  spec.ops[0].param_requires_grad = {false};
  const CaseResult r = run_case(spec);
  EXPECT_EQ(r.verdict, VerdictKind::kPass) << describe(r);
  EXPECT_THAT(r.features, Contains("no_grad_input"));
}

TEST(RunCase, ACaseWithTwoFaultsSymptomsReportsBothFindings) {
  // Two fusers: RowStat's statistic into GroupedLinear(scale_bias), then the FusedResidual
  // pattern. scale-bias-grad drops the scales' gradient in the first, same-fusion-grad-drop
  // the residual's in the second: two causes, two signatures, one case.
  CaseSpec spec;
  spec.input_shape = {6, 4};
  spec.ops = {op("RowStat", {}, {}, {hidden("s")}),
              op("GroupedLinear", {{"groups", 2}, {"out", 4}, {"scale_bias", 1}}, {std::nullopt, std::string("s")}),
              op(kBoundaryOp),
              op("MakeExtraOutput", {}, {}, {hidden("r")}),
              op("ConstantScale", {{"scale", 0.75}}),
              op("AddExtraInput", {}, {std::string("r")})};
  spec.fusions = {"FusedResidual.joint"};
  spec.seed = 21;
  EXPECT_EQ(run_case(spec).verdict, VerdictKind::kPass);
  ops::FaultScope one(ops::Fault::kScaleBiasGrad);
  const CaseResult first = run_case(spec);
  ops::FaultScope two(ops::Fault::kSameFusionGradDrop);
  const CaseResult both = run_case(spec);
  EXPECT_GT(both.signatures().size(), first.signatures().size()) << describe(both);
  EXPECT_TRUE(std::any_of(both.findings.begin(), both.findings.end(), [](const Finding& f) {
    return f.kind == VerdictKind::kMissingGradient && f.role == "grad_channel";
  })) << describe(both);
  EXPECT_TRUE(std::any_of(both.findings.begin(), both.findings.end(), [](const Finding& f) {
    return f.op.rfind("FusedResidual", 0) == 0;
  })) << describe(both);
}

TEST(RunCase, HalfPrecisionFaultsAreFoundInTheirOwnDtypeAndNotInFloat32) {
  // A fused forward 1.0625x off in bfloat16 only: the widest-dtype rerun would pass, and the
  // finding says so, but the case is decided in its own dtype.
  CaseSpec spec = linear_bias_relu("bfloat16");
  spec.ops[2] = op("GELU");
  ASSERT_EQ(run_case(spec).verdict, VerdictKind::kPass);
  ops::FaultScope fault(ops::Fault::kHalfOutputScale);
  const CaseResult r = run_case(spec);
  EXPECT_EQ(r.verdict, VerdictKind::kMismatch) << describe(r);
  EXPECT_THAT(r.findings.front().note, HasSubstr("passes in float64 on the same values")) << describe(r);
  EXPECT_EQ(r.findings.front().op, "ForwardLinearBiasActivation") << describe(r);
  spec.dtype = "float32";
  EXPECT_EQ(run_case(spec).verdict, VerdictKind::kPass);
}

}  // namespace
}  // namespace gradfuzz::runner

namespace gradfuzz::runner {
namespace {

using harness::testing::op;

/// AddExtraInput(in_place=1) on a public extra input.
CaseSpec in_place_add() {
  CaseSpec spec;
  spec.ops = {op("AddExtraInput", {{"in_place", 1}})};
  spec.seed = 7;
  return spec;
}

// Root cause by ablation: the planted in-place defect (AddExtraInput(in_place) adds into the
// caller's extra input) is gone when the op runs with in_place=0, so its finding is signed as
// caused by the in-place write; a defect that stays without in_place (a fused residual that
// drops a gradient) keeps its op; without the option nothing is re-signed.
TEST(RunCase, AFindingThatIsGoneWithoutInPlaceIsSignedAsTheInPlaceWrites) {
  ASSERT_EQ(run_case(in_place_add()).verdict, VerdictKind::kPass);
  ops::FaultScope fault(ops::Fault::kInPlaceExtraInput);
  const CaseResult r = run_case(in_place_add());
  ASSERT_FALSE(r.findings.empty()) << describe(r);
  bool signed_in_place = false;
  for (const Finding& f : r.findings) {
    if (f.kind != VerdictKind::kModifiedInput) continue;
    EXPECT_EQ(f.signature, "modified_input|in_place:AddExtraInput|in_place=1|extra_input") << describe(r);
    EXPECT_THAT(f.note, HasSubstr("caused by writing in place"));
    signed_in_place = true;
  }
  EXPECT_TRUE(signed_in_place) << describe(r);

  RunOptions plain;
  plain.attribute_in_place = false;
  for (const Finding& f : run_case(in_place_add(), plain).findings) {
    EXPECT_EQ(f.signature.find("in_place:"), std::string::npos) << f.signature;
  }

  ops::FaultScope off(ops::Fault::kInPlaceExtraInput, false);
  ops::FaultScope drop(ops::Fault::kSameFusionGradDrop);
  CaseSpec spec = residual("FusedResidual.joint");
  spec.ops[2].attrs["in_place"] = 1;
  const CaseResult fused = run_case(spec);
  ASSERT_EQ(fused.verdict, VerdictKind::kMismatch) << describe(fused);
  for (const Finding& f : fused.findings) {
    if (f.kind == VerdictKind::kMismatch) {
      EXPECT_EQ(f.signature.find("in_place:"), std::string::npos) << f.signature;
    }
  }
}

// ---------------------------------------------------------------------------------------
// FP8 GEMM accumulation: a backend with Hopper's FP8 MMA (issue 14; docs/BACKENDS.md "FP8
// GEMM accumulation")

/// A backend whose paths are the FP8 quantize-dequantize math in the case's dtype with every
/// FP8 GEMM computed as Hopper's FP8 MMA accumulates (ops::emulate_fp8_gemm, which gives TE
/// 2.20.2's values on the H200 bit for bit: tests/ops/quantization_test.cc): a correct
/// implementation whose GEMMs are not the reference's. It declares the recipes, FP8
/// quantization as the reference's, and (unless `declare_accumulation` is false) the
/// accumulation it does; `fault` plants an error of a given size.
class HopperFp8Backend final : public Backend {
 public:
  /// A planted error: the input gradient scaled by 2^-7 (NVIDIA/TransformerEngine#3342's
  /// size), or the output scaled by `factor`.
  enum class Fault { kNone, kGradInputTimes2ToTheMinus7, kOutputScaled };

  explicit HopperFp8Backend(bool declare_accumulation = true, Fault fault = Fault::kNone, double factor = 1)
      : caps_(model_capabilities()), fault_(fault), factor_(factor) {
    caps_.backend = "hopper";
    caps_.fp8_reference_exact = true;
    for (const char* recipe : {"DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"}) {
      caps_.recipes.push_back({recipe, true, "", {"E4M3", "HYBRID"}, {}});
    }
    model_.fast = {ops::Fp8Gemm::kFprop};  // te.ops' per-tensor recipes (base.py _2X_ACC_FPROP)
    if (declare_accumulation) {
      harness::Fp8GemmAccumulationCapability declared;
      declared.fast_accumulation = {
          {"DelayedScaling", {"fprop"}}, {"Float8CurrentScaling", {"fprop"}}, {"Float8BlockScaling", {}}};
      caps_.fp8_gemm_accumulation = declared;
    }
  }
  std::string name() const override { return "hopper"; }
  const BackendCapabilities& capabilities() override { return caps_; }
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& requests) override {
    std::vector<PathRun> runs;
    for (const PathRequest& request : requests) {
      PathRun run = evaluate(spec, plan, tensors);
      run.name = request.name;
      runs.push_back(std::move(run));
    }
    return runs;
  }

 private:
  PathRun evaluate(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors) {
    PathRun run;
    harness::BuiltCase built;
    harness::BuildOptions build;
    build.call_then_bind = false;
    harness::create_ops(spec, plan, &tensors, build, built);
    harness::build_case(spec, plan, tensors, build, built);
    ops::QuantRecipe recipe = ops::QuantRecipe::parse(spec.recipe->name, spec.recipe->fp8_format, spec.recipe->options);
    ops::Fp8GemmAccumulation model = model_;
    if (recipe.kind == ops::RecipeKind::kFloat8BlockScaling) model.fast.clear();  // gemm.py: split for blockwise
    ops::ReferenceQuantization quantization(std::move(recipe));
    quantization.set_accumulation(model, ops::AccumulationMode::kEmulate);
    ops::ReferenceEvaluator evaluator(*built.sequential, harness::scalar_type_from_name(spec.dtype));
    evaluator.set_quantization(&quantization);
    const auto options = at::TensorOptions().dtype(at::kDouble);
    at::Tensor input = tensors.input.to(options).requires_grad_(spec.input_requires_grad);
    run.outputs = evaluator.forward(input, {});
    const ops::ReferenceGradients grads = evaluator.backward(tensors.cotangents);
    run.grad_input = grads.grad_input;
    run.grad_params.resize(spec.ops.size());
    for (size_t i = 0; i < plan.ops.size(); ++i) {
      const int64_t ordinal = plan.ops[i].ordinal;
      if (ordinal >= 0 && ordinal < static_cast<int64_t>(grads.grad_params.size())) {
        run.grad_params[i] = grads.grad_params[static_cast<size_t>(ordinal)];
      }
    }
    if (fault_ == Fault::kGradInputTimes2ToTheMinus7) run.grad_input = run.grad_input * std::ldexp(1.0, -7);
    if (fault_ == Fault::kOutputScaled) run.outputs[0] = run.outputs[0] * factor_;
    return run;
  }

  BackendCapabilities caps_;
  ops::Fp8GemmAccumulation model_;
  Fault fault_;
  double factor_;
};

/// The H200 case of docs/TE.md (2026-12-02): one Linear [16, 48] -> 16, float32, under
/// Float8BlockScaling 1,1,1 (TE's output 3.9e-4 off at one element, its accumulation).
CaseSpec h200_linear() {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 16}})};
  spec.input_shape = {16, 48};
  spec.dtype = "float32";
  spec.recipe = harness::RecipeSpec{"Float8BlockScaling", "E4M3", {{"block_scaling_dims", "1,1,1"}}};
  spec.seed = 5541103688933942353ULL;
  return spec;
}

/// Linear -> GELU -> Linear under `recipe`: the second Linear quantizes the GELU of the
/// first one's GEMM output, so its accumulation error moves a later quantizer's input too.
CaseSpec fp8_chain(const harness::RecipeSpec& recipe, const std::string& dtype, uint64_t seed) {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 32}}), op("GELU"), op("Linear", {{"out", 16}})};
  spec.input_shape = {16, 64};
  spec.dtype = dtype;
  spec.recipe = recipe;
  spec.seed = seed;
  return spec;
}

bool has_finding_on(const CaseResult& r, const std::string& tensor) {
  return std::any_of(r.findings.begin(), r.findings.end(), [&](const Finding& f) {
    return f.kind == VerdictKind::kMismatch && f.tensor == tensor &&
           f.path_pair.find("~reference") != std::string::npos;
  });
}

TEST(RunCase, HopperAccumulationPassesOnlyWithItsDeclaredTerm) {
  // The H200's own case: the emulated GEMMs give TE's values, which the tight FP8 rule
  // rejected as long as the reference's GEMMs were taken as exact (docs/TE.md, call A).
  HopperFp8Backend declared;
  const CaseResult pass = run_case(h200_linear(), declared, RunOptions{});
  EXPECT_EQ(pass.verdict, VerdictKind::kPass) << describe(pass);
  HopperFp8Backend undeclared(/*declare_accumulation=*/false);
  const CaseResult fail = run_case(h200_linear(), undeclared, RunOptions{});
  EXPECT_EQ(fail.verdict, VerdictKind::kMismatch) << describe(fail);
  EXPECT_TRUE(has_finding_on(fail, "output")) << describe(fail);
  // With the term a single FP8 GEMM is still held to about its accumulation: 3% off fails
  // in both dtypes (the coarse estimate, one FP8 ulp anywhere, let 30% through).
  HopperFp8Backend off(true, HopperFp8Backend::Fault::kOutputScaled, 1.03);
  for (const std::string dtype : {"float32", "bfloat16"}) {
    CaseSpec spec = h200_linear();
    spec.dtype = dtype;
    EXPECT_EQ(run_case(spec, declared, RunOptions{}).verdict, VerdictKind::kPass) << dtype;
    const CaseResult three = run_case(spec, off, RunOptions{});
    EXPECT_TRUE(has_finding_on(three, "output")) << dtype << ": " << describe(three);
  }
}

// What an exported script holds a recipe case's output to (judging_expectation's bounds and
// expected values), checked as the script checks: a target's own accumulation must be taken
// (the H200's te scripts of a passing BackwardLinearScale case failed on the output by TE's
// fast fprop accumulation, 2026-12-02 third lease).
bool script_would_pass(const Expectation& e, const at::Tensor& got) {
  const at::Tensor expected = e.expected.at("output").to(at::kDouble);
  const oracle::TensorBound b = e.bounds->bound("output");
  const at::Tensor g = got.detach().to(at::kDouble).cpu();
  const double rms = expected.pow(2).mean().sqrt().item<double>();
  at::Tensor limit = b.atol + b.rtol * (rms + expected.abs());
  if (b.allowance.defined()) limit = limit + b.allowance;
  return (g - expected).abs().le(limit).all().item<bool>() && (g - expected).norm().item<double>() <= b.norm_bound;
}

TEST(RunCase, AnExportedExpectationTakesTheTargetsFp8Accumulation) {
  const CaseSpec spec = h200_linear();
  HopperFp8Backend hopper;
  const harness::CasePlan plan = harness::plan_case(spec);
  const PreparedCase prepared = prepare_case(spec);
  const std::vector<PathRun> runs = hopper.run_paths(spec, plan, prepared.tensors, {{"fused", {}, false}});
  ASSERT_TRUE(runs.front().ok());
  const at::Tensor got = runs.front().outputs.at(0);
  // The model's capabilities (exact GEMMs): the Hopper GEMM's output fails, as on the H200.
  const Expectation exact = judging_expectation(spec);
  ASSERT_TRUE(exact.quantized && exact.bounds);
  EXPECT_FALSE(script_would_pass(exact, got));
  // The target's: it passes, and an output 3% off still fails.
  const Expectation target = judging_expectation(spec, {}, {}, &hopper.capabilities());
  ASSERT_TRUE(target.quantized && target.bounds);
  EXPECT_TRUE(script_would_pass(target, got));
  EXPECT_FALSE(script_would_pass(target, got * 1.03));
  // A target whose FP8 is not the reference's: the coarse allowance, wider still.
  BackendCapabilities coarse = model_capabilities();
  coarse.fp8_reference_exact = false;
  const Expectation loose = judging_expectation(spec, {}, {}, &coarse);
  EXPECT_TRUE(script_would_pass(loose, got));
  EXPECT_GT(loose.bounds->bound("output").allowance.max().item<double>(),
            target.bounds->bound("output").allowance.max().item<double>());
}

TEST(RunCase, UnderEachRecipeHopperAccumulationPassesAndFp8FaultsStillFail) {
  // Linear -> GELU -> Linear: the first GEMM's accumulation error reaches the second
  // Linear's quantizer, so an element near an FP8 rounding boundary may round the other
  // way there (the windows take the term: set_fp8_windows).
  const std::vector<harness::RecipeSpec> recipes = {
      {"DelayedScaling", "HYBRID", {}},
      {"Float8CurrentScaling", "E4M3", {}},
      {"Float8BlockScaling", "E4M3", {}},
      {"Float8BlockScaling", "HYBRID", {{"block_scaling_dims", "1,1,1"}}}};
  HopperFp8Backend clean;
  HopperFp8Backend scaled(true, HopperFp8Backend::Fault::kGradInputTimes2ToTheMinus7);
  // A quarter too large: an FP8 scale off by a power of two's fraction, a format's spacing.
  HopperFp8Backend large(true, HopperFp8Backend::Fault::kOutputScaled, 1.25);
  for (const auto& recipe : recipes) {
    for (const std::string dtype : {"float32", "bfloat16"}) {
      for (const uint64_t seed : {11u, 12u}) {
        SCOPED_TRACE(recipe.name + " " + recipe.fp8_format + " " + dtype + " seed " + std::to_string(seed));
        const CaseSpec spec = fp8_chain(recipe, dtype, seed);
        const CaseResult pass = run_case(spec, clean, RunOptions{});
        EXPECT_EQ(pass.verdict, VerdictKind::kPass) << describe(pass);
        // The input gradient nearly gone: far outside its bound.
        const CaseResult small = run_case(spec, scaled, RunOptions{});
        EXPECT_TRUE(has_finding_on(small, "grad_input")) << describe(small);
        for (const Finding& f : small.findings) {
          if (f.tensor == "grad_input" && f.norm_bound > 0) {
            EXPECT_GT(f.norm_err, 3 * f.norm_bound) << describe(small);
          }
        }
        const CaseResult off = run_case(spec, large, RunOptions{});
        EXPECT_TRUE(has_finding_on(off, "output")) << describe(off);
      }
    }
  }
}

// ---- overlap (RunOptions::overlap): the evidence drawn while a remote backend runs the paths.

/// `inner` as it is: the test backends below change one thing of it.
class Wrapping : public Backend {
 public:
  explicit Wrapping(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  const BackendCapabilities& capabilities() override { return inner_.capabilities(); }
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths) override {
    return inner_.run_paths(spec, plan, tensors, paths);
  }

 private:
  Backend& inner_;
};

/// `inner`'s runs, with the first output scaled by `factor` (a planted error of any size).
class ScaledOutput final : public Wrapping {
 public:
  ScaledOutput(Backend& inner, double factor) : Wrapping(inner), factor_(factor) {}
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths) override {
    std::vector<PathRun> runs = Wrapping::run_paths(spec, plan, tensors, paths);
    for (PathRun& run : runs) {
      if (!run.outputs.empty() && run.outputs[0].defined()) run.outputs[0] = run.outputs[0] * factor_;
    }
    return runs;
  }

 private:
  double factor_;
};

/// `inner`'s runs, their answer held back for `polls` calls of ready(): the case draws that
/// many pieces of evidence ahead, as it does while TE runs the paths in the adapter.
class SlowAnswer final : public Wrapping {
 public:
  SlowAnswer(Backend& inner, int polls) : Wrapping(inner), polls_(polls) {}
  std::unique_ptr<backends::PendingPaths> start_paths(const CaseSpec& spec, const CasePlan& plan,
                                                      const CaseTensors& tensors,
                                                      const std::vector<PathRequest>& paths) override {
    ++started_;
    return std::make_unique<Held>(run_paths(spec, plan, tensors, paths), polls_);
  }
  int started() const { return started_; }

 private:
  class Held final : public backends::PendingPaths {
   public:
    Held(std::vector<PathRun> runs, int polls) : runs_(std::move(runs)), polls_(polls) {}
    bool ready() override { return polls_-- <= 0; }
    std::vector<PathRun> get() override { return std::move(runs_); }

   private:
    std::vector<PathRun> runs_;
    int polls_;
  };
  int polls_;
  int started_ = 0;
};

/// The counts of `cost` whose name ends in `what`, summed.
int64_t ending_in(const CaseCost& cost, const std::string& what) {
  int64_t n = 0;
  for (const auto& [name, count] : cost.counts) {
    if (name.size() >= what.size() && name.compare(name.size() - what.size(), what.size(), what) == 0) n += count;
  }
  return n;
}

TEST(RunCase, EvidenceDrawnAheadGivesTheSameResultsBitForBit) {
  // Quantizing cases (four recipes, with and without repeat calls: the coarse evidence) and
  // half-precision ones (output noise), clean and with errors from well outside to the edge
  // of their bounds, so that cases pass at the first check, after one or two evidence
  // rounds, or fail throughout; each judged with no overlap and with the answer held back
  // for 2, 5 and 1000 polls (the gathering, then the coarse evidence or a sample, then
  // everything drawn ahead: the gathering goes a reference evaluation at a time). The
  // results, serialized losslessly, must be identical.
  std::vector<std::pair<std::string, CaseSpec>> specs;
  const std::vector<harness::RecipeSpec> recipes = {
      {"DelayedScaling", "HYBRID", {}}, {"Float8CurrentScaling", "E4M3", {}}, {"Float8BlockScaling", "E4M3", {}}};
  for (const auto& recipe : recipes) {
    for (const std::string dtype : {"float32", "bfloat16"}) {
      CaseSpec spec = fp8_chain(recipe, dtype, 21);
      specs.emplace_back(recipe.name + " " + dtype, spec);
      spec.repeat_calls = {harness::RepeatCall{}};
      specs.emplace_back(recipe.name + " " + dtype + " repeat call", spec);
    }
  }
  HopperFp8Backend hopper;
  ModelBackend model;
  int64_t used[4] = {0, 0, 0, 0};
  int64_t partly = 0;
  RunOptions none;
  none.overlap = RunOptions::Overlap::kNone;
  RunOptions ahead;
  ahead.overlap = RunOptions::Overlap::kEvidence;
  ahead.overlap_piece_limit_s = 1e9;  // however loaded the machine
  auto check = [&](const std::string& what, const CaseSpec& spec, Backend& inner) {
    for (const double factor : {1.0, 1.004, 1.03, 1.25}) {
      ScaledOutput backend(inner, factor);
      const nlohmann::json expected = run_case(spec, backend, none);
      for (const int polls : {2, 5, 1000}) {
        SCOPED_TRACE(what + " x" + std::to_string(factor) + ", " + std::to_string(polls) + " polls");
        SlowAnswer slow(backend, polls);
        CaseCostRecorder recorder(true);
        const CaseResult got = run_case(spec, slow, ahead);
        const CaseCost cost = recorder.finish();
        EXPECT_EQ(nlohmann::json(got), expected);
        EXPECT_GE(slow.started(), 1);
        used[0] += ending_in(cost, "ahead_gathered_used");
        used[1] += ending_in(cost, "ahead_coarse_used");
        used[2] += ending_in(cost, "ahead_samples_used");
        used[3] += ending_in(cost, "ahead_gathered_in_part");
        const int64_t samples = ending_in(cost, "ahead_samples_used");
        if (samples > 0 && samples < 14) ++partly;
      }
    }
  };
  for (const auto& [what, spec] : specs) check(what, spec, hopper);
  for (const std::string dtype : {"bfloat16", "float16"}) {
    CaseSpec spec = linear_bias_relu(dtype);
    check("model " + dtype, spec, model);
    spec.repeat_calls = {harness::RepeatCall{}};
    check("model " + dtype + " repeat call", spec, model);
  }
  // Each kind of piece drawn ahead was taken by a case that needed it, some gatherings and
  // rounds in part (the rest drawn after the answer).
  EXPECT_GT(used[0], 0);
  EXPECT_GT(used[1], 0);
  EXPECT_GT(used[2], 0);
  EXPECT_GT(used[3], 0);
  EXPECT_GT(partly, 0);
}

TEST(RunCase, NothingIsDrawnAheadWhereTheBackendAnswersAtOnce) {
  // The model runs the paths when asked: the reference and the evidence run in their stages.
  const CaseSpec spec = fp8_chain({"Float8CurrentScaling", "E4M3", {}}, "bfloat16", 21);
  HopperFp8Backend scaled(true, HopperFp8Backend::Fault::kGradInputTimes2ToTheMinus7);
  CaseCostRecorder recorder(true);
  const CaseResult r = run_case(spec, scaled, RunOptions{});
  const CaseCost cost = recorder.finish();
  EXPECT_TRUE(has_finding_on(r, "grad_input")) << describe(r);
  EXPECT_EQ(ending_in(cost, "ahead_gathered"), 0);
  EXPECT_EQ(cost.seconds.count("paths/backend/overlap"), 0u);
  EXPECT_GT(cost.seconds.count("judge/evidence"), 0u);
  // Held back, the same case draws its evidence ahead; with Overlap::kReference only its
  // reference.
  SlowAnswer slow(scaled, 1000);
  RunOptions reference_only;
  reference_only.overlap = RunOptions::Overlap::kReference;
  CaseCostRecorder again(true);
  EXPECT_EQ(nlohmann::json(run_case(spec, slow, reference_only)), nlohmann::json(r));
  const CaseCost held = again.finish();
  EXPECT_EQ(ending_in(held, "ahead_gathered"), 0);
  EXPECT_GT(held.seconds.count("paths/backend/overlap"), 0u);
  EXPECT_EQ(held.seconds.count("reference"), 1u);
  // A case whose reference takes longer than a piece may overrun the answer by draws none.
  RunOptions costly;
  costly.overlap_piece_limit_s = 0;
  CaseCostRecorder third(true);
  EXPECT_EQ(nlohmann::json(run_case(spec, slow, costly)), nlohmann::json(r));
  const CaseCost limited = third.finish();
  EXPECT_EQ(ending_in(limited, "ahead_pieces"), 0);
  EXPECT_GT(limited.seconds.count("paths/backend/overlap"), 0u);
  // The same case with a limit above its reference's time draws its evidence ahead.
  RunOptions unlimited;
  unlimited.overlap_piece_limit_s = 1e9;
  CaseCostRecorder fourth(true);
  EXPECT_EQ(nlohmann::json(run_case(spec, slow, unlimited)), nlohmann::json(r));
  EXPECT_GT(ending_in(fourth.finish(), "ahead_gathered_used"), 0);
}

}  // namespace
}  // namespace gradfuzz::runner
