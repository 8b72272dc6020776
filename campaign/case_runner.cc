#include "campaign/case_runner.h"

#include <memory>
#include <stdexcept>

#include "ops/faults.h"

namespace gradfuzz::campaign {

harness::CaseResult run_with_fault(const harness::CaseSpec& spec, const std::string& fault, backends::Backend& backend,
                                   const runner::RunOptions& run_options) {
  // The model's switchboard is process-wide: every fault off except the one asked for.
  bool model_fault = false;
  std::vector<std::unique_ptr<ops::FaultScope>> scopes;
  for (ops::Fault f : ops::all_faults()) {
    const bool on = !fault.empty() && ops::fault_name(f) == fault;
    model_fault = model_fault || on;
    scopes.push_back(std::make_unique<ops::FaultScope>(f, on));
  }
  // Any other name is one of the backend's own planted faults, on for this case only.
  struct BackendFault {
    backends::Backend& backend;
    bool on;
    ~BackendFault() {
      if (on) backend.set_fault("");
    }
  } planted{backend, !fault.empty() && !model_fault};
  if (planted.on) backend.set_fault(fault);
  return runner::run_case(spec, backend, run_options);
}

int InProcessRunner::submit(Job job) {
  if (!ready_.empty()) throw std::logic_error("InProcessRunner::submit with a result not collected");
  JobResult r;
  r.id = job.id;
  r.slot = 0;
  runner::RunOptions options = run_options_;
  options.trace = options.trace || job.trace;
  r.result = run_with_fault(job.spec, job.fault, *backend_, options);
  ready_.push_back(std::move(r));
  return 0;
}

std::optional<JobResult> InProcessRunner::wait(std::optional<std::chrono::steady_clock::time_point> /*deadline*/) {
  if (ready_.empty()) return std::nullopt;
  JobResult r = std::move(ready_.front());
  ready_.pop_front();
  return r;
}

harness::CaseResult InProcessRunner::run_now(const harness::CaseSpec& spec, const std::string& fault) {
  return run_with_fault(spec, fault, *backend_, run_options_);
}

harness::CaseResult InProcessRunner::run_traced(const harness::CaseSpec& spec, const std::string& fault) {
  runner::RunOptions options = run_options_;
  options.trace = true;
  return run_with_fault(spec, fault, *backend_, options);
}

}  // namespace gradfuzz::campaign
