#pragma once

#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"
#include "ops/fusion_registry.h"
#include "ops/op_registry.h"

namespace gradfuzz::harness {

/// One catalog op as a backend builds it.
struct OpCapability {
  std::string name;
  /// What runs it ("ops::Linear", "te.ops.BasicLinear", "adapter custom op").
  std::string implementation;
  /// Attr -> values the generator draws from for this backend (a catalog attr with the
  /// values the backend supports, or a backend-only option the model accepts and ignores).
  std::map<std::string, std::vector<double>> options;
  /// Output styles the op can be built with (kVector always).
  std::vector<ops::OutputStyle> output_styles{ops::OutputStyle::kVector};
};

/// One fusion registration a backend has.
struct FusionCapability {
  std::string name;
  ops::FusionPass pass = ops::FusionPass::kForward;
  std::string implementation;
};

/// What a backend can run (docs/BACKENDS.md "hello"): the generator draws only from it.
struct BackendCapabilities {
  std::string backend = "model";
  std::vector<std::string> devices;
  std::vector<std::string> dtypes;
  std::vector<OpCapability> ops;
  std::vector<FusionCapability> fusions;
  /// Documented behaviours that differ from runtime.md ("surplus_extra_inputs_ignored",
  /// "lazy_fuser_construction").
  std::vector<std::string> deviations;
  /// "python", "torch", "transformer_engine" versions (remote backends).
  std::map<std::string, std::string> versions;
  std::string device_name;
  /// Whether the backend runs a case's repeat_calls (further calls of the same Sequential
  /// with their plans); the generator draws them only then.
  bool repeat_calls = false;

  const OpCapability* op(const std::string& name) const;
  bool has_deviation(const std::string& name) const;
  std::vector<std::string> op_names() const;
  std::vector<std::string> fusion_names() const;
};

void to_json(nlohmann::json& j, const BackendCapabilities& caps);
/// Throws std::invalid_argument (or nlohmann errors) naming the bad field.
void from_json(const nlohmann::json& j, BackendCapabilities& caps);

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
};

/// "model", "te", "torch".
const std::vector<std::string>& backend_names();
/// Throws std::invalid_argument listing the known names for an unknown one.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

/// Capabilities of the model backend: every catalog op with both output styles, every
/// catalog fusion, every dtype, cpu (and cuda when this process has it).
BackendCapabilities model_capabilities();

/// The JSON the adapter and export requests carry for a case: the spec, the plan (with
/// resolved attrs and parameter shapes) and the values (indices into `tensors`, which this
/// appends to, floating tensors as float64 CPU).
nlohmann::json case_request_json(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 std::vector<at::Tensor>& tensors_out);

}  // namespace gradfuzz::harness
