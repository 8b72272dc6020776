#include "campaign/worker_pool.h"

#include <ATen/Context.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "backends/wire.h"
#include "oracle/signature.h"
#ifdef GRADFUZZ_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include "ops/faults.h"

namespace gradfuzz::campaign {

namespace {

/// A sanitizer error as a finding, naming the first error's kernel.
harness::Finding sanitizer_finding(const SanitizerReport& report) {
  harness::Finding f;
  f.kind = harness::VerdictKind::kSanitizer;
  f.path_pair = "every path";
  f.tensor = "sanitizer";
  f.role = "sanitizer";
  f.op = report.kernel;
  f.message = report.first_error;
  return f;
}

using nlohmann::json;
using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string executable_path(const std::string& given) {
  if (!given.empty()) return given;
  // Tests run the CLI inside a test binary; they name the real gradfuzz to start workers.
  if (const char* env = std::getenv("GRADFUZZ_EXECUTABLE"); env && *env) return env;
  char buffer[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) throw std::runtime_error("cannot find the gradfuzz executable (/proc/self/exe)");
  return std::string(buffer, static_cast<size_t>(n));
}

std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", s);
  return text;
}

}  // namespace

struct WorkerPool::Slot {
  enum class State { kStarting, kIdle, kBusy };
  int index = 0;
  std::unique_ptr<backends::ChildProcess> child;
  State state = State::kStarting;
  std::optional<Job> job;
  Clock::time_point deadline;
  int64_t cases = 0;
  /// This worker's compute-sanitizer log (empty without --sanitize).
  std::string sanitizer_log;
  /// Starts of this slot in a row that died or hung before hello (reset by a hello).
  int failed_starts = 0;
};

namespace {

/// A slot whose worker dies before it is ready this many times in a row, after the backend
/// has started once, ends the run: the backend broke (a GPU gone, a deleted interpreter),
/// which no restart mends. A single death there (a kill, an OOM) is restarted.
constexpr int kMaxFailedStarts = 3;

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options) : options_(std::move(options)) {
  if (options_.workers < 1) throw std::invalid_argument("WorkerPool: expected at least one worker");
  options_.executable = executable_path(options_.executable);
  if (options_.mps) mps_ = std::make_unique<MpsDaemon>(options_.mps_control);
  for (int i = 0; i < options_.workers; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->index = i;
  }
  for (auto& slot : slots_) start(*slot);
  // Every worker answers hello before the first case.
  const auto deadline = after(options_.backend.start_timeout_s + 10);
  for (auto& slot : slots_) {
    while (slot->state == Slot::State::kStarting) {
      if (Clock::now() > deadline) {
        throw backends::BackendUnavailable("worker " + std::to_string(slot->index) + " did not start within " +
                                           format_seconds(options_.backend.start_timeout_s + 10) + " s");
      }
      pump(deadline);
    }
  }
}

WorkerPool::~WorkerPool() {
  for (auto& slot : slots_) {
    if (!slot->child) continue;
    try {
      backends::wire::write_frame(slot->child->stdin_fd(), json{{"op", "quit"}}, {});
    } catch (const std::exception&) {
      // Killed below either way.
    }
  }
  for (auto& slot : slots_) slot->child.reset();  // kills the process group and reaps
}

void WorkerPool::start(Slot& slot) {
  backends::ChildProcess::Options process;
  process.argv = {options_.executable,   "worker",         "--backend",
                  options_.backend.name, "--case-timeout", format_seconds(options_.case_timeout_s)};
  if (!options_.backend.python.empty()) {
    process.argv.push_back("--python-exe");
    process.argv.push_back(options_.backend.python);
  }
  if (!options_.backend.adapter_dir.empty()) {
    process.argv.push_back("--adapter-dir");
    process.argv.push_back(options_.backend.adapter_dir);
  }
  const auto& r = options_.run_options;
  if (!r.finite_differences) process.argv.push_back("--no-finite-differences");
  if (!r.shared_runs) process.argv.push_back("--no-shared-runs");
  process.argv.push_back("--overlap");
  process.argv.push_back(runner::overlap_name(r.overlap));
  if (options_.backend.world_size > 1) {
    // The worker's adapter starts its rank processes with it (docs/BACKENDS.md
    // "Distributed cases"): not a case's time.
    process.argv.push_back("--world-size");
    process.argv.push_back(std::to_string(options_.backend.world_size));
    process.argv.push_back("--rank-device");
    process.argv.push_back(options_.backend.rank_device);
  }
  if (!options_.devices.empty()) {
    // One device per worker, or for distributed cases one per rank: worker k gets the
    // world_size devices from k * world_size on, round-robin.
    const size_t per_worker = static_cast<size_t>(std::max<int64_t>(1, options_.backend.world_size));
    std::string visible;
    for (size_t rank = 0; rank < per_worker; ++rank) {
      const size_t at = (static_cast<size_t>(slot.index) * per_worker + rank) % options_.devices.size();
      visible += (visible.empty() ? "" : ",") + options_.devices[at];
    }
    process.env["CUDA_VISIBLE_DEVICES"] = visible;
  }
  if (mps_) {
    for (const auto& [name, value] : mps_->env()) process.env[name] = value;
  }
  if (options_.sanitizer) {
    // One log per worker start, named by the supervisor: a memcheck error usually kills the
    // CUDA context and the worker with it, and then the supervisor reads the log itself.
    SanitizerOptions sanitizer = *options_.sanitizer;
    slot.sanitizer_log = sanitizer.log_pattern;
    const auto at = slot.sanitizer_log.find("%p");
    if (at != std::string::npos) {
      slot.sanitizer_log.replace(at, 2, "slot" + std::to_string(slot.index) + "-" + std::to_string(started_));
    }
    sanitizer.log_pattern = slot.sanitizer_log;
    process.argv = sanitizer_argv(sanitizer, process.argv);
    for (const auto& [k, v] : sanitizer_environment()) process.env[k] = v;
    process.env[kSanitizerLogEnv] = slot.sanitizer_log;
  }
  process.new_process_group = true;
  slot.child = std::make_unique<backends::ChildProcess>(process);
  slot.state = Slot::State::kStarting;
  slot.job.reset();
  slot.cases = 0;
  slot.deadline = after(options_.backend.start_timeout_s + 10);
  ++started_;
  backends::wire::write_frame(slot.child->stdin_fd(), json{{"op", "hello"}}, {});
}

void WorkerPool::restart(Slot& slot) {
  slot.child.reset();
  start(slot);
}

int WorkerPool::idle() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s->state == Slot::State::kIdle; }));
}

int WorkerPool::in_flight() const {
  return static_cast<int>(
      std::count_if(slots_.begin(), slots_.end(), [](const auto& s) { return s->state == Slot::State::kBusy; }));
}

int WorkerPool::submit(Job job) {
  for (auto& slot : slots_) {
    if (slot->state != Slot::State::kIdle) continue;
    json header{{"op", "run"}, {"spec", job.spec}, {"fault", job.fault}, {"id", job.id}};
    if (job.trace) header["trace"] = true;
    slot->job = std::move(job);
    slot->state = Slot::State::kBusy;
    // A remote backend's worker enforces the case limit on its adapter itself (and says so
    // with the adapter's last words); the margin lets it. The model runs in the worker.
    slot->deadline = after(options_.case_timeout_s + (options_.backend.name == "model" ? 0.0 : 5.0));
    // compute-sanitizer slows kernels by one to two orders of magnitude.
    if (options_.sanitizer) slot->deadline = after(options_.case_timeout_s * 20);
    try {
      backends::wire::write_frame(slot->child->stdin_fd(), std::move(header), {});
    } catch (const backends::wire::PeerClosed&) {
      // The worker died between cases; collect() turns that into this case's crash, which
      // is wrong for the case, so restart and hand it over again instead.
      Job again = std::move(*slot->job);
      restart(*slot);
      while (slot->state == Slot::State::kStarting) collect(*slot);
      return submit(std::move(again));
    }
    return slot->index;
  }
  throw std::logic_error("WorkerPool::submit with no idle worker");
}

JobResult WorkerPool::fail(Slot& slot, harness::VerdictKind kind, const std::string& why) {
  JobResult out;
  out.id = slot.job ? slot.job->id : 0;
  out.slot = slot.index;
  harness::CaseResult& r = out.result;
  r.backend = options_.backend.name;
  if (slot.job) {
    r.seed = slot.job->spec.seed;
    for (const auto& op : slot.job->spec.ops) {
      if (op.name != harness::kBoundaryOp) r.op_types.push_back(op.name);
    }
  }
  const std::string tail = slot.child ? slot.child->stderr_tail(3000) : std::string();
  harness::Finding f;
  f.kind = kind;
  f.path_pair = "every path";
  f.tensor = harness::verdict_name(kind);
  f.role = harness::verdict_name(kind);
  f.message = why;
  r.notes = why + (tail.empty() ? std::string() : "; the worker's stderr ends with:\n" + tail);
  if (!slot.sanitizer_log.empty()) {
    // The worker died reading the rest of its log; a sanitizer error is why it died.
    std::ifstream in(slot.sanitizer_log, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    const SanitizerReport report = parse_sanitizer_log(text.str());
    if (report.errors > 0) {
      f = sanitizer_finding(report);
      r.notes = std::to_string(report.errors) + " sanitizer error(s) before the worker died (" + why +
                "); the first: " + report.first_error;
    }
  }
  r.findings.push_back(std::move(f));
  r.summarize();
  // Worker deaths are signed here: no runner saw the case's paths.
  for (auto& finding : r.findings) finding.signature = oracle::process_signature(finding, r.op_types);
  restart(slot);
  return out;
}

void WorkerPool::start_failed(Slot& slot, const std::string& why) {
  // Before any worker was ready the backend itself is in doubt: say why at once.
  if (!ever_ready_ || ++slot.failed_starts >= kMaxFailedStarts) {
    throw backends::BackendUnavailable(
        "worker " + std::to_string(slot.index) + " " + why +
        (ever_ready_ ? " (" + std::to_string(slot.failed_starts) + " starts in a row)" : ""));
  }
  restart(slot);
}

std::optional<JobResult> WorkerPool::collect(Slot& slot) {
  backends::wire::Frame frame;
  try {
    frame = backends::wire::read_frame(slot.child->stdout_fd(), slot.deadline);
  } catch (const backends::wire::PeerClosed&) {
    const std::string how = slot.child->terminate();
    if (slot.state == Slot::State::kStarting) {
      start_failed(slot, how + " before it was ready: " + slot.child->stderr_tail(3000));
      return std::nullopt;
    }
    return fail(slot, harness::VerdictKind::kCrash, "the worker running the case " + how);
  } catch (const backends::wire::Timeout&) {
    if (slot.state == Slot::State::kStarting) {
      slot.child->terminate();
      start_failed(slot, "did not answer hello in time: " + slot.child->stderr_tail(3000));
      return std::nullopt;
    }
    slot.child->terminate();
    return fail(slot, harness::VerdictKind::kTimeout,
                "the case ran past the limit of " + format_seconds(options_.case_timeout_s) + " s; worker killed");
  } catch (const backends::wire::ProtocolError& e) {
    slot.child->terminate();
    return fail(slot, harness::VerdictKind::kCrash, std::string("the worker broke the protocol: ") + e.what());
  }
  const json& h = frame.header;
  if (slot.state == Slot::State::kStarting) {
    if (!h.value("ok", false)) {
      throw backends::BackendUnavailable(h.value("error", std::string("worker refused to start")));
    }
    if (capabilities_.ops.empty()) capabilities_ = h.at("capabilities").get<harness::BackendCapabilities>();
    slot.state = Slot::State::kIdle;
    slot.failed_starts = 0;
    ever_ready_ = true;
    return std::nullopt;
  }
  if (!h.value("ok", false)) {
    const uint64_t id = slot.job ? slot.job->id : 0;
    slot.state = Slot::State::kIdle;
    slot.job.reset();
    throw WorkerInternalError(h.value("error", std::string("worker failed")), id);
  }
  JobResult out;
  out.id = slot.job->id;
  out.slot = slot.index;
  out.result = h.at("result").get<harness::CaseResult>();
  slot.job.reset();
  slot.state = Slot::State::kIdle;
  if (++slot.cases >= options_.recycle_after) restart(slot);
  return out;
}

bool WorkerPool::pump(std::optional<Clock::time_point> deadline) {
  std::vector<pollfd> fds;
  std::vector<Slot*> owners;
  Clock::time_point soonest = deadline.value_or(Clock::time_point::max());
  for (auto& slot : slots_) {
    if (slot->state == Slot::State::kIdle) continue;
    fds.push_back({slot->child->stdout_fd(), POLLIN, 0});
    owners.push_back(slot.get());
    soonest = std::min(soonest, slot->deadline);
  }
  if (fds.empty()) return false;
  const auto now = Clock::now();
  int timeout_ms = 0;
  if (soonest > now) {
    timeout_ms = static_cast<int>(
        std::min<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(soonest - now).count() + 1, 1 << 30));
  }
  const int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0 && errno != EINTR) throw std::runtime_error("poll on workers failed");
  for (size_t i = 0; i < fds.size(); ++i) {
    Slot& slot = *owners[i];
    const bool readable = n > 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR));
    if (readable || Clock::now() >= slot.deadline) {
      if (auto r = collect(slot)) ready_.push_back(std::move(*r));
    }
  }
  return true;
}

std::optional<JobResult> WorkerPool::wait(std::optional<Clock::time_point> deadline) {
  while (ready_.empty()) {
    if (deadline && Clock::now() >= *deadline) return std::nullopt;
    if (!pump(deadline)) return std::nullopt;
  }
  JobResult r = std::move(ready_.front());
  ready_.pop_front();
  return r;
}

harness::CaseResult WorkerPool::run_now(const harness::CaseSpec& spec, const std::string& fault) {
  return run_job_now(spec, fault, false);
}

harness::CaseResult WorkerPool::run_traced(const harness::CaseSpec& spec, const std::string& fault) {
  return run_job_now(spec, fault, true);
}

harness::CaseResult WorkerPool::run_job_now(const harness::CaseSpec& spec, const std::string& fault, bool trace) {
  while (idle() == 0) {
    if (!pump(std::nullopt)) throw std::logic_error("WorkerPool::run_now: no worker can become idle");
  }
  const uint64_t id = next_internal_id_++;
  submit(Job{id, spec, fault, trace});
  while (true) {
    auto it = std::find_if(ready_.begin(), ready_.end(), [&](const JobResult& r) { return r.id == id; });
    if (it != ready_.end()) {
      harness::CaseResult result = std::move(it->result);
      ready_.erase(it);
      return result;
    }
    if (!pump(std::nullopt)) throw std::logic_error("WorkerPool::run_now lost its case");
  }
}

void WorkerPool::cancel_in_flight() {
  for (auto& slot : slots_) {
    if (slot->state == Slot::State::kBusy) restart(*slot);
  }
}

std::vector<int> WorkerPool::worker_pids() const {
  std::vector<int> out;
  for (const auto& slot : slots_) out.push_back(slot->child ? static_cast<int>(slot->child->pid()) : -1);
  return out;
}

namespace {

/// The sanitizer log of this worker, read incrementally.
class SanitizerLog {
 public:
  SanitizerLog() {
    const char* pattern = std::getenv(kSanitizerLogEnv);
    if (!pattern || !*pattern) return;
    path_ = pattern;
    const auto at = path_.find("%p");
    if (at != std::string::npos) path_.replace(at, 2, std::to_string(::getpid()));
  }
  bool active() const { return !path_.empty(); }
  /// What the log gained since the last call (kernels finish first).
  std::string fresh() {
    if (!active()) return "";
#ifdef GRADFUZZ_WITH_CUDA
    if (at::hasCUDA()) c10::cuda::device_synchronize();
#endif
    std::ifstream in(path_, std::ios::binary);
    if (!in) return "";
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size <= offset_) return "";
    in.seekg(offset_);
    std::string text(static_cast<size_t>(size - offset_), '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    offset_ = size;
    return text;
  }

 private:
  std::string path_;
  std::streamoff offset_ = 0;
};

}  // namespace

int run_worker(const backends::BackendOptions& backend_options, const runner::RunOptions& run_options) {
  // Die with the supervisor, whatever killed it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  SanitizerLog sanitizer;
  // Frames go to the original stdout; anything a library prints goes to stderr instead.
  const int out = ::dup(1);
  ::dup2(2, 1);
  std::unique_ptr<backends::Backend> backend = backends::make_backend(backend_options);
  while (true) {
    backends::wire::Frame request;
    try {
      request = backends::wire::read_frame(0, std::nullopt);
    } catch (const backends::wire::PeerClosed&) {
      return 0;
    }
    const std::string op = request.header.value("op", "");
    if (op == "quit") return 0;
    json reply;
    try {
      if (op == "hello") {
        reply = json{{"ok", true}, {"capabilities", backend->capabilities()}};
        sanitizer.fresh();  // start-up output is not any case's
      } else if (op == "run") {
        const harness::CaseSpec spec = request.header.at("spec").get<harness::CaseSpec>();
        const std::string fault = request.header.value("fault", "");
        runner::RunOptions options = run_options;
        options.trace = options.trace || request.header.value("trace", false);
        harness::CaseResult result = run_with_fault(spec, fault, *backend, options);
        const SanitizerReport report = parse_sanitizer_log(sanitizer.fresh());
        if (report.errors > 0) {
          harness::Finding f = sanitizer_finding(report);
          f.signature = oracle::process_signature(f, result.op_types);
          result.findings.push_back(std::move(f));
          result.notes = std::to_string(report.errors) + " sanitizer error(s); the first: " + report.first_error +
                         (result.notes.empty() ? "" : "; " + result.notes);
          result.summarize();
        }
        reply = json{{"ok", true}, {"result", result}};
      } else {
        reply = json{{"ok", false}, {"error", "unknown request '" + op + "'"}};
      }
    } catch (const std::exception& e) {
      reply = json{{"ok", false}, {"error", e.what()}};
    }
    try {
      backends::wire::write_frame(out, std::move(reply), {});
    } catch (const backends::wire::PeerClosed&) {
      return 0;
    }
  }
}

}  // namespace gradfuzz::campaign
