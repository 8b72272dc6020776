#include "runner/quantization_points.h"

namespace gradfuzz::runner {
namespace {

double attr_or(const harness::OpSpec& op, const std::string& name, double fallback) {
  const auto it = op.attrs.find(name);
  return it == op.attrs.end() ? fallback : it->second;
}

/// BackwardLinearScale (te.ops fused/backward_linear_scale.py: fuser_backward): the Linear's
/// _functional_backward gets the unscaled grad_output, quantizes it with the Linear's
/// grad_output quantizer (amax and delayed-scaling history of the unscaled gradient), and
/// runs dgrad and wgrad with grad_input_alpha = grad_weight_alpha = the ConstantScale's scale;
/// the ConstantScale's own backward does not run.
void backward_linear_scale(const harness::CaseSpec& spec, int64_t begin, int64_t end, ops::QuantizationPoints& points) {
  if (end != begin + 2 || begin < 0 || end > static_cast<int64_t>(spec.ops.size())) return;
  const harness::OpSpec& linear = spec.ops[static_cast<size_t>(begin)];
  const harness::OpSpec& scale = spec.ops[static_cast<size_t>(begin + 1)];
  if (linear.name != "Linear" || scale.name != "ConstantScale") return;
  // The catalog's default scale (ops/basic/catalog.cc) where the case leaves it out.
  points.backward_gemm_alpha[begin] = attr_or(scale, "scale", 0.5);
  points.gradient_passthrough.insert(begin + 1);
}

}  // namespace

const std::vector<FusedQuantizationPoint>& fused_quantization_points() {
  static const std::vector<FusedQuantizationPoint> table{
      {"BackwardLinearScale", /*backward=*/true, &backward_linear_scale},
  };
  return table;
}

ops::QuantizationPoints quantization_points(const harness::CaseSpec& spec, const harness::PathRun& run) {
  ops::QuantizationPoints points;
  for (const harness::FuserPlans& fuser : run.plans) {
    for (const auto& point : fused_quantization_points()) {
      for (const harness::PlanGroup& group : point.backward ? fuser.backward : fuser.forward) {
        if (group.fused && group.name == point.fusion) point.apply(spec, group.begin, group.end, points);
      }
    }
  }
  return points;
}

}  // namespace gradfuzz::runner
