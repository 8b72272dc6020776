#include "ops/fuser.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "ops/basic/activations.h"
#include "ops/basic/channel_ops.h"
#include "ops/basic/grouped_linear.h"
#include "ops/basic/linear.h"
#include "ops/basic/moe.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/sequential.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using testing::CountingIdentity;
using testing::fused_differs_from_reference;
using testing::fused_matches_reference;
using ::testing::HasSubstr;
using testing::int_tensor;
using testing::kFloat64Tol;
using testing::make_generator;
using testing::PathResult;
using testing::run_fused;
using testing::run_reference;
using testing::seeded_randn;
using testing::SplitSource;
using ::testing::StartsWith;
using testing::tensors_close;
using testing::test_options;

// ---- custom ops that misbehave on purpose -------------------------------------------------

/// y = x; one extra input and one extra output (extra output = x): lets one op both produce
/// and consume.
class EchoOp final : public BasicOp {
 public:
  EchoOp() : BasicOp("EchoOp") {}
  int64_t num_extra_inputs() const override { return 1; }
  int64_t num_extra_outputs() const override { return 1; }

 protected:
  ForwardResult forward_impl(OpContext&, const at::Tensor& x, const std::vector<at::Tensor>&) const override {
    return {x, pack({x})};
  }
  BackwardResult backward_impl(OpContext&, const at::Tensor& g, const std::vector<at::Tensor>&) const override {
    return {g, {}, pack({at::Tensor()})};
  }
  ReferenceResult reference_impl(const at::Tensor& x, const std::vector<at::Tensor>&,
                                 const std::vector<at::Tensor>&) const override {
    return {x, {x}};
  }
};

/// Declares one extra output, returns `returned` of them (undefined when `none`).
class BadOutputsOp final : public BasicOp {
 public:
  BadOutputsOp(size_t returned, bool none) : BasicOp("BadOutputsOp"), returned_(returned), none_(none) {}
  int64_t num_extra_outputs() const override { return 1; }

 protected:
  ForwardResult forward_impl(OpContext&, const at::Tensor& x, const std::vector<at::Tensor>&) const override {
    return {x, pack(std::vector<at::Tensor>(returned_, none_ ? at::Tensor() : x * 2))};
  }
  BackwardResult backward_impl(OpContext&, const at::Tensor& g, const std::vector<at::Tensor>&) const override {
    return {g, {}, pack({})};
  }
  ReferenceResult reference_impl(const at::Tensor& x, const std::vector<at::Tensor>&,
                                 const std::vector<at::Tensor>&) const override {
    return {x, {x * 2}};
  }

 private:
  size_t returned_;
  bool none_;
};

/// y = x + e with one extra input whose backward returns two extra-input gradients.
class TooManyGradsOp final : public BasicOp {
 public:
  TooManyGradsOp() : BasicOp("TooManyGradsOp") {}
  int64_t num_extra_inputs() const override { return 1; }

 protected:
  ForwardResult forward_impl(OpContext&, const at::Tensor& x, const std::vector<at::Tensor>& e) const override {
    return {x + e[0], pack({})};
  }
  BackwardResult backward_impl(OpContext&, const at::Tensor& g, const std::vector<at::Tensor>&) const override {
    return {g, {}, pack({g, g})};
  }
  ReferenceResult reference_impl(const at::Tensor& x, const std::vector<at::Tensor>& e,
                                 const std::vector<at::Tensor>&) const override {
    return {x + e[0], {}};
  }
};

/// y = x * w with one parameter w; its backward returns `returned` parameter gradients.
class ParamGradCountOp final : public BasicOp {
 public:
  explicit ParamGradCountOp(size_t returned)
      : BasicOp("ParamGradCountOp"), w_(at::full({1}, 2.0, test_options()).requires_grad_(true)), returned_(returned) {}
  std::vector<at::Tensor> parameters() const override { return {w_}; }

 protected:
  ForwardResult forward_impl(OpContext&, const at::Tensor& x, const std::vector<at::Tensor>&) const override {
    return {x * w_.detach(), pack({})};
  }
  BackwardResult backward_impl(OpContext&, const at::Tensor& g, const std::vector<at::Tensor>&) const override {
    return {g * w_.detach(), std::vector<at::Tensor>(returned_, g.sum().reshape({1})), pack({})};
  }
  ReferenceResult reference_impl(const at::Tensor& x, const std::vector<at::Tensor>&,
                                 const std::vector<at::Tensor>& params) const override {
    return {x * params.at(0), {}};
  }

 private:
  at::Tensor w_;
  size_t returned_;
};

/// A fused op that claims ops in the given order (used for plans that skip an op).
class ClaimingFusedOp final : public FusedOp {
 public:
  ClaimingFusedOp(std::string name, std::vector<BasicOpPtr> ops) : FusedOp(std::move(name), std::move(ops)) {}
};

/// Fused over [MakeExtraOutput, <op without extras>]: returns the producer's extra output
/// undefined, as if every consumer were inside the fusion.
class HidingFusedOp final : public FusedOp {
 public:
  explicit HidingFusedOp(std::vector<BasicOpPtr> ops) : FusedOp("HidingFusedOp", std::move(ops)) {}
  GroupForwardResult forward(std::vector<OpContext*>&, const at::Tensor& input,
                             const std::vector<std::vector<at::Tensor>>&) const override {
    GroupForwardResult out;
    out.output = input;
    out.extra_outputs.push_back(ExtraOutputs::vector({at::Tensor()}));
    out.extra_outputs.push_back(ExtraOutputs::vector({}));
    return out;
  }
};

/// A joint fusion replacing the whole (basic) plan with `make(groups)` once.
FusionRegistry registry_with(const std::string& name, std::function<FusedOpPtr(const std::vector<FusedOpPtr>&)> make,
                             FusionPass pass = FusionPass::kJoint) {
  FusionRegistry registry;
  registry.add(name, pass,
               [make, pass](const std::vector<FusedOpPtr>& groups, const FusionContext&) -> std::vector<FusedOpPtr> {
                 (void)pass;
                 std::vector<FusedOpPtr> out;
                 out.push_back(make(groups));
                 return out;
               });
  return registry;
}

BasicOpPtr producer(const std::string& channel, bool to_caller = false) {
  auto op = std::make_shared<MakeExtraOutput>();
  op->set_extra_output_channel(0, channel, to_caller);
  return op;
}

BasicOpPtr consumer(const std::string& channel, InPlace in_place = InPlace::kNo) {
  auto op = std::make_shared<AddExtraInput>(in_place);
  op->set_extra_input_channel(0, channel);
  return op;
}

// ---- routing tables -------------------------------------------------------------------------

TEST(Fuser, RoutesNamedChannelToEveryConsumer) {
  auto dual = std::make_shared<DualExtraOutput>();
  dual->set_extra_output_channel(0, "a", false).set_extra_output_channel(1, "b", true);
  std::vector<BasicOpPtr> ops{std::make_shared<AddExtraInput>(), dual, consumer("a"), consumer("b"), consumer("a"),
                              std::make_shared<AddExtraInput>()};
  const RoutingTables tables = build_routing_tables(ops);
  EXPECT_EQ(tables.producers.at("a"), (SlotRef{1, 0}));
  EXPECT_EQ(tables.producers.at("b"), (SlotRef{1, 1}));
  EXPECT_EQ(tables.consumers.at(SlotRef{1, 0}), (std::vector<SlotRef>{{2, 0}, {4, 0}}));
  EXPECT_EQ(tables.consumers.at(SlotRef{1, 1}), (std::vector<SlotRef>{{3, 0}}));
  EXPECT_EQ(tables.input_sources.at(SlotRef{4, 0}), (SlotRef{1, 0}));
  EXPECT_EQ(tables.public_inputs, (std::vector<SlotRef>{{0, 0}, {5, 0}}));
  EXPECT_EQ(tables.public_outputs, (std::vector<SlotRef>{{1, 1}}));
}

TEST(Fuser, DuplicateProducerNamesBothOps) {
  auto dual = std::make_shared<DualExtraOutput>();
  dual->set_extra_output_channel(1, "c");
  auto stat = std::make_shared<RowStat>();
  stat->set_extra_output_channel(0, "c");
  try {
    OperationFuser fuser({dual, std::make_shared<Identity>(), stat}, FusionRegistry{}, Locking::kPersistent);
    FAIL() << "duplicate producer accepted";
  } catch (const DuplicateProducerError& e) {
    EXPECT_THAT(e.what(), StartsWith("duplicate-producer"));
    EXPECT_THAT(e.what(), HasSubstr("'c'"));
    EXPECT_THAT(e.what(), HasSubstr("DualExtraOutput (op 0) extra output slot 1"));
    EXPECT_THAT(e.what(), HasSubstr("RowStat (op 2) extra output slot 0"));
  }
  EXPECT_FALSE(dual->locked());  // a failed construction locks nothing
  EXPECT_FALSE(stat->locked());
}

TEST(Fuser, MissingProducerThrowsNamingSlotAndChannel) {
  auto add = consumer("ghost");
  try {
    OperationFuser fuser({std::make_shared<Identity>(), add}, FusionRegistry{}, Locking::kPersistent);
    FAIL() << "missing producer accepted";
  } catch (const MissingProducerError& e) {
    EXPECT_THAT(e.what(), StartsWith("missing-producer"));
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput (op 1) extra input slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("'ghost'"));
  }
  EXPECT_FALSE(add->locked());
}

TEST(Fuser, ProducerAfterConsumerIsProducerNotEarlier) {
  auto add = consumer("c");
  auto make = producer("c");
  try {
    OperationFuser fuser({add, make}, FusionRegistry{}, Locking::kPersistent);
    FAIL() << "producer after consumer accepted";
  } catch (const ProducerNotEarlierError& e) {
    EXPECT_THAT(e.what(), StartsWith("producer-not-earlier"));
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput (op 0)"));
    EXPECT_THAT(e.what(), HasSubstr("MakeExtraOutput (op 1)"));
  }
  EXPECT_FALSE(add->locked());
  EXPECT_FALSE(make->locked());
}

TEST(Fuser, ConsumerAtTheProducersIndexIsProducerNotEarlier) {
  auto echo = std::make_shared<EchoOp>();
  echo->set_extra_output_channel(0, "self", false);
  echo->set_extra_input_channel(0, "self");
  try {
    OperationFuser fuser({std::make_shared<Identity>(), echo}, FusionRegistry{}, Locking::kPersistent);
    FAIL() << "an op consuming its own output accepted";
  } catch (const ProducerNotEarlierError& e) {
    EXPECT_THAT(e.what(), HasSubstr("EchoOp (op 1) extra input slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("below 1"));
  }
}

TEST(Fuser, PersistentConstructionLocksAndTransientDoesNot) {
  auto a = std::make_shared<Identity>();
  OperationFuser transient({a}, FusionRegistry{}, Locking::kTransient);
  EXPECT_FALSE(a->locked());
  OperationFuser persistent({a}, FusionRegistry{}, Locking::kPersistent);
  EXPECT_TRUE(a->locked());
}

TEST(Fuser, ExtraInputSurplusAndShortfallThrow) {
  OperationFuser fuser({std::make_shared<AddExtraInput>()}, FusionRegistry{}, Locking::kTransient);
  const at::Tensor x = at::ones({2, 2}, test_options());
  try {
    fuser.forward(x, {x, x});
    FAIL() << "surplus accepted";
  } catch (const ExtraInputCountError& e) {
    EXPECT_THAT(e.what(), StartsWith("extra-input-count"));
    EXPECT_THAT(e.what(), HasSubstr("expected 1"));
    EXPECT_THAT(e.what(), HasSubstr("got 2"));
  }
  try {
    fuser.forward(x, {});
    FAIL() << "shortfall accepted";
  } catch (const ExtraInputCountError& e) {
    EXPECT_THAT(e.what(), HasSubstr("AddExtraInput (op 0) extra input slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("got 0"));
  }
}

// ---- plans and returned containers ---------------------------------------------------------

TEST(Fuser, FusedOpSkippingAnOpIsPlanMismatch) {
  std::vector<BasicOpPtr> ops{std::make_shared<Identity>(), std::make_shared<ReLU>(),
                              std::make_shared<ConstantScale>(2.0)};
  FusionRegistry registry = registry_with("Skipper", [](const std::vector<FusedOpPtr>& groups) -> FusedOpPtr {
    return std::make_shared<ClaimingFusedOp>(
        "Skipper", std::vector<BasicOpPtr>{groups[0]->basic_ops()[0], groups[2]->basic_ops()[0]});
  });
  OperationFuser fuser(ops, registry, Locking::kTransient);
  try {
    fuser.forward(at::ones({2, 2}, test_options()), {});
    FAIL() << "a plan skipping ReLU ran";
  } catch (const PlanMismatchError& e) {
    EXPECT_THAT(e.what(), StartsWith("plan-mismatch"));
    EXPECT_THAT(e.what(), HasSubstr("Skipper covers ConstantScale where the plan expects ReLU (op 1)"));
  }
  EXPECT_THROW(fuser.forward_plan(0), PlanMismatchError);
}

TEST(Fuser, MapPlanRejectsOpsOutOfOrderAndIncompletePlans) {
  auto a = std::make_shared<Identity>();
  auto b = std::make_shared<ReLU>();
  std::vector<BasicOpPtr> ops{a, b};
  EXPECT_THROW(map_plan({std::make_shared<ClaimingFusedOp>("Swap", std::vector<BasicOpPtr>{b, a})}, ops),
               PlanMismatchError);
  try {
    map_plan({std::make_shared<SingleOpGroup>(a)}, ops);
    FAIL() << "a plan covering 1 of 2 ops accepted";
  } catch (const PlanMismatchError& e) {
    EXPECT_THAT(e.what(), HasSubstr("covers 1 of 2"));
  }
  const std::vector<PlanEntry> entries =
      map_plan({std::make_shared<ClaimingFusedOp>("Both", std::vector<BasicOpPtr>{a, b})}, ops);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].begin, 0);
  EXPECT_EQ(entries[0].end, 2);
  EXPECT_TRUE(entries[0].fused);
}

TEST(Fuser, PublicOutputReturnedNoneThrows) {
  auto bad = std::make_shared<BadOutputsOp>(1, /*none=*/true);
  OperationFuser fuser({std::make_shared<Identity>(), bad}, FusionRegistry{}, Locking::kTransient);
  try {
    fuser.forward(at::ones({2, 2}, test_options()), {});
    FAIL() << "undefined public output accepted";
  } catch (const PublicOutputNoneError& e) {
    EXPECT_THAT(e.what(), StartsWith("public-output-returned-none"));
    EXPECT_THAT(e.what(), HasSubstr("BadOutputsOp (op 1) extra output slot 0"));
  }
  // Bound but also returned to the caller: still public.
  auto bound_public = std::make_shared<BadOutputsOp>(1, true);
  bound_public->set_extra_output_channel(0, "c", /*output_to_caller=*/true);
  OperationFuser fuser2({bound_public}, FusionRegistry{}, Locking::kTransient);
  EXPECT_THROW(fuser2.forward(at::ones({2, 2}, test_options()), {}), PublicOutputNoneError);
}

TEST(Fuser, HiddenOutputReturnedNoneForAConsumerOutsideTheGroupIsNeededOutsideItsFusion) {
  std::vector<BasicOpPtr> ops{producer("c"), std::make_shared<Identity>(), consumer("c")};
  // Fuse only the first two ops; the consumer stays outside.
  FusionRegistry hiding;
  hiding.add("Hider", FusionPass::kForward, [](const std::vector<FusedOpPtr>& groups, const FusionContext&) {
    std::vector<FusedOpPtr> out{
        std::make_shared<HidingFusedOp>(std::vector<BasicOpPtr>{groups[0]->basic_ops()[0], groups[1]->basic_ops()[0]})};
    out.push_back(groups[2]);
    return out;
  });
  OperationFuser fuser(ops, hiding, Locking::kTransient);
  try {
    fuser.forward(at::ones({2, 2}, test_options()), {});
    FAIL() << "undefined channel value needed by an outside consumer accepted";
  } catch (const NeededOutsideFusionError& e) {
    EXPECT_THAT(e.what(), StartsWith("needed-outside-its-fusion"));
    EXPECT_THAT(e.what(), HasSubstr("MakeExtraOutput (op 0) extra output slot 0"));
    EXPECT_THAT(e.what(), HasSubstr("'c'"));
    EXPECT_THAT(e.what(), HasSubstr("HidingFusedOp"));
  }
}

TEST(Fuser, OpReturningTooManyExtraOutputsIsExtraCountError) {
  auto bad = std::make_shared<BadOutputsOp>(2, false);
  OperationFuser fuser({bad}, FusionRegistry{}, Locking::kTransient);
  try {
    fuser.forward(at::ones({2, 2}, test_options()), {});
    FAIL() << "two extra outputs from a one-output op accepted";
  } catch (const ExtraCountError& e) {
    EXPECT_THAT(e.what(), StartsWith("extra-count"));
    EXPECT_THAT(e.what(), HasSubstr("BadOutputsOp returned 2 extra outputs, expected 1"));
  }
  auto none_at_all = std::make_shared<BadOutputsOp>(0, false);
  OperationFuser fuser2({none_at_all}, FusionRegistry{}, Locking::kTransient);
  EXPECT_THROW(fuser2.forward(at::ones({2, 2}, test_options()), {}), ExtraCountError);
}

TEST(Fuser, BackwardReturningTooManyExtraInputGradientsIsExtraCountError) {
  auto bad = std::make_shared<TooManyGradsOp>();
  OperationFuser fuser({bad}, FusionRegistry{}, Locking::kTransient);
  const at::Tensor x = at::ones({2, 2}, test_options()).requires_grad_(true);
  const at::Tensor e = at::ones({2, 2}, test_options()).requires_grad_(true);
  std::vector<at::Tensor> out = fuser.forward(x, {e});
  try {
    out[0].sum().backward();
    FAIL() << "two gradients for one extra input accepted";
  } catch (const std::exception& err) {
    // Autograd may wrap the message; the kind and the op must survive.
    EXPECT_THAT(err.what(), HasSubstr("extra-count"));
    EXPECT_THAT(err.what(), HasSubstr("TooManyGradsOp returned 2 extra-input gradients, expected 1"));
  }
}

TEST(Fuser, BackwardReturningTheWrongNumberOfParameterGradientsIsParamGradCountError) {
  for (size_t returned : {size_t{0}, size_t{2}}) {
    SCOPED_TRACE("returned " + std::to_string(returned));
    OperationFuser fuser({std::make_shared<ParamGradCountOp>(returned)}, FusionRegistry{}, Locking::kTransient);
    const at::Tensor x = at::ones({2, 2}, test_options()).requires_grad_(true);
    std::vector<at::Tensor> out = fuser.forward(x, {});
    try {
      out[0].sum().backward();
      FAIL() << returned << " parameter gradients for one parameter accepted";
    } catch (const std::exception& err) {
      EXPECT_THAT(err.what(), HasSubstr("param-grad-count"));
      EXPECT_THAT(err.what(), HasSubstr("returned " + std::to_string(returned) +
                                        " parameter gradient(s) for ParamGradCountOp (op 0), which has 1"));
    }
  }
}

TEST(Fuser, BackwardReturningOneGradientPerParameterDeliversIt) {
  auto op = std::make_shared<ParamGradCountOp>(1);
  OperationFuser fuser({op}, FusionRegistry{}, Locking::kTransient);
  const at::Tensor x = at::ones({2, 2}, test_options()).requires_grad_(true);
  fuser.forward(x, {})[0].sum().backward();
  const at::Tensor w = op->parameters()[0];
  ASSERT_TRUE(w.grad().defined());
  EXPECT_DOUBLE_EQ(w.grad().item<double>(), 4.0);
}

// ---- which ops need backward ---------------------------------------------------------------

TEST(Fuser, FirstOpRequiringBackwardFollowsInputParamsAndPublicExtras) {
  auto lin = std::make_shared<Linear>(LinearOptions(3, 3), test_options());
  auto srelu = std::make_shared<ScaledSReLU>();
  std::vector<BasicOpPtr> ops{std::make_shared<Identity>(), srelu, lin};
  OperationFuser fuser(ops, FusionRegistry{}, Locking::kTransient);
  const at::Tensor x = at::ones({2, 3}, test_options());
  const at::Tensor s = at::ones({2}, test_options());
  EXPECT_EQ(fuser.first_op_requiring_backward(x, {s}), 2);  // only Linear's weight
  EXPECT_EQ(fuser.first_op_requiring_backward(x, {s.clone().requires_grad_(true)}), 1);
  EXPECT_EQ(fuser.first_op_requiring_backward(x.clone().requires_grad_(true), {s}), 0);
  lin->weight().requires_grad_(false);
  EXPECT_EQ(fuser.first_op_requiring_backward(x, {s}), 3);
  lin->weight().requires_grad_(true);
  at::NoGradGuard no_grad;
  EXPECT_EQ(fuser.first_op_requiring_backward(x.clone().requires_grad_(true), {s}), 3);
}

TEST(Fuser, BackwardStopsBeforeOpsThatNeedNoGradient) {
  at::Generator gen = make_generator(21);
  auto spy0 = std::make_shared<CountingIdentity>();
  auto frozen = std::make_shared<Linear>(LinearOptions(4, 4), test_options());
  frozen->weight().requires_grad_(false);
  auto bias = std::make_shared<Bias>(4, test_options());
  auto spy3 = std::make_shared<CountingIdentity>();
  auto last = std::make_shared<Linear>(LinearOptions(4, 3), test_options());
  Sequential seq({spy0, frozen, bias, spy3, last}, FusionRegistry{});
  const at::Tensor x = seeded_randn({5, 4}, gen);  // does not require grad
  EXPECT_EQ(seq.fusers()[0]->first_op_requiring_backward(x, {}), 2);

  const PathResult expected = run_reference(seq, x, {});
  const PathResult got = run_fused(seq, x, {});
  EXPECT_EQ(spy0->backward_calls, 0);  // nothing computed before the first op needing backward
  EXPECT_EQ(spy3->backward_calls, 1);
  EXPECT_FALSE(got.grad_input.defined());
  EXPECT_FALSE(got.grad_params[1][0].defined());  // frozen weight
  EXPECT_TRUE(tensors_close(got.grad_params[2][0], expected.grad_params[2][0], kFloat64Tol, "bias grad"));
  EXPECT_TRUE(tensors_close(got.grad_params[4][0], expected.grad_params[4][0], kFloat64Tol, "last weight grad"));
  EXPECT_TRUE(seq.fusers()[0]->last_trace()->backward_ran);
}

// ---- the finding-1 scenario: fresh probs from Dispatch -------------------------------------

/// Dispatch(G) -> Scaled activation (scales bound to the fresh probs) -> Combine.
struct DispatchCase {
  std::unique_ptr<Sequential> seq;
  at::Tensor x;
  at::Tensor logits;
};

DispatchCase dispatch_case(BasicOpPtr activation, int64_t features, OutputStyle style = OutputStyle::kVector) {
  at::Generator gen = make_generator(31);
  const int64_t rows = 7;
  const int64_t groups = 3;
  auto dispatch = std::make_shared<Dispatch>(groups);
  dispatch->set_extra_output_channel(0, "splits", false)
      .set_extra_output_channel(1, "probs", false)
      .set_extra_output_channel(2, "map", false);
  activation->set_extra_input_channel(0, "probs");
  auto combine = std::make_shared<Combine>();
  combine->set_extra_input_channel(0, "map");
  for (const BasicOpPtr& op : {static_cast<BasicOpPtr>(dispatch), activation, static_cast<BasicOpPtr>(combine)}) {
    op->set_output_style(style);
  }
  DispatchCase c;
  c.seq = std::make_unique<Sequential>(std::vector<Module>{dispatch, activation, combine}, FusionRegistry{});
  c.x = seeded_randn({rows, features}, gen, at::kDouble, true, /*away_from_zero=*/true);
  c.logits = seeded_randn({rows, groups}, gen, at::kDouble, true);
  return c;
}

void expect_router_gradient_delivered(BasicOpPtr activation, int64_t features) {
  DispatchCase c = dispatch_case(std::move(activation), features);
  const PathResult expected = run_reference(*c.seq, c.x, {c.logits});
  ASSERT_TRUE(expected.grad_extra_inputs[0].defined());
  ASSERT_GT(expected.grad_extra_inputs[0].abs().max().item<double>(), 1e-3);  // a real gradient to lose
  PathResult got = run_fused(*c.seq, c.x, {c.logits});
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol));
  EXPECT_TRUE(tensors_close(got.grad_extra_inputs[0], expected.grad_extra_inputs[0], kFloat64Tol, "router logits"));
  EXPECT_TRUE(tensors_close(got.channel_grads[0]["probs"], expected.channel_grads[0].at("probs"), kFloat64Tol,
                            "probs channel"));
}

void expect_router_gradient_lost_under_fault(BasicOpPtr activation, int64_t features) {
  FaultScope fault(Fault::kInternalRequiresGrad);
  DispatchCase c = dispatch_case(std::move(activation), features);
  const PathResult expected = run_reference(*c.seq, c.x, {c.logits});
  const PathResult got = run_fused(*c.seq, c.x, {c.logits});
  EXPECT_FALSE(tensors_close(got.grad_extra_inputs[0], expected.grad_extra_inputs[0], kFloat64Tol, "router logits"));
}

TEST(FuserFreshProducer, DispatchProbsToScaledSwiGLUDeliverRouterGradient) {
  expect_router_gradient_delivered(std::make_shared<ScaledSwiGLU>(), 6);
}

TEST(FuserFreshProducer, DispatchProbsToScaledSReLUDeliverRouterGradient) {
  expect_router_gradient_delivered(std::make_shared<ScaledSReLU>(), 5);
}

TEST(FuserFreshProducer, InternalRequiresGradFaultLosesRouterGradientThroughScaledSwiGLU) {
  expect_router_gradient_lost_under_fault(std::make_shared<ScaledSwiGLU>(), 6);
}

TEST(FuserFreshProducer, InternalRequiresGradFaultLosesRouterGradientThroughScaledSReLU) {
  expect_router_gradient_lost_under_fault(std::make_shared<ScaledSReLU>(), 5);
}

TEST(FuserFreshProducer, RowStatFreshOutputFeedsScaledSReLUGradient) {
  at::Generator gen = make_generator(37);
  auto stat = std::make_shared<RowStat>();
  stat->set_extra_output_channel(0, "ms", false);
  auto act = std::make_shared<ScaledSReLU>();
  act->set_extra_input_channel(0, "ms");
  Sequential seq({std::make_shared<Linear>(LinearOptions(4, 4), test_options()), stat, act}, FusionRegistry{});
  const at::Tensor x = seeded_randn({5, 4}, gen, at::kDouble, true);
  EXPECT_TRUE(fused_matches_reference(seq, x, {}, kFloat64Tol));
}

// ---- generator-style containers (finding 2) ------------------------------------------------

TEST(FuserContainers, GeneratorStyleMatchesVectorStyleInForwardAndBackward) {
  DispatchCase vec = dispatch_case(std::make_shared<ScaledSwiGLU>(), 6, OutputStyle::kVector);
  DispatchCase gen = dispatch_case(std::make_shared<ScaledSwiGLU>(), 6, OutputStyle::kGenerator);
  const PathResult a = run_fused(*vec.seq, vec.x, {vec.logits});
  const PathResult b = run_fused(*gen.seq, gen.x, {gen.logits});
  // Same ops, same data, same order of math: the container style must not change a bit.
  EXPECT_TRUE(testing::results_close(b, a, testing::Tolerance{0, 0}));
  EXPECT_TRUE(b.grad_extra_inputs[0].defined());
  const PathResult expected = run_reference(*gen.seq, gen.x, {gen.logits});
  EXPECT_TRUE(testing::results_close(b, expected, kFloat64Tol));
}

TEST(FuserContainers, GeneratorStyleOnChannelOpsWorksInBackward) {
  at::Generator gen = make_generator(41);
  auto make = producer("r", true);
  auto add = consumer("r");
  auto dual = std::make_shared<DualExtraOutput>();
  dual->set_extra_output_channel(0, "d", false);
  auto add2 = consumer("d");
  std::vector<BasicOpPtr> ops{make, std::make_shared<Linear>(LinearOptions(3, 3), test_options()), add, dual, add2};
  for (const BasicOpPtr& op : ops) op->set_output_style(OutputStyle::kGenerator);
  Sequential seq(std::vector<Module>(ops.begin(), ops.end()), FusionRegistry{});
  const at::Tensor x = seeded_randn({4, 3}, gen, at::kDouble, true);
  EXPECT_TRUE(fused_matches_reference(seq, x, {}, kFloat64Tol));
}

TEST(FuserContainers, GeneratorOutputsFaultBreaksGeneratorStyle) {
  FaultScope fault(Fault::kGeneratorOutputs);
  DispatchCase gen = dispatch_case(std::make_shared<ScaledSwiGLU>(), 6, OutputStyle::kGenerator);
  try {
    gen.seq->forward(gen.x, {gen.logits});
    FAIL() << "generator containers sized under the generator-outputs fault";
  } catch (const GeneratorMisuseError& e) {
    EXPECT_THAT(e.what(), HasSubstr("generator"));
  }
  // Vector style is unaffected by the fault.
  DispatchCase vec = dispatch_case(std::make_shared<ScaledSwiGLU>(), 6, OutputStyle::kVector);
  EXPECT_TRUE(fused_matches_reference(*vec.seq, vec.x, {vec.logits}, kFloat64Tol));
}

// ---- slot order (finding 4) ----------------------------------------------------------------

TEST(FuserSlotOrder, PublicExtrasFollowOpSlotOrderAcrossOps) {
  at::Generator gen = make_generator(43);
  auto first = std::make_shared<AddExtraInput>();
  auto last = std::make_shared<AddExtraInput>();
  Sequential seq({first, producer("c"), consumer("c"), last}, FusionRegistry{});
  const at::Tensor x = seeded_randn({3, 2}, gen);
  const at::Tensor e1 = seeded_randn({3, 2}, gen);
  const at::Tensor e2 = seeded_randn({3, 2}, gen);
  const std::vector<at::Tensor> out = seq.forward(x, {e1, e2});
  // (x + e1) feeds both the channel and the main path; e2 is added last.
  EXPECT_TRUE(out[0].allclose(2 * (x + e1) + e2));
  EXPECT_TRUE(fused_matches_reference(seq, x.clone().requires_grad_(true),
                                      {e1.clone().requires_grad_(true), e2.clone().requires_grad_(true)}, kFloat64Tol));
}

/// RowStat produces per-row scales for GroupedLinear(scale_bias) slot 1; slot 0 (split sizes)
/// stays public: a public slot *before* a bound one inside one op.
struct PublicThenBound {
  std::unique_ptr<Sequential> seq;
  at::Tensor x;
  at::Tensor splits;
};

PublicThenBound public_then_bound(std::vector<int64_t> splits) {
  at::Generator gen = make_generator(47);
  auto stat = std::make_shared<RowStat>();
  stat->set_extra_output_channel(0, "scales", false);
  auto grouped = std::make_shared<GroupedLinear>(GroupedLinearOptions(3, 4, 2).scale_bias(true), test_options());
  grouped->set_extra_input_channel(1, "scales");
  PublicThenBound c;
  c.seq = std::make_unique<Sequential>(std::vector<Module>{stat, grouped}, FusionRegistry{});
  int64_t rows = 0;
  for (int64_t s : splits) rows += s;
  c.x = seeded_randn({rows, 4}, gen, at::kDouble, true);
  c.splits = int_tensor(splits);
  return c;
}

TEST(FuserSlotOrder, GroupedLinearPublicSplitSizesBeforeBoundScalesWithinOneOp) {
  PublicThenBound c = public_then_bound({2, 0, 3});
  EXPECT_EQ(c.seq->num_public_extra_inputs(), 1);
  EXPECT_TRUE(fused_matches_reference(*c.seq, c.x, {c.splits}, kFloat64Tol));
}

TEST(FuserSlotOrder, SlotOrderFaultBreaksPublicBeforeBoundWithinOneOp) {
  FaultScope fault(Fault::kSlotOrder);
  PublicThenBound c = public_then_bound({2, 0, 3});
  // Bound-first matching hands the caller's split sizes to the scales' slot and leaves the
  // split sizes' slot empty: the fused path raises on a configuration the reference runs.
  EXPECT_NO_THROW(run_reference(*c.seq, c.x, {c.splits}));
  try {
    run_fused(*c.seq, c.x, {c.splits});
    FAIL() << "the slot-order fault went unnoticed";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("invalid-argument: GroupedLinear slot 0: split sizes must be an int64 tensor"));
  }
}

TEST(FuserSlotOrder, ScaleBiasFaultBreaksPublicSplitSizesWithBoundScales) {
  FaultScope fault(Fault::kScaleBiasGrad);
  PublicThenBound c = public_then_bound({2, 0, 3});
  EXPECT_TRUE(fused_differs_from_reference(*c.seq, c.x, {c.splits}, kFloat64Tol));
}

/// SplitSource feeds GroupedLinear(scale_bias) slot 0; slot 1 (scales) is public.
struct BoundThenPublic {
  std::unique_ptr<Sequential> seq;
  at::Tensor x;
  at::Tensor scales;
};

BoundThenPublic bound_then_public() {
  at::Generator gen = make_generator(53);
  auto source = std::make_shared<SplitSource>(std::vector<int64_t>{3, 2});
  source->set_extra_output_channel(0, "splits", false);
  auto grouped = std::make_shared<GroupedLinear>(GroupedLinearOptions(2, 3, 4).scale_bias(true), test_options());
  grouped->set_extra_input_channel(0, "splits");
  BoundThenPublic c;
  c.seq = std::make_unique<Sequential>(std::vector<Module>{source, grouped}, FusionRegistry{});
  c.x = seeded_randn({5, 3}, gen, at::kDouble, true);
  c.scales = seeded_randn({5}, gen, at::kDouble, true);
  return c;
}

TEST(FuserSlotOrder, GroupedLinearBoundSplitSizesThenPublicScales) {
  BoundThenPublic c = bound_then_public();
  const PathResult expected = run_reference(*c.seq, c.x, {c.scales});
  const PathResult got = run_fused(*c.seq, c.x, {c.scales});
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol));
  ASSERT_TRUE(got.grad_extra_inputs[0].defined());  // the public scales get their gradient
  // Split sizes travel through an integer channel: never a gradient.
  EXPECT_EQ(got.channel_grads[0].count("splits"), 0u);
}

TEST(FuserSlotOrder, ScaleBiasFaultBreaksBoundSplitSizesThenPublicScales) {
  FaultScope fault(Fault::kScaleBiasGrad);
  BoundThenPublic c = bound_then_public();
  EXPECT_TRUE(fused_differs_from_reference(*c.seq, c.x, {c.scales}, kFloat64Tol));
}

TEST(FuserSlotOrder, SlotOrderFaultLeavesBoundThenPublicIntact) {
  // Bound slots first is exactly what the faulty matcher assumes: no difference here.
  FaultScope fault(Fault::kSlotOrder);
  BoundThenPublic c = bound_then_public();
  EXPECT_TRUE(fused_matches_reference(*c.seq, c.x, {c.scales}, kFloat64Tol));
}

// ---- fan-out and channel gradients --------------------------------------------------------

TEST(FuserChannels, FanOutToThreeConsumersSumsEveryGradientPlusThePublicOne) {
  at::Generator gen = make_generator(59);
  auto make = producer("r", /*to_caller=*/true);
  Sequential seq({make, std::make_shared<Linear>(LinearOptions(4, 4), test_options()), consumer("r"),
                  std::make_shared<GELU>(), consumer("r"), std::make_shared<Bias>(4, test_options()), consumer("r")},
                 FusionRegistry{});
  const at::Tensor x = seeded_randn({5, 4}, gen, at::kDouble, true);
  const PathResult expected = run_reference(seq, x, {});
  const PathResult got = run_fused(seq, x, {});
  ASSERT_EQ(got.outputs.size(), 2u);  // main + the public channel value
  EXPECT_TRUE(testing::results_close(got, expected, kFloat64Tol));
  ASSERT_EQ(got.channel_grads[0].count("r"), 1u);
  EXPECT_TRUE(tensors_close(got.channel_grads[0].at("r"), expected.channel_grads[0].at("r"), kFloat64Tol, "r"));
  // The public cotangent alone is not the answer: the consumers' gradients were added.
  const at::Tensor public_cotangent = testing::make_cotangents(got.outputs, 77)[1];
  EXPECT_FALSE(tensors_close(got.channel_grads[0].at("r"), public_cotangent, kFloat64Tol, "public only"));
}

TEST(FuserChannels, TraceRecordsChannelValues) {
  auto dual = std::make_shared<DualExtraOutput>(2.0, 3.0);
  dual->set_extra_output_channel(0, "a", false).set_extra_output_channel(1, "b", false);
  auto consume_a = consumer("a");
  Sequential seq({dual, consume_a}, FusionRegistry{});
  const at::Tensor x = at::arange(6, test_options()).reshape({3, 2});
  const std::vector<at::Tensor> out = seq.forward(x, {});
  ASSERT_EQ(out.size(), 1u);  // hidden outputs are not returned; "b" has no consumer and is dropped
  EXPECT_TRUE(out[0].allclose(3 * x));
  const auto trace = seq.fusers()[0]->last_trace();
  EXPECT_TRUE(trace->channel_values.at("a").allclose(2 * x));
  EXPECT_TRUE(trace->channel_values.at("b").allclose(3 * x));
  EXPECT_FALSE(trace->backward_ran);
}

// ---- no aliasing (runtime.md section 11) ---------------------------------------------------

TEST(FuserAliasing, InPlaceAddDoesNotChangeWhatTheNextConsumerReads) {
  at::Generator gen = make_generator(61);
  Sequential seq({producer("c"), consumer("c", InPlace::kYes), consumer("c")}, FusionRegistry{});
  const at::Tensor x = seeded_randn({3, 4}, gen);
  const at::Tensor x_before = x.clone();
  const std::vector<at::Tensor> out = seq.forward(x, {});
  EXPECT_TRUE(out[0].allclose(3 * x_before));  // (x + x) + x; an aliased write would give 4x
  EXPECT_TRUE(x.equal(x_before));              // the caller's tensor is untouched
  EXPECT_TRUE(seq.fusers()[0]->last_trace()->channel_values.at("c").equal(x_before));
  EXPECT_TRUE(fused_matches_reference(seq, x.clone().requires_grad_(true), {}, kFloat64Tol));
}

TEST(FuserAliasing, InPlaceAddOfAPublicExtraInputLeavesTheCallersTensorAlone) {
  at::Generator gen = make_generator(62);
  auto add = std::make_shared<AddExtraInput>(InPlace::kYes);
  Sequential seq({add}, FusionRegistry{});
  const at::Tensor x = seeded_randn({3, 4}, gen);
  const at::Tensor e = seeded_randn({3, 4}, gen);
  const at::Tensor e_before = e.clone();
  const std::vector<at::Tensor> out = seq.forward(x, {e});
  EXPECT_TRUE(out[0].allclose(x + e_before));
  EXPECT_TRUE(e.equal(e_before));
}

TEST(FuserAliasing, InPlaceMakeExtraOutputWritesNeitherTheCallersGradientNorTheStoredChannelGradient) {
  at::Generator gen = make_generator(67);
  auto make = std::make_shared<MakeExtraOutput>(InPlace::kYes);
  make->set_extra_output_channel(0, "c", /*output_to_caller=*/true);
  Sequential seq({make, std::make_shared<Linear>(LinearOptions(4, 4), test_options()), consumer("c")},
                 FusionRegistry{});
  const at::Tensor x = seeded_randn({3, 4}, gen, at::kDouble, true);
  const std::vector<at::Tensor> out = seq.forward(x, {});
  ASSERT_EQ(out.size(), 2u);
  const at::Tensor g_main = seeded_randn({3, 4}, gen);
  const at::Tensor g_public = seeded_randn({3, 4}, gen);
  const at::Tensor g_main_before = g_main.clone();
  const at::Tensor g_public_before = g_public.clone();
  const std::vector<at::Tensor> grads = torch::autograd::grad({out[0], out[1]}, {x}, {g_main, g_public});
  EXPECT_TRUE(g_public.equal(g_public_before));  // the caller's gradient of the public output
  EXPECT_TRUE(g_main.equal(g_main_before));
  // The traced channel gradient is public + consumer gradient (= g_main, AddExtraInput passes
  // it through), never the op's in-place accumulation on top of it.
  const at::Tensor traced = seq.fusers()[0]->last_trace()->channel_grads.at("c");
  EXPECT_TRUE(tensors_close(traced, g_public_before + g_main_before, kFloat64Tol, "channel c grad"));
  // And the whole thing still matches the reference.
  EXPECT_TRUE(fused_matches_reference(seq, x, {}, kFloat64Tol));
}

}  // namespace
}  // namespace gradfuzz::ops
