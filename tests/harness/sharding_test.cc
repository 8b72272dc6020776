#include "harness/sharding.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/builder.h"

namespace gradfuzz::harness {
namespace {

using ::testing::HasSubstr;

OpSpec op(const std::string& name, ops::OpAttrs attrs = {}) {
  return {name, std::move(attrs), {}, {}, ops::OutputStyle::kVector, {}, {}};
}

CaseSpec case_of(std::vector<OpSpec> ops, int64_t world, const std::string& layout, std::vector<int64_t> shape) {
  CaseSpec spec;
  spec.ops = std::move(ops);
  spec.world_size = world;
  spec.input_layout = layout;
  spec.input_shape = std::move(shape);
  spec.dtype = "float32";
  return spec;
}

ops::OpAttrs column(int64_t out, bool sp = false) {
  ops::OpAttrs a{{"out", static_cast<double>(out)}, {"tensor_parallel_mode", 1}};
  if (sp) a["sequence_parallel"] = 1;
  return a;
}
ops::OpAttrs row(int64_t out, bool sp = false) {
  ops::OpAttrs a{{"out", static_cast<double>(out)}, {"tensor_parallel_mode", 2}};
  if (sp) a["sequence_parallel"] = 1;
  return a;
}

ShardingPlan plan_of(const CaseSpec& spec) { return plan_sharding(spec, plan_case(spec)); }

std::string spec_error(const CaseSpec& spec) {
  try {
    plan_of(spec);
  } catch (const SpecError& e) {
    return e.json_path() + " | " + e.what();
  }
  return "no error";
}

TEST(Sharding, AMegatronMlpSplitsTheWeightsByRowsThenColumnsAndEndsReplicated) {
  const CaseSpec spec = case_of(
      {op("Linear", column(8)), op("Bias", {{"tensor_parallel", 1}}), op("GELU"), op("Linear", row(6)), op("Bias")}, 2,
      "replicated", {4, 6});
  const ShardingPlan p = plan_of(spec);
  EXPECT_EQ(p.ops[0].output, Layout::kFeatures);
  EXPECT_EQ(p.ops[0].params[0], sharded(0));  // W_r: rows r of W [out, in]
  EXPECT_EQ(p.ops[1].params[0], sharded(0));  // the bias split with the features
  EXPECT_EQ(p.ops[3].input, Layout::kFeatures);
  EXPECT_EQ(p.ops[3].params[0], sharded(1));  // W_r: columns r
  EXPECT_EQ(p.ops[3].output, Layout::kReplicated);
  EXPECT_EQ(p.ops[4].param_grads[0], replicated());  // every rank computes the whole gradient
  EXPECT_EQ(p.outputs.front(), Layout::kReplicated);
  EXPECT_EQ(p.output_grads.front(), replicated());
  // The column Linear all-reduces the input gradient: every rank holds all of it.
  EXPECT_EQ(p.input_grad, replicated());
}

TEST(Sharding, SequenceParallelChainsSplitRowsAndGiveCopiedParametersSummandGradients) {
  const CaseSpec spec =
      case_of({op("RMSNorm"), op("Linear", column(4, true)), op("ReLU"), op("Linear", row(6, true)), op("Bias")}, 2,
              "rows", {8, 6});
  const ShardingPlan p = plan_of(spec);
  EXPECT_EQ(p.input, Layout::kRows);
  EXPECT_EQ(p.ops[0].param_grads[0], partial());  // gamma sees only its rank's rows
  EXPECT_EQ(p.ops[1].output, Layout::kFeatures);
  EXPECT_EQ(p.ops[3].output, Layout::kRows);
  EXPECT_EQ(p.ops[4].param_grads[0], partial());
  EXPECT_EQ(p.input_grad, sharded(0));
}

TEST(Sharding, AllGatherTakesSummandGradientsThroughTheOpsAfterIt) {
  const CaseSpec spec = case_of({op("AllGather"), op("Bias"), op("ReLU")}, 2, "rows", {4, 6});
  const ShardingPlan p = plan_of(spec);
  EXPECT_EQ(p.outputs.front(), Layout::kReplicated);
  // Its backward sums the ranks' gradients (a reduce-scatter): the cotangent a summand per
  // rank, the bias's gradient too.
  EXPECT_EQ(p.output_grads.front(), partial());
  EXPECT_EQ(p.ops[1].param_grads[0], partial());
  EXPECT_EQ(p.input_grad, sharded(0));
}

TEST(Sharding, AHandWrittenRowSplitMakesSummandsThatACollectiveSums) {
  const CaseSpec spec =
      case_of({op("Linear", {{"out", 3}}), op("ConstantScale"), op("ReduceScatter")}, 2, "features", {4, 6});
  const ShardingPlan p = plan_of(spec);
  EXPECT_EQ(p.ops[0].output, Layout::kPartial);
  EXPECT_EQ(p.ops[0].params[0], sharded(1));
  EXPECT_EQ(p.ops[2].output, Layout::kRows);
  // The gradient of a sum with respect to each summand: the whole gradient on every rank.
  EXPECT_EQ(p.ops[1].output_grad, replicated());
}

TEST(Sharding, LayoutsThatDoNotComposeAreSpecErrorsNamingTheOp) {
  EXPECT_THAT(spec_error(case_of({op("AllGather")}, 2, "replicated", {4, 6})),
              HasSubstr("/ops/0 | /ops/0: AllGather (op 0) on replicated input: it takes rows"));
  EXPECT_THAT(spec_error(case_of({op("Linear", column(4)), op("GELU"), op("Bias")}, 2, "replicated", {4, 6})),
              HasSubstr("/ops/2: Bias (op 2) on features input: it takes replicated or rows"));
  EXPECT_THAT(spec_error(case_of({op("Linear", {{"out", 4}}), op("ReLU")}, 2, "features", {4, 6})),
              HasSubstr("ReLU (op 1) on partial input"));
  EXPECT_THAT(spec_error(case_of({op("Dispatch")}, 2, "replicated", {4, 6})),
              HasSubstr("Dispatch (op 0) has no rule for distributed cases"));
  // AllGather wants summand gradients; a column Linear after it hands every rank the whole.
  EXPECT_THAT(spec_error(case_of({op("AllGather"), op("Linear", column(4))}, 2, "rows", {4, 6})),
              HasSubstr("a replicated tensor's gradient would have to lie two ways"));
  EXPECT_THAT(spec_error(case_of({op("ReLU")}, 2, "rows", {5, 6})),
              HasSubstr("/input_layout: input layout rows splits 5 rows over 2 ranks: not divisible"));
  CaseSpec quantized = case_of({op("Linear", column(16))}, 2, "replicated", {16, 16});
  quantized.recipe = RecipeSpec{"Float8CurrentScaling", "E4M3", {}};
  EXPECT_THAT(spec_error(quantized), HasSubstr("/recipe"));
  CaseSpec cached = case_of({op("ReLU", {{"cache_quantized_input", 1}})}, 2, "rows", {4, 6});
  EXPECT_THAT(spec_error(cached), HasSubstr("cache_quantized_input=1 on several ranks"));
}

TEST(Sharding, OneRankTakesAnyChainWithEverythingReplicated) {
  const CaseSpec spec =
      case_of({op("AllGather"), op("Linear", column(3)), op("Bias"), op("ReduceScatter")}, 1, "replicated", {5, 6});
  const ShardingPlan p = plan_of(spec);
  for (const auto& rule : p.ops) {
    EXPECT_EQ(rule.output, Layout::kReplicated);
    for (const auto& place : rule.params) EXPECT_EQ(place, replicated());
  }
  EXPECT_FALSE(parallel_config_error(spec, plan_case(spec)).has_value());
}

TEST(Sharding, SplitsThatDoNotDivideAreWhatTeRaisesInTheOrderItMeetsThem) {
  auto error_of = [](const CaseSpec& spec) {
    const auto e = parallel_config_error(spec, plan_case(spec));
    return e ? std::to_string(e->op) + (e->at_construction ? " construction: " : " forward: ") + e->message
             : std::string("none");
  };
  EXPECT_EQ(error_of(case_of({op("Linear", column(5))}, 2, "replicated", {4, 6})),
            "0 construction: Linear (op 0): Invalid configuration for tensor parallelism (mode='column', "
            "out_features=5, group_size=2)");
  EXPECT_EQ(error_of(case_of({op("Linear", row(4))}, 2, "replicated", {4, 5})),
            "0 construction: Linear (op 0): Invalid configuration for tensor parallelism (mode='row', in_features=5, "
            "group_size=2)");
  EXPECT_EQ(error_of(case_of({op("Bias", {{"tensor_parallel", 1}})}, 3, "replicated", {4, 5})),
            "0 construction: Bias (op 0): Invalid configuration for tensor parallelism (size=5, "
            "tensor_parallel_size=3)");
  EXPECT_EQ(error_of(case_of({op("Linear", {{"out", 4}}), op("ReduceScatter")}, 2, "features", {5, 6})),
            "1 forward: ReduceScatter (op 1): Attempted to reduce-scatter a tensor with shape=[5, 4] over 2 processes");
  // Construction comes first: every op is made before the first forward.
  const CaseSpec both =
      case_of({op("Linear", column(4)), op("Linear", row(3, true)), op("Linear", column(5))}, 2, "replicated", {5, 6});
  EXPECT_THAT(error_of(both), HasSubstr("2 construction: Linear (op 2)"));
  const CaseSpec sp_rows = case_of({op("Linear", column(4)), op("Linear", row(3, true))}, 2, "replicated", {5, 6});
  EXPECT_THAT(error_of(sp_rows),
              HasSubstr("1 forward: Linear (op 1): First dimension of the tensor should be "
                        "divisible by tensor parallel size, but got dim_size[0]=5 and world_size=2"));
  // A refused op is not held to its input's layout (it is never made): the plan still
  // cuts every rank's values.
  const CaseSpec refused = case_of({op("Linear", row(4))}, 2, "replicated", {4, 5});
  EXPECT_EQ(plan_of(refused).ops[0].params[0], sharded(1));
}

TEST(Sharding, RanksHoldSlicesCopiesAndSummandsThatAddUpToTheWholeExactly) {
  const at::Tensor t = at::arange(30, at::kDouble).reshape({5, 6});
  EXPECT_TRUE(at::equal(shard(t, sharded(0), 2, 0), t.slice(0, 0, 3)));  // tensor_split: 3, 2
  EXPECT_TRUE(at::equal(shard(t, sharded(0), 2, 1), t.slice(0, 3, 5)));
  EXPECT_TRUE(at::equal(shard(t, sharded(1), 3, 2), t.slice(1, 4, 6)));
  EXPECT_TRUE(at::equal(shard(t, replicated(), 2, 1), t));
  at::Tensor sum = at::zeros_like(t);
  for (int64_t r = 0; r < 3; ++r) {
    const at::Tensor summand = shard(t, partial(), 3, r);
    EXPECT_EQ(summand.sizes(), t.sizes());
    sum += summand;
  }
  EXPECT_TRUE(at::equal(sum, t));
  EXPECT_EQ(shard_shape({5, 6}, sharded(0), 2, 1), (std::vector<int64_t>{2, 6}));
}

TEST(Sharding, EachRanksPlanAndValuesAreItsSliceOfTheCase) {
  const CaseSpec spec = case_of({op("Linear", column(8)), op("Linear", row(6))}, 2, "replicated", {4, 6});
  const CasePlan plan = plan_case(spec);
  const ShardingPlan p = plan_sharding(spec, plan);
  const CasePlan local = rank_plan(plan, p, 1);
  EXPECT_EQ(local.ops[0].input_shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(local.ops[0].signature.output_shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(local.ops[0].signature.parameter_shapes[0], (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(local.ops[1].signature.parameter_shapes[0], (std::vector<int64_t>{6, 4}));
  CaseTensors whole;
  whole.input = at::randn({4, 6}, at::kDouble);
  whole.params = {{at::randn({8, 6}, at::kDouble)}, {at::randn({6, 8}, at::kDouble)}};
  whole.cotangents = {at::randn({4, 6}, at::kDouble)};
  const CaseTensors mine = rank_tensors(whole, p, 1);
  EXPECT_TRUE(at::equal(mine.input, whole.input));
  EXPECT_TRUE(at::equal(mine.params[0][0], whole.params[0][0].slice(0, 4, 8)));
  EXPECT_TRUE(at::equal(mine.params[1][0], whole.params[1][0].slice(1, 4, 8)));
  EXPECT_TRUE(at::equal(mine.cotangents[0], whole.cotangents[0]));
}

PathRun rank_run(at::Tensor output, at::Tensor grad_input, std::vector<std::vector<at::Tensor>> grad_params) {
  PathRun r;
  r.name = "fused";
  r.outputs = {std::move(output)};
  r.grad_input = std::move(grad_input);
  r.grad_params = std::move(grad_params);
  return r;
}

TEST(Sharding, AssemblyConcatenatesSlicesSumsSummandsAndTakesRankZerosCopy) {
  // rows input -> plain Linear (copied weight, summand gradients) -> AllGather.
  const CaseSpec spec = case_of({op("Linear", {{"out", 3}}), op("AllGather")}, 2, "rows", {4, 2});
  const ShardingPlan p = plan_of(spec);
  const at::Tensor y = at::arange(12, at::kDouble).reshape({4, 3});
  const at::Tensor dx0 = at::ones({2, 2}, at::kDouble);
  const at::Tensor dx1 = 2 * at::ones({2, 2}, at::kDouble);
  const at::Tensor dw0 = at::full({3, 2}, 0.25, at::kDouble);
  const at::Tensor dw1 = at::full({3, 2}, 0.5, at::kDouble);
  const PathRun whole = assemble_ranks({rank_run(y, dx0, {{dw0}, {}}), rank_run(y + 1, dx1, {{dw1}, {}})}, p);
  EXPECT_TRUE(whole.ok());
  EXPECT_TRUE(at::equal(whole.outputs[0], y));  // replicated: rank 0's (replica_view compares rank 1's)
  EXPECT_TRUE(at::equal(whole.grad_input, at::cat({dx0, dx1}, 0)));
  EXPECT_TRUE(at::allclose(whole.grad_params[0][0], at::full({3, 2}, 0.75, at::kDouble)));
  EXPECT_EQ(whole.ranks.size(), 2u);
  const PathRun copy = replica_view(whole.ranks[1], p);
  EXPECT_TRUE(at::equal(copy.outputs[0], y + 1));
  EXPECT_FALSE(copy.grad_input.defined());
  EXPECT_FALSE(copy.grad_params[0][0].defined());
}

TEST(Sharding, RanksThatDisagreeOnRaisingMakeAnErrorNamingEachRank) {
  const CaseSpec spec = case_of({op("Linear", column(4))}, 2, "replicated", {4, 6});
  const ShardingPlan p = plan_of(spec);
  PathRun ran;
  ran.name = "fused";
  PathRun raised = ran;
  raised.status = PathStatus::kError;
  raised.error_kind = "invalid-argument";
  raised.error_stage = "forward";
  raised.error_message = "bad split";
  const PathRun whole = assemble_ranks({ran, raised}, p);
  EXPECT_EQ(whole.status, PathStatus::kError);
  EXPECT_EQ(whole.error_kind, "invalid-argument");
  EXPECT_EQ(whole.error_message, "the ranks disagree: rank 0 ran; rank 1 invalid-argument during forward: bad split");
}

}  // namespace
}  // namespace gradfuzz::harness
