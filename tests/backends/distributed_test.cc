// Distributed cases end to end on the CPU (docs/BACKENDS.md "Distributed cases"): the torch
// backend's ranks on gloo through worker processes and the adapter, the planted faults of
// the ranks' communication, a rank killed or hanging mid-case, and te.ops's own tensor-
// parallel code on gloo ranks over the stubbed extension (when TE's Python source is here).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backends/remote_backend.h"
#include "campaign/files.h"
#include "corpus/case_file.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "runner/run_case.h"
#include "tools/cli.h"

namespace gradfuzz::tools {
namespace {

using campaign::make_temp_dir;
using campaign::remove_tree;
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

std::string source_dir() {
  const char* root = std::getenv("GRADFUZZ_SOURCE_DIR");
  return root ? root : ".";
}

harness::OpSpec op(const std::string& name, ops::OpAttrs attrs = {}) {
  return {name, std::move(attrs), {}, {}, ops::OutputStyle::kVector, {}, {}};
}

/// A sequence-parallel MLP on 2 ranks from row slices, then AllGather: every collective of
/// the torch emulation in it.
harness::CaseSpec mlp_case() {
  harness::CaseSpec spec;
  spec.ops = {op("Linear", {{"out", 8}, {"tensor_parallel_mode", 1}, {"sequence_parallel", 1}}), op("GELU"),
              op("Linear", {{"out", 6}, {"tensor_parallel_mode", 2}, {"sequence_parallel", 1}}), op("AllGather"),
              op("Bias")};
  spec.world_size = 2;
  spec.input_layout = "rows";
  spec.input_shape = {4, 6};
  spec.dtype = "float32";
  spec.seed = 11;
  return spec;
}

/// Whether a process `pid` exists (a zombie counts: it was not reaped).
bool process_exists(int pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

class Distributed : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir("gradfuzz-dist-"); }
  void TearDown() override { remove_tree(dir_); }
  std::filesystem::path dir_;
};

// Issue 16's CPU acceptance, the campaign: 1000 two-rank cases of the torch backend (gloo),
// their values and gradients assembled from the ranks' slices and judged against the one
// float64 reference, replicated ones compared across the ranks: no finding.
TEST_F(Distributed, ATwoRankTorchCampaignOf1000CasesPasses) {
  const std::string report = (dir_ / "r.json").string();
  const CliRun r =
      cli({"fuzz", "--backend", "torch", "--world-size", "2", "--cases", "1000", "--seed", "16", "--device", "cpu",
           "--workers", "2", "--corpus", (dir_ / "c").string(), "--report", report, "--quiet"});
  ASSERT_EQ(r.exit, 0) << r.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["summary"]["cases_run"], 1000);
  EXPECT_EQ(j["summary"]["failed"], 0) << j["findings"].dump(1);
  EXPECT_EQ(j["summary"]["unsupported"], 0);
  EXPECT_EQ(j["coverage"]["features"]["world_size_2"], 1000);
  for (const char* name : {"AllGather", "ReduceScatter", "AllReduce", "Linear", "MakeExtraOutput", "AddExtraInput"}) {
    EXPECT_GT(j["coverage"]["ops"][name].get<int>(), 0) << name;
  }
}

// The planted faults of the ranks' communication (adapter torch_backend/faults.py): each found by the
// default two-rank campaign within 2000 cases, shrunk, failing on replay with the fault and
// passing without.
TEST_F(Distributed, SelftestFindsEveryDistributedFault) {
  const std::string report = (dir_ / "selftest.json").string();
  const CliRun r =
      cli({"selftest", "--backend", "torch", "--device", "cpu", "--faults",
           "torch-reduce-scatter-wrong-shard,torch-column-parallel-dgrad-not-all-reduced,"
           "torch-all-reduce-backward-reduced",
           "--cases", "2000", "--seed", "16", "--workers", "1", "--corpus", (dir_ / "c").string(), "--report", report});
  ASSERT_EQ(r.exit, 0) << r.out << r.err;
  std::ifstream in(report);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["selftest"].size(), 3u) << j.dump();
  for (const auto& e : j["selftest"]) {
    EXPECT_TRUE(e["ok"].get<bool>()) << e.dump();
    EXPECT_LE(e["cases_to_detect"].get<int64_t>(), 2000) << e.dump();
    EXPECT_LE(e["shrunk_ops"].get<int64_t>(), 3) << e.dump();
  }
}

// Where the backend runs fewer ranks than a fault's cases need (te on one GPU), the selftest
// leaves the fault out and names it; a list of only such faults is a usage error.
TEST_F(Distributed, SelftestLeavesOutFaultsOfMoreRanksThanTheBackendRuns) {
  ::setenv("GRADFUZZ_MAX_WORLD_SIZE", "1", 1);  // read by the adapter at its start
  const CliRun r = cli({"selftest", "--backend", "torch", "--faults", "torch-reduce-scatter-wrong-shard", "--workers",
                        "0", "--cases", "10", "--corpus", (dir_ / "c").string()});
  ::unsetenv("GRADFUZZ_MAX_WORLD_SIZE");
  EXPECT_EQ(r.exit, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("none of 'torch-reduce-scatter-wrong-shard' runs on this backend here; "
                               "torch-reduce-scatter-wrong-shard needs cases of 2 ranks; the torch backend runs 1 "
                               "here"));
  // With others in the list the rest runs; the left-out fault is named.
  ::setenv("GRADFUZZ_MAX_WORLD_SIZE", "1", 1);
  const CliRun mixed =
      cli({"selftest", "--backend", "torch", "--faults",
           "torch-reduce-scatter-wrong-shard,torch-fp8-scale-inv-applied-twice", "--recipe", "Float8CurrentScaling",
           "--dtypes", "float32", "--workers", "0", "--cases", "50", "--corpus", (dir_ / "m").string()});
  ::unsetenv("GRADFUZZ_MAX_WORLD_SIZE");
  EXPECT_EQ(mixed.exit, 0) << mixed.out << mixed.err;
  EXPECT_THAT(mixed.err, HasSubstr("not run: torch-reduce-scatter-wrong-shard needs cases of 2 ranks"));
  EXPECT_THAT(mixed.out, HasSubstr("torch-fp8-scale-inv-applied-twice: ok"));
}

backends::BackendOptions torch_options(double case_timeout_s) {
  backends::BackendOptions o;
  o.name = "torch";
  o.case_timeout_s = case_timeout_s;
  return o;
}

// A rank that dies mid-case (killed from outside while it waits in a collective) is that
// case's crash finding; every rank is killed and reaped, and the next case starts new ones.
TEST_F(Distributed, ARankKilledMidCaseIsACrashAndNoRankIsLeft) {
  backends::RemoteBackend backend(torch_options(60));
  runner::RunOptions options;
  options.finite_differences = false;
  const harness::CaseSpec spec = mlp_case();
  ASSERT_EQ(runner::run_case(spec, backend, options).verdict, harness::VerdictKind::kPass);
  const std::vector<int> ranks = backend.rank_pids();
  ASSERT_EQ(ranks.size(), 2u);
  // Rank 1 sleeps in its first all-gather (torch-rank-hangs), rank 0 waits for it there.
  backend.set_fault("torch-rank-hangs");
  harness::CaseResult result;
  std::thread run([&] { result = runner::run_case(spec, backend, options); });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ::kill(ranks[1], SIGKILL);
  run.join();
  EXPECT_EQ(result.verdict, harness::VerdictKind::kCrash) << result;
  EXPECT_THAT(result.notes, HasSubstr("rank 1 killed by SIGKILL while running the case"));
  for (int pid : ranks) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " left behind";
  EXPECT_TRUE(backend.rank_pids().empty());
  backend.set_fault("");
  EXPECT_EQ(runner::run_case(spec, backend, options).verdict, harness::VerdictKind::kPass);
  EXPECT_EQ(backend.rank_pids().size(), 2u);
}

// A rank that hangs is the case's timeout, answered by the adapter before the case's limit
// (its other ranks wait in a collective); every rank is killed and reaped. A rank that kills
// itself is a crash likewise.
TEST_F(Distributed, AHangingRankIsATimeoutAndADyingOneACrashWithNoRankLeft) {
  backends::RemoteBackend backend(torch_options(4));
  runner::RunOptions options;
  options.finite_differences = false;
  const harness::CaseSpec spec = mlp_case();
  ASSERT_EQ(runner::run_case(spec, backend, options).verdict, harness::VerdictKind::kPass);
  std::vector<int> ranks = backend.rank_pids();
  backend.set_fault("torch-rank-hangs");
  const harness::CaseResult hung = runner::run_case(spec, backend, options);
  EXPECT_EQ(hung.verdict, harness::VerdictKind::kTimeout) << hung;
  EXPECT_THAT(hung.notes, HasSubstr("rank(s) 0, 1 did not answer within 3.6 s"));
  for (int pid : ranks) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " left behind";
  backend.set_fault("");
  ASSERT_EQ(runner::run_case(spec, backend, options).verdict, harness::VerdictKind::kPass);
  ranks = backend.rank_pids();
  backend.set_fault("torch-rank-killed");
  const harness::CaseResult killed = runner::run_case(spec, backend, options);
  EXPECT_EQ(killed.verdict, harness::VerdictKind::kCrash) << killed;
  for (int pid : ranks) EXPECT_FALSE(process_exists(pid)) << "rank process " << pid << " left behind";
}

// te.ops's own AllGather, ReduceScatter, AllReduce, tensor-parallel Bias and column/row
// BasicLinear on two gloo ranks, over the stubbed extension with torch's matmul for its
// GEMM (adapter/tests/te_stub.py): the te backend's distributed path on the CPU. Each case
// passes; each te fault of the ranks' communication is found; and TE's AllReduce, which
// all-reduces its input in place, overwrites the extra output MakeExtraOutput hands the
// caller (the same tensor): a finding of te.ops's own code, where the torch emulation, which
// sums into a copy, passes.
TEST_F(Distributed, TeOpsTensorParallelCodeRunsOnGlooRanksOverTheStubbedExtension) {
  const std::string source = source_dir();
  // The stub needs TE 2.20.2's Python source (tests/te_stub.py: te_source()).
  const char* te_src = std::getenv("GRADFUZZ_TE_SRC");
  const bool have_te = (te_src && std::filesystem::exists(std::string(te_src) + "/transformer_engine")) ||
                       std::filesystem::exists("/tmp/te-src/transformer_engine") ||
                       std::filesystem::exists(source + "/.te/rest/transformer_engine-2.20.2-py3-none-any.whl");
  if (!have_te) GTEST_SKIP() << "TE's Python source is not here (../shared/te/fetch.sh, or GRADFUZZ_TE_SRC)";
  ::setenv("GRADFUZZ_TE_STUB_GEMM", "1", 1);
  backends::BackendOptions te_options;
  te_options.name = "te";
  te_options.python = source + "/adapter/tests/te_stub_python.sh";
  te_options.case_timeout_s = 60;
  backends::RemoteBackend te(te_options);
  runner::RunOptions options;
  options.finite_differences = false;
  const std::string data = source + "/tests/backends/data/";
  auto spec_of = [&](const char* name) { return corpus::load_case_file(data + name).spec; };
  for (const char* name : {"te-tp-all-gather.json", "te-tp-bias.json", "te-tp-mlp.json", "te-tp-reduce-scatter.json"}) {
    const harness::CaseResult result = runner::run_case(spec_of(name), te, options);
    EXPECT_EQ(result.verdict, harness::VerdictKind::kPass) << name << ": " << result;
  }
  const std::vector<std::pair<std::string, std::string>> faults = {
      {"te-reduce-scatter-wrong-shard", "te-tp-reduce-scatter.json"},
      {"te-column-parallel-dgrad-not-all-reduced", "te-tp-mlp.json"},
      {"te-all-reduce-backward-reduced", "te-tp-mlp.json"}};
  for (const auto& [fault, file] : faults) {
    te.set_fault(fault);
    const harness::CaseResult result = runner::run_case(spec_of(file.c_str()), te, options);
    EXPECT_EQ(result.verdict, harness::VerdictKind::kMismatch) << fault << ": " << result;
  }
  te.set_fault("");
  const harness::CaseSpec in_place = spec_of("te-tp-all-reduce-in-place.json");
  const harness::CaseResult on_te = runner::run_case(in_place, te, options);
  ASSERT_EQ(on_te.verdict, harness::VerdictKind::kMismatch) << on_te;
  EXPECT_EQ(on_te.findings.front().signature, "mismatch|MakeExtraOutput|extra_output") << on_te;
  backends::RemoteBackend torch(torch_options(60));
  EXPECT_EQ(runner::run_case(in_place, torch, options).verdict, harness::VerdictKind::kPass);
  // The exported te scripts, one process per rank under torchrun (TE over the stub): the MLP
  // passes, the in-place AllReduce fails on the extra output, as replay says.
  const char* python = std::getenv("GRADFUZZ_TEST_PYTHON");
  const std::string py = python ? python : source + "/.venv/bin/python";
  for (const auto& [name, passes] :
       std::vector<std::pair<std::string, bool>>{{"te-tp-mlp", true}, {"te-tp-all-reduce-in-place", false}}) {
    const std::string script = (dir_ / ("test_" + name + ".py")).string();
    const CliRun r = cli({"export", "--python", data + name + ".json", "--backend", "te", "-o", script});
    ASSERT_EQ(r.exit, 0) << r.err;
    const std::string log = (dir_ / (name + ".log")).string();
    const std::string command =
        "cd " + dir_.string() + " && " + py + " -m torch.distributed.run --nproc-per-node 2 --no-python " + source +
        "/adapter/tests/te_stub_pytest.sh -q -p no:cacheprovider " + script + " > " + log + " 2>&1";
    const int status = std::system(command.c_str());
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    EXPECT_EQ(status == 0, passes) << name << ":\n" << text.str();
    if (!passes) {
      EXPECT_THAT(text.str(), HasSubstr("extra_output[0]: 12 of 12 off")) << name;
    }
  }
  ::unsetenv("GRADFUZZ_TE_STUB_GEMM");
}

}  // namespace
}  // namespace gradfuzz::tools
