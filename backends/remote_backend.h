#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/process.h"

namespace gradfuzz::backends {

/// What an exported pytest file expects (docs/BACKENDS.md "export").
struct ExportRequest {
  /// "te" or "torch": which script to write.
  std::string backend;
  /// What the script must check (docs/BACKENDS.md "export"): {"kind": "pass"|"error",
  /// "error_kind", "tolerance", "tensors": {...}}. A tensor it refers to is written
  /// {"expect_tensor": k}, k an index into expect_tensors.
  nlohmann::json expect;
  std::vector<at::Tensor> expect_tensors;
  std::string case_file;
  /// Where the script may keep values too large to inline (absolute path; empty: none, the
  /// script then draws them from a seed and says so in its notes).
  std::string data_file;
  /// The self-contained form (the whole catalog, reference and oracle embedded).
  bool full = false;
  /// "upstream": a test in TE's own style for `finding` (campaign/export.h ExportForm::kUpstream);
  /// empty: the compact or full form.
  std::string form;
  /// The finding an upstream test is written for (campaign::saved_finding_json).
  nlohmann::json finding;
  /// The torch backend's planted fault an upstream test switches on as replay does.
  std::string fault;
};

/// What the adapter answered an export with.
/// The adapter declined a request it understood, for a reason of the request's own (an
/// export of a finding whose kind exported tests do not write yet): the caller's input, not
/// a failure of the adapter.
class RequestRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ExportReply {
  std::string script;
  /// What the reader should know (values not the case's, a check left out).
  std::vector<std::string> notes;
  /// The values file it wrote, empty when every value is in the script.
  std::string data_file;
  /// An upstream test: where in the framework the first divergence's class is defined
  /// ("transformer_engine/pytorch/ops/basic/basic_linear.py: BasicLinear.op_backward"),
  /// empty when the adapter cannot tell.
  std::string source;
  /// An upstream test: the tensor its one assertion is on (the cluster's first divergence where
  /// the test can read it, else the finding's), empty for an error's test or another form.
  std::string asserted;
};

/// A backend implemented by the Python adapter (`adapter/`, docs/BACKENDS.md), run as a child
/// process spoken to through framed messages. It starts on first use and again after it
/// died; its death during a case throws BackendCrash, its silence past the case's time
/// limit BackendTimeout (the adapter is killed first).
class RemoteBackend final : public Backend {
 public:
  explicit RemoteBackend(BackendOptions options);
  ~RemoteBackend() override;

  std::string name() const override { return options_.name; }
  const BackendCapabilities& capabilities() override;
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths) override;
  /// Sends the run request and returns while the adapter runs it (a distributed case runs
  /// here and now, its ranks answering in turn).
  std::unique_ptr<PendingPaths> start_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                            const std::vector<PathRequest>& paths) override;

  /// The pytest script for `spec` (its paths and values). Throws BackendUnavailable when the
  /// adapter cannot start and std::runtime_error when it refuses the request.
  /// The adapter's planted faults (capabilities().faults): sent with every run request.
  /// Throws std::invalid_argument for a name the adapter does not list.
  void set_fault(const std::string& name) override;

  ExportReply export_script(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                            const std::vector<PathRequest>& paths, const ExportRequest& request);

  /// Process id of the running adapter, or -1 (tests kill it to provoke a crash).
  int adapter_pid() const;
  /// Process ids of the adapter's rank processes (distributed cases), empty when none run
  /// (tests kill one).
  const std::vector<int>& rank_pids() const { return rank_pids_; }

 private:
  void start();
  /// Sends one request and returns the reply; throws BackendCrash / BackendTimeout and
  /// std::runtime_error for a reply with ok=false.
  struct Reply;
  Reply call(nlohmann::json header, const std::vector<at::Tensor>& tensors, double timeout_s);
  /// call() in two halves: send the request, then (after other work) read its reply, waiting
  /// until `deadline`.
  void send(nlohmann::json header, const std::vector<at::Tensor>& tensors);
  Reply receive(std::chrono::steady_clock::time_point deadline, double timeout_s);
  /// The run request of a single-process case, and its reply's runs.
  nlohmann::json run_request(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                             const std::vector<PathRequest>& paths, std::vector<at::Tensor>& out_tensors) const;
  static std::vector<PathRun> runs_of(const Reply& reply, size_t requested);
  class Pending;
  [[noreturn]] void fail_dead(const std::string& what);
  /// Has the adapter start `world_size` rank processes on `device` unless they run.
  void start_ranks(int64_t world_size, const std::string& device);
  /// A distributed case: each rank's plan and values, its replies assembled per path.
  std::vector<PathRun> run_ranks(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths);

  BackendOptions options_;
  std::unique_ptr<ChildProcess> child_;
  BackendCapabilities capabilities_;
  bool have_capabilities_ = false;
  std::string fault_;
  /// A request sent whose reply is not read yet (start_paths): no other request may go out.
  bool awaiting_reply_ = false;
  /// The adapter's rank processes: how many, on which device, their pids (0: none).
  int64_t ranks_world_size_ = 0;
  std::string ranks_device_;
  std::vector<int> rank_pids_;
};

/// The argv and environment the adapter is started with for `options` (python, -m
/// gradfuzz_adapter, --backend NAME; PYTHONPATH gets the adapter folder in front).
ChildProcess::Options adapter_process_options(const BackendOptions& options);

}  // namespace gradfuzz::backends
