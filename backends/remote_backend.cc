#include "backends/remote_backend.h"

#include <ATen/ATen.h>
#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "backends/wire.h"
#include "harness/sharding.h"

#ifndef GRADFUZZ_DEFAULT_PYTHON
#define GRADFUZZ_DEFAULT_PYTHON "python3"
#endif
#ifndef GRADFUZZ_SOURCE_DIR
#define GRADFUZZ_SOURCE_DIR "."
#endif

namespace gradfuzz::backends {

namespace {

using nlohmann::json;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

PathStatus status_from(const std::string& s) {
  if (s == "ok") return PathStatus::kOk;
  if (s == "error") return PathStatus::kError;
  if (s == "unsupported") return PathStatus::kUnsupported;
  if (s == "skipped") return PathStatus::kSkipped;
  throw wire::ProtocolError("unknown path status '" + s + "'");
}

std::vector<PlanGroup> plan_groups(const json& j) {
  std::vector<PlanGroup> out;
  for (const auto& g : j) {
    out.push_back({g.at("name").get<std::string>(), g.at("begin").get<int64_t>(), g.at("end").get<int64_t>(),
                   g.at("fused").get<bool>()});
  }
  return out;
}

std::vector<FuserPlans> fuser_plans(const json& j) {
  std::vector<FuserPlans> out;
  for (const auto& fuser : j) {
    FuserPlans p;
    p.forward = plan_groups(fuser.at("forward"));
    p.backward = plan_groups(fuser.at("backward"));
    out.push_back(std::move(p));
  }
  return out;
}

PathRun path_from(const json& j, const wire::Frame& frame) {
  PathRun run;
  run.name = j.at("name").get<std::string>();
  run.status = status_from(j.at("status").get<std::string>());
  if (run.status == PathStatus::kError) {
    const json& e = j.at("error");
    run.error_kind = e.value("kind", "unrecognized");
    run.error_type = e.value("type", "");
    run.error_message = e.value("message", "");
    run.error_stage = e.value("phase", "");
    run.error_origin = e.value("origin", "");
    if (!run.error_type.empty()) run.error_message = run.error_type + ": " + run.error_message;
  }
  if (run.status == PathStatus::kUnsupported) run.error_message = j.value("reason", "");
  if (j.contains("outputs")) {
    for (const auto& ref : j["outputs"]) run.outputs.push_back(wire::tensor_at(frame, ref));
  }
  if (j.contains("grad_input")) run.grad_input = wire::tensor_at(frame, j["grad_input"]);
  if (j.contains("grad_params")) {
    for (const auto& op : j["grad_params"]) {
      run.grad_params.emplace_back();
      for (const auto& ref : op) run.grad_params.back().push_back(wire::tensor_at(frame, ref));
    }
  }
  if (j.contains("grad_extra_inputs")) {
    for (const auto& ref : j["grad_extra_inputs"]) run.grad_extra_inputs.push_back(wire::tensor_at(frame, ref));
  }
  if (j.contains("channel_grads")) {
    for (const auto& fuser : j["channel_grads"]) {
      run.channel_grads.emplace_back();
      for (const auto& [name, ref] : fuser.items()) run.channel_grads.back()[name] = wire::tensor_at(frame, ref);
    }
  }
  if (j.contains("plans")) run.plans = fuser_plans(j["plans"]);
  if (j.contains("expected_plans")) run.expected_plans = fuser_plans(j["expected_plans"]);
  if (j.contains("modified")) run.modified = j["modified"].get<std::vector<std::string>>();
  if (j.contains("modified_by") && j["modified_by"].is_object()) {
    for (const auto& [name, w] : j["modified_by"].items()) {
      harness::Writer writer;
      writer.group = {w.at("name").get<std::string>(), w.at("begin").get<int64_t>(), w.at("end").get<int64_t>(),
                      w.value("fused", false)};
      writer.pass = w.value("pass", "");
      run.modified_by[name] = std::move(writer);
    }
  }
  // Protocol 2: the case's repeat calls of the same Sequential, each a path of its own.
  if (j.contains("trace") && j["trace"].is_array()) {
    for (const auto& e : j["trace"]) {
      TraceEntry entry;
      entry.pass = e.at("pass").get<std::string>();
      entry.fuser = e.value("fuser", int64_t{0});
      entry.group = {e.value("name", std::string()), e.at("begin").get<int64_t>(), e.at("end").get<int64_t>(),
                     e.value("fused", false)};
      entry.impl_class = e.value("class", std::string());
      entry.method = e.value("method", std::string());
      if (e.contains("tensor") && !e["tensor"].is_null()) entry.tensor = wire::tensor_at(frame, e["tensor"]);
      entry.quantized = e.value("quantized", false);
      if (e.contains("extras") && e["extras"].is_array()) {
        for (const auto& x : e["extras"]) {
          TraceEntry::Extra extra;
          extra.op = x.at("op").get<int64_t>();
          extra.slot = x.at("slot").get<int64_t>();
          if (x.contains("tensor") && !x["tensor"].is_null()) extra.tensor = wire::tensor_at(frame, x["tensor"]);
          extra.quantized = x.value("quantized", false);
          entry.extras.push_back(std::move(extra));
        }
      }
      run.trace.push_back(std::move(entry));
    }
  }
  if (j.contains("repeats")) {
    for (const auto& r : j["repeats"]) run.repeats.push_back(path_from(r, frame));
  }
  if (j.contains("left_locked")) run.left_locked = j["left_locked"].get<std::vector<int64_t>>();
  if (j.contains("graph_outputs")) run.graph_outputs = j["graph_outputs"].get<std::vector<int64_t>>();
  if (j.contains("fp8_state") && j["fp8_state"].is_object()) {
    const json& s = j["fp8_state"];
    run.fp8_states_checked = s.value("checked", int64_t{0});
    run.fp8_tensors_checked = s.value("tensors_checked", int64_t{0});
    for (const auto& v : s.value("violations", json::array())) {
      run.fp8_state_violations.push_back({v.value("op", int64_t{-1}), v.value("quantizer", std::string()),
                                          v.value("what", std::string()), v.value("note", std::string())});
    }
  }
  return run;
}

/// `j` with every {"expect_tensor": k} replaced by the frame index offset + k.
json with_tensor_offsets(const json& j, int64_t offset) {
  if (j.is_object()) {
    if (j.size() == 1 && j.contains("expect_tensor")) return offset + j.at("expect_tensor").get<int64_t>();
    json out = json::object();
    for (const auto& [k, v] : j.items()) out[k] = with_tensor_offsets(v, offset);
    return out;
  }
  if (j.is_array()) {
    json out = json::array();
    for (const auto& v : j) out.push_back(with_tensor_offsets(v, offset));
    return out;
  }
  return j;
}

json paths_json(const std::vector<PathRequest>& paths) {
  json out = json::array();
  for (const auto& p : paths) {
    json path{{"name", p.name}, {"fusions", p.fusions}, {"skip_if_nothing_fused", p.skip_if_nothing_fused}};
    // Defaults (docs/BACKENDS.md "run"): writers watched in the path's own run, one fresh
    // Sequential per requires-grad pattern, no condition.
    if (p.writers == harness::WriterSearch::kRerun) path["modified_by"] = "rerun";
    if (p.writers == harness::WriterSearch::kNone) path["modified_by"] = false;
    if (p.expected_plans == harness::ExpectedPlans::kPerCall) path["expected_plans"] = "per_call";
    if (p.expected_plans == harness::ExpectedPlans::kNone) path["expected_plans"] = false;
    if (!p.only_if_fired.empty()) path["only_if_fired"] = p.only_if_fired;
    if (p.trace) path["trace"] = true;
    out.push_back(std::move(path));
  }
  return out;
}

}  // namespace

struct RemoteBackend::Reply {
  wire::Frame frame;
};

ChildProcess::Options adapter_process_options(const BackendOptions& options) {
  ChildProcess::Options o;
  const std::string python =
      !options.python.empty() ? options.python : env_or("GRADFUZZ_PYTHON", GRADFUZZ_DEFAULT_PYTHON);
  const std::string adapter_dir = !options.adapter_dir.empty()
                                      ? options.adapter_dir
                                      : env_or("GRADFUZZ_ADAPTER_DIR", std::string(GRADFUZZ_SOURCE_DIR) + "/adapter");
  o.argv = {python, "-m", "gradfuzz_adapter", "--backend", options.name};
  const std::string path = env_or("PYTHONPATH", "");
  o.env["PYTHONPATH"] = adapter_dir + (path.empty() ? "" : ":" + path);
  // The adapter's stdout carries frames; Python must not buffer its stderr either, so a
  // crash leaves its last words.
  o.env["PYTHONUNBUFFERED"] = "1";
  return o;
}

RemoteBackend::RemoteBackend(BackendOptions options) : options_(std::move(options)) {}

RemoteBackend::~RemoteBackend() {
  if (child_ && child_->running()) {
    try {
      wire::write_frame(child_->stdin_fd(), json{{"op", "quit"}}, {});
    } catch (const std::exception&) {
      // It is going away either way: the destructor of ChildProcess kills it.
    }
  }
}

int RemoteBackend::adapter_pid() const { return child_ ? static_cast<int>(child_->pid()) : -1; }

void RemoteBackend::fail_dead(const std::string& what) {
  const std::string how = child_ ? child_->terminate() : std::string("not running");
  const std::string tail = child_ ? child_->stderr_tail() : std::string();
  child_.reset();
  ranks_world_size_ = 0;
  rank_pids_.clear();
  throw BackendCrash("the " + options_.name + " adapter " + what + " (" + how + ")" +
                     (tail.empty() ? std::string() : "; its stderr ends with:\n" + tail));
}

void RemoteBackend::start() {
  if (child_ && child_->running()) return;
  child_.reset();
  ranks_world_size_ = 0;
  rank_pids_.clear();
  const ChildProcess::Options process = adapter_process_options(options_);
  try {
    child_ = std::make_unique<ChildProcess>(process);
  } catch (const std::exception& e) {
    throw BackendUnavailable(std::string("cannot start the ") + options_.name + " adapter: " + e.what());
  }
  try {
    wire::write_frame(child_->stdin_fd(), json{{"op", "hello"}}, {});
    const auto deadline = wire::Clock::now() + std::chrono::duration_cast<wire::Clock::duration>(
                                                   std::chrono::duration<double>(options_.start_timeout_s));
    wire::Frame reply = wire::read_frame(child_->stdout_fd(), deadline);
    if (!reply.header.value("ok", false)) {
      throw std::runtime_error(reply.header.value("error", std::string("hello refused")));
    }
    if (!have_capabilities_) {
      capabilities_ = reply.header.at("capabilities").get<BackendCapabilities>();
      capabilities_.backend = options_.name;
      if (reply.header.contains("versions")) {
        capabilities_.versions = reply.header["versions"].get<std::map<std::string, std::string>>();
      }
      if (reply.header.contains("device_name") && reply.header["device_name"].is_string()) {
        capabilities_.device_name = reply.header["device_name"].get<std::string>();
      }
      have_capabilities_ = true;
    }
  } catch (const std::exception& e) {
    const std::string how = child_->terminate();
    const std::string tail = child_->stderr_tail();
    child_.reset();
    std::string argv;
    for (const auto& a : process.argv) argv += (argv.empty() ? "" : " ") + a;
    throw BackendUnavailable("the " + options_.name + " adapter (" + argv +
                             ", PYTHONPATH=" + process.env.at("PYTHONPATH") + ") did not start: " + e.what() + " (" +
                             how + ")" + (tail.empty() ? std::string() : "; its stderr ends with:\n" + tail));
  }
  if (options_.world_size > 1) {
    try {
      start_ranks(options_.world_size, options_.rank_device);
    } catch (const std::exception& e) {
      throw BackendUnavailable("the " + options_.name + " adapter did not start " +
                               std::to_string(options_.world_size) + " ranks: " + e.what());
    }
  }
}

void RemoteBackend::start_ranks(int64_t world_size, const std::string& device) {
  if (ranks_world_size_ == world_size && ranks_device_ == device) return;
  Reply reply = call(json{{"op", "start_ranks"},
                          {"world_size", world_size},
                          {"device", device},
                          {"timeout_s", options_.start_timeout_s}},
                     {}, options_.start_timeout_s);
  rank_pids_ = reply.frame.header.value("pids", std::vector<int>{});
  ranks_world_size_ = world_size;
  ranks_device_ = device;
}

const BackendCapabilities& RemoteBackend::capabilities() {
  if (!have_capabilities_) start();
  return capabilities_;
}

RemoteBackend::Reply RemoteBackend::call(json header, const std::vector<at::Tensor>& tensors, double timeout_s) {
  send(std::move(header), tensors);
  return receive(
      wire::Clock::now() + std::chrono::duration_cast<wire::Clock::duration>(std::chrono::duration<double>(timeout_s)),
      timeout_s);
}

void RemoteBackend::send(json header, const std::vector<at::Tensor>& tensors) {
  if (awaiting_reply_) {
    throw std::logic_error("the " + options_.name + " backend got a request while the answer to another is awaited");
  }
  start();
  child_->clear_stderr();
  try {
    wire::write_frame(child_->stdin_fd(), std::move(header), tensors);
  } catch (const wire::PeerClosed&) {
    fail_dead("died before it read the case");
  }
  awaiting_reply_ = true;
}

RemoteBackend::Reply RemoteBackend::receive(wire::Clock::time_point deadline, double timeout_s) {
  awaiting_reply_ = false;
  Reply reply;
  try {
    reply.frame = wire::read_frame(child_->stdout_fd(), deadline);
  } catch (const wire::PeerClosed&) {
    fail_dead("died while running the case");
  } catch (const wire::Timeout&) {
    const std::string tail = child_->stderr_tail();
    child_->terminate();
    child_.reset();
    throw BackendTimeout("the " + options_.name + " adapter did not answer within " + std::to_string(timeout_s) +
                         " s and was killed" + (tail.empty() ? std::string() : "; its stderr ends with:\n" + tail));
  } catch (const wire::ProtocolError& e) {
    // A garbled answer: the adapter is in an unknown state, start afresh next time.
    child_->terminate();
    child_.reset();
    throw std::logic_error(std::string("the adapter broke the protocol: ") + e.what());
  }
  if (!reply.frame.header.value("ok", false)) {
    if (reply.frame.header.value("refused", false)) {
      throw RequestRefused(reply.frame.header.value("error", std::string("no reason given")));
    }
    throw std::logic_error("the " + options_.name +
                           " adapter failed: " + reply.frame.header.value("error", std::string("no reason given")));
  }
  return reply;
}

std::vector<PathRun> RemoteBackend::run_ranks(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                              const std::vector<PathRequest>& paths) {
  const harness::ShardingPlan sharding = harness::plan_sharding(spec, plan);
  start_ranks(spec.world_size, spec.device);
  // Each rank's shapes and values, cut from the case's (harness/sharding.h); every op also
  // carries its unsharded input shape and layouts (te.ops's constructors take the whole
  // sizes and split them themselves).
  std::vector<at::Tensor> out_tensors;
  json ranks = json::array();
  for (int64_t r = 0; r < spec.world_size; ++r) {
    const CasePlan local_plan = harness::rank_plan(plan, sharding, r);
    const CaseTensors local = harness::rank_tensors(tensors, sharding, r);
    json request = case_request_json(spec, local_plan, local, out_tensors);
    json& plan_ops = request["plan"]["ops"];
    for (size_t i = 0; i < plan_ops.size() && i < plan.ops.size(); ++i) {
      plan_ops[i]["global_input_shape"] = plan.ops[i].input_shape;
      plan_ops[i]["input_layout"] = harness::layout_name(sharding.ops[i].input);
      plan_ops[i]["output_layout"] = harness::layout_name(sharding.ops[i].output);
    }
    ranks.push_back({{"plan", std::move(request["plan"])}, {"values", std::move(request["values"])}});
  }
  json header{{"op", "run"}, {"spec", spec}, {"ranks", std::move(ranks)}, {"paths", paths_json(paths)}};
  if (!fault_.empty()) header["fault"] = fault_;
  // The adapter answers for a lost rank before this side's own limit kills it.
  header["timeout_s"] = 0.9 * options_.case_timeout_s;
  Reply reply = call(std::move(header), out_tensors, options_.case_timeout_s);
  const json& h = reply.frame.header;
  if (h.contains("failure")) {
    // Every rank was killed: the next distributed case starts new ones.
    ranks_world_size_ = 0;
    rank_pids_.clear();
    const std::string kind = h["failure"].value("kind", "crash");
    const std::string message =
        "the " + options_.name + " adapter's ranks: " + h["failure"].value("message", std::string("no reason given"));
    if (kind == "timeout") throw BackendTimeout(message);
    throw BackendCrash(message);
  }
  std::vector<PathRun> runs;
  if (h.contains("unsupported")) {
    for (const auto& p : paths) {
      PathRun run;
      run.name = p.name;
      run.status = PathStatus::kUnsupported;
      run.error_message = h["unsupported"].get<std::string>();
      runs.push_back(std::move(run));
    }
    return runs;
  }
  try {
    if (h.contains("pids")) rank_pids_ = h["pids"].get<std::vector<int>>();
    const json& rank_replies = h.at("ranks");
    if (static_cast<int64_t>(rank_replies.size()) != spec.world_size) {
      throw std::runtime_error(std::to_string(rank_replies.size()) + " rank replies for " +
                               std::to_string(spec.world_size) + " ranks");
    }
    std::vector<std::vector<PathRun>> per_rank;
    for (const auto& rank : rank_replies) {
      per_rank.emplace_back();
      for (const auto& p : rank.at("paths")) per_rank.back().push_back(path_from(p, reply.frame));
      if (per_rank.back().size() != paths.size()) {
        throw std::runtime_error("a rank answered " + std::to_string(per_rank.back().size()) + " paths for " +
                                 std::to_string(paths.size()) + " requested");
      }
    }
    for (size_t k = 0; k < paths.size(); ++k) {
      std::vector<PathRun> of_path;
      for (auto& rank : per_rank) of_path.push_back(std::move(rank[k]));
      runs.push_back(harness::assemble_ranks(std::move(of_path), sharding));
    }
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("the adapter's distributed run reply is malformed: ") + e.what());
  }
  return runs;
}

json RemoteBackend::run_request(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                const std::vector<PathRequest>& paths, std::vector<at::Tensor>& out_tensors) const {
  json header = case_request_json(spec, plan, tensors, out_tensors);
  header["op"] = "run";
  if (!fault_.empty()) header["fault"] = fault_;
  header["paths"] = paths_json(paths);
  return header;
}

std::vector<PathRun> RemoteBackend::runs_of(const Reply& reply, size_t requested) {
  std::vector<PathRun> runs;
  try {
    for (const auto& p : reply.frame.header.at("paths")) runs.push_back(path_from(p, reply.frame));
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("the adapter's run reply is malformed: ") + e.what());
  }
  if (runs.size() != requested) {
    throw std::logic_error("the adapter answered " + std::to_string(runs.size()) + " paths for " +
                           std::to_string(requested) + " requested");
  }
  return runs;
}

std::vector<PathRun> RemoteBackend::run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                              const std::vector<PathRequest>& paths) {
  if (harness::is_distributed(spec)) return run_ranks(spec, plan, tensors, paths);
  std::vector<at::Tensor> out_tensors;
  json header = run_request(spec, plan, tensors, paths, out_tensors);
  return runs_of(call(std::move(header), out_tensors, options_.case_timeout_s), paths.size());
}

/// A run request sent, its reply not read yet.
class RemoteBackend::Pending final : public PendingPaths {
 public:
  Pending(RemoteBackend& backend, size_t requested)
      : backend_(backend),
        requested_(requested),
        deadline_(wire::Clock::now() + std::chrono::duration_cast<wire::Clock::duration>(
                                           std::chrono::duration<double>(backend.options_.case_timeout_s))) {}
  ~Pending() override {
    if (answered_) return;
    try {
      get();
    } catch (...) {  // the caller left without the runs (an exception of its own): nothing to report
    }
  }
  bool ready() override {
    if (answered_ || !backend_.child_) return true;
    pollfd p{backend_.child_->stdout_fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable, closed, or an error: get() says which
  }
  std::vector<PathRun> get() override {
    if (answered_) throw std::logic_error("PendingPaths::get called twice");
    answered_ = true;
    return runs_of(backend_.receive(deadline_, backend_.options_.case_timeout_s), requested_);
  }

 private:
  RemoteBackend& backend_;
  size_t requested_;
  wire::Clock::time_point deadline_;
  bool answered_ = false;
};

std::unique_ptr<PendingPaths> RemoteBackend::start_paths(const CaseSpec& spec, const CasePlan& plan,
                                                         const CaseTensors& tensors,
                                                         const std::vector<PathRequest>& paths) {
  if (harness::is_distributed(spec)) return Backend::start_paths(spec, plan, tensors, paths);
  std::vector<at::Tensor> out_tensors;
  json header = run_request(spec, plan, tensors, paths, out_tensors);
  send(std::move(header), out_tensors);
  return std::make_unique<Pending>(*this, paths.size());
}

void RemoteBackend::set_fault(const std::string& name) {
  if (!name.empty() && !capabilities().fault(name)) {
    std::string known;
    for (const auto& f : capabilities().faults) known += (known.empty() ? "" : ", ") + f.name;
    throw std::invalid_argument("the " + options_.name + " backend has no planted fault '" + name +
                                "'; its faults: " + (known.empty() ? "none" : known));
  }
  fault_ = name;
}

ExportReply RemoteBackend::export_script(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                         const std::vector<PathRequest>& paths, const ExportRequest& request) {
  std::vector<at::Tensor> out_tensors;
  json header = case_request_json(spec, plan, tensors, out_tensors);
  header["op"] = "export";
  header["backend"] = request.backend;
  header["paths"] = paths_json(paths);
  // The expectations' tensors follow the case's; their references become frame indices.
  const int64_t offset = static_cast<int64_t>(out_tensors.size());
  for (const auto& t : request.expect_tensors) wire::add_tensor(out_tensors, t);
  header["expect"] = with_tensor_offsets(request.expect, offset);
  header["case_file"] = request.case_file;
  if (!request.data_file.empty()) header["data_file"] = request.data_file;
  if (request.full) header["full"] = true;
  if (!request.form.empty()) header["form"] = request.form;
  if (!request.finding.is_null()) header["finding"] = request.finding;
  if (!request.fault.empty()) header["fault"] = request.fault;
  Reply reply = call(std::move(header), out_tensors, options_.case_timeout_s);
  ExportReply out;
  const json& h = reply.frame.header;
  out.script = h.at("script").get<std::string>();
  if (h.contains("notes") && h["notes"].is_array()) out.notes = h["notes"].get<std::vector<std::string>>();
  if (h.contains("data_file") && h["data_file"].is_string()) out.data_file = h["data_file"].get<std::string>();
  if (h.contains("source") && h["source"].is_string()) out.source = h["source"].get<std::string>();
  if (h.contains("asserted") && h["asserted"].is_string()) out.asserted = h["asserted"].get<std::string>();
  return out;
}

}  // namespace gradfuzz::backends
