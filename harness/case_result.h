#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gradfuzz::harness {

/// Verdict kinds of fuzzer.md "Paths and oracle", plus:
/// - kModifiedInput: a path changed a caller-owned tensor (input, extra input, cotangent);
/// - kUnsupported: the backend declined a valid case it documents as unsupported (counted,
///   not a finding).
enum class VerdictKind {
  kPass,
  kMismatch,
  kMissingGradient,
  kUnexpectedError,
  kCrash,
  kTimeout,
  kModifiedInput,
  kUnsupported,
  kSanitizer
};
/// "pass", "mismatch", "missing_gradient", "unexpected_error", "crash", "timeout",
/// "modified_input", "unsupported", "sanitizer" (compute-sanitizer reported an error while
/// the case ran).
const char* verdict_name(VerdictKind kind);
/// Inverse of verdict_name; throws std::invalid_argument listing the known names.
VerdictKind verdict_from_name(const std::string& name);

/// One failed comparison, with everything needed to read it without rerunning.
struct TensorMismatch {
  VerdictKind kind = VerdictKind::kMismatch;
  /// "fused~reference", "unfused~reference", "fused~unfused", "reference~finite_difference".
  std::string path_pair;
  /// Tensor role and name: "output", "extra_output[1]", "grad_input", "grad_param[2].weight",
  /// "grad_extra_input[0]", "grad_channel[probs]".
  std::string tensor;
  /// Role without indices or names, for signatures: "grad_param", "grad_channel"...
  std::string role;
  std::vector<int64_t> index;  // worst element
  double expected = 0;
  double got = 0;
  double max_abs_err = 0;
  double max_rel_err = 0;
  double atol = 0;
  double rtol = 0;
  /// Largest |expected| of the tensor (0 when unknown): how big a structural error there is.
  double scale = 0;
  /// The rounding baseline's own error at the worst element (0 without a baseline): what the
  /// case's dtype costs there, e.g. the noise of a gradient that is zero by symmetry.
  double rounding = 0;
};

/// The outcome of one case: a value, never a bare bool.
struct CaseResult {
  VerdictKind verdict = VerdictKind::kPass;
  std::vector<TensorMismatch> details;
  /// For unexpected_error: which path raised what ("fused raised locked: ..., reference passed").
  std::string error_detail;
  /// For unexpected_error: the error kinds per path, "fused=locked unfused=locked
  /// reference=none" (used by signature() when no tensor detail exists).
  std::string error_kinds;
  uint64_t seed = 0;
  /// Catalog op types of the case, in order (Boundary excluded).
  std::vector<std::string> op_types;
  /// Backend the case ran on ("model", "te", "torch").
  std::string backend = "model";
  /// Fusion registrations that fired in the fused path's plans (either pass).
  std::vector<std::string> fusions_fired;
  /// Fused ops that ran in the fused path's forward and backward plans, by name.
  std::vector<std::string> fused_forward;
  std::vector<std::string> fused_backward;
  /// Hand-written CUDA kernels the case launched: name -> {launches, launches with more
  /// than one block} (model backend on CUDA).
  std::map<std::string, std::array<int64_t, 2>> kernels;
  /// Coverage features the case exercised (fuzzer.md coverage.features names).
  std::vector<std::string> features;

  bool passed() const { return verdict == VerdictKind::kPass; }
  /// A finding: neither a pass nor a case the backend declined.
  bool failed() const { return verdict != VerdictKind::kPass && verdict != VerdictKind::kUnsupported; }
  /// Deduplication key: kind, sorted unique op types, tensor role of the first detail.
  std::string signature() const;
  /// The signature's last part: the tensor role of the first detail of the verdict's kind,
  /// or, without tensor details, the per-path error kinds.
  std::string signature_role() const;
};

std::ostream& operator<<(std::ostream& os, const CaseResult& result);

/// Lossless JSON form (workers send results to the supervisor this way). from_json throws
/// std::invalid_argument on an unknown verdict name and nlohmann errors on a bad shape.
void to_json(nlohmann::json& j, const TensorMismatch& d);
void from_json(const nlohmann::json& j, TensorMismatch& d);
void to_json(nlohmann::json& j, const CaseResult& result);
void from_json(const nlohmann::json& j, CaseResult& result);

}  // namespace gradfuzz::harness
