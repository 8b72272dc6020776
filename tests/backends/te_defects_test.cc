// TE defects that gradfuzz found on the H200, reproduced on the CPU by the torch backend's
// recipe emulation with the defect planted (adapter/gradfuzz_adapter/torch_faults.py): the
// emulation without it passes the case (the reference and the emulation agree), with it the
// case fails with the signature TE's run had. That is what explains a te cluster without a
// GPU (docs/TE.md), and it keeps the explanation checked as the oracle changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace gradfuzz::tools {
namespace {

using ::testing::HasSubstr;

struct CliRun {
  int exit = 0;
  std::string out;
  std::string err;
};

CliRun cli(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  const int code = run_cli(args, out, err, /*terminal=*/false);
  return {code, out.str(), err.str()};
}

std::string data(const std::string& name) {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/backends/data/" + name;
}

// te-groupedlinear-ignores-backward-override (known/te-2.20.2.json): Dispatch -> GroupedLinear
// under Float8CurrentScaling HYBRID with backward_override=dequantized, a cluster of the
// 2026-12-02d lease signed `mismatch|Dispatch|grad_input` (TE's GroupedLinear weight gradient
// stayed within its bound, so the wrong input gradient shows first in Dispatch's tensor). The
// emulation with GroupedLinear's backward the fully quantized one gives TE's value at TE's
// worst element (grad_input[2][8] -0.5291 where the override's reference is -0.3778).
TEST(TeDefects, GroupedLinearIgnoringTheBackwardOverrideGivesTEsFinding) {
  const std::string file = data("te-groupedlinear-override-dgrad.json");
  const CliRun clean = cli({"replay", file, "--backend", "torch", "--workers", "0"});
  EXPECT_EQ(clean.exit, 0) << clean.out << clean.err;
  EXPECT_THAT(clean.out, HasSubstr("1 cases, 0 failed"));
  const CliRun planted = cli({"replay", file, "--backend", "torch", "--workers", "0", "--fault",
                              "torch-grouped-linear-ignores-backward-override"});
  EXPECT_EQ(planted.exit, 1) << planted.out << planted.err;
  EXPECT_THAT(planted.out, HasSubstr("[mismatch|Dispatch|grad_input]"));
}

}  // namespace
}  // namespace gradfuzz::tools
