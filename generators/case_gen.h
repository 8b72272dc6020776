#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/capabilities.h"
#include "harness/case_spec.h"

namespace gradfuzz::generators {

/// How big a case's dimensions are (issue: kernels' edges).
/// - kTiny: rows 1..8, features 2..8 (fast, many cases);
/// - kEdge: rows and features at and around the block, warp and vector widths of kernels
///   (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, ..., 8191, 8192), within max_tensor_elements;
/// - kLarge: rows 1024..32768, features 1024..16384, within max_tensor_elements;
/// - kMix: one of the three per case (tiny 6, edge 3, large 1 in 10).
enum class ShapeRegime { kTiny, kEdge, kLarge, kMix };
/// "tiny", "edge", "large", "mix".
const char* shape_regime_name(ShapeRegime regime);
/// Inverse of shape_regime_name; throws std::invalid_argument listing the names.
ShapeRegime shape_regime_from_name(const std::string& name);

/// What the default case generator may draw from.
struct GenOptions {
  /// Upper bound on catalog ops per case (Boundary modules not counted); >= 1.
  int max_ops = 8;
  /// Dtypes drawn uniformly; must not be empty.
  std::vector<std::string> dtypes{"float64", "float32"};
  /// Device of every case ("cpu" or "cuda").
  std::string device = "cpu";
  /// Fusions a case may enable; nullopt means every fusion the backend has.
  std::optional<std::vector<std::string>> fusions;
  /// The backend under test (harness/backend.h): only its ops, output styles and fusions
  /// (with their passes) are drawn, backend-only options from their domains, and no invalid
  /// configuration that a documented deviation makes valid. Null: the model's catalog.
  std::shared_ptr<const harness::BackendCapabilities> capabilities;
  ShapeRegime shapes = ShapeRegime::kTiny;
  /// Largest element count of any one tensor a case of the edge or large regime may have
  /// (activations [rows, features] and weights [out, in]); dimensions are halved to fit.
  int64_t max_tensor_elements = int64_t{1} << 24;
  /// Steering (campaign/known_issues.h): feature -> the share of cases allowed to draw it
  /// ("generator_outputs", "call_then_bind", "in_place"); a case not allowed one draws none
  /// of it. Features not listed, and an empty map, draw as the distribution notes say.
  std::map<std::string, double> feature_weights;
  /// Quantization recipes (backends whose capabilities list available ones): "any" (the
  /// default) draws one in half the cases, "none" never, a recipe's name in every case.
  std::string recipe = "any";
  /// Draw distributed cases of this many ranks (generators/parallel_gen.h: tensor- and
  /// sequence-parallel chains) instead of one-process ones; nullopt: one-process cases, as
  /// before distributed cases existed. 1 draws the same chains on one rank (te.ops turns the
  /// modes off there and its collectives are identities).
  std::optional<int64_t> world_size;
  /// Draw the usage script's elements the backend runs (capabilities.usage); false: none,
  /// the cases as before them (a benchmark's "usage off").
  bool usage = true;

  /// Fluent setters, one per field.
  GenOptions& set_max_ops(int v) {
    max_ops = v;
    return *this;
  }
  GenOptions& set_dtypes(std::vector<std::string> v) {
    dtypes = std::move(v);
    return *this;
  }
  GenOptions& set_device(std::string v) {
    device = std::move(v);
    return *this;
  }
  GenOptions& set_fusions(std::vector<std::string> v) {
    fusions = std::move(v);
    return *this;
  }
  GenOptions& set_capabilities(std::shared_ptr<const harness::BackendCapabilities> v) {
    capabilities = std::move(v);
    return *this;
  }
  GenOptions& set_shapes(ShapeRegime v) {
    shapes = v;
    return *this;
  }
  GenOptions& set_max_tensor_elements(int64_t v) {
    max_tensor_elements = v;
    return *this;
  }
  GenOptions& set_recipe(std::string v) {
    recipe = std::move(v);
    return *this;
  }
  GenOptions& set_usage(bool v) {
    usage = v;
    return *this;
  }
  GenOptions& set_world_size(std::optional<int64_t> v) {
    world_size = v;
    return *this;
  }
  GenOptions& set_feature_weights(std::map<std::string, double> v) {
    feature_weights = std::move(v);
    return *this;
  }
};

/// The default case generator (fuzzer.md "Generation and shrinking"). Every case it yields
/// passes validate_case(): shapes propagate through the registry's signatures, every bound
/// input has an earlier producer in its fuser with an equal SlotSpec (and, for split sizes,
/// the same row count), no Boundary sits inside a channel's span. The number of catalog ops
/// is uniform in [1, budget] with budget = ceil(max_ops * min(size, 100) / 100); every other
/// choice ignores the size (distribution documented in case_gen.cc). Throws
/// std::invalid_argument for empty dtypes or max_ops < 1.
rc::Gen<harness::CaseSpec> gen_case(const GenOptions& options = {});

/// Deterministic driver: the case that gen_case(options) yields for rc::Random(seed) and
/// `size`. No global RNG: the same (seed, size, options) always gives the same case.
harness::CaseSpec generate_case(uint64_t seed, int size, const GenOptions& options = {});

}  // namespace gradfuzz::generators
