#pragma once

#include <string>
#include <vector>

namespace gradfuzz::ops {

/// The known defects of the review, each switchable back on inside the runtime.
enum class Fault {
  kInternalRequiresGrad,  // finding 1: grad-wanted flag read from the produced tensor
  kGeneratorOutputs,      // finding 2: extra-output containers sized and indexed directly
  kTransientLock,         // finding 3: standalone calls lock the op
  kSameFusionGradDrop,    // finding 4: fused op drops its internal channel gradient
  kSlotOrder,             // finding 4: public extras matched bound-slots-first
  kScaleBiasGrad,         // finding 4: GroupedLinear(scale_bias) grad in the wrong slot
  // runtime.md section 11 hazards, repaired in the runtime:
  kInPlaceExtraInput,   // an op writing into its extra input gets the channel's own tensor, not a copy
  kAliasedChannelGrad,  // the first stored channel gradient is the consumer's tensor, not a copy
  // runtime.md section 5: plans are rebuilt when first_op_requiring_backward changes.
  kStalePlan,  // a fuser keeps its first call's plans for every later call
  // Process-level defects, to prove worker isolation (a campaign must survive each):
  kCrashSegfault,  // SIGSEGV in forward when a fused group spans three or more ops
  kCrashAbort,     // abort() in backward when a channel collects a second consumer's gradient
  kHang,           // forward never returns for a generator-style op with two extra outputs
  // A kernel defect no comparison can see (compute-sanitizer finds it):
  kOobWrite,  // the CUDA bias-activation epilogue touches one element past its output
  // Defects that exist only in bfloat16/float16 (issue 12: the low-precision oracle must
  // see them whatever their size; a float32 rerun never does):
  kHalfOutputScale,      // ForwardLinearBiasActivation's output is 1.0625x too large
  kHalfDroppedGradTerm,  // BackwardAddRMSNorm drops the extra output's gradient term
  kHalfAccumulation,     // BackwardActivationBias sums a bias gradient of >= 64 rows in the dtype
  kHalfSavedDtype,       // ForwardLinearBiasAdd saves Linear's input for backward as float8 e4m3
};

/// All faults, in the order `gradfuzz list faults` prints them.
const std::vector<Fault>& all_faults();
/// How a fault shows: in a comparison or an error of some path (kCompared), by killing or
/// hanging the process that runs the case (kProcess), or only to compute-sanitizer on a
/// GPU (kSanitizer).
enum class FaultVisibility { kCompared, kProcess, kSanitizer };
FaultVisibility fault_visibility(Fault fault);

/// Kebab-case name used on the command line and in reports ("slot-order").
std::string fault_name(Fault fault);
/// One line on what the fault breaks (`gradfuzz list faults`).
std::string fault_description(Fault fault);
/// The shape regime a campaign needs to reach the fault ("edge": reductions of at least 64
/// elements), empty when any will do.
std::string fault_shapes(Fault fault);
/// Whether the fault exists only in bfloat16/float16 cases.
bool fault_is_half_precision(Fault fault);
/// Inverse of fault_name; throws UnknownNameError listing the known names.
Fault fault_from_name(const std::string& name);

/// Whether `fault` is on. Off by default. The switchboard is process-wide because the
/// faults model a defect of the runtime build, not a property of one object.
bool fault_enabled(Fault fault);
void set_fault_enabled(Fault fault, bool enabled);

/// Switches one fault on (or every fault off, for std::nullopt-like use with kNone)
/// for the lifetime of the scope and restores the previous state.
class FaultScope {
 public:
  explicit FaultScope(Fault fault, bool enabled = true);
  ~FaultScope();
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;

 private:
  Fault fault_;
  bool previous_;
};

}  // namespace gradfuzz::ops
