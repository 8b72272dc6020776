#include "runner/run_options.h"

#include <stdexcept>

namespace gradfuzz::runner {

const char* overlap_name(RunOptions::Overlap overlap) {
  switch (overlap) {
    case RunOptions::Overlap::kNone:
      return "none";
    case RunOptions::Overlap::kReference:
      return "reference";
    case RunOptions::Overlap::kEvidence:
      return "evidence";
  }
  return "evidence";
}

RunOptions::Overlap overlap_from_name(const std::string& name) {
  for (const auto o : {RunOptions::Overlap::kNone, RunOptions::Overlap::kReference, RunOptions::Overlap::kEvidence}) {
    if (name == overlap_name(o)) return o;
  }
  throw std::invalid_argument("expected none, reference or evidence, got '" + name + "'");
}

}  // namespace gradfuzz::runner
