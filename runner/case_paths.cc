#include "runner/case_paths.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>

#include "runner/case_cost.h"

namespace gradfuzz::runner {

using backends::Backend;
using harness::CasePlan;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::Finding;
using harness::PathRequest;
using harness::PathRun;
using harness::PathStatus;
using harness::VerdictKind;

namespace {

/// Names of the case's fusions registered for `pass` in `caps`.
std::set<std::string> fusions_of_pass(const harness::BackendCapabilities& caps, ops::FusionPass pass) {
  std::set<std::string> out;
  for (const auto& f : caps.fusions) {
    if (f.pass == pass) out.insert(f.name);
  }
  return out;
}

bool fired_any_of(const PathRun& run, const std::set<std::string>& names) {
  for (const auto& fuser : run.plans) {
    for (const auto* pass : {&fuser.forward, &fuser.backward}) {
      for (const auto& g : *pass) {
        if (g.fused && names.count(g.name)) return true;
      }
    }
  }
  return false;
}

std::vector<std::string> without(const std::vector<std::string>& all, const std::set<std::string>& drop) {
  std::vector<std::string> out;
  for (const auto& f : all) {
    if (!drop.count(f)) out.push_back(f);
  }
  return out;
}

/// The backend's crash or time-out: every path's finding.
Finding process_finding(VerdictKind kind, const std::string& what) {
  Finding f;
  f.kind = kind;
  f.path_pair = "every path";
  f.tensor = harness::verdict_name(kind);
  f.role = harness::verdict_name(kind);
  f.message = what;
  return f;
}

}  // namespace

CasePaths::CasePaths(const CaseSpec& spec, const RunOptions& options, bool trace)
    : spec_(spec), options_(options), trace_(trace) {}

PathRequest CasePaths::request(std::string name, std::vector<std::string> fusions, bool skip_if_nothing_fused) const {
  PathRequest r{std::move(name), std::move(fusions), skip_if_nothing_fused};
  const bool writes_in_place = std::any_of(spec_.ops.begin(), spec_.ops.end(), [](const harness::OpSpec& op) {
    const auto it = op.attrs.find("in_place");
    return it != op.attrs.end() && it->second == 1;
  });
  r.writers = !options_.find_writers                    ? harness::WriterSearch::kNone
              : options_.shared_runs && writes_in_place ? harness::WriterSearch::kDuringRun
                                                        : harness::WriterSearch::kRerun;
  r.expected_plans = !options_.check_plans  ? harness::ExpectedPlans::kNone
                     : options_.shared_runs ? harness::ExpectedPlans::kPerPattern
                                            : harness::ExpectedPlans::kPerCall;
  r.trace = trace_;
  return r;
}

std::optional<Finding> CasePaths::run(Backend& backend, const CasePlan& plan, const CaseTensors& tensors,
                                      const WhileWaiting& while_waiting) {
  requests_ = {request("fused", spec_.fusions, false)};
  if (options_.run_unfused) requests_.push_back(request("unfused", {}, true));
  const harness::BackendCapabilities& caps = backend.capabilities();
  const auto forward_only = fusions_of_pass(caps, ops::FusionPass::kForward);
  const auto backward_only = fusions_of_pass(caps, ops::FusionPass::kBackward);
  std::vector<PathRequest> single_pass;
  if (options_.single_pass_paths) {
    single_pass = {request("forward_fused", without(spec_.fusions, backward_only), false),
                   request("backward_fused", without(spec_.fusions, forward_only), false)};
  }
  const bool one_request = options_.shared_runs && !single_pass.empty() && !forward_only.empty() &&
                           !backward_only.empty() && !requests_.empty();
  if (one_request) {
    // The single-pass paths in the same request, run only where the fused path fires a
    // forward-only and a backward-only fusion (what the second request would be sent for).
    std::vector<PathRequest> all = requests_;
    for (PathRequest r : single_pass) {
      r.only_if_fired = {{forward_only.begin(), forward_only.end()}, {backward_only.begin(), backward_only.end()}};
      all.push_back(std::move(r));
    }
    if (!send(backend, spec_, plan, tensors, all, &while_waiting)) return failure_;
    if (runs_.size() == all.size() && runs_[requests_.size()].status != PathStatus::kSkipped) {
      single_pass_ = single_pass;  // what ran, for the confirmation's rerun
    }
  } else {
    if (!send(backend, spec_, plan, tensors, requests_, &while_waiting)) return failure_;
    if (!single_pass.empty() && !runs_.empty() && runs_.front().ok() && fired_any_of(runs_.front(), forward_only) &&
        fired_any_of(runs_.front(), backward_only)) {
      single_pass_ = single_pass;
      if (!send(backend, spec_, plan, tensors, single_pass_, nullptr)) return failure_;
    }
  }
  for (const auto& r : runs_) {
    if (r.status != PathStatus::kSkipped) active_.push_back(&r);
  }
  return std::nullopt;
}

void CasePaths::run_first_calls(Backend& backend, const CasePlan& plan, const CaseTensors& tensors,
                                const std::vector<PathRequest>& paths) {
  std::vector<PathRequest> requests;
  for (const PathRequest& path : paths) {
    if (path.fusions.empty()) continue;  // no fused op: the basic ops' points
    PathRequest r{path.name, path.fusions, false};
    r.writers = harness::WriterSearch::kNone;
    r.expected_plans = harness::ExpectedPlans::kNone;
    requests.push_back(std::move(r));
  }
  if (requests.empty()) return;
  CaseSpec first_call = spec_;  // the points come from the first call's plans
  first_call.repeat_calls.clear();
  try {
    runs_ = backend.run_paths(first_call, plan, tensors, requests);
  } catch (const backends::BackendCrash&) {
    return;
  } catch (const backends::BackendTimeout&) {
    return;
  }
  for (const auto& r : runs_) {
    if (r.ok()) active_.push_back(&r);
  }
}

std::vector<PathRun> CasePaths::rerun(Backend& backend, const CaseSpec& spec, const CasePlan& plan,
                                      const CaseTensors& tensors) const {
  std::vector<PathRun> runs = backend.run_paths(spec, plan, tensors, requests_);
  if (!single_pass_.empty()) {
    for (auto& r : backend.run_paths(spec, plan, tensors, single_pass_)) runs.push_back(std::move(r));
  }
  return runs;
}

const PathRun* CasePaths::named(const std::string& name) const {
  for (const PathRun* r : active_) {
    if (r->name == name) return r;
  }
  return nullptr;
}

/// One request; false (failure_ set) where the backend crashed or timed out.
bool CasePaths::send(Backend& backend, const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                     const std::vector<PathRequest>& requests, const WhileWaiting* while_waiting) {
  CostStage stage("backend");
  try {
    std::vector<PathRun> runs;
    if (while_waiting != nullptr && *while_waiting && options_.overlap != RunOptions::Overlap::kNone) {
      const std::unique_ptr<backends::PendingPaths> pending = backend.start_paths(spec, plan, tensors, requests);
      (*while_waiting)(*pending);
      runs = pending->get();
    } else {
      runs = backend.run_paths(spec, plan, tensors, requests);
    }
    count_request(requests, runs);
    for (auto& r : runs) runs_.push_back(std::move(r));
    return true;
  } catch (const backends::BackendCrash& e) {
    failure_ = process_finding(VerdictKind::kCrash, e.what());
  } catch (const backends::BackendTimeout& e) {
    failure_ = process_finding(VerdictKind::kTimeout, e.what());
  }
  return false;
}

/// The case cost's counts of one backend request (runner/case_cost.h): the paths it ran,
/// their repeat calls, the fresh Sequentials a fused path's repeat calls are planned
/// against, and the paths watched for the writer of a changed caller tensor or run a
/// second time to find it (modified_by), as the request asked the backend to.
void CasePaths::count_request(const std::vector<PathRequest>& requests, const std::vector<PathRun>& runs) const {
  if (!case_cost_recording()) return;
  count_cost("requests");
  for (size_t i = 0; i < runs.size() && i < requests.size(); ++i) {
    const PathRun& run = runs[i];
    const PathRequest& request = requests[i];
    if (run.status == PathStatus::kSkipped) continue;
    count_cost("path:" + run.name);
    count_cost("repeat_calls", static_cast<int64_t>(run.repeats.size()));
    if (!request.fusions.empty() && request.expected_plans == harness::ExpectedPlans::kPerCall) {
      count_cost("fresh_plans", static_cast<int64_t>(run.repeats.size()));
    } else if (!request.fusions.empty() && request.expected_plans == harness::ExpectedPlans::kPerPattern) {
      std::set<std::pair<bool, bool>> patterns;
      for (size_t k = 0; k < run.repeats.size() && k < spec_.repeat_calls.size(); ++k) {
        const harness::RepeatCall& call = spec_.repeat_calls[k];
        if (call.no_grad || call.input_requires_grad != spec_.input_requires_grad) {
          patterns.insert({call.no_grad, call.input_requires_grad});
        }
      }
      count_cost("fresh_plans", static_cast<int64_t>(patterns.size()));
    }
    if (request.writers == harness::WriterSearch::kDuringRun) count_cost("watched_paths");
    if (request.writers == harness::WriterSearch::kRerun && !run.modified.empty()) count_cost("writer_runs");
  }
}

}  // namespace gradfuzz::runner
