#include "campaign/confirmation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <nlohmann/json.hpp>

#include "campaign/campaign.h"
#include "campaign/files.h"
#include "corpus/case_file.h"
#include "tests/harness/test_specs.h"

namespace gradfuzz::campaign {
namespace {

using harness::CaseResult;
using harness::CaseSpec;
using harness::Finding;
using harness::OutputBindingSpec;
using harness::VerdictKind;
using harness::testing::op;
using ::testing::ElementsAre;

/// A runner whose every case's result a test function decides (no backend); it counts the
/// traced runs it was asked for.
class ScriptedRunner final : public CaseRunner {
 public:
  explicit ScriptedRunner(std::function<CaseResult(const CaseSpec&)> script) : script_(std::move(script)) {
    caps_ = harness::model_capabilities();
    caps_.backend = "te";
    caps_.versions["transformer_engine"] = "2.20.2";
  }
  const harness::BackendCapabilities& capabilities() override { return caps_; }
  int slots() const override { return 1; }
  int idle() const override { return ready_.empty() ? 1 : 0; }
  int in_flight() const override { return static_cast<int>(ready_.size()); }
  int submit(Job job) override {
    ready_.push_back(JobResult{job.id, job.trace ? run_traced(job.spec, job.fault) : run_now(job.spec, job.fault), 0});
    return 0;
  }
  std::optional<JobResult> wait(std::optional<std::chrono::steady_clock::time_point>) override {
    if (ready_.empty()) return std::nullopt;
    JobResult r = std::move(ready_.front());
    ready_.pop_front();
    return r;
  }
  CaseResult run_now(const CaseSpec& spec, const std::string&) override {
    CaseResult r = script_(spec);
    r.backend = "te";
    r.summarize();
    return r;
  }
  CaseResult run_traced(const CaseSpec& spec, const std::string& fault) override {
    ++traced;
    return run_now(spec, fault);
  }
  void cancel_in_flight() override { ready_.clear(); }
  int64_t traced = 0;

 private:
  std::function<CaseResult(const CaseSpec&)> script_;
  harness::BackendCapabilities caps_;
  std::deque<JobResult> ready_;
};

Finding weight_gradient(const std::string& path) {
  Finding f;
  f.kind = VerdictKind::kMismatch;
  f.path_pair = path + "~reference";
  f.tensor = "grad_param[1].Linear[0]";
  f.role = "grad_param";
  f.op = "Linear";
  f.signature = "mismatch|Linear|grad_param";
  return f;
}

/// MakeExtraOutput(in_place) -> Linear -> AddExtraInput(in_place) of one channel, float32.
CaseSpec residual(double in_place = 1) {
  CaseSpec spec;
  spec.input_shape = {2, 4};
  spec.dtype = "float32";
  spec.ops = {op("MakeExtraOutput", {{"in_place", in_place}}, {}, {OutputBindingSpec{"r", false}}),
              op("Linear", {{"out", 4}}), op("AddExtraInput", {{"in_place", in_place}}, {"r"})};
  return spec;
}

bool writes_in_place(const CaseSpec& spec) {
  for (const auto& o : spec.ops) {
    const auto it = o.attrs.find("in_place");
    if (it != o.attrs.end() && it->second == 1) return true;
  }
  return false;
}

KnownIssues documented_in_place() {
  return known_issues_from_json(nlohmann::json::parse(R"({"schema_version": 1, "entries": [
    {"id": "te-in-place-aliasing", "status": "documented-behaviour",
     "match": {"options": ["in_place=1"], "backend": "te"}}]})"),
                                "k.json");
}

ConfirmationContext context_with(const KnownIssues* known) {
  ConfirmationContext c;
  c.known = known;
  c.backend = "te";
  c.version = "2.20.2";
  return c;
}

const reports::VariantRun& variant(const reports::Confirmation& c, const std::string& name) {
  for (const auto& v : c.variants) {
    if (v.name == name) return v;
  }
  throw std::runtime_error("no variant " + name);
}

CaseResult fused_result(std::vector<Finding> findings) {
  CaseResult r;
  r.fused_backward = {"BackwardLinearAdd"};
  r.findings = std::move(findings);
  r.summarize();
  return r;
}

TEST(ConfirmCluster, AFindingGoneWithoutTheDocumentedInPlaceWriteIsItsConsequence) {
  // Fused and unfused paths both wrong with in_place=1, both right without it.
  ScriptedRunner runner([](const CaseSpec& spec) {
    return writes_in_place(spec) ? fused_result({weight_gradient("fused"), weight_gradient("unfused")}) : CaseResult{};
  });
  const KnownIssues known = documented_in_place();
  const CaseSpec spec = residual();
  const reports::Confirmation c =
      confirm_cluster(runner, spec, runner.run_now(spec, ""), "mismatch|Linear|grad_param", context_with(&known));
  EXPECT_EQ(c.diagnosis, "known-consequence");
  EXPECT_EQ(c.explained_by, "te-in-place-aliasing");
  EXPECT_EQ(variant(c, "in_place_off").verdict, "passes");
  EXPECT_EQ(variant(c, "unfused").verdict, "fails");
  // Without a documented entry the same runs are all-paths, and nothing explains them.
  const reports::Confirmation alone =
      confirm_cluster(runner, spec, runner.run_now(spec, ""), "mismatch|Linear|grad_param", context_with(nullptr));
  EXPECT_EQ(alone.diagnosis, "all-paths");
  EXPECT_TRUE(alone.explained_by.empty());
}

TEST(ConfirmCluster, WhatTheDocumentedWriteLeavesOnTheSameTensorIsAKnownCausesToo) {
  // With in_place=1 the weight gradient is signed by the fused group and the unfused path
  // raises the documented view error; without it the same tensor is still wrong, for a known
  // FP8 cause (H100 quick start, 2026-12-06: BackwardLinearScale under backward_override).
  Finding fused = weight_gradient("fused");
  fused.signature = "mismatch|BackwardLinearScale|grad_param";
  Finding raised;
  raised.kind = VerdictKind::kUnexpectedError;
  raised.path_pair = "unfused~reference";
  raised.tensor = "error";
  raised.role = "error";
  raised.message = "A view was created in no_grad mode and is being modified inplace";
  raised.signature = "unexpected_error|_OperationFuserAutogradFunction|backward|view modified inplace";
  ScriptedRunner runner([&](const CaseSpec& spec) {
    return writes_in_place(spec) ? fused_result({fused, raised}) : fused_result({weight_gradient("fused")});
  });
  const KnownIssues known = known_issues_from_json(nlohmann::json::parse(R"json({"schema_version": 1, "entries": [
    {"id": "te-in-place-aliasing", "status": "documented-behaviour", "match": {"options": ["in_place=1"], "backend": "te"}},
    {"id": "te-override-wgrad", "status": "open-defect",
     "match": {"signature": "mismatch|Linear|grad_param", "backend": "te"}}]})json"),
                                                   "k.json");
  const CaseSpec spec = residual();
  const auto c = confirm_cluster(runner, spec, runner.run_now(spec, ""), fused.signature, context_with(&known));
  EXPECT_EQ(variant(c, "unfused").verdict, "raises");
  EXPECT_EQ(variant(c, "in_place_off").verdict, "fails_otherwise");
  EXPECT_EQ(c.diagnosis, "known-consequence");
  EXPECT_EQ(c.explained_by, "te-override-wgrad");
  // A new cause left on the tensor keeps the cluster new.
  const KnownIssues documented_only = documented_in_place();
  const auto alone =
      confirm_cluster(runner, spec, runner.run_now(spec, ""), fused.signature, context_with(&documented_only));
  EXPECT_EQ(alone.diagnosis, "all-paths");
  EXPECT_TRUE(alone.explained_by.empty());
}

TEST(ConfirmCluster, AFusedKernelWrongWhereItsUnfusedOpsAreRightStaysNew) {
  // BackwardLinearAdd fuses only with in_place=1: without it the finding is gone too, but the
  // unfused path with the same in-place flags is right, so the write is not the cause.
  ScriptedRunner runner([](const CaseSpec& spec) {
    return writes_in_place(spec) ? fused_result({weight_gradient("fused")}) : CaseResult{};
  });
  const KnownIssues known = documented_in_place();
  const CaseSpec spec = residual();
  const reports::Confirmation c =
      confirm_cluster(runner, spec, runner.run_now(spec, ""), "mismatch|Linear|grad_param", context_with(&known));
  EXPECT_EQ(c.diagnosis, "fused-only");
  EXPECT_TRUE(c.explained_by.empty());
  EXPECT_EQ(variant(c, "unfused").verdict, "passes");
  EXPECT_EQ(variant(c, "in_place_off").verdict, "passes");
  // Every variant but the unfused path's is a run of its own, traced.
  EXPECT_EQ(runner.traced, static_cast<int64_t>(c.variants.size()) - 1);
}

TEST(ConfirmCluster, RecipeDtypeAndErrorsGiveTheirDiagnoses) {
  CaseSpec fp8 = residual(0);
  fp8.recipe = harness::RecipeSpec{"Float8CurrentScaling", "E4M3", {}};
  ScriptedRunner quantized([](const CaseSpec& spec) {
    CaseResult r;
    if (spec.recipe) r.findings = {weight_gradient("fused")};
    return r;
  });
  const auto q =
      confirm_cluster(quantized, fp8, quantized.run_now(fp8, ""), "mismatch|Linear|grad_param", context_with(nullptr));
  EXPECT_EQ(q.diagnosis, "quantized-only");
  EXPECT_EQ(variant(q, "no_recipe").verdict, "passes");
  EXPECT_EQ(variant(q, "unfused").verdict, "not_run");

  CaseSpec half = residual(0);
  half.dtype = "bfloat16";
  ScriptedRunner rounding([](const CaseSpec& spec) {
    CaseResult r;
    if (spec.dtype == "bfloat16") r.findings = {weight_gradient("fused")};
    return r;
  });
  const auto h =
      confirm_cluster(rounding, half, rounding.run_now(half, ""), "mismatch|Linear|grad_param", context_with(nullptr));
  EXPECT_EQ(h.diagnosis, "half-only");
  EXPECT_EQ(variant(h, "float32").change, "bfloat16 -> float32");

  Finding raised;
  raised.kind = VerdictKind::kUnexpectedError;
  raised.path_pair = "fused~reference";
  raised.tensor = "error";
  raised.role = "error";
  raised.signature = "unexpected_error|BasicLinear|forward|c10-error|unsupported quantizer";
  ScriptedRunner crashing([&](const CaseSpec&) {
    CaseResult r;
    r.findings = {raised};
    return r;
  });
  const CaseSpec plain = residual(0);
  const auto e = confirm_cluster(crashing, plain, crashing.run_now(plain, ""), raised.signature, context_with(nullptr));
  EXPECT_EQ(e.diagnosis, "crash");
}

TEST(ConfirmCluster, RemovesEachOpWhereTheCaseStaysValidAndSaysWhetherTheFindingStays) {
  // The finding needs the Linear: without it the case passes; without an in-place op it stays.
  ScriptedRunner runner([](const CaseSpec& spec) {
    CaseResult r;
    for (const auto& o : spec.ops) {
      if (o.name == "Linear") r.findings = {weight_gradient("fused")};
    }
    return r;
  });
  const CaseSpec spec = residual(0);
  const auto c =
      confirm_cluster(runner, spec, runner.run_now(spec, ""), "mismatch|Linear|grad_param", context_with(nullptr));
  std::vector<std::string> removals;
  for (const auto& v : c.variants) {
    if (v.name.rfind("without_op[", 0) == 0) removals.push_back(v.name + ":" + v.verdict);
  }
  EXPECT_THAT(removals, ElementsAre("without_op[0]:fails", "without_op[1]:passes", "without_op[2]:fails"));
  EXPECT_EQ(c.diagnosis, "all-paths");
}

TEST(FindingRecorder, AClusterConfirmedAsADocumentedConsequenceIsKnownAndSoAreItsLaterCases) {
  const std::filesystem::path dir = make_temp_dir("gradfuzz-confirm-");
  CampaignOptions options;
  options.cases = 20;
  options.seed = 3;
  options.max_ops = 3;
  options.backend = "te";
  options.corpus_dir = dir;
  options.shrink = false;
  options.known = std::make_shared<const KnownIssues>(documented_in_place());
  // Every case with an in-place op fails on both paths, and passes without the write.
  ScriptedRunner runner([](const CaseSpec& spec) {
    return writes_in_place(spec) ? fused_result({weight_gradient("fused"), weight_gradient("unfused")}) : CaseResult{};
  });
  class Collect final : public reports::Reporter {
   public:
    void report_context(const reports::ReportContext&) override {}
    void report_case(const reports::CaseRecord& r) override { records.push_back(r); }
    void finalize(const reports::RunSummary&) override {}
    std::vector<reports::CaseRecord> records;
  } reporter;
  const CampaignOutcome outcome = run_campaign(options, runner, reporter, nullptr);
  ASSERT_GT(outcome.failed, 0) << "no generated case wrote in place";
  EXPECT_EQ(outcome.new_findings(), 0);
  EXPECT_EQ(outcome.known_failed, outcome.failed);
  ASSERT_EQ(outcome.findings.size(), 1u);
  const reports::Finding& f = outcome.findings[0].finding;
  ASSERT_TRUE(f.known.has_value());
  EXPECT_EQ(f.known->id, "te-in-place-aliasing");
  ASSERT_TRUE(f.confirmation.has_value());
  EXPECT_EQ(f.confirmation->diagnosis, "known-consequence");
  EXPECT_EQ(f.cluster, "mismatch|Linear|grad_param|known:te-in-place-aliasing");
  // The saved case says what it stands for.
  const corpus::CaseFile saved = corpus::load_case_file(f.case_file);
  ASSERT_TRUE(saved.finding.has_value());
  EXPECT_EQ(saved.finding->finding.signature, "mismatch|Linear|grad_param");
  EXPECT_EQ(saved.finding->diagnosis, "known-consequence");
  for (const auto& record : reporter.records) {
    for (const auto& key : record.clusters) EXPECT_EQ(key, f.cluster);
  }
  remove_tree(dir);
}

}  // namespace
}  // namespace gradfuzz::campaign
