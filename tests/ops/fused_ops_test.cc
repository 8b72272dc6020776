// Every fusion of the catalog (ops/fused/fused_ops.h): it fires on its pattern (asserted on
// the fuser's trace) and matches both the unfused path and the reference, in float64 and
// float32.

#include "ops/fused/fused_ops.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "ops/basic/channel_ops.h"
#include "ops/basic/grouped_linear.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fusion_registry.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using testing::find_entry;
using testing::int_tensor;
using testing::kFloat64Tol;
using testing::make_generator;
using testing::make_op;
using testing::PathResult;
using testing::run_fused;
using testing::run_reference;
using testing::seeded_randn;
using testing::SplitSource;
using testing::tolerance_for;

/// The ops and data of one pattern instance.
struct Built {
  std::vector<BasicOpPtr> ops;
  at::Tensor x;
  std::vector<at::Tensor> extras;
};

using Builder = std::function<Built(at::ScalarType, at::Generator&)>;

struct FusionCase {
  std::string label;
  std::string fusion;  // registration name, also the fused op's name
  FusionPass pass;
  int64_t begin;
  int64_t end;
  Builder build;
};

std::ostream& operator<<(std::ostream& os, const FusionCase& c) { return os << c.label; }

BasicOpPtr op(const std::string& name, const OpAttrs& attrs, int64_t rows, int64_t features, at::ScalarType dtype) {
  return make_op(name, attrs, {rows, features}, dtype);
}

BasicOpPtr bind_out(BasicOpPtr o, const std::string& channel, bool to_caller = false) {
  o->set_extra_output_channel(0, channel, to_caller);
  return o;
}

BasicOpPtr bind_in(BasicOpPtr o, int64_t slot, const std::string& channel) {
  o->set_extra_input_channel(slot, channel);
  return o;
}

at::Tensor input(at::Generator& gen, int64_t rows, int64_t features, at::ScalarType dtype) {
  // Away from 0 so activation kinks cannot split the paths.
  return seeded_randn({rows, features}, gen, dtype, true, /*away_from_zero=*/true);
}

Builder linear_bias_act(const std::string& act) {
  return [act](at::ScalarType dt, at::Generator& gen) {
    Built b{{op("Linear", {{"out", 6}}, 5, 4, dt), op("Bias", {}, 5, 6, dt)}, input(gen, 5, 4, dt), {}};
    if (!act.empty()) b.ops.push_back(op(act, {}, 5, 6, dt));
    return b;
  };
}

Builder linear_bias_add(bool bias) {
  return [bias](at::ScalarType dt, at::Generator& gen) {
    Built b{{op("Linear", {{"out", 3}}, 5, 4, dt)}, input(gen, 5, 4, dt), {}};
    if (bias) b.ops.push_back(op("Bias", {}, 5, 3, dt));
    b.ops.push_back(op("AddExtraInput", {}, 5, 3, dt));
    b.extras.push_back(seeded_randn({5, 3}, gen, dt, true));
    return b;
  };
}

Built linear_scale_add(at::ScalarType dt, at::Generator& gen) {
  return {{op("Linear", {{"out", 3}}, 5, 4, dt), op("ConstantScale", {{"scale", 0.75}}, 5, 3, dt),
           op("AddExtraInput", {}, 5, 3, dt)},
          input(gen, 5, 4, dt),
          {seeded_randn({5, 3}, gen, dt, true)}};
}

Built make_extra_linear(at::ScalarType dt, at::Generator& gen) {
  // The extra output feeds a later consumer, so its gradient holds a channel gradient.
  return {{bind_out(op("MakeExtraOutput", {}, 5, 4, dt), "r"), op("Linear", {{"out", 4}}, 5, 4, dt),
           bind_in(op("AddExtraInput", {}, 5, 4, dt), 0, "r")},
          input(gen, 5, 4, dt),
          {}};
}

Built linear_scale(at::ScalarType dt, at::Generator& gen) {
  return {{op("Linear", {{"out", 3}}, 5, 4, dt), op("ConstantScale", {{"scale", -2.0}}, 5, 3, dt)},
          input(gen, 5, 4, dt),
          {}};
}

Builder activation_bias(const std::string& act) {
  return [act](at::ScalarType dt, at::Generator& gen) {
    return Built{{op("Linear", {{"out", 6}}, 5, 4, dt), op("Bias", {}, 5, 6, dt), op(act, {}, 5, 6, dt)},
                 input(gen, 5, 4, dt),
                 {}};
  };
}

/// MakeExtraOutput, RMSNorm (zero-centred gamma when `zero_centered`), and with a bound
/// extra output an AddExtraInput reading it.
Builder add_rmsnorm(bool public_extra, bool zero_centered = false) {
  return [public_extra, zero_centered](at::ScalarType dt, at::Generator& gen) {
    const OpAttrs norm_attrs{{"zero_centered_gamma", zero_centered ? 1.0 : 0.0}};
    if (public_extra) {
      // Unbound: the extra output's gradient comes from the caller alone.
      return Built{
          {op("MakeExtraOutput", {}, 5, 4, dt), op("RMSNorm", norm_attrs, 5, 4, dt)}, input(gen, 5, 4, dt), {}};
    }
    return Built{{bind_out(op("MakeExtraOutput", {}, 5, 4, dt), "r"), op("RMSNorm", norm_attrs, 5, 4, dt),
                  bind_in(op("AddExtraInput", {}, 5, 4, dt), 0, "r")},
                 input(gen, 5, 4, dt),
                 {}};
  };
}

/// SplitSource, GroupedLinear, `act` (ScaledSwiGLU with `interleave`), GroupedLinear.
Builder grouped_mlp(const std::string& act, bool fc2_scale_bias, int64_t interleave = 0) {
  return [act, fc2_scale_bias, interleave](at::ScalarType dt, at::Generator& gen) {
    const int64_t rows = 7, features = 4, hidden = 3, groups = 3;
    auto source = std::make_shared<SplitSource>(std::vector<int64_t>{3, 0, 4});
    source->set_extra_output_channel(0, "splits", false);
    const int64_t fc1_out = act == "ScaledSwiGLU" ? 2 * hidden : hidden;
    BasicOpPtr fc1 =
        bind_in(op("GroupedLinear", {{"groups", groups}, {"out", fc1_out}}, rows, features, dt), 0, "splits");
    const OpAttrs act_attrs =
        act == "ScaledSwiGLU" ? OpAttrs{{"interleave", static_cast<double>(interleave)}} : OpAttrs{};
    BasicOpPtr activation = op(act, act_attrs, rows, fc1_out, dt);
    BasicOpPtr fc2 =
        bind_in(op("GroupedLinear", {{"groups", groups}, {"out", features}, {"scale_bias", fc2_scale_bias ? 1.0 : 0.0}},
                   rows, hidden, dt),
                0, "splits");
    Built b{{source, fc1, activation, fc2}, input(gen, rows, features, dt), {}};
    b.extras.push_back(seeded_randn({rows}, gen, dt, true));                      // activation scales
    if (fc2_scale_bias) b.extras.push_back(seeded_randn({rows}, gen, dt, true));  // fc2 bias scales
    return b;
  };
}

Builder residual(bool public_channel) {
  return [public_channel](at::ScalarType dt, at::Generator& gen) {
    return Built{{bind_out(op("MakeExtraOutput", {}, 5, 4, dt), "res", public_channel),
                  op("Linear", {{"out", 4}}, 5, 4, dt), bind_in(op("AddExtraInput", {}, 5, 4, dt), 0, "res")},
                 input(gen, 5, 4, dt),
                 {}};
  };
}

std::vector<FusionCase> fusion_cases() {
  return {
      {"LinearBiasGELU", "ForwardLinearBiasActivation", FusionPass::kForward, 0, 3, linear_bias_act("GELU")},
      {"LinearBiasReLU", "ForwardLinearBiasActivation", FusionPass::kForward, 0, 3, linear_bias_act("ReLU")},
      {"LinearBias", "ForwardLinearBiasActivation", FusionPass::kForward, 0, 2, linear_bias_act("")},
      {"LinearBiasAdd", "ForwardLinearBiasAdd", FusionPass::kForward, 0, 3, linear_bias_add(true)},
      {"LinearAdd", "ForwardLinearBiasAdd", FusionPass::kForward, 0, 2, linear_bias_add(false)},
      {"LinearScaleAdd", "ForwardLinearScaleAdd", FusionPass::kForward, 0, 3, linear_scale_add},
      {"MakeExtraOutputLinear", "BackwardLinearAdd", FusionPass::kBackward, 0, 2, make_extra_linear},
      {"LinearScale", "BackwardLinearScale", FusionPass::kBackward, 0, 2, linear_scale},
      {"BiasReLU", "BackwardActivationBias", FusionPass::kBackward, 1, 3, activation_bias("ReLU")},
      {"BiasGELU", "BackwardActivationBias", FusionPass::kBackward, 1, 3, activation_bias("GELU")},
      {"AddRMSNormBound", "BackwardAddRMSNorm", FusionPass::kBackward, 0, 2, add_rmsnorm(false)},
      {"AddRMSNormPublic", "BackwardAddRMSNorm", FusionPass::kBackward, 0, 2, add_rmsnorm(true)},
      {"AddRMSNormZeroCenteredGammaBound", "BackwardAddRMSNorm", FusionPass::kBackward, 0, 2, add_rmsnorm(false, true)},
      {"AddRMSNormZeroCenteredGammaPublic", "BackwardAddRMSNorm", FusionPass::kBackward, 0, 2, add_rmsnorm(true, true)},
      {"GroupedMLPSwiGLU", "GroupedMLP", FusionPass::kJoint, 1, 4, grouped_mlp("ScaledSwiGLU", false)},
      {"GroupedMLPSReLU", "GroupedMLP", FusionPass::kJoint, 1, 4, grouped_mlp("ScaledSReLU", false)},
      {"GroupedMLPScaleBias", "GroupedMLP", FusionPass::kJoint, 1, 4, grouped_mlp("ScaledSwiGLU", true)},
      {"GroupedMLPSwiGLUInterleave1", "GroupedMLP", FusionPass::kJoint, 1, 4, grouped_mlp("ScaledSwiGLU", false, 1)},
      {"ResidualForward", "FusedResidual.forward", FusionPass::kForward, 0, 3, residual(false)},
      {"ResidualBackward", "FusedResidual.backward", FusionPass::kBackward, 0, 3, residual(false)},
      {"ResidualJoint", "FusedResidual.joint", FusionPass::kJoint, 0, 3, residual(false)},
      {"ResidualJointPublicChannel", "FusedResidual.joint", FusionPass::kJoint, 0, 3, residual(true)},
      {"ResidualBackwardPublicChannel", "FusedResidual.backward", FusionPass::kBackward, 0, 3, residual(true)},
  };
}

/// Whether the plans of the last call show `c` fired (and only in its passes).
::testing::AssertionResult fired(const FuserTrace& trace, const FusionCase& c) {
  const bool in_forward = c.pass != FusionPass::kBackward;
  const bool in_backward = c.pass != FusionPass::kForward;
  for (const auto& [plan, wanted, label] : {std::make_tuple(&trace.forward_plan, in_forward, "forward"),
                                            std::make_tuple(&trace.backward_plan, in_backward, "backward")}) {
    const PlanEntry* entry = find_entry(*plan, c.fusion);
    if (wanted && (!entry || entry->begin != c.begin || entry->end != c.end || !entry->fused)) {
      return ::testing::AssertionFailure()
             << c.fusion << " did not fire over [" << c.begin << ", " << c.end << ") in the " << label << " plan";
    }
    if (!wanted && entry) return ::testing::AssertionFailure() << c.fusion << " appeared in the " << label << " plan";
  }
  return ::testing::AssertionSuccess();
}

class CatalogFusion : public ::testing::TestWithParam<std::tuple<FusionCase, at::ScalarType>> {};

TEST_P(CatalogFusion, FiresAndMatchesUnfusedPathAndReference) {
  const auto& [c, dtype] = GetParam();
  at::Generator gen = make_generator(211);
  const Built b = c.build(dtype, gen);
  Sequential fused(std::vector<Module>(b.ops.begin(), b.ops.end()), FusionRegistry::catalog().only({c.fusion}));
  Sequential unfused(std::vector<Module>(b.ops.begin(), b.ops.end()), FusionRegistry{});
  const testing::Tolerance tol = tolerance_for(dtype);

  const PathResult expected = run_reference(fused, b.x, b.extras);
  const PathResult got = run_fused(fused, b.x, b.extras);
  ASSERT_TRUE(fused.fusers()[0]->last_trace()->backward_ran);
  EXPECT_TRUE(fired(*fused.fusers()[0]->last_trace(), c));
  const PathResult plain = run_fused(unfused, b.x, b.extras);
  for (const PlanEntry& entry : unfused.fusers()[0]->last_trace()->forward_plan) EXPECT_FALSE(entry.fused);

  EXPECT_TRUE(testing::results_close(got, expected, tol)) << "fused vs reference";
  EXPECT_TRUE(testing::results_close(plain, expected, tol)) << "unfused vs reference";
  // Fused and unfused run the same dtype: compare them directly, float64-tight or float32 defaults.
  EXPECT_TRUE(testing::results_close(got, plain, tol)) << "fused vs unfused";
  EXPECT_EQ(got.outputs[0].scalar_type(), dtype);
}

INSTANTIATE_TEST_SUITE_P(EveryFusion, CatalogFusion,
                         ::testing::Combine(::testing::ValuesIn(fusion_cases()),
                                            ::testing::Values(at::kDouble, at::kFloat)),
                         [](const ::testing::TestParamInfo<std::tuple<FusionCase, at::ScalarType>>& p) {
                           return std::get<0>(p.param).label +
                                  (std::get<1>(p.param) == at::kDouble ? "_float64" : "_float32");
                         });

TEST(CatalogFusions, EveryRegisteredFusionHasACase) {
  const std::vector<FusionCase> cases = fusion_cases();
  for (const std::string& name : FusionRegistry::catalog().names()) {
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [&](const FusionCase& c) { return c.fusion == name; })) << name;
  }
}

TEST(CatalogFusions, BackwardFusionDeclinesWhenTheInputNeedsNoGradientAndParamsAreFrozen) {
  at::Generator gen = make_generator(223);
  Built b = linear_scale(at::kDouble, gen);
  b.ops[0]->parameters()[0].requires_grad_(false);
  Sequential seq(std::vector<Module>(b.ops.begin(), b.ops.end()),
                 FusionRegistry::catalog().only({"BackwardLinearScale"}));
  seq.forward(b.x.detach(), {});
  EXPECT_EQ(find_entry(seq.fusers()[0]->last_trace()->backward_plan, "BackwardLinearScale"), nullptr);
  b.ops[0]->parameters()[0].requires_grad_(true);
}

TEST(CatalogFusions, GroupedMLPDeclinesWhenTheLinearsReadDifferentSplitChannels) {
  at::Generator gen = make_generator(227);
  const int64_t rows = 4;
  auto s1 = std::make_shared<SplitSource>(std::vector<int64_t>{2, 2});
  s1->set_extra_output_channel(0, "a", false);
  auto s2 = std::make_shared<SplitSource>(std::vector<int64_t>{1, 3});
  s2->set_extra_output_channel(0, "b", false);
  BasicOpPtr fc1 = bind_in(op("GroupedLinear", {{"groups", 2}, {"out", 6}}, rows, 4, at::kDouble), 0, "a");
  BasicOpPtr act = op("ScaledSwiGLU", {}, rows, 6, at::kDouble);
  BasicOpPtr fc2 = bind_in(op("GroupedLinear", {{"groups", 2}, {"out", 4}}, rows, 3, at::kDouble), 0, "b");
  Sequential seq({s1, s2, fc1, act, fc2}, FusionRegistry::catalog().only({"GroupedMLP"}));
  const at::Tensor x = input(gen, rows, 4, at::kDouble);
  const at::Tensor scales = seeded_randn({rows}, gen, at::kDouble, true);
  EXPECT_TRUE(testing::fused_matches_reference(seq, x, {scales}, kFloat64Tol));
  EXPECT_EQ(find_entry(seq.fusers()[0]->last_trace()->forward_plan, "GroupedMLP"), nullptr);
}

// ---- TE's options on the fused ops --------------------------------------------------------

TEST(BackwardAddRMSNormZeroCenteredGamma, FiresAndMatchesFiniteDifferencesInFloat64) {
  for (bool public_extra : {false, true}) {
    at::Generator gen = make_generator(239);
    const Built b = add_rmsnorm(public_extra, /*zero_centered=*/true)(at::kDouble, gen);
    Sequential seq(std::vector<Module>(b.ops.begin(), b.ops.end()),
                   FusionRegistry::catalog().only({"BackwardAddRMSNorm"}));
    const PathResult got = run_fused(seq, b.x, b.extras);
    const PlanEntry* entry = find_entry(seq.fusers()[0]->last_trace()->backward_plan, "BackwardAddRMSNorm");
    ASSERT_NE(entry, nullptr) << "public_extra=" << public_extra;
    EXPECT_TRUE(entry->fused);
    // Central differences, step 1e-6: truncation ~1e-12, rounding ~1e-9 for these O(10) losses.
    EXPECT_TRUE(testing::gradients_match_finite_differences(seq, b.x, b.extras, got, 1e-6, {1e-6, 1e-6}))
        << "public_extra=" << public_extra;
  }
}

TEST(BackwardAddRMSNormZeroCenteredGamma, DiffersFromTheDirectFormWithTheSameStoredGamma) {
  // Guards the test above against a fused op that ignores the option: with the same stored
  // gamma, the two forms must give different input gradients.
  at::Generator gen_a = make_generator(241);
  at::Generator gen_b = make_generator(241);
  const Built zero_centered = add_rmsnorm(true, true)(at::kDouble, gen_a);
  const Built direct = add_rmsnorm(true, false)(at::kDouble, gen_b);
  {
    at::NoGradGuard no_grad;
    direct.ops[1]->parameters()[0].copy_(zero_centered.ops[1]->parameters()[0]);
  }
  auto fused_grad = [](const Built& b) {
    Sequential seq(std::vector<Module>(b.ops.begin(), b.ops.end()),
                   FusionRegistry::catalog().only({"BackwardAddRMSNorm"}));
    return run_fused(seq, b.x, b.extras).grad_input;
  };
  EXPECT_FALSE(at::allclose(fused_grad(zero_centered), fused_grad(direct)));
}

// ---- FusedResidual and the same-fusion rule (finding 4) -------------------------------------

void expect_residual(const std::string& fusion, bool breaks_under_fault) {
  at::Generator gen = make_generator(229);
  const Built b = residual(false)(at::kDouble, gen);
  Sequential seq(std::vector<Module>(b.ops.begin(), b.ops.end()), FusionRegistry::catalog().only({fusion}));
  {
    FaultScope fault(Fault::kSameFusionGradDrop);
    const bool matches = testing::fused_matches_reference(seq, b.x, b.extras, kFloat64Tol);
    EXPECT_EQ(static_cast<bool>(matches), !breaks_under_fault) << fusion;
  }
  EXPECT_TRUE(testing::fused_matches_reference(seq, b.x, b.extras, kFloat64Tol));
}

TEST(FusedResidual, SameFusionGradDropFaultBreaksTheBackwardFusion) { expect_residual("FusedResidual.backward", true); }

TEST(FusedResidual, SameFusionGradDropFaultBreaksTheJointFusion) { expect_residual("FusedResidual.joint", true); }

TEST(FusedResidual, SameFusionGradDropFaultLeavesTheForwardOnlyFusionCorrect) {
  expect_residual("FusedResidual.forward", false);
}

TEST(FusedResidual, TracesTheOwnedChannelGradient) {
  at::Generator gen = make_generator(233);
  const Built b = residual(false)(at::kDouble, gen);
  Sequential seq(std::vector<Module>(b.ops.begin(), b.ops.end()),
                 FusionRegistry::catalog().only({"FusedResidual.joint"}));
  const PathResult expected = run_reference(seq, b.x, b.extras);
  const PathResult got = run_fused(seq, b.x, b.extras);
  ASSERT_EQ(got.channel_grads[0].count("res"), 1u);
  EXPECT_TRUE(
      testing::tensors_close(got.channel_grads[0].at("res"), expected.channel_grads[0].at("res"), kFloat64Tol, "res"));
}

}  // namespace
}  // namespace gradfuzz::ops
