#pragma once

#include "ops/basic_op.h"

namespace gradfuzz::ops {

/// The tensor-parallel communication ops of te.ops (`AllGather`, `ReduceScatter`,
/// `AllReduce`), as the model sees them: one process holding the unsharded tensors.
///
/// A distributed case runs on N ranks, each holding a slice (or a copy, or a summand) of
/// every tensor (harness/sharding.h: layouts). On the unsharded tensors each collective
/// is the identity: AllGather concatenates the row slices back into the whole, ReduceScatter
/// sums the summands and hands each rank its rows of the sum, AllReduce sums them for every
/// rank, and their backwards are the conjugate collectives, again the identity on the whole.
/// So the float64 reference runs them as identities; the ranks' own collectives run in the
/// backends that run ranks (te, torch).
///
/// ctx layout: saved = {}; saved_sizes = {}. Backward: dx = g.
enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };

/// "AllGather", "ReduceScatter", "AllReduce".
const char* collective_name(CollectiveKind kind);

class Collective final : public BasicOp {
 public:
  explicit Collective(CollectiveKind kind) : BasicOp(collective_name(kind)), kind_(kind) {}
  CollectiveKind kind() const { return kind_; }

 protected:
  GRADFUZZ_BASIC_OP_IMPL();

 private:
  CollectiveKind kind_;
};

}  // namespace gradfuzz::ops
