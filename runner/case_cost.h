#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "harness/case_result.h"
#include "harness/case_spec.h"

namespace gradfuzz::runner {

/// Where one case's time goes in the process that runs it (docs/BENCHMARKS.md "The te
/// worker: where a case's time goes"): wall seconds per stage of run_case, each exclusive of
/// the stages nested in it ("ablation/paths" is the ablation rerun's path requests), and
/// counts (backend requests, path runs by kind, the adapter's second runs).
struct CaseCost {
  std::map<std::string, double> seconds;
  /// The process's CPU seconds per stage, likewise: on a shared machine less noisy than
  /// wall time; a backend stage's wall time less its CPU time is the adapter's.
  std::map<std::string, double> cpu_seconds;
  std::map<std::string, int64_t> counts;
};

/// Whether this process records case costs: $GRADFUZZ_CASE_COST names a file (read once).
bool case_cost_enabled();

/// Whether a CaseCostRecorder records on this thread.
bool case_cost_recording();

/// Records the costs of the case run on this thread from construction to finish() (nothing
/// when `enabled` is false, or when another recorder records on this thread already).
class CaseCostRecorder {
 public:
  explicit CaseCostRecorder(bool enabled);
  ~CaseCostRecorder();
  CaseCostRecorder(const CaseCostRecorder&) = delete;
  CaseCostRecorder& operator=(const CaseCostRecorder&) = delete;
  /// The costs so far; the time not in any stage is "other" (op creation, values, the
  /// result's summary).
  CaseCost finish();

 private:
  bool active_;
};

/// A named stage of the case recorded on this thread (no-op without a recorder): its wall
/// time, less that of the stages opened inside it, goes to the stage's path ("judge",
/// "ablation/reference").
class CostStage {
 public:
  explicit CostStage(const char* name);
  ~CostStage();
  CostStage(const CostStage&) = delete;
  CostStage& operator=(const CostStage&) = delete;

 private:
  bool active_;
};

/// Adds `n` to counter `what` of the case recorded on this thread, under the open stages'
/// path ("ablation/requests"); no-op without a recorder.
void count_cost(const std::string& what, int64_t n = 1);

/// Appends one JSON line to $GRADFUZZ_CASE_COST: the case's seed, dtype, recipe, verdict,
/// op and repeat-call counts, and `cost`. Errors writing are ignored (a measurement must not
/// fail a campaign).
void log_case_cost(const harness::CaseSpec& spec, const harness::CaseResult& result, const CaseCost& cost);

}  // namespace gradfuzz::runner
