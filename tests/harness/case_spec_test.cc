#include "harness/case_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ops/fusion_registry.h"
#include "ops/op_registry.h"

namespace gradfuzz::harness {
namespace {

using ::testing::HasSubstr;

// ----- A generator of arbitrary (not necessarily runnable) specs for the round trip.

rc::Gen<std::optional<std::string>> gen_channel() {
  return rc::gen::oneOf(rc::gen::just(std::optional<std::string>()),
                        rc::gen::map(rc::gen::elementOf(std::vector<std::string>{"a", "probs", "x/y", "~t", "split"}),
                                     [](std::string s) { return std::optional<std::string>(std::move(s)); }));
}

/// Some of `names` (in order, no repeats).
rc::Gen<std::vector<std::string>> gen_subset(std::vector<std::string> names) {
  const size_t n = names.size();
  return rc::gen::map(rc::gen::container<std::vector<bool>>(n, rc::gen::arbitrary<bool>()),
                      [names](const std::vector<bool>& keep) {
                        std::vector<std::string> out;
                        for (size_t i = 0; i < names.size(); ++i) {
                          if (keep[i]) out.push_back(names[i]);
                        }
                        return out;
                      });
}

/// Some of `names`, each with a finite value.
rc::Gen<ops::OpAttrs> gen_subset_map(std::vector<std::string> names) {
  auto finite = rc::gen::suchThat(rc::gen::arbitrary<double>(), [](double v) { return std::isfinite(v); });
  return rc::gen::map(rc::gen::pair(gen_subset(names), rc::gen::container<std::vector<double>>(names.size(), finite)),
                      [](const std::pair<std::vector<std::string>, std::vector<double>>& p) {
                        ops::OpAttrs attrs;
                        for (size_t i = 0; i < p.first.size(); ++i) attrs[p.first[i]] = p.second[i];
                        return attrs;
                      });
}

rc::Gen<OpSpec> gen_op() {
  auto names = ops::OpRegistry::catalog().names();
  names.push_back(kBoundaryOp);
  return rc::gen::mapcat(rc::gen::elementOf(names), [](const std::string& name) {
    if (name == kBoundaryOp) return rc::gen::just(OpSpec{name, {}, {}, {}, ops::OutputStyle::kVector, {}, {}});
    std::vector<std::string> attr_names;
    for (const auto& [key, value] : ops::OpRegistry::catalog().info(name).defaults) attr_names.push_back(key);
    return rc::gen::build<OpSpec>(
        rc::gen::set(&OpSpec::name, rc::gen::just(name)), rc::gen::set(&OpSpec::attrs, gen_subset_map(attr_names)),
        rc::gen::set(&OpSpec::input_channels,
                     rc::gen::container<std::vector<std::optional<std::string>>>(gen_channel())),
        rc::gen::set(&OpSpec::output_bindings,
                     rc::gen::container<std::vector<OutputBindingSpec>>(
                         rc::gen::build<OutputBindingSpec>(rc::gen::set(&OutputBindingSpec::channel, gen_channel()),
                                                           rc::gen::set(&OutputBindingSpec::output_to_caller)))),
        rc::gen::set(&OpSpec::output_style, rc::gen::element(ops::OutputStyle::kVector, ops::OutputStyle::kGenerator)),
        rc::gen::set(&OpSpec::param_requires_grad), rc::gen::set(&OpSpec::extra_input_requires_grad));
  });
}

rc::Gen<CaseSpec> gen_spec() {
  return rc::gen::mapcat(rc::gen::container<std::vector<OpSpec>>(gen_op()), [](std::vector<OpSpec> op_list) {
    std::vector<int64_t> catalog_ops;
    for (size_t i = 0; i < op_list.size(); ++i) {
      if (op_list[i].name != kBoundaryOp) catalog_ops.push_back(static_cast<int64_t>(i));
    }
    auto op_index = catalog_ops.empty() ? rc::gen::just<int64_t>(-1) : rc::gen::elementOf(catalog_ops);
    auto fusion_names = ops::FusionRegistry::catalog().names();
    return rc::gen::build<CaseSpec>(
        rc::gen::set(&CaseSpec::ops, rc::gen::just(op_list)),
        rc::gen::set(&CaseSpec::fusions, gen_subset(fusion_names)),
        rc::gen::set(
            &CaseSpec::call_then_bind,
            catalog_ops.empty()
                ? rc::gen::just(std::vector<CallThenBindStep>{})
                : rc::gen::container<std::vector<CallThenBindStep>>(rc::gen::build<CallThenBindStep>(
                      rc::gen::set(&CallThenBindStep::op, op_index), rc::gen::set(&CallThenBindStep::grad_mode)))),
        rc::gen::set(&CaseSpec::input_requires_grad),
        rc::gen::set(&CaseSpec::input_shape,
                     rc::gen::container<std::vector<int64_t>>(2, rc::gen::inRange<int64_t>(1, 64))),
        rc::gen::set(&CaseSpec::dtype, rc::gen::element<std::string>("float64", "float32", "bfloat16", "float16")),
        rc::gen::set(&CaseSpec::device, rc::gen::element<std::string>("cpu", "cuda")), rc::gen::set(&CaseSpec::seed),
        rc::gen::set(&CaseSpec::extra_input_count_delta, rc::gen::inRange<int64_t>(-3, 4)),
        rc::gen::set(&CaseSpec::corrupt_split_sizes),
        rc::gen::set(&CaseSpec::late_binds,
                     catalog_ops.empty()
                         ? rc::gen::just(std::vector<LateBindStep>{})
                         : rc::gen::container<std::vector<LateBindStep>>(rc::gen::build<LateBindStep>(
                               rc::gen::set(&LateBindStep::op, op_index),
                               rc::gen::set(&LateBindStep::slot, rc::gen::inRange<int64_t>(0, 4)),
                               rc::gen::set(&LateBindStep::channel, rc::gen::element<std::string>("a", "b"))))),
        rc::gen::set(&CaseSpec::repeat_calls,
                     rc::gen::container<std::vector<RepeatCall>>(rc::gen::build<RepeatCall>(
                         rc::gen::set(&RepeatCall::no_grad), rc::gen::set(&RepeatCall::input_requires_grad)))),
        rc::gen::set(&CaseSpec::world_size, rc::gen::inRange<int64_t>(1, kMaxWorldSize + 1)),
        rc::gen::set(&CaseSpec::input_layout, rc::gen::element<std::string>("replicated", "rows", "features")));
  });
}

RC_GTEST_PROP(CaseSpecJson, RoundTripsEveryFieldExactly, ()) {
  const CaseSpec spec = *gen_spec();
  nlohmann::json j;
  to_json(j, spec);
  // Through text too, as a case file does.
  const nlohmann::json reparsed = nlohmann::json::parse(j.dump());
  CaseSpec back;
  from_json(reparsed, back);
  RC_ASSERT(back == spec);
}

CaseSpec linear_bias_relu() {
  CaseSpec spec;
  spec.ops = {{"Linear", {{"out", 6}}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              {"Bias", {}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              {"ReLU", {}, {}, {}, ops::OutputStyle::kVector, {}, {}}};
  spec.fusions = {"ForwardLinearBiasActivation"};
  spec.seed = 7;
  return spec;
}

nlohmann::json spec_json(const CaseSpec& spec) {
  nlohmann::json j;
  to_json(j, spec);
  return j;
}

std::string error_of(const nlohmann::json& j) {
  CaseSpec spec;
  try {
    from_json(j, spec);
  } catch (const SpecError& e) {
    return e.json_path() + " | " + e.what();
  }
  return "no error";
}

TEST(CaseSpecJson, WritesSnakeCaseKeysAndOmitsDefaults) {
  CaseSpec spec = linear_bias_relu();
  spec.ops[1].input_channels = {};
  const nlohmann::json j = spec_json(spec);
  EXPECT_EQ(j["ops"][0]["name"], "Linear");
  EXPECT_EQ(j["ops"][0]["attrs"]["out"], 6.0);
  EXPECT_FALSE(j["ops"][1].contains("attrs"));
  EXPECT_FALSE(j["ops"][1].contains("output_style"));
  EXPECT_FALSE(j.contains("late_binds"));
  EXPECT_FALSE(j.contains("corrupt_split_sizes"));
  EXPECT_EQ(j["input_shape"], nlohmann::json::array({4, 8}));
  EXPECT_EQ(j["fusions"][0], "ForwardLinearBiasActivation");
}

TEST(CaseSpecJson, WritesPublicSlotsAsNullAndBindingsAsObjects) {
  CaseSpec spec;
  spec.ops = {{"DualExtraOutput",
               {},
               {},
               {{std::string("c"), false}, {std::nullopt, true}},
               ops::OutputStyle::kGenerator,
               {},
               {}},
              {"AddExtraInput", {}, {std::nullopt}, {}, ops::OutputStyle::kVector, {}, {false}}};
  const nlohmann::json j = spec_json(spec);
  EXPECT_TRUE(j["ops"][1]["input_channels"][0].is_null());
  EXPECT_EQ(j["ops"][0]["output_bindings"][0]["channel"], "c");
  EXPECT_EQ(j["ops"][0]["output_bindings"][0]["output_to_caller"], false);
  EXPECT_EQ(j["ops"][0]["output_style"], "generator");
  EXPECT_EQ(j["ops"][1]["extra_input_requires_grad"], nlohmann::json::array({false}));
  CaseSpec back;
  from_json(j, back);
  EXPECT_EQ(back, spec);
}

TEST(CaseSpecJson, RejectsUnknownOpNamingPathAndKnownOps) {
  nlohmann::json j = spec_json(linear_bias_relu());
  j["ops"][2]["name"] = "Relu";
  const std::string error = error_of(j);
  EXPECT_THAT(error, HasSubstr("/ops/2/name"));
  EXPECT_THAT(error, HasSubstr("unknown op 'Relu'"));
  EXPECT_THAT(error, HasSubstr("ReLU"));
  EXPECT_THAT(error, HasSubstr("Boundary"));
}

TEST(CaseSpecJson, RejectsUnknownAttrKeyAndWrongTypes) {
  nlohmann::json j = spec_json(linear_bias_relu());
  j["ops"][0]["attrs"]["outt"] = 3;
  EXPECT_THAT(error_of(j), HasSubstr("/ops/0/attrs/outt | "));
  // The known attrs are listed (Linear's also include TE's accumulate_into_main_grad).
  EXPECT_THAT(error_of(j), HasSubstr("known attrs: "));
  EXPECT_THAT(error_of(j), HasSubstr(", out"));

  j = spec_json(linear_bias_relu());
  j["ops"][0]["attrs"]["out"] = "six";
  EXPECT_THAT(error_of(j), HasSubstr("/ops/0/attrs/out | "));

  j = spec_json(linear_bias_relu());
  j["ops"][1]["colour"] = "red";
  EXPECT_THAT(error_of(j), HasSubstr("/ops/1/colour | "));

  j = spec_json(linear_bias_relu());
  j["input_shape"][1] = -2;
  EXPECT_THAT(error_of(j), HasSubstr("/input_shape/1 | "));

  j = spec_json(linear_bias_relu());
  j["input_shape"] = {4, 8, 2};
  EXPECT_THAT(error_of(j), HasSubstr("/input_shape | "));

  j = spec_json(linear_bias_relu());
  j["seed"] = -1;
  EXPECT_THAT(error_of(j), HasSubstr("/seed | "));

  j = spec_json(linear_bias_relu());
  j["dtype"] = "float8";
  EXPECT_THAT(error_of(j), HasSubstr("/dtype | "));

  j = spec_json(linear_bias_relu());
  j.erase("ops");
  EXPECT_THAT(error_of(j), HasSubstr("/ | "));
  EXPECT_THAT(error_of(j), HasSubstr("missing required key 'ops'"));

  EXPECT_THAT(error_of(nlohmann::json::array()), HasSubstr("expected an object"));
}

TEST(CaseSpecJson, RejectsMalformedFusionNamesAndBadStepIndices) {
  // Fusion names belong to a backend (te names TE's fusions): only their form is checked
  // here; corpus files of the model backend are checked against its catalog.
  nlohmann::json j = spec_json(linear_bias_relu());
  j["fusions"].push_back("GroupedMLP_CuTeGEMMGLU");
  EXPECT_NO_THROW(j.get<CaseSpec>());
  j["fusions"].push_back("Forward Everything!");
  EXPECT_THAT(error_of(j), HasSubstr("/fusions/2 | "));
  EXPECT_THAT(error_of(j), HasSubstr("expected a fusion name"));

  j = spec_json(linear_bias_relu());
  j["call_then_bind"] = {{{"op", 5}, {"grad_mode", true}}};
  EXPECT_THAT(error_of(j), HasSubstr("/call_then_bind/0/op | "));

  CaseSpec spec = linear_bias_relu();
  spec.ops.insert(spec.ops.begin() + 1, OpSpec{kBoundaryOp, {}, {}, {}, ops::OutputStyle::kVector, {}, {}});
  j = spec_json(spec);
  j["late_binds"] = {{{"op", 1}, {"slot", 0}, {"channel", "c"}}};
  EXPECT_THAT(error_of(j), HasSubstr("/late_binds/0/op | "));
  EXPECT_THAT(error_of(j), HasSubstr("Boundary"));

  j = spec_json(spec);
  j["ops"][1]["input_channels"] = {"c"};
  EXPECT_THAT(error_of(j), HasSubstr("/ops/1 | "));
}

TEST(CaseSpecJson, RepeatCallsAreObjectsOfTwoFlags) {
  nlohmann::json j;
  CaseSpec spec;
  spec.repeat_calls = {{true, false}, {false, true}};
  to_json(j, spec);
  EXPECT_EQ(j.at("repeat_calls"),
            nlohmann::json::parse(
                R"([{"no_grad":true,"input_requires_grad":false},{"no_grad":false,"input_requires_grad":true}])"));
  j["repeat_calls"][1]["grad"] = true;
  try {
    j.get<CaseSpec>();
    FAIL() << "an unknown key in a repeat call was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.json_path(), "/repeat_calls/1/grad");
  }
  j["repeat_calls"][1].erase("grad");
  j["repeat_calls"][0]["no_grad"] = 1;
  try {
    j.get<CaseSpec>();
    FAIL() << "a number for a flag was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.json_path(), "/repeat_calls/0/no_grad");
  }
}

// The usage script's steps: written only where set (older case files and their hashes stay),
// read back, checked against the call's grad mode, named by usage_elements/usage_coverage.
TEST(CaseSpecJson, UsageStepsRoundTripAndAreCheckedAgainstGradMode) {
  CaseSpec spec;
  spec.repeat_calls.resize(3);
  spec.repeat_calls[0].update = true;
  spec.repeat_calls[0].checkpoint = true;
  spec.repeat_calls[1].no_grad = true;
  spec.repeat_calls[1].inference_mode = true;
  spec.repeat_calls[2].recompute = true;
  spec.repeat_calls[2].second_sequential = true;
  spec.read_after_backward = true;
  spec.deferred_init = true;
  nlohmann::json j;
  to_json(j, spec);
  EXPECT_EQ(j.at("repeat_calls")[2],
            nlohmann::json::parse(
                R"({"no_grad":false,"input_requires_grad":true,"recompute":true,"second_sequential":true})"));
  EXPECT_TRUE(j.at("read_after_backward").get<bool>());
  EXPECT_TRUE(j.at("deferred_init").get<bool>());
  EXPECT_EQ(j.get<CaseSpec>(), spec);
  EXPECT_EQ(spec.usage_elements(),
            (std::vector<std::string>{"update", "inference_mode", "checkpoint", "recompute", "read_after_backward",
                                      "second_sequential", "deferred_init"}));
  EXPECT_EQ(spec.usage_coverage(),
            (std::vector<std::string>{"training_steps", "eval_pass", "inference_mode", "checkpoint_roundtrip",
                                      "recompute", "read_after_backward", "op_in_two_fusers", "deferred_init"}));
  nlohmann::json plain;
  to_json(plain, CaseSpec{});
  EXPECT_FALSE(plain.contains("read_after_backward"));
  EXPECT_FALSE(plain.contains("deferred_init"));
  nlohmann::json ranks = j;
  ranks["world_size"] = 2;
  try {
    ranks.get<CaseSpec>();
    FAIL() << "deferred_init on two ranks was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.json_path(), "/deferred_init");
    EXPECT_THAT(e.what(), ::testing::HasSubstr("world_size must be 1"));
  }
  j["repeat_calls"][1]["no_grad"] = false;
  try {
    j.get<CaseSpec>();
    FAIL() << "inference_mode on a call with grad was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.json_path(), "/repeat_calls/1/inference_mode");
  }
  j["repeat_calls"][1]["no_grad"] = true;
  j["repeat_calls"][2]["no_grad"] = true;
  try {
    j.get<CaseSpec>();
    FAIL() << "recompute on a no_grad call was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.json_path(), "/repeat_calls/2/recompute");
  }
}

/// Expects `j` refused as a case with `path` and a message holding `words`.
void expect_refused(const nlohmann::json& j, const std::string& path, const std::string& words) {
  try {
    j.get<CaseSpec>();
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const SpecError& e) {
    EXPECT_EQ(e.json_path(), path);
    EXPECT_THAT(e.what(), ::testing::HasSubstr(words));
  }
}

TEST(CaseSpecJson, RecipeChangesSeveralSequentialsAndQuantizedWeightsRoundTripWithTheirNeedsChecked) {
  CaseSpec spec;
  spec.ops = {OpSpec{"Linear", {{"out", 8}}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              OpSpec{kBoundaryOp, {}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              OpSpec{"ReLU", {}, {}, {}, ops::OutputStyle::kVector, {}, {}}};
  spec.recipe = RecipeSpec{"Float8CurrentScaling", "E4M3", {}};
  spec.repeat_calls.resize(2);
  spec.several_sequentials = true;
  spec.quantized_params = true;
  spec.held_quantized_tensor = true;
  nlohmann::json j;
  to_json(j, spec);
  EXPECT_FALSE(j.at("repeat_calls")[1].contains("recipe_off"));
  EXPECT_FALSE(j.at("repeat_calls")[1].contains("amax_history_len"));
  EXPECT_TRUE(j.at("quantized_params").get<bool>());
  EXPECT_EQ(j.get<CaseSpec>(), spec);
  EXPECT_EQ(spec.usage_coverage(),
            (std::vector<std::string>{"several_sequentials", "quantized_params", "held_quantized_tensor"}));

  // A call with the recipe off (not with quantized weights: they keep no high-precision values).
  CaseSpec off = spec;
  off.quantized_params = off.held_quantized_tensor = false;
  off.repeat_calls[0].recipe_off = true;
  nlohmann::json o;
  to_json(o, off);
  EXPECT_TRUE(o.at("repeat_calls")[0].at("recipe_off").get<bool>());
  EXPECT_EQ(o.get<CaseSpec>(), off);
  EXPECT_EQ(off.usage_elements(), (std::vector<std::string>{"recipe_change", "several_sequentials"}));
  nlohmann::json off_quantized = o;
  off_quantized["quantized_params"] = true;
  expect_refused(off_quantized, "/repeat_calls/0/recipe_off", "no high-precision values");
  nlohmann::json no_recipe = o;
  no_recipe.erase("recipe");
  expect_refused(no_recipe, "/repeat_calls/0/recipe_off", "no recipe");
  nlohmann::json both = o;
  both["repeat_calls"][0]["amax_history_len"] = 4;
  expect_refused(both, "/repeat_calls/0/amax_history_len", "drop one");

  // What each element needs, refused with the key's path.
  nlohmann::json no_boundary = j;
  no_boundary["ops"].erase(1);
  expect_refused(no_boundary, "/several_sequentials", "no Boundary");
  nlohmann::json delayed = j;
  delayed["recipe"]["name"] = "DelayedScaling";
  expect_refused(delayed, "/quantized_params", "DelayedScaling");
  nlohmann::json high = j;
  high["recipe"]["options"]["backward_override"] = "high_precision";
  expect_refused(high, "/quantized_params", "backward_override of high_precision");
  nlohmann::json held_alone = j;
  held_alone.erase("quantized_params");
  expect_refused(held_alone, "/held_quantized_tensor", "needs quantized_params");
  nlohmann::json length = j;
  length["repeat_calls"][1]["amax_history_len"] = 4;
  expect_refused(length, "/repeat_calls/1/amax_history_len", "option of DelayedScaling");
  length["repeat_calls"][1]["amax_history_len"] = 0;
  expect_refused(length, "/repeat_calls/1/amax_history_len", "[1, 1048576]");

  // A DelayedScaling case takes the length change; an edit that removes a need drops the
  // element (the shrinker's candidates stay loadable).
  CaseSpec stepped = off;
  stepped.repeat_calls[0].recipe_off = false;
  stepped.recipe->name = "DelayedScaling";
  stepped.repeat_calls[1].amax_history_len = 3;
  to_json(j, stepped);
  EXPECT_EQ(j.at("repeat_calls")[1].at("amax_history_len").get<int64_t>(), 3);
  EXPECT_EQ(j.get<CaseSpec>(), stepped);
  CaseSpec cut = spec;
  cut.ops.erase(cut.ops.begin() + 1);
  cut.drop_unmet_usage();
  EXPECT_FALSE(cut.several_sequentials);
  EXPECT_TRUE(cut.quantized_params && cut.held_quantized_tensor);
  cut.recipe.reset();
  cut.drop_unmet_usage();
  EXPECT_FALSE(cut.quantized_params || cut.held_quantized_tensor);
  CaseSpec both_off = off;
  both_off.quantized_params = true;
  both_off.drop_unmet_usage();
  EXPECT_TRUE(both_off.quantized_params);
  EXPECT_FALSE(both_off.repeat_calls[0].recipe_off);
  stepped.recipe->name = "Float8BlockScaling";
  stepped.drop_unmet_usage();
  EXPECT_EQ(stepped.repeat_calls[1].amax_history_len, 0);
  CaseSpec cleared = spec;
  cleared.clear_usage();
  EXPECT_TRUE(cleared.usage_coverage().empty());
}

TEST(CaseSpecJson, WorldSizeAndInputLayoutAreWrittenOnlyForDistributedCases) {
  CaseSpec spec = linear_bias_relu();
  EXPECT_FALSE(spec_json(spec).contains("world_size"));  // one-process case files stay as they were
  EXPECT_FALSE(spec_json(spec).contains("input_layout"));
  EXPECT_FALSE(is_distributed(spec));
  spec.world_size = 2;
  spec.input_layout = "rows";
  const nlohmann::json j = spec_json(spec);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["input_layout"], "rows");
  EXPECT_TRUE(is_distributed(spec));
  EXPECT_EQ(j.get<CaseSpec>(), spec);
  // One rank with a collective or a tensor-parallel option runs as ranks too (te.ops needs a
  // process group for them).
  CaseSpec one = linear_bias_relu();
  one.ops[0].attrs["tensor_parallel_mode"] = 1;
  EXPECT_TRUE(is_distributed(one));
  one = linear_bias_relu();
  one.ops.push_back({"AllReduce", {}, {}, {}, ops::OutputStyle::kVector, {}, {}});
  EXPECT_TRUE(is_distributed(one));
}

TEST(CaseSpecJson, RejectsWorldSizesOutOfRangeAndUnknownLayoutsNamingThePath) {
  nlohmann::json j = spec_json(linear_bias_relu());
  j["world_size"] = 0;
  EXPECT_THAT(error_of(j), HasSubstr("/world_size | /world_size: expected a number of ranks in [1, 64], got 0"));
  j["world_size"] = 65;
  EXPECT_THAT(error_of(j), HasSubstr("got 65"));
  j["world_size"] = "two";
  EXPECT_THAT(error_of(j), HasSubstr("/world_size | /world_size: expected an integer, got string"));
  j["world_size"] = 2;
  j["input_layout"] = "columns";
  EXPECT_THAT(error_of(j), HasSubstr("/input_layout | /input_layout: unknown input layout 'columns'; known layouts: "
                                     "replicated, rows, features"));
}

TEST(CaseSpec, NumOpsCountsCatalogOpsOnly) {
  CaseSpec spec = linear_bias_relu();
  spec.ops.push_back(OpSpec{kBoundaryOp, {}, {}, {}, ops::OutputStyle::kVector, {}, {}});
  EXPECT_EQ(spec.num_ops(), 3);
  std::ostringstream os;
  os << spec;
  EXPECT_THAT(os.str(), HasSubstr("\"Boundary\""));
}

TEST(CaseSpecWiring, FindsMissingAndLateProducersPerFuser) {
  CaseSpec spec;
  spec.ops = {{"RowStat", {}, {}, {{std::string("s"), false}}, ops::OutputStyle::kVector, {}, {}},
              {"ScaledSReLU", {}, {std::string("s")}, {}, ops::OutputStyle::kVector, {}, {}}};
  EXPECT_FALSE(check_static_wiring(spec).has_value());

  CaseSpec late = spec;
  std::swap(late.ops[0], late.ops[1]);
  auto problem = check_static_wiring(late);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->kind, "producer-not-earlier");
  EXPECT_EQ(problem->json_path, "/ops/0/input_channels/0");

  CaseSpec crossing = spec;
  crossing.ops.insert(crossing.ops.begin() + 1, OpSpec{kBoundaryOp, {}, {}, {}, ops::OutputStyle::kVector, {}, {}});
  problem = check_static_wiring(crossing);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->kind, "missing-producer");
  EXPECT_EQ(problem->json_path, "/ops/2/input_channels/0");

  CaseSpec twice = spec;
  twice.ops.insert(twice.ops.begin(), spec.ops[0]);
  problem = check_static_wiring(twice);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->kind, "duplicate-producer");
}

}  // namespace
}  // namespace gradfuzz::harness
