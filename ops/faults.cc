#include "ops/faults.h"

#include <array>
#include <atomic>

#include "ops/errors.h"

namespace gradfuzz::ops {
namespace {

constexpr size_t kNumFaults = 17;
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
                                            Fault::kOobWrite,
                                            Fault::kHalfOutputScale,
                                            Fault::kHalfDroppedGradTerm,
                                            Fault::kHalfAccumulation,
                                            Fault::kHalfSavedDtype};
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
    case Fault::kHalfOutputScale:
      return "half-output-scale";
    case Fault::kHalfDroppedGradTerm:
      return "half-dropped-grad-term";
    case Fault::kHalfAccumulation:
      return "half-accumulation";
    case Fault::kHalfSavedDtype:
      return "half-saved-dtype";
  }
  GRADFUZZ_INTERNAL_ASSERT(false, "unhandled fault");
}

std::string fault_description(Fault fault) {
  switch (fault) {
    case Fault::kInternalRequiresGrad:
      return "review finding 1: a bound slot's gradient-wanted flag taken from the produced tensor";
    case Fault::kGeneratorOutputs:
      return "review finding 2: extra-output containers sized and indexed directly";
    case Fault::kTransientLock:
      return "review finding 3: a standalone call locks the op's bindings";
    case Fault::kSameFusionGradDrop:
      return "review finding 4: a fused op owning both ends of a channel drops its gradient";
    case Fault::kSlotOrder:
      return "review finding 4: public extra inputs matched bound-slots-first";
    case Fault::kScaleBiasGrad:
      return "review finding 4: GroupedLinear(scale_bias) returns the scales gradient in the wrong slot";
    case Fault::kInPlaceExtraInput:
      return "an in-place op writes into the channel's own tensor";
    case Fault::kAliasedChannelGrad:
      return "the first stored channel gradient aliases the consumer's tensor";
    case Fault::kStalePlan:
      return "a fuser keeps its first call's plans";
    case Fault::kCrashSegfault:
      return "SIGSEGV in forward when a fused group spans three or more ops";
    case Fault::kCrashAbort:
      return "abort() in backward when a channel collects a second consumer's gradient";
    case Fault::kHang:
      return "forward never returns for a generator-style op with two extra outputs";
    case Fault::kOobWrite:
      return "the CUDA bias-activation epilogue writes one element past its output";
    case Fault::kHalfOutputScale:
      return "bfloat16/float16 only: ForwardLinearBiasActivation's output 1.0625x too large";
    case Fault::kHalfDroppedGradTerm:
      return "bfloat16/float16 only: BackwardAddRMSNorm drops the extra output's gradient term";
    case Fault::kHalfAccumulation:
      return "bfloat16/float16 only: BackwardActivationBias sums a bias gradient of >= 64 rows in the dtype";
    case Fault::kHalfSavedDtype:
      return "bfloat16/float16 only: ForwardLinearBiasAdd saves Linear's input for backward as float8 e4m3";
  }
  GRADFUZZ_INTERNAL_ASSERT(false, "unhandled fault");
}

std::string fault_shapes(Fault fault) { return fault == Fault::kHalfAccumulation ? "edge" : ""; }

bool fault_is_half_precision(Fault fault) {
  return fault == Fault::kHalfOutputScale || fault == Fault::kHalfDroppedGradTerm ||
         fault == Fault::kHalfAccumulation || fault == Fault::kHalfSavedDtype;
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
