#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/case_result.h"
#include "harness/case_spec.h"

namespace gradfuzz::corpus {

/// Version of the case-file format written and accepted.
inline constexpr int64_t kSchemaVersion = 1;
/// Largest case file read (a generated case file is a few KB).
inline constexpr size_t kMaxCaseFileBytes = size_t{16} << 20;
/// Sub-directories of a corpus (FuzzTest-like layout): cases replayed by every ctest run,
/// and cases that killed a process.
inline constexpr const char* kRegressionDir = "regression";
inline constexpr const char* kCrashingDir = "crashing";

/// Verdict expected on replay: pass, or the finding kind with the fault that produced it.
struct ExpectedVerdict {
  harness::VerdictKind kind = harness::VerdictKind::kPass;
  std::optional<std::string> fault;
  bool operator==(const ExpectedVerdict& o) const { return kind == o.kind && fault == o.fault; }
};

/// Where a case came from.
struct Provenance {
  uint64_t campaign_seed = 0;
  std::string tool_version;
  /// ISO 8601 UTC ("2025-01-31T12:00:00Z").
  std::string date;
  std::optional<std::string> fault;
  bool operator==(const Provenance& o) const {
    return campaign_seed == o.campaign_seed && tool_version == o.tool_version && date == o.date && fault == o.fault;
  }
};

/// The finding a cluster's case was saved for (a campaign's findings/ and crashing/ files):
/// what `gradfuzz export --upstream` writes its test for, without running the case again.
struct SavedFinding {
  /// The cluster's first finding (its signature, kind, path pair, tensor, role, op, error).
  harness::Finding finding;
  /// Where the case's values first diverge in that finding's path (a traced run).
  std::optional<harness::Divergence> first_divergence;
  /// The confirmation's diagnosis ("fused-only", ...; empty where none ran).
  std::string diagnosis;
  bool operator==(const SavedFinding& o) const;
};

/// One case file: {schema_version, backend, spec, verdict{kind, fault}, provenance{campaign_seed,
/// tool_version, date, fault}, finding?} plus, for intentionally invalid wiring, wiring_error (the
/// error kind the static check predicts; a file whose spec has a static wiring problem
/// without declaring it is rejected as malformed).
struct CaseFile {
  harness::CaseSpec spec;
  ExpectedVerdict verdict;
  Provenance provenance;
  std::optional<std::string> wiring_error;
  /// Backend the case was recorded on ("model", "te", "torch"; absent in a file: "model").
  /// Fusion names are checked against the model's catalog for model files; the other
  /// backends' names are checked when a backend runs the case.
  std::string backend = "model";
  /// Optional `finding`: the cluster the case was saved for (SavedFinding).
  std::optional<SavedFinding> finding;
  bool operator==(const CaseFile& o) const {
    return spec == o.spec && verdict == o.verdict && provenance == o.provenance && wiring_error == o.wiring_error &&
           backend == o.backend && finding == o.finding;
  }
};

/// A case file that cannot be used. The message names the file and the JSON path of the
/// problem ("corpus/regression/ab.json: /spec/ops/2/name: unknown op 'Foo'; known ops: ...").
class CorpusError : public std::runtime_error {
 public:
  CorpusError(std::string file, std::string json_path, const std::string& message);
  const std::string& file() const { return file_; }
  /// JSON pointer of the problem; empty when the file could not be read at all.
  const std::string& json_path() const { return json_path_; }

 private:
  std::string file_;
  std::string json_path_;
};

/// A CaseFile with today's date, the given provenance, and wiring_error filled from
/// harness::check_static_wiring(spec).
CaseFile make_case_file(harness::CaseSpec spec, ExpectedVerdict verdict, uint64_t campaign_seed,
                        std::string tool_version, std::optional<std::string> fault);

/// 64-bit FNV-1a of the spec's canonical JSON (keys sorted, compact), as 16 hex digits.
std::string spec_hash(const harness::CaseSpec& spec);
/// spec_hash(spec) + ".json".
std::string case_file_name(const harness::CaseSpec& spec);

/// The file's JSON document.
nlohmann::json case_file_to_json(const CaseFile& file);
/// Parses a case-file document; `file` names it in errors. Throws CorpusError.
CaseFile case_file_from_json(const nlohmann::json& j, const std::string& file);

/// Writes `file` into `dir` (created if needed) as case_file_name(spec), atomically: a
/// temporary file in the same directory, fsync, rename. Returns the final path. Throws
/// CorpusError when the file system refuses.
std::filesystem::path write_case_file(const std::filesystem::path& dir, const CaseFile& file);

/// Reads and validates one case file: JSON syntax, schema_version, the spec (unknown keys,
/// ops, attrs, fusions...), and static wiring (a bound input channel no earlier op of the
/// same fuser produces, unless declared in wiring_error). Throws CorpusError naming the
/// file and the JSON path; never crashes on malformed input.
CaseFile load_case_file(const std::filesystem::path& path);

/// Case files under `path`: the path itself when it is a file, else every *.json under the
/// directory (recursively), sorted. Throws CorpusError when `path` does not exist.
std::vector<std::filesystem::path> list_case_files(const std::filesystem::path& path);
/// The union over several paths, each expanded as above, in argument order.
std::vector<std::filesystem::path> list_case_files(const std::vector<std::filesystem::path>& paths);

}  // namespace gradfuzz::corpus
