#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/case_spec.h"
#include "ops/op_registry.h"

namespace gradfuzz::generators {

/// Kind of a problem that is a spec defect rather than a runtime error (bad dtype, flag
/// lists longer than the op's slots, a knob without effect...).
inline constexpr const char* kSpecProblem = "spec";

/// One reason why a CaseSpec is not a valid case. `kind` is the gradfuzz::Error::kind()
/// string the runtime is expected to raise for it ("missing-producer"), or kSpecProblem.
struct ValidationProblem {
  std::string kind;
  /// JSON-pointer-like location: "/ops/3/input_channels/0".
  std::string path;
  std::string message;
};

/// Static facts about one module of a case, computed from the op registry's signatures.
struct ModuleLayout {
  bool boundary = false;
  /// Index of the fuser holding this op; -1 for a Boundary module.
  int64_t fuser = -1;
  /// Main input shape of this module.
  std::vector<int64_t> input_shape;
  /// Output shape and extra slot specs (empty for a Boundary module).
  ops::OpSignature signature;
};

/// Per-module layout of a whole case.
struct CaseLayout {
  std::vector<ModuleLayout> modules;
  int64_t num_fusers = 0;
};

/// Global `(module index, slot)` reference used by the generator tooling.
struct SlotAt {
  int64_t op = 0;
  int64_t slot = 0;
  bool operator==(const SlotAt& o) const { return op == o.op && slot == o.slot; }
  bool operator<(const SlotAt& o) const { return op != o.op ? op < o.op : slot < o.slot; }
};

/// One channel of a valid case: its producing output slot and every consuming input slot.
struct ChannelInfo {
  std::string name;
  int64_t fuser = 0;
  SlotAt producer;
  std::vector<SlotAt> consumers;
};

/// Number of parameters of a catalog op (ops.md: Linear weight; Bias bias; GroupedLinear
/// weights and, with `bias`, bias; RMSNorm gamma; LayerNorm gamma, beta); 0 otherwise.
int64_t param_count(const harness::OpSpec& op);

/// Attr value of `op`, falling back to the catalog default; throws UnknownNameError for an
/// attr the op does not have.
double attr_or_default(const harness::OpSpec& op, const std::string& key);

/// Shapes and signatures of every module. Returns nullopt (and appends the problem) when a
/// module's name is unknown or its attrs do not fit the shape reaching it.
std::optional<CaseLayout> compute_layout(const harness::CaseSpec& spec,
                                         std::vector<ValidationProblem>* problems = nullptr);

/// Channels of `spec`, by fuser and name, in producer order. Bound inputs without a producer
/// in their fuser are left out (validate_case reports them).
std::vector<ChannelInfo> case_channels(const harness::CaseSpec& spec, const CaseLayout& layout);

/// Every problem of `spec`, in the order the runtime would meet them: spec shape, then per
/// fuser duplicate producers and bound inputs (missing-producer, producer-not-earlier), slot
/// shape/kind mismatches (invalid-argument), late binds, extra-input count, split sizes.
/// Empty means the case is valid and must run without error on every path.
/// `known_fusions`: the fusion names of the backend the case is for (null: the model's
/// catalog).
std::vector<ValidationProblem> validate_case(const harness::CaseSpec& spec,
                                             const std::vector<std::string>* known_fusions = nullptr);

/// validate_case(spec).empty().
bool is_valid_case(const harness::CaseSpec& spec, const std::vector<std::string>* known_fusions = nullptr);

/// Number of public extra input slots of the whole case (what the caller passes).
int64_t count_public_inputs(const harness::CaseSpec& spec, const CaseLayout& layout);

/// Canonical form: trailing default entries of every per-slot list are dropped (an unbound
/// input, an unbound public output, a true requires-grad flag), so equal cases compare equal.
void canonicalize(harness::CaseSpec& spec);

}  // namespace gradfuzz::generators
