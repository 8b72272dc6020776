#pragma once

#include <rapidcheck.h>

#include "generators/case_gen.h"
#include "generators/invalid_gen.h"
#include "harness/case_spec.h"

namespace gradfuzz::generators {

/// Distributed cases (harness/sharding.h) of *options.world_size ranks: tensor- and
/// sequence-parallel chains as te.ops users write them, drawn layout by layout so that every
/// case's layouts compose and every split divides (validate_case is empty). The main input
/// lies replicated, in row slices or in feature slices (1/3 each, on one rank replicated);
/// rows, and features wherever they are split, are multiples of N (each rank's slice is a
/// tiny, edge or large dimension). Blocks, by the layout they start from (weights):
/// - replicated: Megatron MLP (column Linear, [tensor-parallel Bias], [ReLU|GELU|SReLU], row
///   Linear, [Bias]) 4, a column Linear 2, a plain Linear [+ ConstantScale] 1, one op 2, a
///   residual (MakeExtraOutput, the MLP back to the same features, AddExtraInput bound to
///   it) 3;
/// - rows: the same MLP with sequence_parallel 4, AllGather 2, a sequence-parallel column
///   Linear 2, one op 2, a residual around the sequence-parallel MLP 3;
/// - features: a row Linear (sequence_parallel 1/2) [+ ConstantScale] 3, a plain Linear
///   (summands out) [+ ConstantScale] then AllReduce or ReduceScatter (or summands left, 1/4)
///   3, one op 2, a residual around an activation 1;
/// - partial: AllReduce or ReduceScatter 4, ConstantScale, Identity, a plain Linear or
///   MakeExtraOutput 1.
/// One op is drawn among those the layout takes (ops/ sharding rules). A Boundary between
/// blocks with chance 1/5; op count, requires-grad flags, fusions, repeat calls, dtype and
/// seed as gen_case draws them; no recipe, call-then-bind step or cache_quantized_input
/// (plan_sharding refuses them on several ranks). Throws std::invalid_argument unless
/// options.world_size is in [1, harness::kMaxWorldSize].
rc::Gen<harness::CaseSpec> gen_parallel_case(const GenOptions& options);

/// Distributed cases that te.ops must refuse (world_size > 1), each with one split that
/// does not divide, drawn uniformly: a column Linear's out, a row Linear's in, a
/// tensor-parallel Bias's size (at construction), the rows of a ReduceScatter or of a
/// sequence-parallel row Linear's output (forward). Every path and the reference must raise
/// invalid-argument; validate_case reports it first. Throws std::invalid_argument unless
/// options.world_size is in [2, harness::kMaxWorldSize].
rc::Gen<InvalidCase> gen_parallel_invalid_case(const GenOptions& options);

}  // namespace gradfuzz::generators
