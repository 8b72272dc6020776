#include "ops/extra_outputs.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/errors.h"
#include "tests/ops/test_util.h"

namespace gradfuzz::ops {
namespace {

using ::testing::HasSubstr;
using testing::on_device;
using testing::test_options;

std::vector<at::Tensor> three_tensors() {
  at::manual_seed(11);
  return {on_device(at::randn({2})), on_device(at::randn({3})), at::Tensor()};
}

TEST(ExtraOutputs, VectorIsSizedIndexableAndRereadable) {
  const std::vector<at::Tensor> tensors = three_tensors();
  ExtraOutputs out = ExtraOutputs::vector(tensors);
  EXPECT_EQ(out.style(), OutputStyle::kVector);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_TRUE(out.at(1).equal(tensors[1]));
  EXPECT_EQ(out.materialize().size(), 3u);
  EXPECT_EQ(out.materialize().size(), 3u);  // vectors may be read any number of times
}

TEST(ExtraOutputs, GeneratorYieldsEveryTensorInOrderInOnePass) {
  const std::vector<at::Tensor> tensors = three_tensors();
  ExtraOutputs out = ExtraOutputs::make(OutputStyle::kGenerator, tensors);
  EXPECT_EQ(out.style(), OutputStyle::kGenerator);
  const std::vector<at::Tensor> got = out.materialize();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].equal(tensors[0]));
  EXPECT_TRUE(got[1].equal(tensors[1]));
  EXPECT_FALSE(got[2].defined());  // undefined entries (None) survive the generator
}

TEST(ExtraOutputs, GeneratorIsLazy) {
  int calls = 0;
  ExtraOutputs out = ExtraOutputs::generator([&calls]() -> std::optional<at::Tensor> {
    if (calls >= 2) return std::nullopt;
    ++calls;
    return at::ones({1}, test_options(at::kFloat));
  });
  EXPECT_EQ(calls, 0);  // nothing evaluated before materialize
  EXPECT_EQ(out.materialize().size(), 2u);
  EXPECT_EQ(calls, 2);
}

TEST(ExtraOutputs, GeneratorSecondMaterializeThrows) {
  ExtraOutputs out = ExtraOutputs::make(OutputStyle::kGenerator, three_tensors());
  out.materialize();
  try {
    out.materialize();
    FAIL() << "a generator was read twice without an error";
  } catch (const GeneratorMisuseError& e) {
    EXPECT_THAT(e.what(), HasSubstr("generator-misuse"));
    EXPECT_THAT(e.what(), HasSubstr("second time"));
  }
}

TEST(ExtraOutputs, GeneratorHasNoSize) {
  ExtraOutputs out = ExtraOutputs::make(OutputStyle::kGenerator, three_tensors());
  try {
    (void)out.size();
    FAIL() << "size() of a generator did not throw";
  } catch (const GeneratorMisuseError& e) {
    EXPECT_THAT(e.what(), HasSubstr("has no size"));
  }
}

TEST(ExtraOutputs, GeneratorCannotBeIndexed) {
  ExtraOutputs out = ExtraOutputs::make(OutputStyle::kGenerator, three_tensors());
  try {
    (void)out.at(0);
    FAIL() << "at() of a generator did not throw";
  } catch (const GeneratorMisuseError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot be indexed"));
  }
}

TEST(ExtraOutputs, StyleNamesRoundTripAndUnknownNameThrows) {
  EXPECT_EQ(output_style_from_name(output_style_name(OutputStyle::kVector)), OutputStyle::kVector);
  EXPECT_EQ(output_style_from_name(output_style_name(OutputStyle::kGenerator)), OutputStyle::kGenerator);
  try {
    output_style_from_name("tuple");
    FAIL() << "unknown style accepted";
  } catch (const UnknownNameError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'tuple'"));
    EXPECT_THAT(e.what(), HasSubstr("vector, generator"));
  }
}

}  // namespace
}  // namespace gradfuzz::ops
