#include "ops/fusion_registry.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/basic/activations.h"
#include "ops/basic/linear.h"
#include "ops/errors.h"
#include "ops/fused/fused_ops.h"
#include "ops/fuser.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using testing::test_options;

/// A fused op over a whole run of groups, named by the fusion that made it.
class TagFusedOp final : public FusedOp {
 public:
  TagFusedOp(std::string name, std::vector<BasicOpPtr> ops) : FusedOp(std::move(name), std::move(ops)) {}
};

std::vector<BasicOpPtr> all_basic(const std::vector<FusedOpPtr>& groups) {
  std::vector<BasicOpPtr> ops;
  for (const FusedOpPtr& g : groups) ops.insert(ops.end(), g->basic_ops().begin(), g->basic_ops().end());
  return ops;
}

/// A fusion that records what it saw and fuses everything it gets into one op `name`
/// when `fire` says so.
FusionFn recording_fusion(const std::string& name, std::vector<std::string>* seen,
                          std::function<bool(const FusionContext&)> fire = nullptr) {
  return [name, seen, fire](const std::vector<FusedOpPtr>& groups, const FusionContext& context) {
    std::string names;
    for (const FusedOpPtr& g : groups) names += (names.empty() ? "" : ",") + g->name();
    seen->push_back(name + "<-" + names);
    if (fire && !fire(context)) return groups;
    return std::vector<FusedOpPtr>{std::make_shared<TagFusedOp>(name, all_basic(groups))};
  };
}

TEST(FusionRegistry, CatalogListsEveryFusionOfTheSpec) {
  const std::vector<std::string> names = FusionRegistry::catalog().names();
  for (const char* expected :
       {"ForwardLinearBiasActivation", "ForwardLinearBiasAdd", "ForwardLinearScaleAdd", "BackwardLinearAdd",
        "BackwardLinearScale", "BackwardActivationBias", "BackwardAddRMSNorm", "GroupedMLP", "FusedResidual.forward",
        "FusedResidual.backward", "FusedResidual.joint"}) {
    EXPECT_THAT(names, ::testing::Contains(std::string(expected)));
  }
}

TEST(FusionRegistry, OnlyWithAnUnknownNameThrowsAndListsKnownNames) {
  try {
    FusionRegistry::catalog().only({"GroupedMLP", "FusedResidual"});
    FAIL() << "unknown fusion accepted";
  } catch (const UnknownNameError& e) {
    EXPECT_THAT(e.what(), StartsWith("unknown-name"));
    EXPECT_THAT(e.what(), HasSubstr("'FusedResidual'"));
    EXPECT_THAT(e.what(), HasSubstr("FusedResidual.joint"));
    EXPECT_THAT(e.what(), HasSubstr("BackwardLinearScale"));
  }
}

TEST(FusionRegistry, OnlyKeepsExactlyTheNamedFusionsInRegistrationOrder) {
  std::vector<std::string> seen;
  FusionRegistry registry;
  registry.add("a", FusionPass::kJoint, recording_fusion("a", &seen))
      .add("b", FusionPass::kForward, recording_fusion("b", &seen))
      .add("c", FusionPass::kBackward, recording_fusion("c", &seen));
  const FusionRegistry subset = registry.only({"c", "a"});
  EXPECT_EQ(subset.names(), (std::vector<std::string>{"a", "c"}));
  EXPECT_TRUE(registry.only({}).empty());
}

TEST(FusionRegistry, PassesApplyJointFirstThenForwardAndBackwardSeparatelyInOrder) {
  std::vector<std::string> seen;
  FusionRegistry registry;
  // Two forward fusions: the second sees the first's output.
  registry.add("fwd1", FusionPass::kForward, recording_fusion("fwd1", &seen))
      .add("joint", FusionPass::kJoint,
           [&seen](const std::vector<FusedOpPtr>& groups, const FusionContext&) {
             seen.push_back("joint<-" + std::to_string(groups.size()));
             return groups;
           })
      .add("fwd2", FusionPass::kForward, recording_fusion("fwd2", &seen))
      .add("bwd", FusionPass::kBackward, recording_fusion("bwd", &seen));
  OperationFuser fuser({std::make_shared<Identity>(), std::make_shared<ReLU>()}, registry, Locking::kTransient);
  const std::vector<FusedOpPtr>& forward = fuser.forward_plan(0);
  ASSERT_EQ(forward.size(), 1u);
  EXPECT_EQ(forward[0]->name(), "fwd2");
  EXPECT_EQ(fuser.backward_plan(0)[0]->name(), "bwd");
  EXPECT_EQ(seen, (std::vector<std::string>{"joint<-2", "fwd1<-Identity,ReLU", "fwd2<-fwd1", "bwd<-Identity,ReLU"}));
}

TEST(FusionRegistry, PlansAreRebuiltWhenFirstOpRequiringBackwardChanges) {
  std::vector<std::string> seen;
  FusionRegistry registry;
  registry.add("bwd", FusionPass::kBackward, recording_fusion("bwd", &seen, [](const FusionContext& c) {
                 return c.first_op_requiring_backward == 0;
               }));
  auto lin = std::make_shared<Linear>(LinearOptions(2, 2), test_options());
  OperationFuser fuser({lin, std::make_shared<ConstantScale>(0.5)}, registry, Locking::kTransient);
  EXPECT_EQ(fuser.backward_plan(0).size(), 1u);
  EXPECT_EQ(fuser.backward_plan(0).size(), 1u);
  EXPECT_EQ(seen.size(), 1u);  // cached while the index stays
  EXPECT_EQ(fuser.backward_plan(1).size(), 2u);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(fuser.backward_plan(0).size(), 1u);
  EXPECT_EQ(seen.size(), 3u);

  // Through forward(): the input's requires_grad moves the index and the plan follows.
  lin->weight().requires_grad_(false);
  const at::Tensor x = at::ones({3, 2}, test_options());
  fuser.forward(x, {});
  EXPECT_EQ(fuser.backward_plan(fuser.first_op_requiring_backward(x, {})).size(), 2u);
  fuser.forward(x.clone().requires_grad_(true), {});
  EXPECT_EQ(fuser.backward_plan(0).size(), 1u);
  lin->weight().requires_grad_(true);
}

TEST(FusionRegistry, CatalogBackwardFusionDeclinesWhenItsOpsNeedNoBackward) {
  auto lin = std::make_shared<Linear>(LinearOptions(2, 2), test_options());
  OperationFuser fuser({lin, std::make_shared<ConstantScale>(0.5)},
                       FusionRegistry::catalog().only({"BackwardLinearScale"}), Locking::kTransient);
  ASSERT_EQ(fuser.backward_plan(0).size(), 1u);
  EXPECT_EQ(fuser.backward_plan(0)[0]->name(), "BackwardLinearScale");
  EXPECT_EQ(fuser.backward_plan(2).size(), 2u);  // nothing needs backward: declined
}

TEST(FusionRegistry, ApplyPatternReplacesOnlyMatchedRuns) {
  std::vector<FusedOpPtr> groups;
  std::vector<BasicOpPtr> ops{std::make_shared<Identity>(), std::make_shared<ReLU>(), std::make_shared<Identity>(),
                              std::make_shared<ReLU>()};
  for (const BasicOpPtr& op : ops) groups.push_back(std::make_shared<SingleOpGroup>(op));
  const std::vector<FusedOpPtr> out = apply_pattern(
      groups, FusionContext{0, &ops},
      [](const std::vector<FusedOpPtr>& gs, size_t i, const FusionContext&) -> std::pair<FusedOpPtr, size_t> {
        if (i + 1 < gs.size() && gs[i]->name() == "Identity" && gs[i + 1]->name() == "ReLU" && i == 2) {
          return {std::make_shared<TagFusedOp>("IdRelu", all_basic({gs[i], gs[i + 1]})), 2};
        }
        return {nullptr, 0};
      });
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]->name(), "Identity");
  EXPECT_EQ(out[2]->name(), "IdRelu");
  EXPECT_EQ(map_plan(out, ops)[2].begin, 2);
}

TEST(FusionRegistry, PassNames) {
  EXPECT_STREQ(fusion_pass_name(FusionPass::kJoint), "joint");
  EXPECT_STREQ(fusion_pass_name(FusionPass::kForward), "forward");
  EXPECT_STREQ(fusion_pass_name(FusionPass::kBackward), "backward");
  EXPECT_EQ(fused_residual_name(FusionPass::kBackward), "FusedResidual.backward");
}

}  // namespace
}  // namespace gradfuzz::ops
