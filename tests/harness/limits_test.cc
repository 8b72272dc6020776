// Limits on what one case may ask for (issue: a nightly run must survive hostile case files):
// every limit is checked from the spec and the ops' signatures, before anything is allocated.
#include "harness/limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "harness/builder.h"
#include "ops/op_registry.h"

namespace gradfuzz::harness {
namespace {

using ::testing::HasSubstr;

OpSpec op(const std::string& name, ops::OpAttrs attrs = {}) {
  OpSpec o;
  o.name = name;
  o.attrs = std::move(attrs);
  return o;
}

CaseSpec linear_chain(std::vector<int64_t> shape, double out) {
  CaseSpec spec;
  spec.input_shape = std::move(shape);
  spec.ops = {op("Linear", {{"out", out}}), op("Bias")};
  return spec;
}

std::string path_of(const CaseSpec& spec, const CaseLimits& limits = {}) {
  try {
    check_case_limits(spec, limits);
  } catch (const SpecError& e) {
    return e.json_path() + " | " + e.what();
  }
  return "";
}

TEST(CaseLimits, AcceptsOrdinaryCases) {
  EXPECT_EQ(path_of(linear_chain({8, 16}, 32)), "");
  EXPECT_EQ(path_of(linear_chain({4096, 4096}, 4096)), "");
}

TEST(CaseLimits, RefusesAnInputPastTheTensorLimitNamingItsPath) {
  EXPECT_THAT(path_of(linear_chain({int64_t{1} << 62, 4}, 4)), HasSubstr("/input_shape/0 | "));
  EXPECT_THAT(path_of(linear_chain({60000, 60000}, 4)), HasSubstr("/input_shape | "));
  EXPECT_THAT(path_of(linear_chain({60000, 60000}, 4)), HasSubstr("3600000000 elements"));
}

TEST(CaseLimits, CountsParametersFromTheSignatureBeforeAnyAllocation) {
  // [16, 100000] input is small; the Linear weight [100000, 100000] is not.
  const std::string p = path_of(linear_chain({16, 100000}, 100000));
  EXPECT_THAT(p, HasSubstr("/ops/0 | "));
  EXPECT_THAT(p, HasSubstr("Linear"));
}

TEST(CaseLimits, RefusesHugeDimensionsGroupsDeltasAndOpCounts) {
  EXPECT_THAT(path_of(linear_chain({4, 4}, 1e18)), HasSubstr("/ops/0/attrs/out | "));
  CaseSpec grouped = linear_chain({4, 4}, 4);
  grouped.ops = {op("GroupedLinear", {{"groups", 100000}})};
  EXPECT_THAT(path_of(grouped), HasSubstr("/ops/0/attrs/groups | "));
  CaseSpec delta = linear_chain({4, 4}, 4);
  delta.extra_input_count_delta = INT64_MAX;
  EXPECT_THAT(path_of(delta), HasSubstr("/extra_input_count_delta | "));
  CaseSpec many = linear_chain({4, 4}, 4);
  many.ops.assign(1000, op("Identity"));
  EXPECT_THAT(path_of(many), HasSubstr("/ops | "));
}

TEST(CaseLimits, SumsTheWholeCaseAgainstItsOwnLimit) {
  CaseLimits limits;
  limits.max_tensor_elements = 1 << 20;
  limits.max_case_elements = 1 << 22;
  CaseSpec spec;
  spec.input_shape = {1024, 1024};
  for (int i = 0; i < 8; ++i) spec.ops.push_back(op("Identity"));
  EXPECT_THAT(path_of(spec, limits), HasSubstr("have more than gradfuzz's limit"));
}

TEST(CaseLimits, SignaturesDeclareExactlyTheParametersTheFactoryAllocates) {
  const auto& registry = ops::OpRegistry::catalog();
  const std::vector<int64_t> shape{6, 8};
  for (const auto& name : registry.names()) {
    ops::OpAttrs attrs;
    if (name == "SwiGLU" || name == "ScaledSwiGLU") attrs["interleave"] = 0;
    ops::OpSignature sig;
    try {
      sig = registry.signature(name, attrs, shape);
    } catch (const std::exception&) {
      continue;  // an op that needs other attrs for this shape
    }
    const auto created = registry.create(name, attrs, shape, at::TensorOptions().dtype(at::kFloat));
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& p : created->parameters()) shapes.push_back(p.sizes().vec());
    EXPECT_EQ(sig.parameter_shapes, shapes) << name;
  }
}

TEST(JsonNestingDepth, CountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("{\"a\": [1, {\"b\": 2}]}"), 3);
  EXPECT_EQ(json_nesting_depth("\"[[[[\""), 0);
  EXPECT_EQ(json_nesting_depth("{\"x\": \"\\\"[\"}"), 1);
  EXPECT_EQ(json_nesting_depth(std::string(60000, '[') + std::string(60000, ']')), 60000);
}

}  // namespace
}  // namespace gradfuzz::harness
