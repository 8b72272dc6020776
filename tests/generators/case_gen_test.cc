#include "generators/case_gen.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "generators/coverage.h"
#include "generators/validate.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"
#include "runner/run_case.h"

namespace gradfuzz::generators {
namespace {

using harness::CaseSpec;

std::string describe(const std::vector<ValidationProblem>& problems) {
  std::ostringstream os;
  for (const auto& p : problems) os << p.kind << " at " << p.path << ": " << p.message << "\n";
  return os.str();
}

RC_GTEST_PROP(CaseGen, GeneratedCasesAreStaticallyValid, ()) {
  const CaseSpec spec = *gen_case();
  const auto problems = validate_case(spec);
  if (!problems.empty()) RC_FAIL(describe(problems));
  RC_ASSERT(spec.num_ops() >= 1);
  RC_ASSERT(spec.num_ops() <= 8);
}

RC_GTEST_PROP(CaseGen, RespectsOptions, ()) {
  const int max_ops = *rc::gen::inRange(1, 6);
  const std::vector<std::string> fusions{"GroupedMLP", "FusedResidual.joint"};
  GenOptions options;
  options.set_max_ops(max_ops).set_dtypes({"bfloat16", "float16"}).set_device("cuda").set_fusions(fusions);
  const CaseSpec spec = *gen_case(options);
  RC_ASSERT(spec.num_ops() <= max_ops);
  RC_ASSERT(spec.dtype == "bfloat16" || spec.dtype == "float16");
  RC_ASSERT(spec.device == "cuda");
  for (const auto& f : spec.fusions) RC_ASSERT(std::find(fusions.begin(), fusions.end(), f) != fusions.end());
  RC_ASSERT(validate_case(spec).empty());
}

RC_GTEST_PROP(CaseGen, JsonRoundTripPreservesGeneratedCases, ()) {
  const CaseSpec spec = *gen_case();
  const nlohmann::json j = spec;
  CaseSpec back;
  from_json(j, back);
  RC_ASSERT(back == spec);
}

TEST(CaseGen, SameSeedAndSizeGiveTheSameCase) {
  std::set<std::string> distinct;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const CaseSpec a = generate_case(seed, 100);
    const CaseSpec b = generate_case(seed, 100);
    EXPECT_EQ(a, b) << "seed " << seed;
    std::ostringstream os;
    os << a;
    distinct.insert(os.str());
  }
  // Different seeds give different cases (the value seed alone makes them differ).
  EXPECT_EQ(distinct.size(), 50u);
}

TEST(CaseGen, SizeScalesTheOpBudget) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    EXPECT_LE(generate_case(seed, 0).num_ops(), 1) << "seed " << seed;
    EXPECT_LE(generate_case(seed, 50).num_ops(), 4) << "seed " << seed;
    EXPECT_LE(generate_case(seed, 100).num_ops(), 8) << "seed " << seed;
  }
}

TEST(CaseGen, RejectsEmptyDtypesAndNonPositiveMaxOps) {
  EXPECT_THROW(gen_case(GenOptions{}.set_dtypes({})), std::invalid_argument);
  EXPECT_THROW(gen_case(GenOptions{}.set_max_ops(0)), std::invalid_argument);
}

// Over a fixed campaign of cases, the default generator reaches every catalog op, every
// fusion pattern (enabled, inside one fuser) and every coverage feature, counted statically.
TEST(CaseGen, ReachesEveryOpFusionAndFeature) {
  constexpr int kCases = 1500;
  StaticCoverage total;
  int64_t invalid = 0;
  for (int i = 0; i < kCases; ++i) {
    const CaseSpec spec = generate_case(static_cast<uint64_t>(i) * 7919u + 1u, 100);
    if (!is_valid_case(spec)) ++invalid;
    total.merge(static_coverage(spec));
  }
  EXPECT_EQ(invalid, 0);
  std::ostringstream report;
  for (const auto& name : ops::OpRegistry::catalog().names()) {
    // The collectives come only in distributed cases (parallel_gen_test.cc).
    if (name == "AllGather" || name == "ReduceScatter" || name == "AllReduce") continue;
    EXPECT_GT(total.ops[name], 0) << "op " << name << " never generated";
    report << "op " << name << "=" << total.ops[name] << "\n";
  }
  for (const auto& name : ops::FusionRegistry::catalog().names()) {
    EXPECT_GT(total.fusions[name], 0) << "fusion pattern " << name << " never generated";
    report << "fusion " << name << "=" << total.fusions[name] << "\n";
  }
  for (const auto& name : coverage_feature_names()) {
    EXPECT_GT(total.features[name], 0) << "feature " << name << " never generated";
    report << "feature " << name << "=" << total.features[name] << "\n";
  }
  std::cout << "static coverage over " << kCases << " cases:\n" << report.str();
}

// Valid by construction also means the runtime accepts every case: no path raises.
TEST(CaseGen, GeneratedCasesRunWithoutErrors) {
  runner::RunOptions options;
  options.finite_differences = false;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const CaseSpec spec = generate_case(seed, 100);
    const auto result = runner::run_case(spec, options);
    EXPECT_NE(result.verdict, harness::VerdictKind::kUnexpectedError) << "seed " << seed << ": " << result.notes << "\n"
                                                                      << spec;
    EXPECT_THAT(result.notes, ::testing::Not(::testing::HasSubstr("raised"))) << "seed " << seed << "\n" << spec;
  }
}

}  // namespace
}  // namespace gradfuzz::generators

namespace gradfuzz::generators {
namespace {

TEST(CaseGen, ABackendsDocumentedOptionValuesNarrowTheDraw) {
  // TE's GLU kernels take interleave 0 or 32: a case with interleave 4 would be `unsupported`
  // there, a draw wasted.
  auto caps = std::make_shared<harness::BackendCapabilities>(harness::model_capabilities());
  for (auto& op : caps->ops) {
    if (op.name == "SwiGLU" || op.name == "ScaledSwiGLU") op.options["interleave"] = {0, 32};
  }
  GenOptions options;
  options.set_capabilities(caps);
  std::map<double, int> seen;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    const CaseSpec spec = generate_case(seed, 100, options);
    for (const auto& op : spec.ops) {
      if (op.name != "SwiGLU" && op.name != "ScaledSwiGLU") continue;
      auto it = op.attrs.find("interleave");
      ASSERT_NE(it, op.attrs.end());
      ++seen[it->second];
    }
  }
  ASSERT_FALSE(seen.empty());
  for (const auto& [value, count] : seen) EXPECT_TRUE(value == 0 || value == 32) << "interleave " << value << " drawn";
}

}  // namespace
}  // namespace gradfuzz::generators

namespace gradfuzz::generators {
namespace {

// Under an FP8 recipe TE's GEMMs take dimensions that are multiples of 16 only (seen on the
// H200: 'CanonicalizeGemmInput: Assertion failed: ret.lda % 16 == 0' after a SwiGLU halved 16
// features to 8). Every GEMM of a recipe case must see aligned rows and features and make
// aligned outputs, whatever ops come before it; without a recipe the generator draws as before.
TEST(CaseGen, UnderARecipeEveryGemmSeesDimensionsThatAreMultiplesOf16) {
  auto caps = std::make_shared<harness::BackendCapabilities>(harness::model_capabilities());
  harness::RecipeCapability recipe;
  recipe.name = "Float8CurrentScaling";
  recipe.available = true;
  recipe.fp8_formats = {"E4M3", "HYBRID"};
  caps->recipes.push_back(recipe);
  GenOptions options;
  options.set_capabilities(caps);
  options.recipe = "Float8CurrentScaling";
  int64_t gemms = 0;
  int64_t swiglu = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    const CaseSpec spec = generate_case(seed, 100, options);
    ASSERT_TRUE(spec.recipe.has_value());
    const harness::CasePlan plan = harness::plan_case(spec);
    for (size_t i = 0; i < spec.ops.size(); ++i) {
      const auto& op = spec.ops[i];
      EXPECT_NE(op.name, "Reshape") << "seed " << seed;
      const auto& in = plan.ops[i].input_shape;
      if (op.name == "SwiGLU" || op.name == "ScaledSwiGLU") {
        ++swiglu;
        EXPECT_EQ(in.back() % 32, 0) << "seed " << seed << " op " << i;
      }
      if (op.name != "Linear" && op.name != "GroupedLinear") continue;
      ++gemms;
      EXPECT_EQ(in.front() % 16, 0) << "seed " << seed << " op " << i << " rows";
      EXPECT_EQ(in.back() % 16, 0) << "seed " << seed << " op " << i << " features";
      EXPECT_EQ(static_cast<int64_t>(op.attrs.at("out")) % 16, 0) << "seed " << seed << " op " << i << " out";
    }
  }
  EXPECT_GT(gemms, 1000);
  EXPECT_GT(swiglu, 50);  // the SwiGLUs are still drawn, on aligned halves
}

}  // namespace
}  // namespace gradfuzz::generators
