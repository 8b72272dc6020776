#include "runner/case_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/harness/test_specs.h"

namespace gradfuzz::runner {
namespace {

using harness::CasePlan;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::PathRequest;
using harness::PathRun;
using harness::PathStatus;
using harness::PlanGroup;
using harness::VerdictKind;
using harness::testing::op;
using ::testing::ElementsAre;

/// A stand-in for the backend under test: it records each request and answers each path with
/// `answer` (fired: the fused groups its fused path's plans show; every path runs).
class ScriptedBackend final : public backends::Backend {
 public:
  ScriptedBackend() {
    caps_.backend = "scripted";
    caps_.fusions = {{"ForwardOnly", ops::FusionPass::kForward, ""}, {"BackwardOnly", ops::FusionPass::kBackward, ""}};
  }
  std::string name() const override { return "scripted"; }
  const harness::BackendCapabilities& capabilities() override { return caps_; }
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan&, const CaseTensors&,
                                 const std::vector<PathRequest>& paths) override {
    if (crash) throw backends::BackendCrash("worker died");
    requests.push_back(paths);
    dtypes.push_back(spec.dtype);
    std::vector<PathRun> runs;
    for (const PathRequest& request : paths) {
      PathRun run;
      run.name = request.name;
      harness::FuserPlans plans;
      for (const std::string& fusion : request.fusions) {
        PlanGroup g;
        g.name = fusion;
        g.fused = std::find(fired.begin(), fired.end(), fusion) != fired.end();
        (fusion == "BackwardOnly" ? plans.backward : plans.forward).push_back(g);
      }
      run.plans.push_back(plans);
      const bool skip = !request.only_if_fired.empty() && fired.size() < 2;
      run.status = skip ? PathStatus::kSkipped : PathStatus::kOk;
      runs.push_back(std::move(run));
    }
    return runs;
  }

  std::vector<std::string> fired;
  bool crash = false;
  std::vector<std::vector<PathRequest>> requests;
  std::vector<std::string> dtypes;

 private:
  harness::BackendCapabilities caps_;
};

CaseSpec fused_case(bool in_place = false) {
  CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 4}, {"in_place", in_place ? 1.0 : 0.0}})};
  spec.fusions = {"ForwardOnly", "BackwardOnly"};
  return spec;
}

std::vector<std::string> names(const std::vector<PathRequest>& requests) {
  std::vector<std::string> out;
  for (const auto& r : requests) out.push_back(r.name);
  return out;
}

std::vector<std::string> names(const std::vector<const PathRun*>& runs) {
  std::vector<std::string> out;
  for (const auto* r : runs) out.push_back(r->name);
  return out;
}

std::vector<std::string> names(const std::vector<PathRun>& runs) {
  std::vector<std::string> out;
  for (const auto& r : runs) out.push_back(r.name);
  return out;
}

const CasePaths::WhileWaiting kNoOverlap;

TEST(CasePaths, SharedRunsSendTheSinglePassPathsInTheOneRequest) {
  const CaseSpec spec = fused_case();
  const RunOptions options;
  ScriptedBackend backend;
  backend.fired = {"ForwardOnly", "BackwardOnly"};
  CasePaths paths(spec, options, /*trace=*/false);
  EXPECT_FALSE(paths.run(backend, {}, {}, kNoOverlap).has_value());
  ASSERT_EQ(backend.requests.size(), 1u);
  EXPECT_THAT(names(backend.requests[0]), ElementsAre("fused", "unfused", "forward_fused", "backward_fused"));
  const PathRequest& forward_fused = backend.requests[0][2];
  EXPECT_THAT(forward_fused.fusions, ElementsAre("ForwardOnly"));
  EXPECT_EQ(forward_fused.only_if_fired.size(), 2u);
  EXPECT_EQ(backend.requests[0][0].writers, harness::WriterSearch::kRerun);
  EXPECT_EQ(backend.requests[0][0].expected_plans, harness::ExpectedPlans::kPerPattern);
  EXPECT_THAT(names(paths.active()), ElementsAre("fused", "unfused", "forward_fused", "backward_fused"));
  EXPECT_EQ(paths.named("unfused"), paths.active()[1]);
  EXPECT_EQ(paths.named("absent"), nullptr);
  // The confirmation's rerun: the first request's paths, then the single-pass ones.
  CaseSpec wide = spec;
  wide.dtype = "float64";
  EXPECT_THAT(names(paths.rerun(backend, wide, {}, {})),
              ElementsAre("fused", "unfused", "forward_fused", "backward_fused"));
  EXPECT_THAT(backend.dtypes, ElementsAre(spec.dtype, "float64", "float64"));
}

TEST(CasePaths, SinglePassPathsThatDoNotFireAreSkippedAndNotRerun) {
  const CaseSpec spec = fused_case();
  const RunOptions options;
  ScriptedBackend backend;
  backend.fired = {"ForwardOnly"};
  CasePaths paths(spec, options, false);
  EXPECT_FALSE(paths.run(backend, {}, {}, kNoOverlap).has_value());
  EXPECT_THAT(names(paths.active()), ElementsAre("fused", "unfused"));
  EXPECT_THAT(names(paths.rerun(backend, spec, {}, {})), ElementsAre("fused", "unfused"));
}

TEST(CasePaths, WithoutSharedRunsTheSinglePassPathsAreASecondRequest) {
  const CaseSpec spec = fused_case(/*in_place=*/true);
  RunOptions options;
  options.shared_runs = false;
  ScriptedBackend backend;
  backend.fired = {"ForwardOnly", "BackwardOnly"};
  CasePaths paths(spec, options, /*trace=*/true);
  EXPECT_FALSE(paths.run(backend, {}, {}, kNoOverlap).has_value());
  ASSERT_EQ(backend.requests.size(), 2u);
  EXPECT_THAT(names(backend.requests[0]), ElementsAre("fused", "unfused"));
  EXPECT_THAT(names(backend.requests[1]), ElementsAre("forward_fused", "backward_fused"));
  EXPECT_EQ(backend.requests[0][0].expected_plans, harness::ExpectedPlans::kPerCall);
  EXPECT_TRUE(backend.requests[0][0].trace);
  EXPECT_THAT(names(paths.active()), ElementsAre("fused", "unfused", "forward_fused", "backward_fused"));
}

TEST(CasePaths, InPlaceCasesAreWatchedForWritersDuringTheRun) {
  const CaseSpec spec = fused_case(/*in_place=*/true);
  RunOptions options;
  EXPECT_EQ(CasePaths(spec, options, false).request("fused", {}, false).writers, harness::WriterSearch::kDuringRun);
  options.find_writers = false;
  options.check_plans = false;
  const PathRequest r = CasePaths(spec, options, false).request("fused", {}, false);
  EXPECT_EQ(r.writers, harness::WriterSearch::kNone);
  EXPECT_EQ(r.expected_plans, harness::ExpectedPlans::kNone);
}

TEST(CasePaths, ACrashIsEveryPathsFinding) {
  const CaseSpec spec = fused_case();
  const RunOptions options;
  ScriptedBackend backend;
  backend.crash = true;
  CasePaths paths(spec, options, false);
  const auto failure = paths.run(backend, {}, {}, kNoOverlap);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind, VerdictKind::kCrash);
  EXPECT_EQ(failure->path_pair, "every path");
  EXPECT_EQ(failure->message, "worker died");
  EXPECT_TRUE(paths.active().empty());
}

TEST(CasePaths, TheOverlapWaitsForTheFirstRequestOnly) {
  const CaseSpec spec = fused_case();
  RunOptions options;
  options.shared_runs = false;
  ScriptedBackend backend;
  backend.fired = {"ForwardOnly", "BackwardOnly"};
  int waited = 0;
  CasePaths paths(spec, options, false);
  EXPECT_FALSE(paths
                   .run(backend, {}, {},
                        [&](backends::PendingPaths& pending) {
                          EXPECT_TRUE(pending.ready());  // the default: run when asked
                          ++waited;
                        })
                   .has_value());
  EXPECT_EQ(waited, 1);
  options.overlap = RunOptions::Overlap::kNone;
  CasePaths none(spec, options, false);
  EXPECT_FALSE(none.run(backend, {}, {}, [&](backends::PendingPaths&) { ++waited; }).has_value());
  EXPECT_EQ(waited, 1);
}

TEST(CasePaths, FirstCallsRunOnlyThePathsWithFusions) {
  CaseSpec spec = fused_case();
  spec.repeat_calls = {harness::RepeatCall{}};
  const RunOptions options;
  ScriptedBackend backend;
  CasePaths paths(spec, options, false);
  paths.run_first_calls(backend, {}, {}, {PathRequest{"fused", {"ForwardOnly"}}, PathRequest{"unfused", {}}});
  ASSERT_EQ(backend.requests.size(), 1u);
  EXPECT_THAT(names(backend.requests[0]), ElementsAre("fused"));
  EXPECT_EQ(backend.requests[0][0].writers, harness::WriterSearch::kNone);
  EXPECT_THAT(names(paths.active()), ElementsAre("fused"));
}

}  // namespace
}  // namespace gradfuzz::runner
