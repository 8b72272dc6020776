#pragma once

// The low-precision rule's evidence around one reference set (oracle/rounding.h): what a
// non-float64 case that fails the first check is judged with. A sampler owns its set's
// evidence, the generators its samples are drawn from, the FP8 windows and the pieces drawn
// ahead while a remote backend runs the paths (RunOptions::Overlap::kEvidence): the overlap
// and judging both advance it, in the same order, so that it draws the same samples either way.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/path_run.h"
#include "ops/quantization.h"
#include "ops/reference.h"
#include "oracle/rounding.h"
#include "oracle/tolerances.h"
#include "runner/reference_set.h"

namespace gradfuzz::runner {

/// The rounding samples each round of the evidence adds (EvidenceSampler::add_round): round
/// 0's come with the gathering (two).
inline constexpr int kEvidenceRounds = 3;
inline constexpr std::array<int64_t, kEvidenceRounds> kEvidenceSamples = {0, 6, 8};

/// The generators a sampler draws from: the rounding samples' (perturbed values, FP8 jitter)
/// and the output noise's, which has its own so that the rounding samples stay those of the
/// case's seed whatever else is measured.
struct Draws {
  at::Generator samples;
  at::Generator noise;
  /// Both generators' states, copied (undefined ones stay undefined).
  Draws clone() const;
};

/// `bounds` with each tensor's per-element allowance raised to its largest element's: for
/// the elements of a quantizing case's repeat calls, which round other values than call 1's.
oracle::CaseBounds uniform_allowance(oracle::CaseBounds bounds);

/// The bounds of a call after an optimizer step: uniform_allowance, and no whole-tensor norm
/// bound. Call 1's norm bound is evidence of how call 1's values round (it collapses to the
/// floor where they round exactly); the step's values round otherwise, so only the elements'
/// bounds, each at its tensor's largest allowance, hold for them.
oracle::CaseBounds stepped_allowance(oracle::CaseBounds bounds);

/// The evidence of one reference set (its rounding baseline, input sensitivity, output noise,
/// kinks; FP8 windows for a quantizing case), drawn in pieces of about one reference
/// evaluation each: the gathering (round 0), then, where the case quantizes and has repeat
/// calls, the repeat calls' coarse evidence, then the rounds' further samples.
class EvidenceSampler {
 public:
  struct Options {
    /// The case's dtype (the rounding baseline's and the samples' compute dtype).
    at::ScalarType dtype = at::kFloat;
    oracle::ToleranceContext context;
    oracle::RoundingRule rule;
    /// capabilities.fp8_reference_exact: the backend's FP8 is the reference's bit for bit, so
    /// a quantizing case's samples move only the elements within their FP8 window.
    bool fp8_reference_exact = false;
  };

  /// What a sampler hands on to the sampler of the same reference set in a rerun of the same
  /// values (the in-place ablation: EvidenceCarry): its evidence, FP8 windows and generators,
  /// and what they were measured against.
  struct Carry {
    ops::QuantizationPoints points;
    /// The set's evidence_values() the evidence was measured against.
    std::map<std::string, at::Tensor> reference;
    oracle::RoundingEvidence evidence;
    std::optional<oracle::RoundingEvidence> coarse;
    Fp8Windows windows;
    Draws draws;
  };

  /// A sampler of `set` (which must outlive it); nothing drawn yet.
  EvidenceSampler(const ReferenceSet& set, Options options);
  EvidenceSampler(const EvidenceSampler&) = delete;
  EvidenceSampler& operator=(const EvidenceSampler&) = delete;

  // ---- judging: the evidence of a round, the bounds it gives.

  /// Round 0: the rounding baseline (the reference in the case's dtype, kinks recorded); for
  /// a quantizing case the FP8 windows; two rounding samples from generators started afresh
  /// from the case's seed; the kinks (the reference again with the elements near one taken
  /// the other way). Finishes a gathering begun ahead; once gathered, the same answer. False
  /// where the rounding baseline raised.
  bool gather();
  /// Round `round`'s samples (kEvidenceSamples): those drawn ahead, then the rest.
  void add_round(int round);
  /// The rule's bounds with the evidence so far (oracle::evidence_bounds; `cancellation`
  /// counts the tensors the sensitivity widened).
  oracle::CaseBounds bounds(int64_t* cancellation = nullptr) const;
  /// A quantizing case's repeat-call bounds, nullopt for another case: FP8 windows hold for
  /// call 1's values only, so four samples that jitter every quantized element (the coarse
  /// estimate, drawn once) with each tensor's largest allowance.
  std::optional<oracle::CaseBounds> repeat_call_bounds();
  const oracle::RoundingEvidence& evidence() const { return evidence_; }

  // ---- the overlap: pieces drawn ahead, kept apart until judging asks for them.

  /// One more piece in judging's order: the gathering a reference evaluation at a time, the
  /// coarse evidence, one sample of the next round. The rounds and the coarse evidence draw
  /// from copies of the generators, so that judging that never asks sees them as they were.
  /// False when nothing is left to draw ahead (or the gathering failed).
  bool advance();

  // ---- hand-offs

  /// The samples of a case's sets are one stream in judging's order: this sampler's next
  /// draws continue from where `previous`'s left the generators (a no-op for itself; pieces
  /// drawn ahead from its own generators are then dropped).
  void continue_from(const EvidenceSampler& previous);
  /// The state to hand on; matches: whether `carry` was measured on this sampler's set
  /// (same points, same reference values bit for bit); take: continue from it.
  Carry carry() const;
  bool matches(const Carry& carry) const;
  void take(const Carry& carry);

 private:
  /// The gathering's progress, a piece at a time (gather_piece).
  struct Gathering {
    enum class Step { kBaseline, kFp8Reference, kAccumulation, kWindows, kSamples, kKinks, kDone };
    Step step = Step::kBaseline;
    ops::KinkProbe probe;
    harness::PathRun baseline;
    std::vector<at::Tensor> baseline_scaled;
    std::vector<at::Tensor> reference_scaled;
    std::vector<std::vector<at::Tensor>> accumulated;
    /// The FP8 windows can be set (a backend whose FP8 is the reference's, runs that match).
    bool windows = false;
    int samples = 0;
    oracle::KinkGroups kinks;
    size_t group = 0;
    /// The result once done: false where the baseline raised.
    bool ok = true;
  };
  /// Pieces drawn ahead (advance): valid from the end of a gathering begun ahead until the
  /// generators are another sampler's.
  struct Ahead {
    bool valid = false;
    Draws draws;
    std::optional<oracle::RoundingEvidence> coarse;
    at::Generator after_coarse;
    /// Per round (index as kEvidenceSamples): the samples drawn, their maxima, the
    /// generators after them.
    struct Round {
      int64_t taken = 0;
      std::map<std::string, at::Tensor> sensitivity;
      std::map<std::string, at::Tensor> output_noise;
      Draws after;
    };
    std::array<Round, kEvidenceRounds> rounds;
  };

  bool gather_piece();
  void rounding_sample(Draws& draws, std::map<std::string, at::Tensor>& sensitivity,
                       std::map<std::string, at::Tensor>& output_noise);
  oracle::RoundingEvidence coarse_evidence(at::Generator& samples);
  void set_fp8_windows(const std::vector<at::Tensor>& baseline_scaled, std::vector<at::Tensor> reference_scaled,
                       const std::vector<std::vector<at::Tensor>>& accumulated);
  bool wants_coarse() const;

  const ReferenceSet& set_;
  const Options options_;
  oracle::RoundingEvidence evidence_;
  std::optional<oracle::RoundingEvidence> coarse_;
  Fp8Windows windows_;
  Draws draws_;
  Gathering gathering_;
  /// The gathering was begun by advance().
  bool begun_ahead_ = false;
  Ahead ahead_;
};

/// What a case run's evidence hands the in-place ablation's rerun of the same values, so that
/// it does not draw the same samples again: its sets' samplers' carries, in order, and the
/// last round it compared with (0: the gathering's samples; kEvidenceRounds - 1: all). The
/// rerun differs only in its ops' in_place options, which the float64 reference does not see:
/// where its reference sets match (EvidenceSampler::matches) the samples are the ones it would
/// draw. Its findings are those of its own evidence because an allowance only grows with
/// samples (oracle::evidence_bounds: maxima over samples): a round the rerun would have
/// stopped at earlier (no finding left) has none with more samples either.
struct EvidenceCarry {
  std::vector<EvidenceSampler::Carry> sets;
  int rounds = -1;
};

}  // namespace gradfuzz::runner
