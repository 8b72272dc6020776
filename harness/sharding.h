#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/builder.h"
#include "harness/case_spec.h"
#include "harness/path_run.h"

namespace gradfuzz::harness {

// Distributed cases (docs/BACKENDS.md "Distributed cases"). A case with world_size N runs
// the same Sequential on N ranks, as te.ops tensor and sequence parallelism does: each rank
// holds a slice, a copy or a summand of every tensor. The values are the case's, drawn
// whole from its seed (draw_case_tensors); each rank gets its slice of them
// (rank_tensors), and the ranks' results are put back together (assemble_ranks) into the
// unsharded tensors that the float64 reference computes once. Which slice a rank holds
// follows from the input's layout and each op's rule (plan_sharding).

/// How the tensor between two ops lies on the ranks.
enum class Layout {
  /// Every rank holds all of it (and, for a gradient, computes all of it).
  kReplicated,
  /// Rank r holds the r-th of N row slices (sequence parallelism).
  kRows,
  /// Rank r holds the r-th of N feature slices (tensor parallelism).
  kFeatures,
  /// Every rank holds a tensor of the whole shape; the tensor is their sum.
  kPartial,
};
/// "replicated", "rows", "features", "partial".
const char* layout_name(Layout layout);
/// The layout of CaseSpec::input_layout (replicated, rows or features).
Layout input_layout_of(const CaseSpec& spec);

/// Where one tensor's values lie on the ranks.
struct Placement {
  enum class Kind { kReplicated, kSharded, kPartial };
  Kind kind = Kind::kReplicated;
  /// kSharded: the dimension split into N consecutive slices (0 rows, 1 features).
  int64_t dim = 0;
  bool operator==(const Placement& o) const { return kind == o.kind && (kind != Kind::kSharded || dim == o.dim); }
  bool operator!=(const Placement& o) const { return !(*this == o); }
};
Placement replicated();
Placement sharded(int64_t dim);
Placement partial();
/// "replicated", "rows", "features", "partial" (a 1-D tensor split along dim 0: "rows").
std::string placement_name(const Placement& p);
/// Where a tensor of `layout` lies: rows and features are slices, a partial tensor is summands.
Placement value_placement(Layout layout);

/// One op's rule: the layouts of its tensors and where its parameters lie, and where the
/// gradients of all of them lie. A gradient lies as its tensor's values do, except: the
/// gradient of a partial tensor is the whole gradient on every rank (of a sum with respect
/// to each summand), and the gradient of a replicated tensor is either the whole gradient on
/// every rank or a summand per rank, as the ops around it need (AllGather's backward sums
/// the ranks' gradients: summands; AllReduce's and a row Linear's take the whole on every
/// rank, a column Linear's makes it). A parameter copied on every rank whose op sees only
/// a slice of the rows, or summands, gets a summand of its gradient.
struct OpSharding {
  Layout input = Layout::kReplicated;
  Layout output = Layout::kReplicated;
  /// Per extra input slot and per extra output slot.
  std::vector<Layout> extra_inputs;
  std::vector<Layout> extra_outputs;
  /// Per parameter: its values and its gradient.
  std::vector<Placement> params;
  std::vector<Placement> param_grads;
  /// The gradients of the op's main input and output.
  Placement input_grad;
  Placement output_grad;
};

/// Every tensor of a distributed case with its placement.
struct ShardingPlan {
  int64_t world_size = 1;
  /// Per spec op (a Boundary passes its input's layout on).
  std::vector<OpSharding> ops;
  Layout input = Layout::kReplicated;
  Placement input_grad;
  /// Main output, then the public extra outputs: their values, and their gradients (where
  /// the cotangents lie: a summand per rank is the cotangent's rows of that rank, zeros
  /// elsewhere).
  std::vector<Layout> outputs;
  std::vector<Placement> output_grads;
  /// Per public extra input passed (CasePlan::public_inputs order): values and gradients.
  std::vector<Layout> extra_inputs;
  std::vector<Placement> extra_input_grads;
  /// Per fuser: channel -> where its gradient lies.
  std::vector<std::map<std::string, Placement>> channel_grads;
};

/// The layouts of `spec` on spec.world_size ranks. One rank: everything replicated. More:
/// from spec.input_layout through each op's rule, te.ops's own:
/// - AllGather: rows -> replicated; ReduceScatter: partial -> rows; AllReduce: partial ->
///   replicated;
/// - Linear tensor_parallel_mode 1 (column): replicated (sequence_parallel: rows) ->
///   features, weight split by output rows; mode 2 (row): features -> replicated
///   (sequence_parallel: rows), weight split by input columns; mode 0 on features ->
///   partial with the weight split by columns (a row split written by hand), on anything
///   else the same layout with the weight copied;
/// - Bias: tensor_parallel=1 features -> features (bias split), else replicated or rows;
/// - ConstantScale, Identity, MakeExtraOutput: any layout; ReLU, GELU, SReLU,
///   AddExtraInput: all but partial (they are not linear, or add the same value N times);
///   SwiGLU, RMSNorm, LayerNorm: replicated or rows (they need every feature).
/// The gradients of replicated tensors follow (OpSharding): whole where a column Linear
/// makes them or AllReduce or a row Linear takes them, summands where AllGather takes them,
/// through the ops in between (they pass a gradient on as it comes); whole where nothing
/// decides. An op that raises at construction on this world (parallel_config_error) has its
/// output layout without its input's being checked: it never runs. Throws SpecError
/// (naming the op's JSON path and the layouts) for a chain whose layouts do not compose, a
/// replicated tensor whose gradient would have to be whole and summands at once (AllGather
/// feeding a column Linear), an op without a rule, a recipe, call-then-bind steps, late
/// binds, other invalid-configuration knobs, cache_quantized_input=1 (a rank's quantizer
/// scales by its slice's amax: not modelled), and an input layout whose dimension N does
/// not divide.
ShardingPlan plan_sharding(const CaseSpec& spec, const CasePlan& plan);

/// A configuration te.ops refuses on spec.world_size > 1 ranks: an op split over ranks
/// whose dimension N does not divide.
struct ParallelConfigError {
  int64_t op = 0;
  /// TE raises it when the op is made (else in the forward, before any communication).
  bool at_construction = true;
  std::string message;
};
/// The first one of `spec` in the order TE meets them (every op is made before the first
/// forward): Linear mode 1 with out % N != 0, mode 2 with in % N != 0, Bias
/// tensor_parallel=1 with n % N != 0 (at construction); ReduceScatter and Linear mode 2 with
/// sequence_parallel on rows % N != 0 (forward). nullopt on one rank and for valid cases.
std::optional<ParallelConfigError> parallel_config_error(const CaseSpec& spec, const CasePlan& plan);

/// Rank `rank`'s part of `t` under `p`: the whole tensor (replicated); its slice along the
/// placement's dimension, as torch.tensor_split cuts N slices (equal when N divides the
/// dimension; the first ones one longer otherwise, in cases TE refuses anyway); or, as a
/// summand (partial), the tensor with every row outside rank `rank`'s row slice zeroed (the
/// summands add up to `t` exactly).
at::Tensor shard(const at::Tensor& t, const Placement& p, int64_t world_size, int64_t rank);
/// The shape shard() gives.
std::vector<int64_t> shard_shape(const std::vector<int64_t>& shape, const Placement& p, int64_t world_size,
                                 int64_t rank);

/// Rank `rank`'s plan: every shape as that rank holds it (inputs, outputs, slots, parameters).
CasePlan rank_plan(const CasePlan& plan, const ShardingPlan& sharding, int64_t rank);
/// Rank `rank`'s values: its part of every value of `tensors` (inputs, parameters, extra
/// inputs at their layouts; cotangents where the outputs' gradients lie).
CaseTensors rank_tensors(const CaseTensors& tensors, const ShardingPlan& sharding, int64_t rank);

/// One path's run from the ranks' runs of it (rank 0 first), kept in `ranks`: the status is
/// theirs when they agree (a rank that raised while another ran, or raised another kind, is
/// an error naming each rank); the tensors are put together as they lie (slices
/// concatenated, summands summed in float64, replicated ones taken from rank 0: the oracle
/// compares the other ranks' copies with it, replica_view); plans and the writer from
/// rank 0, changed caller tensors of any rank; each repeat call assembled alike. A rank
/// missing a gradient another has contributes zeros. Throws std::invalid_argument for an
/// empty `ranks`.
PathRun assemble_ranks(std::vector<PathRun> ranks, const ShardingPlan& sharding);

/// The placements of `sharding` as JSON, for exported scripts (adapter/gradfuzz_adapter/
/// exporter_dist.py): {"world_size", "input", "input_grad", "outputs", "output_grads",
/// "extra_inputs", "extra_input_grads", "ops": [{"input_layout", "global_input_shape",
/// "params", "param_grads"}]}, each placement by placement_name (slices of dim 0 "rows",
/// of the last dim "features").
nlohmann::json sharding_json(const ShardingPlan& sharding, const CasePlan& plan);

/// `rank_run` with only the tensors every rank holds whole (replicated placements); the
/// others undefined. The copies on rank k > 0 must agree with rank 0's.
PathRun replica_view(const PathRun& rank_run, const ShardingPlan& sharding);

}  // namespace gradfuzz::harness
