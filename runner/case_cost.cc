#include "runner/case_cost.h"

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

namespace gradfuzz::runner {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double cpu_now() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// The open stages of the case recorded on this thread.
struct Ledger {
  bool recording = false;
  CaseCost cost;
  Clock::time_point start;
  double cpu_start = 0;
  struct Open {
    std::string path;
    Clock::time_point start;
    double cpu_start = 0;
    double nested_s = 0;
    double nested_cpu_s = 0;
  };
  std::vector<Open> stack;

  std::string prefix() const { return stack.empty() ? std::string() : stack.back().path + "/"; }
};

thread_local Ledger ledger;

const char* cost_file() {
  static const char* file = [] {
    const char* v = std::getenv("GRADFUZZ_CASE_COST");
    return v && *v ? v : nullptr;
  }();
  return file;
}

}  // namespace

bool case_cost_enabled() { return cost_file() != nullptr; }

bool case_cost_recording() { return ledger.recording; }

CaseCostRecorder::CaseCostRecorder(bool enabled) : active_(enabled && !ledger.recording) {
  if (!active_) return;
  ledger.recording = true;
  ledger.cost = {};
  ledger.stack.clear();
  ledger.start = Clock::now();
  ledger.cpu_start = cpu_now();
}

CaseCostRecorder::~CaseCostRecorder() {
  if (active_) ledger.recording = false;
}

CaseCost CaseCostRecorder::finish() {
  if (!active_) return {};
  double staged = 0;
  for (const auto& [path, s] : ledger.cost.seconds) staged += s;
  double staged_cpu = 0;
  for (const auto& [path, s] : ledger.cost.cpu_seconds) staged_cpu += s;
  CaseCost out = std::move(ledger.cost);
  out.seconds["other"] = seconds_between(ledger.start, Clock::now()) - staged;
  out.cpu_seconds["other"] = cpu_now() - ledger.cpu_start - staged_cpu;
  ledger.cost = {};
  ledger.recording = false;
  active_ = false;
  return out;
}

CostStage::CostStage(const char* name) : active_(ledger.recording) {
  if (!active_) return;
  ledger.stack.push_back({ledger.prefix() + name, Clock::now(), cpu_now(), 0, 0});
}

CostStage::~CostStage() {
  if (!active_ || ledger.stack.empty()) return;
  const Ledger::Open open = std::move(ledger.stack.back());
  ledger.stack.pop_back();
  const double total = seconds_between(open.start, Clock::now());
  const double cpu = cpu_now() - open.cpu_start;
  ledger.cost.seconds[open.path] += total - open.nested_s;
  ledger.cost.cpu_seconds[open.path] += cpu - open.nested_cpu_s;
  if (!ledger.stack.empty()) {
    ledger.stack.back().nested_s += total;
    ledger.stack.back().nested_cpu_s += cpu;
  }
}

void count_cost(const std::string& what, int64_t n) {
  if (!ledger.recording) return;
  ledger.cost.counts[ledger.prefix() + what] += n;
}

void log_case_cost(const harness::CaseSpec& spec, const harness::CaseResult& result, const CaseCost& cost) {
  const char* file = cost_file();
  if (!file) return;
  const nlohmann::json line{{"seed", spec.seed},
                            {"dtype", spec.dtype},
                            {"ops", spec.num_ops()},
                            {"repeat_calls", spec.repeat_calls.size()},
                            {"recipe", spec.recipe ? spec.recipe->name : std::string()},
                            {"verdict", harness::verdict_name(result.verdict)},
                            {"seconds", cost.seconds},
                            {"cpu_seconds", cost.cpu_seconds},
                            {"counts", cost.counts}};
  std::ofstream out(file, std::ios::app);
  out << line.dump() << '\n';
}

}  // namespace gradfuzz::runner
