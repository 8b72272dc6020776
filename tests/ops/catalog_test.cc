// Every basic op of the catalog (ops/basic/*.h, created by name through OpRegistry): the
// fused-path forward and backward against the reference path with autograd, in float64.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "ops/basic/activations.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/moe.h"
#include "ops/errors.h"
#include "ops/op_registry.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::fused_matches_reference;
using testing::int_tensor;
using testing::kFloat64Tol;
using testing::make_generator;
using testing::make_op;
using testing::on_device;
using testing::PathResult;
using testing::run_fused;
using testing::run_reference;
using testing::seeded_randn;
using testing::test_options;

struct OpCase {
  std::string label;
  std::string name;
  OpAttrs attrs;
  int64_t rows;
  int64_t features;
};

std::ostream& operator<<(std::ostream& os, const OpCase& c) { return os << c.label; }

/// Split sizes with a zero-sized group in the middle whenever G >= 3.
std::vector<int64_t> splits_for(int64_t groups, int64_t rows) {
  std::vector<int64_t> sizes(groups, 0);
  for (int64_t r = 0; r < rows; ++r) sizes[(r % groups == 1 && groups >= 3) ? 0 : r % groups] += 1;
  return sizes;
}

/// One public extra input per slot, by the slot's kind: seeded floats that require grad,
/// split sizes that sum to rows, or a routing permutation.
std::vector<at::Tensor> extras_for(const OpSignature& sig, int64_t rows, at::Generator& gen) {
  std::vector<at::Tensor> extras;
  for (const SlotSpec& spec : sig.extra_inputs) {
    switch (spec.kind) {
      case TensorKind::kFloat:
        extras.push_back(seeded_randn(spec.shape, gen, at::kDouble, true, /*away_from_zero=*/true));
        break;
      case TensorKind::kSplitSizes:
        extras.push_back(int_tensor(splits_for(spec.shape.at(0), rows)));
        break;
      case TensorKind::kRoutingMap:
        // Drawn on the CPU generator, then moved: the same permutation on every device.
        extras.push_back(on_device(at::randperm(rows, gen, at::TensorOptions().dtype(at::kLong))));
        break;
    }
  }
  return extras;
}

class CatalogOp : public ::testing::TestWithParam<OpCase> {};

TEST_P(CatalogOp, FusedPathMatchesReferenceInFloat64) {
  const OpCase& c = GetParam();
  at::Generator gen = make_generator(101);
  BasicOpPtr op = make_op(c.name, c.attrs, {c.rows, c.features});
  const OpSignature sig = OpRegistry::catalog().signature(c.name, c.attrs, {c.rows, c.features});
  EXPECT_EQ(static_cast<int64_t>(sig.extra_inputs.size()), op->num_extra_inputs());
  EXPECT_EQ(static_cast<int64_t>(sig.extra_outputs.size()), op->num_extra_outputs());
  Sequential seq({op}, FusionRegistry{});
  // Inputs away from 0: ReLU/SReLU kinks would make the two paths' subgradients differ.
  const at::Tensor x = seeded_randn({c.rows, c.features}, gen, at::kDouble, true, /*away_from_zero=*/true);
  const std::vector<at::Tensor> extras = extras_for(sig, c.rows, gen);
  const PathResult expected = run_reference(seq, x, extras);
  const PathResult got = run_fused(seq, x, extras);
  ASSERT_EQ(got.outputs.size(), 1 + sig.extra_outputs.size());
  EXPECT_EQ(got.outputs[0].sizes(), at::IntArrayRef(sig.output_shape));
  for (size_t s = 0; s < sig.extra_outputs.size(); ++s) {
    EXPECT_EQ(got.outputs[1 + s].sizes(), at::IntArrayRef(sig.extra_outputs[s].shape)) << "extra output " << s;
    // Integer outputs (split sizes, routing maps) are not differentiable.
    EXPECT_EQ(sig.extra_outputs[s].kind == TensorKind::kFloat, got.outputs[1 + s].requires_grad()) << s;
  }
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol));
  // A differentiable input whose reference gradient is non-zero got one; integer inputs none.
  for (size_t s = 0; s < sig.extra_inputs.size(); ++s) {
    if (sig.extra_inputs[s].kind != TensorKind::kFloat) {
      EXPECT_FALSE(got.grad_extra_inputs[s].defined()) << "integer slot " << s << " got a gradient";
    }
  }
}

std::vector<OpCase> catalog_cases() {
  return {
      {"Linear", "Linear", {{"out", 3}}, 5, 4},
      {"Bias", "Bias", {}, 5, 4},
      {"ConstantScale", "ConstantScale", {{"scale", -1.25}}, 5, 4},
      {"ReLU", "ReLU", {}, 5, 4},
      {"GELU", "GELU", {}, 5, 4},
      {"SReLU", "SReLU", {}, 5, 4},
      {"SwiGLU", "SwiGLU", {}, 5, 6},
      {"ScaledSwiGLU", "ScaledSwiGLU", {}, 5, 6},
      {"ScaledSwiGLUInterleave2", "ScaledSwiGLU", {{"interleave", 2}}, 5, 8},
      {"ScaledSReLU", "ScaledSReLU", {}, 5, 4},
      {"MakeExtraOutput", "MakeExtraOutput", {}, 5, 4},
      {"MakeExtraOutputInPlace", "MakeExtraOutput", {{"in_place", 1}}, 5, 4},
      {"AddExtraInput", "AddExtraInput", {}, 5, 4},
      {"AddExtraInputInPlace", "AddExtraInput", {{"in_place", 1}}, 5, 4},
      {"GroupedLinear", "GroupedLinear", {{"groups", 3}, {"out", 2}}, 7, 4},
      {"GroupedLinearNoBias", "GroupedLinear", {{"groups", 2}, {"out", 3}, {"bias", 0}}, 6, 4},
      {"GroupedLinearScaleBias", "GroupedLinear", {{"groups", 3}, {"out", 2}, {"scale_bias", 1}}, 7, 4},
      {"GroupedLinearOneGroup", "GroupedLinear", {{"groups", 1}, {"out", 2}}, 3, 4},
      {"RMSNorm", "RMSNorm", {}, 5, 4},
      {"LayerNorm", "LayerNorm", {{"eps", 1e-3}}, 5, 4},
      {"Dispatch", "Dispatch", {{"groups", 3}}, 7, 4},
      {"Combine", "Combine", {}, 6, 3},
      {"RowStat", "RowStat", {}, 5, 4},
      {"DualExtraOutput", "DualExtraOutput", {{"s0", 0.25}, {"s1", 2.0}}, 5, 4},
      {"Identity", "Identity", {}, 5, 4},
      {"Reshape", "Reshape", {{"features", 2}}, 5, 4},
  };
}

INSTANTIATE_TEST_SUITE_P(EveryBasicOp, CatalogOp, ::testing::ValuesIn(catalog_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& p) { return p.param.label; });

TEST(Catalog, EveryOpOfTheSpecIsRegisteredAndCovered) {
  const std::vector<std::string> names = OpRegistry::catalog().names();
  for (const char* expected :
       {"Linear", "Bias", "ConstantScale", "ReLU", "GELU", "SReLU", "SwiGLU", "ScaledSwiGLU", "ScaledSReLU",
        "MakeExtraOutput", "AddExtraInput", "GroupedLinear", "RMSNorm", "LayerNorm", "Dispatch", "Combine", "RowStat",
        "DualExtraOutput", "Identity", "Reshape"}) {
    EXPECT_THAT(names, ::testing::Contains(std::string(expected)));
  }
  // Every registered op has a case above.
  const std::vector<OpCase> cases = catalog_cases();
  for (const std::string& name : names) {
    EXPECT_TRUE(std::any_of(cases.begin(), cases.end(), [&](const OpCase& c) { return c.name == name; }))
        << name << " has no catalog test case";
  }
}

TEST(Catalog, UnknownOpThrowsAndListsKnownOps) {
  try {
    make_op("Linaer", {}, {2, 2});
    FAIL() << "unknown op accepted";
  } catch (const UnknownNameError& e) {
    EXPECT_THAT(e.what(), StartsWith("unknown-name"));
    EXPECT_THAT(e.what(), HasSubstr("'Linaer'"));
    EXPECT_THAT(e.what(), HasSubstr("GroupedLinear"));
  }
}

TEST(Catalog, UnknownAttrThrowsAndListsTheOpsAttrs) {
  try {
    make_op("GroupedLinear", {{"gruops", 2}}, {4, 4});
    FAIL() << "unknown attr accepted";
  } catch (const UnknownNameError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'gruops'"));
    EXPECT_THAT(e.what(), HasSubstr("scale_bias"));
  }
}

TEST(Catalog, ParametersAreDeterministicAndNonZero) {
  BasicOpPtr a = make_op("Bias", {}, {3, 5});
  BasicOpPtr b = make_op("Bias", {}, {3, 5});
  EXPECT_TRUE(a->parameters()[0].equal(b->parameters()[0]));
  EXPECT_EQ(at::count_nonzero(a->parameters()[0]).item<int64_t>(), 5);  // a zero bias hides routing bugs
}

TEST(GroupedLinearOp, SplitSizesThatDoNotSumToRowsThrowClearError) {
  BasicOpPtr op = make_op("GroupedLinear", {{"groups", 2}, {"out", 3}}, {12, 4});
  const at::Tensor x = at::ones({12, 4}, test_options());
  try {
    (*op)(x, {int_tensor({4, 6})});
    FAIL() << "split sizes summing to 10 for 12 rows accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), StartsWith("invalid-argument"));
    EXPECT_THAT(e.what(), HasSubstr("GroupedLinear slot 0: split sizes must sum to rows=12, got 10"));
  }
  EXPECT_THROW((*op)(x, {int_tensor({12})}), InvalidArgumentError);        // numel != G
  EXPECT_THROW((*op)(x, {int_tensor({13, -1})}), InvalidArgumentError);    // negative entry
  EXPECT_THROW((*op)(x, {at::ones({2}, test_options())}), InvalidArgumentError);  // not integer
  // The reference path validates the same way.
  Sequential seq({op}, FusionRegistry{});
  ReferenceEvaluator ref(seq);
  EXPECT_THROW(ref.forward(x, {int_tensor({4, 6})}), InvalidArgumentError);
}

TEST(GroupedLinearOp, ZeroSizedGroupsGetZeroWeightGradients) {
  at::Generator gen = make_generator(103);
  BasicOpPtr op = make_op("GroupedLinear", {{"groups", 4}, {"out", 2}}, {5, 3});
  Sequential seq({op}, FusionRegistry{});
  const at::Tensor x = seeded_randn({5, 3}, gen, at::kDouble, true);
  const std::vector<at::Tensor> extras{int_tensor({0, 5, 0, 0})};
  const PathResult expected = run_reference(seq, x, extras);
  const PathResult got = run_fused(seq, x, extras);
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol));
  const at::Tensor gw = got.grad_params[0][0];
  ASSERT_TRUE(gw.defined());
  EXPECT_EQ(at::count_nonzero(gw[0]).item<int64_t>(), 0);
  EXPECT_GT(at::count_nonzero(gw[1]).item<int64_t>(), 0);
}

TEST(GroupedLinearOp, AllRowsInZeroGroupsIsEmptyInput) {
  BasicOpPtr op = make_op("GroupedLinear", {{"groups", 2}, {"out", 2}}, {1, 3});
  // Zero rows is allowed by the op (not the catalog factory): sizes {0, 0}.
  const at::Tensor x = at::zeros({0, 3}, test_options());
  const std::vector<at::Tensor> out = (*op)(x, {int_tensor({0, 0})});
  EXPECT_EQ(out[0].sizes(), (std::vector<int64_t>{0, 2}));
}

/// Dispatch -> GroupedLinear(split sizes bound) -> ScaledSwiGLU(probs bound) -> GroupedLinear
/// -> Combine(map bound): integer channels travel like any tensor and never get gradients.
TEST(MoeChain, IntegerChannelsRouteAndNeverGetGradients) {
  at::Generator gen = make_generator(107);
  const int64_t rows = 9, features = 4, groups = 3;
  auto dispatch = std::make_shared<Dispatch>(groups);
  dispatch->set_extra_output_channel(0, "splits", false)
      .set_extra_output_channel(1, "probs", false)
      .set_extra_output_channel(2, "map", false);
  BasicOpPtr fc1 = make_op("GroupedLinear", {{"groups", groups}, {"out", 6}}, {rows, features});
  fc1->set_extra_input_channel(0, "splits");
  BasicOpPtr act = make_op("ScaledSwiGLU", {}, {rows, 6});
  act->set_extra_input_channel(0, "probs");
  BasicOpPtr fc2 = make_op("GroupedLinear", {{"groups", groups}, {"out", features}}, {rows, 3});
  fc2->set_extra_input_channel(0, "splits");
  BasicOpPtr combine = make_op("Combine", {}, {rows, features});
  combine->set_extra_input_channel(0, "map");
  Sequential seq({dispatch, fc1, act, fc2, combine}, FusionRegistry{});
  const at::Tensor x = seeded_randn({rows, features}, gen, at::kDouble, true);
  const at::Tensor logits = seeded_randn({rows, groups}, gen, at::kDouble, true);
  const PathResult expected = run_reference(seq, x, {logits});
  const PathResult got = run_fused(seq, x, {logits});
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol));
  const auto trace = seq.fusers()[0]->last_trace();
  EXPECT_EQ(trace->channel_values.at("splits").scalar_type(), at::kLong);
  EXPECT_EQ(trace->channel_values.at("map").scalar_type(), at::kLong);
  EXPECT_EQ(trace->channel_grads.count("splits"), 0u);
  EXPECT_EQ(trace->channel_grads.count("map"), 0u);
  EXPECT_EQ(trace->channel_grads.count("probs"), 1u);
  EXPECT_EQ(expected.channel_grads[0].count("splits"), 0u);
}

}  // namespace
}  // namespace gradfuzz::ops
