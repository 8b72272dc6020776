#pragma once

#include <stdexcept>
#include <string>

namespace gradfuzz {

/// Base of every error the runtime raises for misuse. `kind()` is a stable kebab-case
/// identifier ("producer-not-earlier") that the harness compares across paths.
class Error : public std::runtime_error {
 public:
  Error(std::string kind, const std::string& message)
      : std::runtime_error(kind + ": " + message), kind_(std::move(kind)) {}
  const std::string& kind() const noexcept { return kind_; }

 private:
  std::string kind_;
};

#define GRADFUZZ_DECLARE_ERROR(Name, kind_text)                          \
  class Name : public ::gradfuzz::Error {                                \
   public:                                                               \
    static constexpr const char* kKind = kind_text;                      \
    explicit Name(const std::string& message) : Error(kKind, message) {} \
  }

namespace ops {

/// Binding slot index outside [0, num_extra_inputs/outputs).
GRADFUZZ_DECLARE_ERROR(SlotOutOfRangeError, "slot-out-of-range");
/// Empty channel name given to a setter.
GRADFUZZ_DECLARE_ERROR(InvalidChannelNameError, "invalid-channel-name");
/// Binding changed on an op that a persistent fuser or Sequential has locked.
GRADFUZZ_DECLARE_ERROR(LockedError, "locked");
/// Two output slots of one fuser registered the same channel name.
GRADFUZZ_DECLARE_ERROR(DuplicateProducerError, "duplicate-producer");
/// A bound input slot whose channel has no producer in the same fuser.
GRADFUZZ_DECLARE_ERROR(MissingProducerError, "missing-producer");
/// A bound input slot whose producer sits at or after the consumer.
GRADFUZZ_DECLARE_ERROR(ProducerNotEarlierError, "producer-not-earlier");
/// A fusion plan whose fused op does not cover the next basic ops in order.
GRADFUZZ_DECLARE_ERROR(PlanMismatchError, "plan-mismatch");
/// An op or group returned the wrong number of extra outputs or extra-input gradients.
GRADFUZZ_DECLARE_ERROR(ExtraCountError, "extra-count");
/// A backward returned a parameter-gradient list whose length is not the op's parameter count.
GRADFUZZ_DECLARE_ERROR(ParamGradCountError, "param-grad-count");
/// A public extra output came back undefined.
GRADFUZZ_DECLARE_ERROR(PublicOutputNoneError, "public-output-returned-none");
/// An extra output came back undefined although a consumer outside its group needs it.
GRADFUZZ_DECLARE_ERROR(NeededOutsideFusionError, "needed-outside-its-fusion");
/// The caller passed too many or too few public extra inputs.
GRADFUZZ_DECLARE_ERROR(ExtraInputCountError, "extra-input-count");
/// A tensor argument with the wrong shape, dtype or value (split sizes that do not sum...).
GRADFUZZ_DECLARE_ERROR(InvalidArgumentError, "invalid-argument");
/// A single-pass extra-output generator was sized, indexed or read twice.
GRADFUZZ_DECLARE_ERROR(GeneratorMisuseError, "generator-misuse");
/// Unknown op, fusion or fault name, or bad options for a known one.
GRADFUZZ_DECLARE_ERROR(UnknownNameError, "unknown-name");
/// A known quantization recipe the reference does not emulate (MXFP8BlockScaling, NVFP4BlockScaling).
GRADFUZZ_DECLARE_ERROR(UnsupportedRecipeError, "unsupported-recipe");

}  // namespace ops

/// Internal invariant check: a failure is a bug in gradfuzz, not misuse.
#define GRADFUZZ_INTERNAL_ASSERT(cond, msg)                                                                        \
  do {                                                                                                             \
    if (!(cond)) {                                                                                                 \
      throw std::logic_error(std::string("gradfuzz internal assertion failed: ") + #cond + " (" + __FILE__ + ":" + \
                             std::to_string(__LINE__) + "): " + (msg));                                            \
    }                                                                                                              \
  } while (false)

}  // namespace gradfuzz
