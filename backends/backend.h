#pragma once

#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/capabilities.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"

namespace gradfuzz::backends {

// The case's value types (harness/), used throughout this folder.
using harness::backend_names;
using harness::BackendCapabilities;
using harness::CasePlan;
using harness::CaseSpec;
using harness::CaseTensors;
using harness::FuserPlans;
using harness::FusionCapability;
using harness::model_capabilities;
using harness::OpCapability;
using harness::PathRequest;
using harness::PathRun;
using harness::PathStatus;
using harness::PlanGroup;
using harness::TraceEntry;

/// A backend process died while running a case (the case is a `crash` finding).
class BackendCrash : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// A backend did not answer within the case's time limit (a `timeout` finding).
class BackendTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// A backend that cannot be used at all (TE does not import, the adapter is missing): a
/// usage problem, not a finding.
class BackendUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A run_paths request under way (Backend::start_paths): the caller does its own work while
/// the backend runs the paths (a remote backend's adapter runs them in its own process).
/// Destroyed unanswered, it waits for the answer and drops it, so that the backend's next
/// request is read in step.
class PendingPaths {
 public:
  virtual ~PendingPaths() = default;
  /// Whether the answer is there (get() will not wait); true at once for a backend that ran
  /// the paths when asked.
  virtual bool ready() = 0;
  /// The runs, as run_paths returns them (and throwing as it throws); once.
  virtual std::vector<PathRun> get() = 0;
};

/// What is under test: builds a case's Sequential and runs it once per path
/// (docs/BACKENDS.md). The reference, the values and the oracle stay in the harness.
class Backend {
 public:
  virtual ~Backend() = default;
  /// "model", "te" or "torch".
  virtual std::string name() const = 0;
  /// Throws BackendUnavailable when the backend cannot start.
  virtual const BackendCapabilities& capabilities() = 0;
  /// Runs `paths` in order on the values of `tensors` and returns one PathRun each (status
  /// kSkipped for a path whose skip rule held). Runtime errors of the backend are PathRun
  /// errors; throws BackendCrash, BackendTimeout (remote backends) and std::logic_error for
  /// broken invariants.
  virtual std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                         const std::vector<PathRequest>& paths) = 0;
  /// run_paths begun: the runs come from the returned object's get(), which must be called
  /// (or the object destroyed) before anything else is asked of this backend. By default
  /// the paths run here and now (in process, nothing to overlap); a remote backend sends the
  /// request and returns while its adapter runs it. `spec`, `plan` and `tensors` need only
  /// live during this call.
  virtual std::unique_ptr<PendingPaths> start_paths(const CaseSpec& spec, const CasePlan& plan,
                                                    const CaseTensors& tensors, const std::vector<PathRequest>& paths);
  /// Switches on one of the backend's planted faults (capabilities().faults) for the next
  /// run_paths calls; empty switches it off. The model's faults live in ops/faults.h's
  /// switchboard (campaign/case_runner.h sets them); a backend without planted faults of
  /// its own throws std::invalid_argument naming the fault.
  virtual void set_fault(const std::string& name);
};

/// How to reach a backend.
struct BackendOptions {
  std::string name = "model";
  /// Python interpreter of the adapter (te, torch); empty: $GRADFUZZ_PYTHON, else the one
  /// configured at build time, else python3.
  std::string python;
  /// The adapter's folder (holding gradfuzz_adapter/); empty: $GRADFUZZ_ADAPTER_DIR, else
  /// the source tree's adapter/.
  std::string adapter_dir;
  /// Seconds a remote backend may take for one case before it is killed (timeout).
  double case_timeout_s = 120;
  /// Seconds the adapter may take to start and answer hello (TE imports in 6-9 s).
  double start_timeout_s = 120;
  /// Rank processes a remote backend starts right after its adapter (a campaign of
  /// distributed cases, --world-size), so that their start is not a case's time; 1: none
  /// until a distributed case needs them. `rank_device`: "cpu" (gloo) or "cuda" (NCCL).
  int64_t world_size = 1;
  std::string rank_device = "cpu";
};

/// Throws std::invalid_argument listing the known names for an unknown one.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

/// The JSON the adapter and export requests carry for a case: the spec, the plan (with
/// resolved attrs and parameter shapes) and the values (indices into `tensors`, which this
/// appends to, floating tensors as float64 CPU).
nlohmann::json case_request_json(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 std::vector<at::Tensor>& tensors_out);

}  // namespace gradfuzz::backends
