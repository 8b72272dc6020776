#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ops/fusion_registry.h"
#include "ops/op_registry.h"

namespace gradfuzz::harness {

/// One catalog op as a backend builds it.
struct OpCapability {
  std::string name;
  /// What runs it ("ops::Linear", "te.ops.BasicLinear", "adapter custom op").
  std::string implementation;
  /// Attr -> values the generator draws from for this backend (a catalog attr with the
  /// values the backend supports, or a backend-only option the model accepts and ignores).
  std::map<std::string, std::vector<double>> options;
  /// Output styles the op can be built with (kVector always).
  std::vector<ops::OutputStyle> output_styles{ops::OutputStyle::kVector};
};

/// One fusion registration a backend has.
struct FusionCapability {
  std::string name;
  ops::FusionPass pass = ops::FusionPass::kForward;
  std::string implementation;
};

/// A defect the backend can switch on for one case (docs/BACKENDS.md "Planted faults").
struct FaultCapability {
  std::string name;
  std::string description;
  /// What it replaces ("transformer_engine.pytorch.ops.fused....fuser_backward").
  std::string target;
  /// A fault of the ranks' communication: it fires only in cases of this many ranks (the
  /// selftest draws such cases for it); 0 for every other fault.
  int64_t world_size = 0;
};

/// A quantization recipe the backend runs (docs/BACKENDS.md "Recipes"): its formats and the
/// option values the generator draws (strings); `available` false with TE's reason for one
/// the device cannot run.
struct RecipeCapability {
  std::string name;
  bool available = false;
  std::string reason;
  std::vector<std::string> fp8_formats;
  std::map<std::string, std::vector<std::string>> options;
};

/// How a backend's FP8 GEMMs accumulate (docs/BACKENDS.md "FP8 GEMM accumulation";
/// ops::Fp8GemmAccumulation is the model): the accumulator's fraction bits, the products it
/// adds per aligned step, the products between two fp32 promotions under split
/// accumulation, and per recipe the GEMMs ("fprop", "dgrad", "wgrad") that run with fast
/// accumulation instead.
struct Fp8GemmAccumulationCapability {
  int64_t fraction_bits = 13;
  int64_t products_per_step = 32;
  int64_t promotion_products = 128;
  std::map<std::string, std::vector<std::string>> fast_accumulation;
};

/// What a backend can run (docs/BACKENDS.md "hello"): the generator draws only from it.
struct BackendCapabilities {
  std::string backend = "model";
  std::vector<std::string> devices;
  std::vector<std::string> dtypes;
  std::vector<OpCapability> ops;
  std::vector<FusionCapability> fusions;
  /// Documented behaviours that differ from runtime.md ("surplus_extra_inputs_ignored",
  /// "lazy_fuser_construction").
  std::vector<std::string> deviations;
  /// "python", "torch", "transformer_engine" versions (remote backends).
  std::map<std::string, std::string> versions;
  std::string device_name;
  /// Whether the backend runs a case's repeat_calls (further calls of the same Sequential
  /// with their plans); the generator draws them only then.
  bool repeat_calls = false;
  /// The usage elements of a case's script of steps the backend runs (harness/case_spec.h:
  /// RepeatCall's "update", "inference_mode", "checkpoint", "recompute"; CaseSpec's
  /// "read_after_backward"); the generator draws only these, the runner declines others.
  std::vector<std::string> usage;
  bool runs_usage(const std::string& element) const;
  /// Whether the backend reports the gradient of every channel (te: only where the
  /// producer's backward group holds none of the channel's consumers); the oracle judges
  /// the channels a backend does not expose only when it says it exposes all.
  bool exposes_all_channels = true;
  /// Whether the backend's FP8 quantization is the reference's bit for bit wherever a
  /// rounding difference cannot carry a value across an FP8 rounding boundary (torch: its
  /// emulation casts as the reference does; te on the H200: its quantizers, with the recipe
  /// options te.ops honours, docs/TE.md), and its FP8 GEMMs exact up to
  /// fp8_gemm_accumulation. Then the oracle holds quantized cases to the FP8 rounding a
  /// correct implementation can do (runner: set_fp8_windows); otherwise to the coarse
  /// estimate, one FP8 ulp on any quantized element.
  bool fp8_reference_exact = false;
  /// How the backend's FP8 GEMMs accumulate, when not exactly (te on Hopper): the oracle's
  /// rounding samples and FP8 windows then carry each quantized GEMM's accumulation term.
  std::optional<Fp8GemmAccumulationCapability> fp8_gemm_accumulation;
  /// Most ranks a distributed case may have here (harness/sharding.h): the te backend's
  /// visible GPUs, the torch backend's process limit; 1 runs only one-process cases (the
  /// model: its runtime is one process).
  int64_t max_world_size = 1;
  /// Planted faults (the model's are ops/faults.h's; te and torch list the adapter's).
  std::vector<FaultCapability> faults;
  /// Recipes; empty: the backend runs none (the model).
  std::vector<RecipeCapability> recipes;

  const OpCapability* op(const std::string& name) const;
  bool has_deviation(const std::string& name) const;
  std::vector<std::string> op_names() const;
  std::vector<std::string> fusion_names() const;
  const FaultCapability* fault(const std::string& name) const;
  /// The recipes with available set.
  std::vector<const RecipeCapability*> available_recipes() const;
};

void to_json(nlohmann::json& j, const BackendCapabilities& caps);
/// Throws std::invalid_argument (or nlohmann errors) naming the bad field.
void from_json(const nlohmann::json& j, BackendCapabilities& caps);

/// Capabilities of the model backend: every catalog op with both output styles, every
/// catalog fusion, every dtype, cpu (and cuda when this process has it).
BackendCapabilities model_capabilities();

/// The backends gradfuzz can test: "model", "te", "torch".
const std::vector<std::string>& backend_names();

}  // namespace gradfuzz::harness
