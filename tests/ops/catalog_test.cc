// Every basic op of the catalog (ops/basic/*.h, created by name through OpRegistry): the
// fused-path forward and backward against the reference path with autograd, in float64.

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "ops/basic/activations.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/moe.h"
#include "ops/basic/norms.h"
#include "ops/errors.h"
#include "ops/op_registry.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using testing::fused_matches_reference;
using ::testing::HasSubstr;
using testing::int_tensor;
using testing::kFloat64Tol;
using testing::make_generator;
using testing::make_op;
using testing::on_device;
using testing::PathResult;
using testing::run_fused;
using testing::run_reference;
using testing::seeded_randn;
using ::testing::StartsWith;
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
      // The collectives: the identity on the unsharded tensors the model holds.
      {"AllGather", "AllGather", {}, 5, 4},
      {"ReduceScatter", "ReduceScatter", {}, 6, 4},
      {"AllReduce", "AllReduce", {}, 5, 4},
      {"LinearColumnParallel", "Linear", {{"out", 4}, {"tensor_parallel_mode", 1}, {"sequence_parallel", 1}}, 6, 4},
      {"LinearRowParallel", "Linear", {{"out", 3}, {"tensor_parallel_mode", 2}}, 5, 4},
      {"BiasTensorParallel", "Bias", {{"tensor_parallel", 1}}, 5, 4},
  };
}

INSTANTIATE_TEST_SUITE_P(EveryBasicOp, CatalogOp, ::testing::ValuesIn(catalog_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& p) { return p.param.label; });

TEST(Catalog, EveryOpOfTheSpecIsRegisteredAndCovered) {
  const std::vector<std::string> names = OpRegistry::catalog().names();
  for (const char* expected : {"Linear",        "Bias",          "ConstantScale",   "ReLU",        "GELU",
                               "SReLU",         "SwiGLU",        "ScaledSwiGLU",    "ScaledSReLU", "MakeExtraOutput",
                               "AddExtraInput", "GroupedLinear", "RMSNorm",         "LayerNorm",   "Dispatch",
                               "Combine",       "RowStat",       "DualExtraOutput", "Identity",    "Reshape"}) {
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
  EXPECT_THROW((*op)(x, {int_tensor({12})}), InvalidArgumentError);               // numel != G
  EXPECT_THROW((*op)(x, {int_tensor({13, -1})}), InvalidArgumentError);           // negative entry
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

// ---- TE's options (te-backend.md: where TE's math differs, the catalog gains the option) -----

/// Central differences of a float64 loss: step 1e-6 leaves a truncation error ~1e-12 and a
/// rounding error ~1e-16·|L|/1e-6 ~ 1e-9 for the O(10) losses here, far inside 1e-6.
constexpr double kFiniteDifferenceStep = 1e-6;
constexpr testing::Tolerance kFiniteDifferenceTol{1e-6, 1e-6};

class CatalogTEMathOption : public ::testing::TestWithParam<OpCase> {};

TEST_P(CatalogTEMathOption, FusedPathMatchesReferenceAndFiniteDifferencesInFloat64) {
  const OpCase& c = GetParam();
  at::Generator gen = make_generator(113);
  BasicOpPtr op = make_op(c.name, c.attrs, {c.rows, c.features});
  Sequential seq({op}, FusionRegistry{});
  const at::Tensor x = seeded_randn({c.rows, c.features}, gen, at::kDouble, true, /*away_from_zero=*/true);
  const PathResult expected = run_reference(seq, x, {});
  const PathResult got = run_fused(seq, x, {});
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol)) << "fused vs reference";
  EXPECT_TRUE(
      testing::gradients_match_finite_differences(seq, x, {}, got, kFiniteDifferenceStep, kFiniteDifferenceTol));
}

INSTANTIATE_TEST_SUITE_P(
    NewMathOptions, CatalogTEMathOption,
    ::testing::Values(
        OpCase{"SwiGLUInterleave1", "SwiGLU", {{"interleave", 1}}, 5, 6},
        OpCase{"SwiGLUInterleave2", "SwiGLU", {{"interleave", 2}}, 5, 8},
        OpCase{"SwiGLUInterleave2ThreeBlocks", "SwiGLU", {{"interleave", 2}}, 4, 12},
        OpCase{"RMSNormZeroCenteredGamma", "RMSNorm", {{"zero_centered_gamma", 1}}, 5, 6},
        OpCase{"LayerNormZeroCenteredGamma", "LayerNorm", {{"zero_centered_gamma", 1}, {"eps", 1e-3}}, 5, 6}),
    [](const ::testing::TestParamInfo<OpCase>& p) { return p.param.label; });

/// Runs `op` alone through the fused path on `x` (which requires grad), cotangent seed 77.
PathResult run_alone(const BasicOpPtr& op, const at::Tensor& x, const std::vector<at::Tensor>& extras = {}) {
  Sequential seq({op}, FusionRegistry{});
  return run_fused(seq, x, extras);
}

/// TE's definition (rmsnorm.py, layer_norm.py): with zero_centered_gamma the scale is 1 + w and
/// dL/dw = dL/dγ, so the zero-centred op with w equals the direct op with γ = w + 1, for the
/// fused path and for the reference alike.
void expect_zero_centered_equals_direct_form(const std::string& name) {
  at::Generator gen = make_generator(127);
  BasicOpPtr zero_centered = make_op(name, {{"zero_centered_gamma", 1}}, {5, 6});
  BasicOpPtr direct = make_op(name, {}, {5, 6});
  const at::Tensor w = zero_centered->parameters()[0];
  // Both forms start as the same function; the stored parameter is not the same.
  EXPECT_TRUE(at::allclose(w + 1, direct->parameters()[0])) << name;
  EXPECT_GT(at::count_nonzero(w).item<int64_t>(), 0);
  {
    // Another w, so the check does not lean on the initial values.
    at::NoGradGuard no_grad;
    w.add_(seeded_randn({6}, gen, at::kDouble) * 0.3);
    direct->parameters()[0].copy_(w + 1);
  }
  const at::Tensor x = seeded_randn({5, 6}, gen, at::kDouble, true);
  const PathResult got_zero_centered = run_alone(zero_centered, x);
  const PathResult got_direct = run_alone(direct, x);
  EXPECT_TRUE(testing::results_close(got_zero_centered, got_direct, kFloat64Tol)) << name << " fused";
  Sequential seq_zero_centered({zero_centered}, FusionRegistry{});
  Sequential seq_direct({direct}, FusionRegistry{});
  EXPECT_TRUE(
      testing::results_close(run_reference(seq_zero_centered, x, {}), run_reference(seq_direct, x, {}), kFloat64Tol))
      << name << " reference";
}

TEST(CatalogZeroCenteredGamma, RMSNormWithWEqualsTheDirectFormWithGammaWPlusOne) {
  expect_zero_centered_equals_direct_form("RMSNorm");
}

TEST(CatalogZeroCenteredGamma, LayerNormWithWEqualsTheDirectFormWithGammaWPlusOne) {
  expect_zero_centered_equals_direct_form("LayerNorm");
}

TEST(CatalogZeroCenteredGamma, IsStoredOnTheOpAndDefaultsToOff) {
  const auto* rms = dynamic_cast<const RMSNorm*>(make_op("RMSNorm", {{"zero_centered_gamma", 1}}, {2, 4}).get());
  ASSERT_NE(rms, nullptr);
  EXPECT_TRUE(rms->zero_centered_gamma());
  const auto* ln = dynamic_cast<const LayerNorm*>(make_op("LayerNorm", {}, {2, 4}).get());
  ASSERT_NE(ln, nullptr);
  EXPECT_FALSE(ln->zero_centered_gamma());
}

/// TE's SwiGLU with glu_interleave_size k (swiglu.py, op_forward/op_backward) de-interleaves
/// with reshape(-1, F/2k, 2, k).transpose(1, 2) before the plain kernel and re-interleaves the
/// gradient with reshape(-1, 2, F/2k, k).transpose(1, 2); the catalog's interleave must agree.
TEST(CatalogSwiGLUInterleave, MatchesTEsDeinterleaveThenPlainSwiGLU) {
  at::Generator gen = make_generator(131);
  const int64_t rows = 3, features = 12, k = 2;
  const at::Tensor x = seeded_randn({rows, features}, gen, at::kDouble, true);
  const at::Tensor plain_x =
      x.detach().reshape({-1, features / (2 * k), 2, k}).transpose(1, 2).reshape({rows, features}).requires_grad_(true);
  const PathResult interleaved = run_alone(make_op("SwiGLU", {{"interleave", k}}, {rows, features}), x);
  const PathResult plain = run_alone(make_op("SwiGLU", {}, {rows, features}), plain_x);
  EXPECT_TRUE(testing::tensors_close(interleaved.outputs[0], plain.outputs[0], kFloat64Tol, "output"));
  const at::Tensor reinterleaved =
      plain.grad_input.reshape({-1, 2, features / (2 * k), k}).transpose(1, 2).reshape({rows, features});
  EXPECT_TRUE(testing::tensors_close(interleaved.grad_input, reinterleaved, kFloat64Tol, "grad_input"));
}

TEST(CatalogSwiGLUInterleave, HasTheLayoutOfScaledSwiGLUWithUnitScales) {
  at::Generator gen = make_generator(137);
  const at::Tensor x = seeded_randn({4, 8}, gen, at::kDouble, true);
  const at::Tensor ones = at::ones({4}, testing::test_options());
  const PathResult swiglu = run_alone(make_op("SwiGLU", {{"interleave", 2}}, {4, 8}), x);
  const PathResult scaled = run_alone(make_op("ScaledSwiGLU", {{"interleave", 2}}, {4, 8}), x, {ones});
  EXPECT_TRUE(testing::tensors_close(swiglu.outputs[0], scaled.outputs[0], kFloat64Tol, "output"));
  EXPECT_TRUE(testing::tensors_close(swiglu.grad_input, scaled.grad_input, kFloat64Tol, "grad_input"));
}

/// The message of the InvalidArgumentError that `fn` throws ("" if it throws nothing).
template <typename Fn>
std::string invalid_argument_message(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgumentError& e) {
    return e.what();
  }
  return "";
}

/// The message of the InvalidArgumentError of the catalog signature of `name` ("" if none).
std::string signature_error(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& shape) {
  return invalid_argument_message([&] { OpRegistry::catalog().signature(name, attrs, shape); });
}

/// The message of the InvalidArgumentError of creating `name` from the catalog ("" if none).
std::string create_error(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& shape) {
  return invalid_argument_message([&] { make_op(name, attrs, shape); });
}

TEST(CatalogSwiGLUInterleave, InterleaveThatDoesNotDivideTheFeaturesThrowsClearError) {
  const std::string expected = "SwiGLU: interleave=3 needs input features divisible by 6, got 8";
  EXPECT_THAT(signature_error("SwiGLU", {{"interleave", 3}}, {4, 8}), HasSubstr(expected));
  EXPECT_THAT(create_error("SwiGLU", {{"interleave", 3}}, {4, 8}), HasSubstr(expected));
  // Odd feature counts are refused whatever the interleave.
  EXPECT_THAT(signature_error("SwiGLU", {{"interleave", 1}}, {4, 7}),
              HasSubstr("SwiGLU: input features must be even and >= 2 (halves a, b), got 7"));
  // An op built for another width refuses the input at run time, with the same message.
  BasicOpPtr op = make_op("SwiGLU", {{"interleave", 3}}, {4, 6});
  EXPECT_THAT(invalid_argument_message([&] { (*op)(at::ones({4, 8}, test_options()), {}); }), HasSubstr(expected));
}

TEST(CatalogSwiGLUInterleave, NegativeOrFractionalInterleaveThrowsClearError) {
  EXPECT_THAT(signature_error("SwiGLU", {{"interleave", -1}}, {4, 8}),
              HasSubstr("SwiGLU: attr 'interleave' must be an integer >= 0, got -1"));
  EXPECT_THAT(signature_error("SwiGLU", {{"interleave", 1.5}}, {4, 8}),
              HasSubstr("SwiGLU: attr 'interleave' must be an integer >= 0, got 1.5"));
  EXPECT_THAT(invalid_argument_message([] { SwiGLU op(-2); }), HasSubstr("SwiGLU: interleave must be >= 0, got -2"));
}

TEST(CatalogTensorParallel, ModesOtherThanNoneColumnOrRowThrowClearErrors) {
  EXPECT_THAT(signature_error("Linear", {{"tensor_parallel_mode", 3}}, {4, 8}),
              HasSubstr("Linear: attr 'tensor_parallel_mode' must be 0 (none), 1 (column) or 2 (row), got 3"));
  EXPECT_THAT(create_error("Linear", {{"tensor_parallel_mode", 1.5}}, {4, 8}),
              HasSubstr("Linear: attr 'tensor_parallel_mode' must be an integer >= 0, got 1.5"));
  EXPECT_EQ(signature_error("Linear", {{"tensor_parallel_mode", 2}}, {4, 8}), "");
}

TEST(CatalogZeroCenteredGamma, ValueOtherThanZeroOrOneThrowsClearError) {
  EXPECT_THAT(signature_error("RMSNorm", {{"zero_centered_gamma", 2}}, {4, 8}),
              HasSubstr("RMSNorm: attr 'zero_centered_gamma' must be 0 or 1, got 2"));
  EXPECT_THAT(create_error("LayerNorm", {{"zero_centered_gamma", 0.5}}, {4, 8}),
              HasSubstr("LayerNorm: attr 'zero_centered_gamma' must be 0 or 1, got 0.5"));
}

/// TE constructor options that do not change the math, per op (the task's list).
const std::vector<std::pair<std::string, std::vector<std::string>>>& neutral_options() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> options{
      {"Linear", {"accumulate_into_main_grad", "sequence_parallel"}},
      {"Bias", {"tensor_parallel"}},
      {"GroupedLinear",
       {"accumulate_into_main_grad", "single_grouped_weight", "single_grouped_bias", "delay_wgrad_compute"}},
      {"ScaledSwiGLU", {"activation_recompute_in_mlp"}},
      {"ScaledSReLU", {"activation_recompute_in_mlp"}},
      {"RMSNorm", {"sm_margin"}},
      {"LayerNorm", {"sm_margin"}},
  };
  return options;
}

TEST(CatalogTEOptions, EveryOptionIsListedWithDefaultZeroAndDocumentedAsWithoutEffect) {
  const auto& catalog = OpRegistry::catalog();
  for (const auto& [name, attrs] : neutral_options()) {
    const OpInfo& info = catalog.info(name);
    EXPECT_THAT(info.summary, HasSubstr("accepted, no effect on the model")) << name;
    for (const std::string& attr : attrs) {
      ASSERT_EQ(info.defaults.count(attr), 1u) << name << " does not list " << attr;
      EXPECT_EQ(info.defaults.at(attr), 0.0) << name << "." << attr;
      EXPECT_THAT(info.summary, HasSubstr(attr)) << name;
    }
  }
  for (const char* name : {"RMSNorm", "LayerNorm"}) {
    EXPECT_EQ(catalog.info(name).defaults.at("zero_centered_gamma"), 0.0) << name;
    EXPECT_THAT(catalog.info(name).summary, HasSubstr("zero_centered_gamma")) << name;
  }
  EXPECT_EQ(catalog.info("SwiGLU").defaults.at("interleave"), 0.0);
}

TEST(CatalogTEOptions, FlagsOtherThanZeroOrOneAndNegativeSmMarginThrowClearErrors) {
  for (const auto& [name, attrs] : neutral_options()) {
    for (const std::string& attr : attrs) {
      if (attr == "sm_margin") continue;
      EXPECT_THAT(signature_error(name, {{attr, 2}}, {4, 8}),
                  HasSubstr(name + ": attr '" + attr + "' must be 0 or 1, got 2"));
      EXPECT_THAT(create_error(name, {{attr, -1}}, {4, 8}),
                  HasSubstr(name + ": attr '" + attr + "' must be 0 or 1, got -1"));
    }
  }
  for (const std::string name : {"RMSNorm", "LayerNorm"}) {
    EXPECT_THAT(signature_error(name, {{"sm_margin", -1}}, {4, 8}),
                HasSubstr(name + ": attr 'sm_margin' must be an integer >= 0, got -1"));
    EXPECT_THAT(create_error(name, {{"sm_margin", 2.5}}, {4, 8}),
                HasSubstr(name + ": attr 'sm_margin' must be an integer >= 0, got 2.5"));
    // Any non-negative integer is accepted.
    EXPECT_EQ(signature_error(name, {{"sm_margin", 16}}, {4, 8}), "");
  }
}

/// The attrs that make `name` run on an input [rows, features] with one public slot per
/// extra input, plus every neutral option of `name` switched on when `neutral_on`.
OpAttrs attrs_with_neutral(const std::string& name, const std::vector<std::string>& neutral, bool neutral_on) {
  OpAttrs attrs;
  if (name == "GroupedLinear") attrs = {{"groups", 2}, {"out", 3}, {"scale_bias", 1}};
  if (name == "Linear") attrs = {{"out", 3}};
  if (!neutral_on) return attrs;
  for (const std::string& attr : neutral) attrs[attr] = attr == "sm_margin" ? 8.0 : 1.0;
  return attrs;
}

TEST(CatalogTEOptions, OptionsWithoutEffectLeaveOutputsAndEveryGradientUnchanged) {
  for (const auto& [name, neutral] : neutral_options()) {
    const int64_t rows = 6, features = 8;
    PathResult results[2];
    for (int on = 0; on < 2; ++on) {
      at::Generator gen = make_generator(139);  // the same data for both
      const OpAttrs attrs = attrs_with_neutral(name, neutral, on == 1);
      BasicOpPtr op = make_op(name, attrs, {rows, features});
      const OpSignature sig = OpRegistry::catalog().signature(name, attrs, {rows, features});
      const at::Tensor x = seeded_randn({rows, features}, gen, at::kDouble, true, /*away_from_zero=*/true);
      results[on] = run_alone(op, x, extras_for(sig, rows, gen));
    }
    // The same code runs on the same values: only rounding could differ, and does not.
    EXPECT_TRUE(testing::results_close(results[1], results[0], kFloat64Tol)) << name;
  }
}

TEST(CatalogCacheQuantizedInput, IsAValidatedFlagThatBuildsTheQuantizedCache) {
  for (const std::string name : {"ReLU", "GELU", "SReLU", "SwiGLU"}) {
    const OpInfo& info = OpRegistry::catalog().info(name);
    EXPECT_EQ(info.defaults.at("cache_quantized_input"), 0.0) << name;
    EXPECT_THAT(info.summary, HasSubstr("cache_quantized_input=1: backward at the input's FP8 E4M3")) << name;
    EXPECT_THAT(signature_error(name, {{"cache_quantized_input", 2}}, {4, 8}),
                HasSubstr(name + ": attr 'cache_quantized_input' must be 0 or 1, got 2"));
    EXPECT_THAT(create_error(name, {{"cache_quantized_input", 0.5}}, {4, 8}),
                HasSubstr(name + ": attr 'cache_quantized_input' must be 0 or 1, got 0.5"));
  }
  for (const std::string name : {"ReLU", "GELU", "SReLU"}) {
    const auto act = std::dynamic_pointer_cast<Activation>(make_op(name, {{"cache_quantized_input", 1}}, {4, 8}));
    ASSERT_NE(act, nullptr) << name;
    EXPECT_EQ(act->input_cache(), InputCache::kQuantized) << name;
    EXPECT_EQ(std::dynamic_pointer_cast<Activation>(make_op(name, {}, {4, 8}))->input_cache(),
              InputCache::kHighPrecision)
        << name;
  }
  const auto swiglu = std::dynamic_pointer_cast<SwiGLU>(make_op("SwiGLU", {{"cache_quantized_input", 1}}, {4, 8}));
  ASSERT_NE(swiglu, nullptr);
  EXPECT_EQ(swiglu->input_cache(), InputCache::kQuantized);
}

}  // namespace
}  // namespace gradfuzz::ops
