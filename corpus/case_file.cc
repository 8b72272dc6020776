#include "corpus/case_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/builder.h"
#include "harness/capabilities.h"
#include "harness/limits.h"
#include "harness/sharding.h"
#include "ops/errors.h"
#include "ops/faults.h"
#include "ops/fusion_registry.h"

namespace gradfuzz::corpus {

namespace fs = std::filesystem;

CorpusError::CorpusError(std::string file, std::string json_path, const std::string& message)
    : std::runtime_error(file + ": " + (json_path.empty() ? std::string() : json_path + ": ") + message),
      file_(std::move(file)),
      json_path_(std::move(json_path)) {}

namespace {

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

nlohmann::json optional_string(const std::optional<std::string>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

void check_keys(const nlohmann::json& j, const std::vector<std::string>& allowed, const std::string& path,
                const std::string& file) {
  if (!j.is_object()) {
    throw CorpusError(file, path.empty() ? "/" : path, std::string("expected an object, got ") + j.type_name());
  }
  for (const auto& item : j.items()) {
    if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end()) {
      std::string known;
      for (const auto& key : allowed) known += (known.empty() ? "" : ", ") + key;
      throw CorpusError(file, path + "/" + item.key(), "unknown key '" + item.key() + "'; known keys: " + known);
    }
  }
}

const nlohmann::json& required(const nlohmann::json& j, const std::string& key, const std::string& path,
                               const std::string& file) {
  if (!j.contains(key)) throw CorpusError(file, path.empty() ? "/" : path, "missing required key '" + key + "'");
  return j.at(key);
}

std::string string_at(const nlohmann::json& j, const std::string& path, const std::string& file) {
  if (!j.is_string()) throw CorpusError(file, path, std::string("expected a string, got ") + j.type_name());
  return j.get<std::string>();
}

/// A fault name or null. A model case's fault is checked against the runtime's fault list; a
/// te or torch case's is one the backend plants (`gradfuzz list faults --backend NAME`), which
/// that backend checks when the case runs: here only its spelling.
std::optional<std::string> fault_at(const nlohmann::json& j, const std::string& path, const std::string& file,
                                    const std::string& backend) {
  if (j.is_null()) return std::nullopt;
  std::string name = string_at(j, path, file);
  if (backend != "model") {
    const bool spelled = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    });
    if (!spelled) {
      throw CorpusError(file, path,
                        "fault '" + name + "' is not a fault name (lower-case letters, digits, '-' and '_')");
    }
    return name;
  }
  try {
    ops::fault_from_name(name);
  } catch (const Error& e) {
    throw CorpusError(file, path, e.what());
  }
  return name;
}

// File-system access goes through POSIX calls, not std::filesystem's free functions: the
// PyPI libtorch.so exports its own, broken copies of those symbols (std::filesystem::status,
// create_directories, remove_all, ...), which the dynamic linker may bind instead of
// libstdc++'s. std::filesystem::path is only used as a value.

enum class FileType { kMissing, kFile, kDirectory, kOther };

FileType file_type(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return FileType::kMissing;
  if (S_ISREG(info.st_mode)) return FileType::kFile;
  if (S_ISDIR(info.st_mode)) return FileType::kDirectory;
  return FileType::kOther;
}

/// mkdir -p; returns 0 or an errno value.
int make_directories(const fs::path& dir) {
  if (dir.empty() || file_type(dir) == FileType::kDirectory) return 0;
  const fs::path parent = dir.parent_path();
  if (!parent.empty() && parent != dir) {
    if (int error = make_directories(parent)) return error;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  return 0;
}

/// Appends every *.json regular file under `dir` (recursively; hidden names skipped).
void collect_json(const fs::path& dir, std::vector<fs::path>& out) {
  DIR* handle = ::opendir(dir.c_str());
  if (!handle) throw CorpusError(dir.string(), "", std::string("cannot list directory: ") + std::strerror(errno));
  std::vector<fs::path> subdirs;
  while (const dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    // Skips ".", "..", hidden files and temporaries of an interrupted write (".<name>.tmp.*").
    if (name.empty() || name.front() == '.') continue;
    const fs::path child = dir / name;
    const FileType type = file_type(child);
    if (type == FileType::kDirectory) {
      subdirs.push_back(child);
    } else if (type == FileType::kFile && child.extension() == ".json") {
      out.push_back(child);
    }
  }
  ::closedir(handle);
  for (const auto& sub : subdirs) collect_json(sub, out);
}

}  // namespace

CaseFile make_case_file(harness::CaseSpec spec, ExpectedVerdict verdict, uint64_t campaign_seed,
                        std::string tool_version, std::optional<std::string> fault) {
  CaseFile file;
  if (auto problem = harness::check_static_wiring(spec)) file.wiring_error = problem->kind;
  file.spec = std::move(spec);
  file.verdict = std::move(verdict);
  file.provenance.campaign_seed = campaign_seed;
  file.provenance.tool_version = std::move(tool_version);
  file.provenance.date = utc_now();
  file.provenance.fault = std::move(fault);
  return file;
}

std::string spec_hash(const harness::CaseSpec& spec) {
  nlohmann::json j;
  to_json(j, spec);
  // nlohmann::json objects keep keys sorted, so dump() is canonical for a given spec.
  const std::string text = j.dump();
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a 64-bit offset basis
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;  // FNV-1a 64-bit prime
  }
  static const char* digits = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i) {
    out[static_cast<size_t>(i)] = digits[hash & 0xf];
    hash >>= 4;
  }
  return out;
}

std::string case_file_name(const harness::CaseSpec& spec) { return spec_hash(spec) + ".json"; }

bool SavedFinding::operator==(const SavedFinding& o) const {
  nlohmann::json a = finding;
  nlohmann::json b = o.finding;
  return a == b && first_divergence == o.first_divergence && diagnosis == o.diagnosis;
}

nlohmann::json case_file_to_json(const CaseFile& file) {
  nlohmann::json spec;
  to_json(spec, file.spec);
  nlohmann::json j = {
      {"schema_version", kSchemaVersion},
      {"backend", file.backend},
      {"spec", std::move(spec)},
      {"verdict", {{"kind", harness::verdict_name(file.verdict.kind)}, {"fault", optional_string(file.verdict.fault)}}},
      {"provenance",
       {{"campaign_seed", file.provenance.campaign_seed},
        {"tool_version", file.provenance.tool_version},
        {"date", file.provenance.date},
        {"fault", optional_string(file.provenance.fault)}}},
  };
  if (file.wiring_error) j["wiring_error"] = *file.wiring_error;
  if (file.finding) {
    nlohmann::json f = file.finding->finding;
    if (file.finding->first_divergence) f["first_divergence"] = *file.finding->first_divergence;
    if (!file.finding->diagnosis.empty()) f["diagnosis"] = file.finding->diagnosis;
    j["finding"] = std::move(f);
  }
  return j;
}

CaseFile case_file_from_json(const nlohmann::json& j, const std::string& file) {
  check_keys(j, {"schema_version", "backend", "spec", "verdict", "provenance", "wiring_error", "finding"}, "", file);
  const nlohmann::json version = required(j, "schema_version", "", file);
  if (!version.is_number_integer() || version.get<int64_t>() != kSchemaVersion) {
    throw CorpusError(file, "/schema_version",
                      "unsupported schema_version " + version.dump() + "; expected " + std::to_string(kSchemaVersion));
  }
  CaseFile out;
  {
    // Counted before the ops are read one by one: a file of a million ops is refused at once.
    const harness::CaseLimits limits;
    const nlohmann::json& spec = required(j, "spec", "", file);
    if (spec.is_object() && spec.contains("ops") && spec["ops"].is_array() &&
        static_cast<int64_t>(spec["ops"].size()) > limits.max_ops) {
      throw CorpusError(file, "/spec/ops",
                        "a case of " + std::to_string(spec["ops"].size()) + " modules is past gradfuzz's limit of " +
                            std::to_string(limits.max_ops));
    }
  }
  try {
    harness::from_json(required(j, "spec", "", file), out.spec);
  } catch (const harness::SpecError& e) {
    const std::string inner = e.json_path() == "/" ? "" : e.json_path();
    // SpecError's what() starts with its path; keep only the message part.
    std::string message = e.what();
    const std::string prefix = e.json_path() + ": ";
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
    throw CorpusError(file, "/spec" + inner, message);
  }
  if (harness::is_distributed(out.spec)) {
    // A distributed case whose layouts do not compose is no case at all (harness/sharding.h).
    try {
      harness::plan_sharding(out.spec, harness::plan_case(out.spec));
    } catch (const harness::SpecError& e) {
      std::string message = e.what();
      const std::string prefix = e.json_path() + ": ";
      if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
      throw CorpusError(file, "/spec" + e.json_path(), message);
    } catch (const std::exception&) {
      // Shapes that do not propagate: every path's op-creation error when the case runs.
    }
  }

  if (j.contains("backend")) {
    out.backend = string_at(j.at("backend"), "/backend", file);
    const auto& known = harness::backend_names();
    if (std::find(known.begin(), known.end(), out.backend) == known.end()) {
      throw CorpusError(file, "/backend", "unknown backend '" + out.backend + "'; known backends: model, te, torch");
    }
  }
  if (out.backend == "model") {
    const auto catalog = ops::FusionRegistry::catalog().names();
    for (size_t k = 0; k < out.spec.fusions.size(); ++k) {
      if (std::find(catalog.begin(), catalog.end(), out.spec.fusions[k]) == catalog.end()) {
        std::string known;
        for (const auto& name : catalog) known += (known.empty() ? "" : ", ") + name;
        throw CorpusError(file, "/spec/fusions/" + std::to_string(k),
                          "unknown fusion '" + out.spec.fusions[k] + "'; known fusions: " + known);
      }
    }
  }

  const nlohmann::json verdict = required(j, "verdict", "", file);
  check_keys(verdict, {"kind", "fault"}, "/verdict", file);
  {
    std::string kind = string_at(required(verdict, "kind", "/verdict", file), "/verdict/kind", file);
    try {
      out.verdict.kind = harness::verdict_from_name(kind);
    } catch (const std::invalid_argument& e) {
      throw CorpusError(file, "/verdict/kind", e.what());
    }
    if (verdict.contains("fault"))
      out.verdict.fault = fault_at(verdict.at("fault"), "/verdict/fault", file, out.backend);
  }

  const nlohmann::json provenance = required(j, "provenance", "", file);
  check_keys(provenance, {"campaign_seed", "tool_version", "date", "fault"}, "/provenance", file);
  if (provenance.contains("campaign_seed")) {
    const auto& seed = provenance.at("campaign_seed");
    if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<int64_t>() >= 0)) {
      throw CorpusError(file, "/provenance/campaign_seed", "expected a non-negative integer, got " + seed.dump());
    }
    out.provenance.campaign_seed = seed.get<uint64_t>();
  }
  if (provenance.contains("tool_version")) {
    out.provenance.tool_version = string_at(provenance.at("tool_version"), "/provenance/tool_version", file);
  }
  if (provenance.contains("date")) out.provenance.date = string_at(provenance.at("date"), "/provenance/date", file);
  if (provenance.contains("fault"))
    out.provenance.fault = fault_at(provenance.at("fault"), "/provenance/fault", file, out.backend);

  if (j.contains("wiring_error")) out.wiring_error = string_at(j.at("wiring_error"), "/wiring_error", file);
  if (j.contains("finding")) {
    const nlohmann::json& f = j.at("finding");
    if (!f.is_object()) throw CorpusError(file, "/finding", "expected an object, got " + std::string(f.type_name()));
    SavedFinding saved;
    try {
      saved.finding = f.get<harness::Finding>();
      if (f.contains("first_divergence")) saved.first_divergence = f.at("first_divergence").get<harness::Divergence>();
    } catch (const std::exception& e) {
      throw CorpusError(file, "/finding", std::string("not a finding: ") + e.what());
    }
    if (f.contains("diagnosis")) saved.diagnosis = string_at(f.at("diagnosis"), "/finding/diagnosis", file);
    out.finding = std::move(saved);
  }
  // Static wiring: a bound input that no earlier op of its fuser produces is a malformed
  // file unless the file says the case is an intentionally invalid configuration.
  auto problem = harness::check_static_wiring(out.spec);
  if (problem && out.wiring_error != problem->kind) {
    throw CorpusError(file, "/spec" + problem->json_path,
                      problem->kind + ": " + problem->message +
                          (out.wiring_error ? " (the file declares wiring_error '" + *out.wiring_error + "')"
                                            : " (an intentionally invalid case must declare \"wiring_error\": \"" +
                                                  problem->kind + "\")"));
  }
  if (!problem && out.wiring_error) {
    throw CorpusError(file, "/wiring_error",
                      "declares '" + *out.wiring_error + "' but the spec has no static wiring problem");
  }
  try {
    harness::check_case_limits(out.spec);
  } catch (const harness::SpecError& e) {
    std::string message = e.what();
    const std::string prefix = e.json_path() + ": ";
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
    throw CorpusError(file, "/spec" + e.json_path(), message);
  }
  return out;
}

fs::path write_case_file(const fs::path& dir, const CaseFile& file) {
  if (int error = make_directories(dir)) {
    throw CorpusError(dir.string(), "", std::string("cannot create directory: ") + std::strerror(error));
  }
  const fs::path target = dir / case_file_name(file.spec);
  static std::atomic<uint64_t> counter{0};
  const fs::path temp =
      dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++));
  const std::string text = case_file_to_json(file).dump(2) + "\n";

  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CorpusError(temp.string(), "", std::string("cannot create: ") + std::strerror(errno));
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      throw CorpusError(temp.string(), "", std::string("cannot write: ") + std::strerror(error));
    }
    written += static_cast<size_t>(n);
  }
  // fsync before rename: after a crash the final name holds either nothing or the whole file.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw CorpusError(temp.string(), "", std::string("cannot sync: ") + std::strerror(error));
  }
  if (::rename(temp.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw CorpusError(target.string(), "", std::string("cannot rename into place: ") + std::strerror(error));
  }
  // Make the rename itself durable.
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return target;
}

CaseFile load_case_file(const fs::path& path) {
  const std::string file = path.string();
  const FileType type = file_type(path);
  if (type == FileType::kMissing) throw CorpusError(file, "", "no such file");
  if (type != FileType::kFile) throw CorpusError(file, "", "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CorpusError(file, "", "cannot open: " + std::string(std::strerror(errno)));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) throw CorpusError(file, "/", "empty file, no JSON");
  const harness::CaseLimits limits;
  if (text.size() > kMaxCaseFileBytes) {
    throw CorpusError(file, "/",
                      "file of " + std::to_string(text.size()) + " bytes, past the limit of " +
                          std::to_string(kMaxCaseFileBytes) + " for a case file");
  }
  if (const int64_t depth = harness::json_nesting_depth(text); depth > limits.max_json_depth) {
    throw CorpusError(
        file, "/",
        "JSON nested " + std::to_string(depth) + " deep, past the limit of " + std::to_string(limits.max_json_depth));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw CorpusError(file, "/", "invalid JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    // out_of_range: a number past what a double holds (1E400).
    throw CorpusError(file, "/", std::string("invalid JSON: ") + e.what());
  }
  try {
    return case_file_from_json(j, file);
  } catch (const CorpusError&) {
    throw;
  } catch (const nlohmann::json::exception& e) {
    // Defensive: a type error the checks above did not anticipate still names the file.
    throw CorpusError(file, "/", std::string("malformed case file: ") + e.what());
  }
}

std::vector<fs::path> list_case_files(const fs::path& path) {
  const FileType type = file_type(path);
  if (type == FileType::kFile) return {path};
  if (type == FileType::kMissing) throw CorpusError(path.string(), "", "no such file or directory");
  if (type != FileType::kDirectory) {
    throw CorpusError(path.string(), "", "not a regular file or a directory (a device, pipe or socket)");
  }
  std::vector<fs::path> files;
  collect_json(path, files);
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<fs::path> list_case_files(const std::vector<fs::path>& paths) {
  std::vector<fs::path> out;
  for (const auto& path : paths) {
    auto files = list_case_files(path);
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

}  // namespace gradfuzz::corpus
