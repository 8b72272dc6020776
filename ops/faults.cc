#include "ops/faults.h"

#include <array>
#include <atomic>

#include "ops/errors.h"

namespace gradfuzz::ops {
namespace {

constexpr size_t kNumFaults = 13;
std::array<std::atomic<bool>, kNumFaults> g_switchboard{};

size_t index_of(Fault fault) { return static_cast<size_t>(fault); }

}  // namespace

const std::vector<Fault>& all_faults() {
  static const std::vector<Fault> faults = {Fault::kInternalRequiresGrad,
                                            Fault::kGeneratorOutputs,
                                            Fault::kTransientLock,
                                            Fault::kSameFusionGradDrop,
                                            Fault::kSlotOrder,
                                            Fault::kScaleBiasGrad,
                                            Fault::kInPlaceExtraInput,
                                            Fault::kAliasedChannelGrad,
                                            Fault::kStalePlan,
                                            Fault::kCrashSegfault,
                                            Fault::kCrashAbort,
                                            Fault::kHang,
                                            Fault::kOobWrite};
  return faults;
}

std::string fault_name(Fault fault) {
  switch (fault) {
    case Fault::kInternalRequiresGrad:
      return "internal-requires-grad";
    case Fault::kGeneratorOutputs:
      return "generator-outputs";
    case Fault::kTransientLock:
      return "transient-lock";
    case Fault::kSameFusionGradDrop:
      return "same-fusion-grad-drop";
    case Fault::kSlotOrder:
      return "slot-order";
    case Fault::kScaleBiasGrad:
      return "scale-bias-grad";
    case Fault::kInPlaceExtraInput:
      return "inplace-extra-input";
    case Fault::kAliasedChannelGrad:
      return "aliased-channel-grad";
    case Fault::kStalePlan:
      return "stale-plan";
    case Fault::kCrashSegfault:
      return "crash-segfault";
    case Fault::kCrashAbort:
      return "crash-abort";
    case Fault::kHang:
      return "hang";
    case Fault::kOobWrite:
      return "oob-write";
  }
  GRADFUZZ_INTERNAL_ASSERT(false, "unhandled fault");
}

Fault fault_from_name(const std::string& name) {
  std::string known;
  for (Fault fault : all_faults()) {
    if (fault_name(fault) == name) return fault;
    known += (known.empty() ? "" : ", ") + fault_name(fault);
  }
  throw UnknownNameError("unknown fault '" + name + "'; known faults: " + known);
}

FaultVisibility fault_visibility(Fault fault) {
  switch (fault) {
    case Fault::kCrashSegfault:
    case Fault::kCrashAbort:
    case Fault::kHang:
      return FaultVisibility::kProcess;
    case Fault::kOobWrite:
      return FaultVisibility::kSanitizer;
    default:
      return FaultVisibility::kCompared;
  }
}

bool fault_enabled(Fault fault) { return g_switchboard[index_of(fault)].load(); }

void set_fault_enabled(Fault fault, bool enabled) { g_switchboard[index_of(fault)].store(enabled); }

FaultScope::FaultScope(Fault fault, bool enabled) : fault_(fault), previous_(fault_enabled(fault)) {
  set_fault_enabled(fault, enabled);
}

FaultScope::~FaultScope() { set_fault_enabled(fault_, previous_); }

}  // namespace gradfuzz::ops
