#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "campaign/campaign.h"
#include "harness/case_spec.h"

namespace gradfuzz::tools {

using campaign::CampaignOptions;

/// Cases of `gradfuzz bench` when --cases is not given.
inline constexpr int64_t kDefaultBenchCases = 200;
/// Times the campaign and the floor are each measured; the fastest of each is reported.
inline constexpr int kBenchRepeats = 3;

/// Time of the bare work of a set of cases: the fused path (runtime with the case's fusions,
/// case dtype and device) and the reference path (float64 CPU), each built, run forward and
/// backward, with no generation, tensor draws, comparison or I/O inside the clock.
struct FloorTimes {
  int64_t cases = 0;
  /// Cases where a path raised (their partial time still counts), and the first message.
  int64_t errors = 0;
  std::string first_error;
  /// Index (in the specs given) of the case that raised first_error.
  int64_t first_error_case = -1;
  /// Op creation, call-then-bind, binding and Sequential construction of both paths.
  double build_s = 0;
  /// Forward and backward of both paths.
  double forward_backward_s = 0;
  double total_s() const { return build_s + forward_backward_s; }
};

/// Measures the floor of `specs` (see FloorTimes). Specs that fail to plan are skipped.
FloorTimes measure_floor(const std::vector<harness::CaseSpec>& specs);

/// Result of `gradfuzz bench`.
struct BenchOutcome {
  int64_t cases = 0;
  int64_t failed = 0;
  double campaign_s = 0;
  FloorTimes floor;
  /// Breakdown of the campaign's own work on the same cases, measured separately: case
  /// generation, case-file I/O (atomic write with fsync, then removal), and run_case alone
  /// (three paths, comparison, finite differences).
  double generation_s = 0;
  double io_s = 0;
  double run_case_s = 0;
  /// Hand-written CUDA kernels launched by run_case over all the cases: name -> {launches,
  /// launches with more than one block} (empty on the CPU).
  std::map<std::string, std::array<int64_t, 2>> kernel_launches;
  double campaign_cases_per_s() const { return campaign_s > 0 ? static_cast<double>(cases) / campaign_s : 0; }
  double floor_cases_per_s() const {
    return floor.total_s() > 0 ? static_cast<double>(floor.cases) / floor.total_s() : 0;
  }
  /// campaign time / floor time (build + forward + backward).
  double overhead() const { return floor.total_s() > 0 ? campaign_s / floor.total_s() : 0; }
};

/// Runs a fixed campaign (`options`, no shrinking, corpus in a temporary directory removed
/// afterwards) and then, on the same cases (regenerated outside the clock), the floor.
/// A warm-up pass over the first few cases runs first so lazy initialisation is not timed.
BenchOutcome run_bench(CampaignOptions options);

/// Prints the bench result as aligned text lines.
void print_bench(const BenchOutcome& outcome, std::ostream& out);

/// One size of `gradfuzz bench --shapes scaling`: a fixed residual chain
/// (MakeExtraOutput, Linear, Bias, GELU, AddExtraInput with every fusion on) on an input of
/// rows x features elements.
struct ScalingRow {
  int64_t elements = 0;  // rows * features of the input (every activation has as many)
  int64_t rows = 0;
  int64_t features = 0;
  /// Seconds per case: runner::run_case (fused, unfused and reference paths, comparison)
  /// and the bare fused+reference floor on the same case (the fastest of its repeats).
  double case_s = 0;
  double floor_s = 0;
  int repeats = 0;
  std::string verdict;
};

/// Times the chain at 10^2, 10^3, ... up to `max_elements` input elements in `dtype` on
/// `device` ("cpu" or "cuda").
std::vector<ScalingRow> run_shape_scaling(const std::string& device, const std::string& dtype, int64_t max_elements,
                                          const runner::RunOptions& run_options);

/// Prints the rows as a table, with the time per element and the harness/floor ratio.
void print_scaling(const std::vector<ScalingRow>& rows, std::ostream& out);

}  // namespace gradfuzz::tools
