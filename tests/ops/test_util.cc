#include "tests/ops/test_util.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <variant>

#include "ops/errors.h"

namespace gradfuzz::ops::testing {

namespace {

constexpr const char* kDeviceVariable = "GRADFUZZ_TEST_DEVICE";

at::Device resolve_test_device() {
  const char* raw = std::getenv(kDeviceVariable);
  const std::string value = raw ? raw : "";
  if (value.empty() || value == "cpu") return at::Device(at::kCPU);
  if (value != "cuda") {
    throw std::runtime_error(std::string(kDeviceVariable) + ": expected 'cpu' or 'cuda' (or unset for cpu), got '" +
                             value + "'");
  }
  if (!at::hasCUDA()) {
    throw std::runtime_error(std::string(kDeviceVariable) +
                             "=cuda: no CUDA device available (this LibTorch build has no CUDA support or "
                             "no GPU is visible); refusing to fall back to the CPU");
  }
  // A concrete device (cuda:N, the current device) so test_device() == t.device() holds for
  // tensors placed there; allocating one also proves the device is usable, up front.
  try {
    return at::empty({0}, at::TensorOptions().device(at::kCUDA)).device();
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(kDeviceVariable) + "=cuda: cannot allocate on the CUDA device: " + e.what());
  }
}

/// Resolves test_device() before any test runs, so a bad GRADFUZZ_TEST_DEVICE is reported
/// once, up front, and fails the run. Deliberately a non-fatal failure: a fatal one would
/// mark every test "[  SKIPPED ]", which ctest (gtest_discover_tests' SKIP_REGULAR_EXPRESSION)
/// counts as not failed. This way every ctest entry exits non-zero, and every test that
/// touches a tensor also fails with the same message.
class TestDeviceEnvironment final : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      const at::Device device = test_device();
      if (!device.is_cpu()) std::cout << "[ gradfuzz  ] ops tests run on " << device << std::endl;
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }
};

[[maybe_unused]] ::testing::Environment* const kTestDeviceEnvironment =
    ::testing::AddGlobalTestEnvironment(new TestDeviceEnvironment);

}  // namespace

at::Device test_device() {
  // Resolved once; a failed resolution throws again on every call (a static initializer that
  // throws is retried), so no caller can ever see a fallback device.
  static const at::Device device = resolve_test_device();
  return device;
}

at::TensorOptions test_options(at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(test_device()); }

at::Tensor on_device(const at::Tensor& t) {
  if (!t.defined() || t.device() == test_device()) return t;
  return t.detach().to(test_device()).requires_grad_(t.requires_grad());
}

Tolerance tolerance_for(at::ScalarType dtype) { return dtype == at::kDouble ? kFloat64Tol : kFloat32Tol; }

BasicOpPtr make_op(const std::string& name, const OpAttrs& attrs, const std::vector<int64_t>& input_shape,
                   at::ScalarType dtype) {
  return OpRegistry::catalog().create(name, attrs, input_shape, test_options(dtype));
}

at::Generator make_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

at::Tensor seeded_randn(at::IntArrayRef shape, at::Generator& gen, at::ScalarType dtype, bool requires_grad,
                        bool away_from_zero) {
  // Drawn and cast on the CPU, then moved: identical values on every test device.
  at::Tensor t = at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble));
  if (away_from_zero) t = at::sign(t) * (t.abs() + 0.2);
  return t.to(dtype).to(test_device()).requires_grad_(requires_grad);
}

at::Tensor int_tensor(const std::vector<int64_t>& values) { return int_tensor(values, test_device()); }

at::Tensor int_tensor(const std::vector<int64_t>& values, at::Device device) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device);
}

std::vector<at::Tensor> make_cotangents(const std::vector<at::Tensor>& outputs, uint64_t seed) {
  at::Generator gen = make_generator(seed);
  std::vector<at::Tensor> out;
  for (const at::Tensor& o : outputs) {
    if (!o.defined() || !at::isFloatingType(o.scalar_type())) {
      out.emplace_back();
      continue;
    }
    // Drawn on the CPU generator, then placed next to the output it is the cotangent of.
    out.push_back(at::randn(o.sizes(), gen, at::TensorOptions().dtype(at::kDouble)).to(o.device()));
  }
  return out;
}

namespace {

/// Gradients of sum_k <outputs_k, cotangents_k> with respect to `wrt` (undefined when unused).
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& cotangents,
                                 const std::vector<at::Tensor>& wrt) {
  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> cots;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined() || !outputs[k].requires_grad() || !cotangents[k].defined()) continue;
    outs.push_back(outputs[k]);
    cots.push_back(cotangents[k].to(outputs[k].device(), outputs[k].scalar_type()));
  }
  if (outs.empty() || wrt.empty()) return std::vector<at::Tensor>(wrt.size());
  return torch::autograd::grad(outs, wrt, cots, /*retain_graph=*/false, /*create_graph=*/false,
                               /*allow_unused=*/true);
}

}  // namespace

PathResult run_fused(Sequential& sequential, const at::Tensor& input, const std::vector<at::Tensor>& extra_inputs,
                     uint64_t cotangent_seed) {
  PathResult result;
  result.outputs = sequential.forward(input, extra_inputs);
  // Cotangents are generated in float64 from the shapes so both paths get the same values.
  const std::vector<at::Tensor> cotangents = make_cotangents(result.outputs, cotangent_seed);

  std::vector<at::Tensor> wrt;
  std::vector<int64_t> input_pos;
  auto want = [&](const at::Tensor& t) -> int64_t {
    if (!t.defined() || !t.requires_grad()) return -1;
    wrt.push_back(t);
    return static_cast<int64_t>(wrt.size()) - 1;
  };
  const int64_t in_pos = want(input);
  std::vector<std::vector<int64_t>> param_pos;
  for (const Module& module : sequential.modules()) {
    const auto* op = std::get_if<BasicOpPtr>(&module);
    if (!op) continue;
    param_pos.emplace_back();
    for (const at::Tensor& p : (*op)->parameters()) param_pos.back().push_back(want(p));
  }
  std::vector<int64_t> extra_pos;
  for (const at::Tensor& e : extra_inputs) extra_pos.push_back(want(e));

  const std::vector<at::Tensor> grads = grads_of(result.outputs, cotangents, wrt);
  auto pick = [&](int64_t pos) { return pos < 0 ? at::Tensor() : grads[pos]; };
  result.grad_input = pick(in_pos);
  for (const auto& positions : param_pos) {
    result.grad_params.emplace_back();
    for (int64_t pos : positions) result.grad_params.back().push_back(pick(pos));
  }
  for (int64_t pos : extra_pos) result.grad_extra_inputs.push_back(pick(pos));
  for (const auto& fuser : sequential.fusers()) {
    result.channel_grads.emplace_back();
    if (auto trace = fuser->last_trace()) result.channel_grads.back() = trace->channel_grads;
  }
  return result;
}

PathResult run_reference(const Sequential& sequential, const at::Tensor& input,
                         const std::vector<at::Tensor>& extra_inputs, uint64_t cotangent_seed) {
  ReferenceEvaluator reference(sequential);
  PathResult result;
  result.outputs = reference.forward(input, extra_inputs);
  const ReferenceGradients grads = reference.backward(make_cotangents(result.outputs, cotangent_seed));
  result.grad_input = grads.grad_input;
  result.grad_params = grads.grad_params;
  result.grad_extra_inputs = grads.grad_extra_inputs;
  result.channel_grads = grads.channel_grads;
  return result;
}

::testing::AssertionResult tensors_close(const at::Tensor& got, const at::Tensor& expected, Tolerance tol,
                                         const std::string& what) {
  if (!expected.defined()) {
    if (!got.defined() || at::count_nonzero(got.detach()).item<int64_t>() == 0) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << what << ": expected no gradient, got a non-zero tensor";
  }
  if (!got.defined()) {
    if (at::count_nonzero(expected.detach()).item<int64_t>() == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": got undefined (a dropped gradient), expected a non-zero "
                                         << expected.sizes() << " tensor";
  }
  if (got.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << what << ": shape " << got.sizes() << ", expected " << expected.sizes();
  }
  const at::Tensor g = got.detach().to(at::kCPU, at::kDouble);
  const at::Tensor e = expected.detach().to(at::kCPU, at::kDouble);
  if (g.numel() == 0) return ::testing::AssertionSuccess();
  const at::Tensor err = (g - e).abs();
  const at::Tensor excess = err - (tol.atol + tol.rtol * e.abs());
  const at::Tensor worst = excess.reshape({-1}).argmax();
  const int64_t index = worst.item<int64_t>();
  const double worst_excess = excess.reshape({-1})[index].item<double>();
  if (worst_excess <= 0 && !at::isnan(g).any().item<bool>()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": worst flat index " << index << " got "
                                       << g.reshape({-1})[index].item<double>() << " expected "
                                       << e.reshape({-1})[index].item<double>() << " (abs err "
                                       << err.reshape({-1})[index].item<double>() << ", rtol " << tol.rtol << ", atol "
                                       << tol.atol << ")";
}

::testing::AssertionResult results_close(const PathResult& got, const PathResult& expected, Tolerance tol) {
  std::ostringstream failures;
  bool ok = true;
  auto check = [&](const at::Tensor& g, const at::Tensor& e, const std::string& what) {
    ::testing::AssertionResult r = tensors_close(g, e, tol, what);
    if (!r) {
      ok = false;
      failures << r.message() << "\n";
    }
  };
  if (got.outputs.size() != expected.outputs.size()) {
    return ::testing::AssertionFailure() << "got " << got.outputs.size() << " outputs, expected "
                                         << expected.outputs.size();
  }
  for (size_t k = 0; k < got.outputs.size(); ++k)
    check(got.outputs[k], expected.outputs[k], "output " + std::to_string(k));
  check(got.grad_input, expected.grad_input, "grad_input");
  // Every list must have the same length: comparing up to the shorter one would let a
  // dropped gradient or a surplus one pass.
  auto same_count = [&](size_t g, size_t e, const std::string& what) {
    if (g == e) return true;
    ok = false;
    failures << "got " << g << " " << what << ", expected " << e << "\n";
    return false;
  };
  if (same_count(got.grad_params.size(), expected.grad_params.size(), "ops' parameter-gradient lists")) {
    for (size_t i = 0; i < expected.grad_params.size(); ++i) {
      if (!same_count(got.grad_params[i].size(), expected.grad_params[i].size(),
                      "parameter gradients of op " + std::to_string(i))) {
        continue;
      }
      for (size_t p = 0; p < expected.grad_params[i].size(); ++p) {
        check(got.grad_params[i][p], expected.grad_params[i][p],
              "grad of op " + std::to_string(i) + " param " + std::to_string(p));
      }
    }
  }
  if (same_count(got.grad_extra_inputs.size(), expected.grad_extra_inputs.size(), "public extra-input gradients")) {
    for (size_t k = 0; k < expected.grad_extra_inputs.size(); ++k) {
      check(got.grad_extra_inputs[k], expected.grad_extra_inputs[k], "grad of public extra input " + std::to_string(k));
    }
  }
  if (same_count(got.channel_grads.size(), expected.channel_grads.size(), "fusers' channel-gradient maps")) {
    for (size_t f = 0; f < expected.channel_grads.size(); ++f) {
      for (const auto& [name, grad] : expected.channel_grads[f]) {
        auto it = got.channel_grads[f].find(name);
        check(it == got.channel_grads[f].end() ? at::Tensor() : it->second, grad,
              "channel '" + name + "' grad (fuser " + std::to_string(f) + ")");
      }
      for (const auto& [name, grad] : got.channel_grads[f]) {
        if (!expected.channel_grads[f].count(name)) {
          check(grad, at::Tensor(),
                "channel '" + name + "' grad (fuser " + std::to_string(f) + ", not in the expected)");
        }
      }
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures.str();
}

::testing::AssertionResult fused_matches_reference(Sequential& sequential, const at::Tensor& input,
                                                   const std::vector<at::Tensor>& extra_inputs, Tolerance tol) {
  try {
    const PathResult expected = run_reference(sequential, input, extra_inputs);
    const PathResult got = run_fused(sequential, input, extra_inputs);
    return results_close(got, expected, tol);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw: " << e.what();
  }
}

::testing::AssertionResult fused_differs_from_reference(Sequential& sequential, const at::Tensor& input,
                                                        const std::vector<at::Tensor>& extra_inputs, Tolerance tol) {
  PathResult expected;
  PathResult got;
  try {
    expected = run_reference(sequential, input, extra_inputs);
    got = run_fused(sequential, input, extra_inputs);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw instead of differing: " << e.what();
  }
  if (results_close(got, expected, tol)) return ::testing::AssertionFailure() << "the fused path matched the reference";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult gradients_match_finite_differences(Sequential& sequential, const at::Tensor& input,
                                                              const std::vector<at::Tensor>& extra_inputs,
                                                              const PathResult& got, double step, Tolerance tol,
                                                              uint64_t cotangent_seed) {
  at::NoGradGuard no_grad;
  // Private copies of the caller's tensors (perturbed below); parameters are perturbed in place.
  const at::Tensor x = input.detach().clone();
  std::vector<at::Tensor> extras;
  for (const at::Tensor& e : extra_inputs) extras.push_back(e.defined() ? e.detach().clone() : e);
  auto loss = [&]() {
    const std::vector<at::Tensor> outputs = sequential.forward(x, extras);
    const std::vector<at::Tensor> cotangents = make_cotangents(outputs, cotangent_seed);
    double total = 0.0;
    for (size_t k = 0; k < outputs.size(); ++k) {
      if (!cotangents[k].defined()) continue;
      total += (outputs[k].to(at::kDouble) * cotangents[k].to(outputs[k].device(), at::kDouble)).sum().item<double>();
    }
    return total;
  };
  // d loss / d target [same shape], by central differences, element by element.
  auto differentiate = [&](const at::Tensor& target) {
    GRADFUZZ_INTERNAL_ASSERT(target.scalar_type() == at::kDouble, "finite differences need float64 tensors");
    const at::Tensor flat = target.detach().view({-1});
    std::vector<double> grad(static_cast<size_t>(flat.numel()));
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double saved = flat[i].item<double>();
      flat[i].fill_(saved + step);
      const double up = loss();
      flat[i].fill_(saved - step);
      const double down = loss();
      flat[i].fill_(saved);
      grad[static_cast<size_t>(i)] = (up - down) / (2.0 * step);
    }
    return at::tensor(grad, at::TensorOptions().dtype(at::kDouble)).view(target.sizes());
  };

  std::ostringstream failures;
  bool ok = true;
  auto check = [&](const at::Tensor& got_grad, const at::Tensor& target, const std::string& what) {
    ::testing::AssertionResult r = tensors_close(got_grad, differentiate(target), tol, what + " vs finite differences");
    if (!r) {
      ok = false;
      failures << r.message() << "\n";
    }
  };
  if (input.requires_grad()) check(got.grad_input, x, "grad_input");
  size_t op_index = 0;
  for (const Module& module : sequential.modules()) {
    const auto* op = std::get_if<BasicOpPtr>(&module);
    if (!op) continue;
    const std::vector<at::Tensor> params = (*op)->parameters();
    for (size_t p = 0; p < params.size(); ++p) {
      if (!params[p].requires_grad()) continue;
      check(op_index < got.grad_params.size() && p < got.grad_params[op_index].size() ? got.grad_params[op_index][p]
                                                                                      : at::Tensor(),
            params[p], "grad of op " + std::to_string(op_index) + " param " + std::to_string(p));
    }
    ++op_index;
  }
  for (size_t k = 0; k < extra_inputs.size(); ++k) {
    const at::Tensor& e = extra_inputs[k];
    if (!e.defined() || !e.requires_grad() || !at::isFloatingType(e.scalar_type())) continue;
    check(k < got.grad_extra_inputs.size() ? got.grad_extra_inputs[k] : at::Tensor(), extras[k],
          "grad of public extra input " + std::to_string(k));
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures.str();
}

const PlanEntry* find_entry(const std::vector<PlanEntry>& plan, const std::string& name) {
  for (const PlanEntry& entry : plan) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

ForwardResult SplitSource::forward_impl(OpContext& /*ctx*/, const at::Tensor& input,
                                        const std::vector<at::Tensor>& /*extra_inputs*/) const {
  return {input, pack({int_tensor(sizes_, input.device())})};
}

BackwardResult SplitSource::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                          const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input [rows, n]; split sizes have no gradient.
  return {grad_output, {}, pack({})};
}

ReferenceResult SplitSource::reference_impl(const at::Tensor& input, const std::vector<at::Tensor>& /*extra_inputs*/,
                                            const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input), {int_tensor(sizes_, input.device())}};
}

ForwardResult CountingIdentity::forward_impl(OpContext& /*ctx*/, const at::Tensor& input,
                                             const std::vector<at::Tensor>& /*extra_inputs*/) const {
  ++forward_calls;
  return {input, pack({})};
}

BackwardResult CountingIdentity::backward_impl(OpContext& /*ctx*/, const at::Tensor& grad_output,
                                               const std::vector<at::Tensor>& /*grad_extra_outputs*/) const {
  // grad_output [rows, n] -> grad_input [rows, n]
  ++backward_calls;
  return {grad_output, {}, pack({})};
}

ReferenceResult CountingIdentity::reference_impl(const at::Tensor& input,
                                                 const std::vector<at::Tensor>& /*extra_inputs*/,
                                                 const std::vector<at::Tensor>& /*params*/) const {
  return {input.view_as(input), {}};
}

}  // namespace gradfuzz::ops::testing
