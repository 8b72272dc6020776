#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// Whether a channel op works in place (catalog attr "in_place", 0/1).
enum class InPlace { kNo, kYes };

/// `y = x`; extra output 0 = x itself (the same tensor). Backward: dx = g + g_extra
/// (g_extra may be undefined). With InPlace::kYes the sum is accumulated into g_extra in
/// place (the fuser guarantees it owns that tensor) and g_extra is returned as dx.
///
/// ctx layout: saved = {}; saved_sizes = {}.
class MakeExtraOutput final : public BasicOp {
 public:
  explicit MakeExtraOutput(InPlace in_place = InPlace::kNo) : BasicOp("MakeExtraOutput"), in_place_(in_place) {}
  int64_t num_extra_outputs() const override { return 1; }
  InPlace in_place() const { return in_place_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  InPlace in_place_;
};

/// `y = x + e`; extra input slot 0 = e (same shape as x). Backward: dx = g, and de = g
/// (the same tensor as grad_output) only when ctx.wants_grad(0), else undefined.
/// With InPlace::kYes (and e of x's dtype) forward writes the sum into e in place and
/// returns e as y; writes_extra_input_in_place(0) then says so, so the fuser hands a copy.
/// Forward throws InvalidArgumentError when e's shape differs from x's.
///
/// ctx layout: saved = {}; saved_sizes = {}.
class AddExtraInput final : public BasicOp {
 public:
  explicit AddExtraInput(InPlace in_place = InPlace::kNo) : BasicOp("AddExtraInput"), in_place_(in_place) {}
  int64_t num_extra_inputs() const override { return 1; }
  bool writes_extra_input_in_place(int64_t slot) const override { return slot == 0 && in_place_ == InPlace::kYes; }
  InPlace in_place() const { return in_place_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  InPlace in_place_;
};

/// `y = x`; extra output 0 = mean of squares per row [rows], a fresh tensor.
/// Backward: dx = g + g_stat[r]·2x/n (g_stat may be undefined).
///
/// ctx layout: saved = {input [rows, n]}; saved_sizes = {}.
class RowStat final : public BasicOp {
 public:
  RowStat() : BasicOp("RowStat") {}
  int64_t num_extra_outputs() const override { return 1; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();
};

/// `y = x`; extra outputs 0 = s0·x, 1 = s1·x (catalog attrs "s0" = 0.5, "s1" = -1.5).
/// Backward: dx = g + s0·g0 + s1·g1 (missing gradients count as zero).
///
/// ctx layout: saved = {}; saved_sizes = {}.
class DualExtraOutput final : public BasicOp {
 public:
  explicit DualExtraOutput(double s0 = 0.5, double s1 = -1.5) : BasicOp("DualExtraOutput"), s0_(s0), s1_(s1) {}
  int64_t num_extra_outputs() const override { return 2; }
  double s0() const { return s0_; }
  double s1() const { return s1_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  double s0_;
  double s1_;
};

}  // namespace gradfuzz::ops
