#include "harness/capabilities.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace gradfuzz::harness {
namespace {

using ::testing::HasSubstr;

/// A te-like capabilities document with `accumulation` as its fp8_gemm_accumulation.
nlohmann::json document(const nlohmann::json& accumulation) {
  nlohmann::json j = model_capabilities();
  j["fp8_gemm_accumulation"] = accumulation;
  return j;
}

std::string parse_error(const nlohmann::json& j) {
  try {
    BackendCapabilities caps = j;
    (void)caps;
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Capabilities, Fp8GemmAccumulationRoundTripsAndIsAbsentByDefault) {
  const BackendCapabilities model = model_capabilities();
  EXPECT_FALSE(model.fp8_gemm_accumulation.has_value());
  EXPECT_FALSE(nlohmann::json(model).contains("fp8_gemm_accumulation"));
  const BackendCapabilities te = document(
      {{"fraction_bits", 13},
       {"products_per_step", 32},
       {"promotion_products", 128},
       {"fast_accumulation", {{"DelayedScaling", {"fprop"}}, {"Float8BlockScaling", nlohmann::json::array()}}}});
  ASSERT_TRUE(te.fp8_gemm_accumulation.has_value());
  EXPECT_EQ(te.fp8_gemm_accumulation->fraction_bits, 13);
  EXPECT_EQ(te.fp8_gemm_accumulation->fast_accumulation.at("DelayedScaling"), std::vector<std::string>{"fprop"});
  EXPECT_TRUE(te.fp8_gemm_accumulation->fast_accumulation.at("Float8BlockScaling").empty());
  const BackendCapabilities again = nlohmann::json(te);
  ASSERT_TRUE(again.fp8_gemm_accumulation.has_value());
  EXPECT_EQ(again.fp8_gemm_accumulation->promotion_products, 128);
  EXPECT_EQ(again.fp8_gemm_accumulation->fast_accumulation, te.fp8_gemm_accumulation->fast_accumulation);
}

TEST(Capabilities, Fp8GemmAccumulationErrorsNameTheField) {
  EXPECT_THAT(parse_error(document({{"fraction_bits", 0}})),
              HasSubstr("fp8_gemm_accumulation.fraction_bits: must be in [1, 52], got 0"));
  EXPECT_THAT(parse_error(document({{"products_per_step", "32"}})),
              HasSubstr("fp8_gemm_accumulation.products_per_step: expected an integer"));
  EXPECT_THAT(
      parse_error(document({{"promotion_products", 100}})),
      HasSubstr("fp8_gemm_accumulation.promotion_products: must be a multiple of products_per_step (32), got 100"));
  EXPECT_THAT(parse_error(document({{"fast_accumulation", {{"DelayedScaling", {"forward"}}}}})),
              HasSubstr("fp8_gemm_accumulation.fast_accumulation.DelayedScaling: expected \"fprop\", \"dgrad\" or "
                        "\"wgrad\", got \"forward\""));
  EXPECT_THAT(parse_error(document(13)), HasSubstr("fp8_gemm_accumulation.: expected an object"));
}

}  // namespace
}  // namespace gradfuzz::harness
