#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "backends/backend.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "runner/run_case.h"

namespace gradfuzz::campaign {

/// One case to run, and what came of it.
struct Job {
  uint64_t id = 0;
  harness::CaseSpec spec;
  /// Fault switched on for this case (name), none when empty.
  std::string fault;
  /// Run it traced (runner::RunOptions::trace): the findings signed by where values first
  /// diverge.
  bool trace = false;
};
struct JobResult {
  uint64_t id = 0;
  harness::CaseResult result;
  /// Which runner slot ran it (its in-flight file).
  int slot = 0;
};

/// Where a campaign's cases run: in worker processes (WorkerPool) or in this process
/// (InProcessRunner, `--workers 0`, for debugging: a crash there ends the run). One
/// supervisor thread drives it.
class CaseRunner {
 public:
  virtual ~CaseRunner() = default;
  virtual const harness::BackendCapabilities& capabilities() = 0;
  /// Slots (in-flight files) the runner uses: 0 .. slots()-1.
  virtual int slots() const = 0;
  /// Slots without a case.
  virtual int idle() const = 0;
  /// Cases handed out and not yet collected.
  virtual int in_flight() const = 0;
  /// Hands `job` to an idle slot and returns the slot. Requires idle() > 0.
  virtual int submit(Job job) = 0;
  /// The next finished case, waiting at most until `deadline` (nullopt when it passed
  /// first, or when nothing is in flight).
  virtual std::optional<JobResult> wait(std::optional<std::chrono::steady_clock::time_point> deadline) = 0;
  /// Runs one case as soon as a slot is free and waits for it (other cases that finish
  /// meanwhile stay for wait()).
  virtual harness::CaseResult run_now(const harness::CaseSpec& spec, const std::string& fault) = 0;
  /// run_now with runner::RunOptions::trace on: its value findings signed by where the values
  /// first diverge (CaseResult::divergences). A runner that cannot trace runs it untraced.
  virtual harness::CaseResult run_traced(const harness::CaseSpec& spec, const std::string& fault) {
    return run_now(spec, fault);
  }
  /// Drops every case in flight (their workers are killed and restarted).
  virtual void cancel_in_flight() = 0;
};

/// Runs each case at submit() in this process on one backend.
class InProcessRunner final : public CaseRunner {
 public:
  InProcessRunner(std::unique_ptr<backends::Backend> backend, runner::RunOptions run_options)
      : backend_(std::move(backend)), run_options_(std::move(run_options)) {}
  const harness::BackendCapabilities& capabilities() override { return backend_->capabilities(); }
  int slots() const override { return 1; }
  int idle() const override { return ready_.empty() ? 1 : 0; }
  int in_flight() const override { return static_cast<int>(ready_.size()); }
  int submit(Job job) override;
  std::optional<JobResult> wait(std::optional<std::chrono::steady_clock::time_point> deadline) override;
  harness::CaseResult run_now(const harness::CaseSpec& spec, const std::string& fault) override;
  harness::CaseResult run_traced(const harness::CaseSpec& spec, const std::string& fault) override;
  void cancel_in_flight() override { ready_.clear(); }

 private:
  std::unique_ptr<backends::Backend> backend_;
  runner::RunOptions run_options_;
  std::deque<JobResult> ready_;
};

/// Runs `spec` on `backend` with `fault` (a fault name, or empty) switched on.
harness::CaseResult run_with_fault(const harness::CaseSpec& spec, const std::string& fault, backends::Backend& backend,
                                   const runner::RunOptions& run_options);

}  // namespace gradfuzz::campaign
