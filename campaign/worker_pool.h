#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/process.h"
#include "campaign/case_runner.h"
#include "campaign/mps.h"
#include "campaign/sanitizer.h"
#include "harness/case_result.h"
#include "harness/case_spec.h"
#include "runner/run_case.h"

namespace gradfuzz::campaign {

/// How the supervisor starts its workers (`gradfuzz worker`, docs/BACKENDS.md "Processes").
struct WorkerPoolOptions {
  /// Worker processes; each owns one backend (and, for te/torch, one adapter).
  int workers = 1;
  backends::BackendOptions backend;
  /// CUDA devices handed out round-robin (CUDA_VISIBLE_DEVICES of each worker); empty: inherit.
  std::vector<std::string> devices;
  /// Seconds one case may run before its worker (and the worker's adapter) is killed.
  double case_timeout_s = 120;
  /// A worker is replaced after this many cases, which bounds the memory a long run can
  /// grow by whatever a backend keeps from case to case.
  int64_t recycle_after = 2000;
  /// Run options passed to run_case in the workers.
  runner::RunOptions run_options;
  /// Path of the gradfuzz executable (default $GRADFUZZ_EXECUTABLE, else /proc/self/exe).
  std::string executable;
  /// Run every worker under compute-sanitizer; a case during which it reports an error gets
  /// the `sanitizer` verdict.
  std::optional<SanitizerOptions> sanitizer;
  /// Start a CUDA MPS control daemon of the pool's own (campaign/mps.h) before the workers
  /// and stop it after them, so the workers' kernels share each GPU's hardware context.
  bool mps = false;
  /// The MPS control program (default nvidia-cuda-mps-control in PATH; tests give a fake).
  std::string mps_control = "nvidia-cuda-mps-control";
};

/// Raised when a worker reports a gradfuzz bug (an internal assertion) for a case.
class WorkerInternalError : public std::runtime_error {
 public:
  WorkerInternalError(const std::string& message, uint64_t job) : std::runtime_error(message), job_(job) {}
  uint64_t job() const { return job_; }

 private:
  uint64_t job_;
};

/// The supervisor's side of the worker processes: hands out cases, collects results, turns
/// a worker's death into a `crash` result and a case past the time limit into a `timeout`
/// result (killing the worker's process group), and restarts workers as needed. Not
/// thread-safe: one supervisor thread drives it.
class WorkerPool final : public CaseRunner {
 public:
  /// Starts every worker and waits for their hello (capabilities). Throws
  /// backends::BackendUnavailable when a worker's backend cannot start.
  explicit WorkerPool(WorkerPoolOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  const harness::BackendCapabilities& capabilities() override { return capabilities_; }
  int slots() const override { return static_cast<int>(slots_.size()); }
  int idle() const override;
  int in_flight() const override;
  int submit(Job job) override;
  std::optional<JobResult> wait(std::optional<std::chrono::steady_clock::time_point> deadline) override;
  harness::CaseResult run_now(const harness::CaseSpec& spec, const std::string& fault) override;
  harness::CaseResult run_traced(const harness::CaseSpec& spec, const std::string& fault) override;
  void cancel_in_flight() override;
  /// Process ids of the workers (tests kill them).
  std::vector<int> worker_pids() const;
  /// Workers started since the pool was made (restarts included).
  int64_t workers_started() const { return started_; }

 private:
  struct Slot;
  /// run_now / run_traced: one case as soon as a slot is free, waited for.
  harness::CaseResult run_job_now(const harness::CaseSpec& spec, const std::string& fault, bool trace);
  void start(Slot& slot);
  void restart(Slot& slot);
  /// One poll over the busy and starting workers (until `deadline` or the soonest case
  /// limit); finished cases go to ready_. False when no worker is busy or starting.
  bool pump(std::optional<std::chrono::steady_clock::time_point> deadline);
  /// Reads one answer from a slot whose stdout is readable; returns the finished job.
  std::optional<JobResult> collect(Slot& slot);
  JobResult fail(Slot& slot, harness::VerdictKind kind, const std::string& why);
  /// A worker died or hung before answering hello: restarted when the backend has started
  /// before and the slot has not failed kMaxFailedStarts times in a row, else
  /// BackendUnavailable.
  void start_failed(Slot& slot, const std::string& why);

  WorkerPoolOptions options_;
  /// Declared before the slots: it outlives the workers (destroyed after them).
  std::unique_ptr<MpsDaemon> mps_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::deque<JobResult> ready_;
  harness::BackendCapabilities capabilities_;
  int64_t started_ = 0;
  /// Whether any worker has answered hello (the backend works).
  bool ever_ready_ = false;
  uint64_t next_internal_id_ = 1ull << 62;
};

/// `gradfuzz worker`: the loop a worker process runs (frames on stdin/stdout). Returns the
/// exit status. Under compute-sanitizer ($GRADFUZZ_SANITIZER_LOG names its log, "%p" the
/// worker's pid) each case's result is checked against what the log gained meanwhile.
int run_worker(const backends::BackendOptions& backend, const runner::RunOptions& run_options);

/// Environment variable that tells a worker where its sanitizer log is.
inline constexpr const char* kSanitizerLogEnv = "GRADFUZZ_SANITIZER_LOG";

}  // namespace gradfuzz::campaign
