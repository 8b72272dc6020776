// Worker processes: a worker that dies or hangs costs its case a crash or timeout verdict,
// never the campaign. These tests start real `gradfuzz worker` processes
// (GRADFUZZ_EXECUTABLE, set by ctest) and provoke the process-level faults in them.
#include "campaign/worker_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include "campaign/campaign.h"
#include "campaign/files.h"
#include "corpus/case_file.h"
#include "harness/case_spec.h"

namespace gradfuzz::campaign {
namespace {

using harness::CaseSpec;
using harness::OpSpec;
using harness::VerdictKind;
using ::testing::HasSubstr;

/// Linear -> Bias -> ReLU with the forward fusion over all three (the crash-segfault fault
/// fires on a fused group of three ops).
CaseSpec three_op_fusion() {
  CaseSpec spec;
  spec.ops = {OpSpec{"Linear", {{"out", 4}}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              OpSpec{"Bias", {}, {}, {}, ops::OutputStyle::kVector, {}, {}},
              OpSpec{"ReLU", {}, {}, {}, ops::OutputStyle::kVector, {}, {}}};
  spec.fusions = {"ForwardLinearBiasActivation"};
  spec.input_shape = {3, 4};
  spec.seed = 11;
  return spec;
}

/// A DualExtraOutput that hands back its outputs as a generator (the hang fault's trigger).
CaseSpec dual_generator() {
  CaseSpec spec;
  spec.ops = {OpSpec{"DualExtraOutput", {}, {}, {}, ops::OutputStyle::kGenerator, {}, {}}};
  spec.input_shape = {2, 3};
  spec.seed = 5;
  return spec;
}

WorkerPoolOptions pool_options(int workers, double timeout_s) {
  WorkerPoolOptions o;
  o.workers = workers;
  o.case_timeout_s = timeout_s;
  return o;
}

TEST(WorkerPool, AWorkerThatSegfaultsGivesACrashVerdictAndIsReplaced) {
  WorkerPool pool(pool_options(1, 30));
  const auto started = pool.workers_started();
  const harness::CaseResult crashed = pool.run_now(three_op_fusion(), "crash-segfault");
  EXPECT_EQ(crashed.verdict, VerdictKind::kCrash);
  EXPECT_THAT(crashed.notes, HasSubstr("signal 11"));
  EXPECT_EQ(crashed.op_types, (std::vector<std::string>{"Linear", "Bias", "ReLU"}));
  EXPECT_EQ(pool.workers_started(), started + 1);
  // The replacement runs the same case without the fault.
  EXPECT_EQ(pool.run_now(three_op_fusion(), "").verdict, VerdictKind::kPass);
}

TEST(WorkerPool, ACaseThatHangsIsKilledAtItsTimeLimit) {
  WorkerPool pool(pool_options(1, 1.0));
  const auto start = std::chrono::steady_clock::now();
  const harness::CaseResult hung = pool.run_now(dual_generator(), "hang");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(hung.verdict, VerdictKind::kTimeout);
  EXPECT_THAT(hung.notes, HasSubstr("limit of 1 s"));
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(pool.run_now(dual_generator(), "").verdict, VerdictKind::kPass);
}

TEST(WorkerPool, AWorkerKilledFromOutsideMidCaseGivesACrashVerdict) {
  WorkerPool pool(pool_options(2, 60));
  const int slot = pool.submit(Job{7, dual_generator(), "hang"});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ::kill(pool.worker_pids()[static_cast<size_t>(slot)], SIGKILL);
  const auto result = pool.wait(std::chrono::steady_clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->id, 7u);
  EXPECT_EQ(result->result.verdict, VerdictKind::kCrash);
  EXPECT_THAT(result->result.notes, HasSubstr("signal 9"));
}

TEST(WorkerPool, AWorkerKilledWhileItStartsIsStartedAgain) {
  // Seen in a kill -9 trial: a replacement worker killed while it loaded ended the whole
  // campaign ("killed by signal 9 before it was ready"). The backend has started before,
  // so the slot starts a new worker and the run goes on.
  WorkerPoolOptions options = pool_options(1, 30);
  options.recycle_after = 1;  // a new worker after every case
  WorkerPool pool(options);
  EXPECT_EQ(pool.run_now(dual_generator(), "").verdict, VerdictKind::kPass);
  const auto started = pool.workers_started();
  // The replacement is loading LibTorch now (hundreds of milliseconds): kill it there.
  ::kill(pool.worker_pids()[0], SIGKILL);
  EXPECT_EQ(pool.run_now(dual_generator(), "").verdict, VerdictKind::kPass);
  EXPECT_GE(pool.workers_started(), started + 1);
}

TEST(WorkerPool, ACampaignOnWorkersSurvivesAbortingCasesAndSavesThemUnderCrashing) {
  const std::filesystem::path dir = make_temp_dir("gradfuzz-pool-");
  WorkerPool pool(pool_options(2, 30));
  CampaignOptions options;
  options.cases = 150;
  options.seed = 3;
  options.fault = "crash-abort";
  options.corpus_dir = dir;
  reports::MultiReporter none({});
  const CampaignOutcome outcome = run_campaign(options, pool, none, nullptr);
  EXPECT_EQ(outcome.cases_run, 150);
  ASSERT_FALSE(outcome.findings.empty()) << "no fan-out channel in 150 cases";
  const auto& finding = outcome.findings.front();
  EXPECT_EQ(finding.finding.result.verdict, VerdictKind::kCrash);
  EXPECT_THAT(finding.finding.case_file, HasSubstr("/crashing/"));
  EXPECT_EQ(corpus::load_case_file(finding.finding.case_file).verdict.kind, VerdictKind::kCrash);
  EXPECT_EQ(count_regular_files(dir / kInflightDir), 0u);
  remove_tree(dir);
}

}  // namespace
}  // namespace gradfuzz::campaign
