#pragma once

#include <vector>

#include "backends/backend.h"

namespace gradfuzz::backends {

/// The model backend: gradfuzz's own runtime (`ops/`) in this process. Paths build the
/// case's ops with the case's dtype and device and the request's fusions (names the model
/// does not have are left out), run the call-then-bind steps, bind, construct the
/// Sequential, apply late binds, then forward and backward with autograd.
class ModelBackend final : public Backend {
 public:
  ModelBackend();
  std::string name() const override { return "model"; }
  const BackendCapabilities& capabilities() override { return capabilities_; }
  std::vector<PathRun> run_paths(const CaseSpec& spec, const CasePlan& plan, const CaseTensors& tensors,
                                 const std::vector<PathRequest>& paths) override;

 private:
  BackendCapabilities capabilities_;
};

}  // namespace gradfuzz::backends
