#include "harness/path_run.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>

#include "ops/errors.h"

namespace gradfuzz::harness {

bool any_fused(const PathRun& run) {
  for (const auto& fuser : run.plans) {
    for (const auto* pass : {&fuser.forward, &fuser.backward}) {
      for (const auto& group : *pass) {
        if (group.fused) return true;
      }
    }
  }
  // A later call with another requires-grad pattern may fuse where the first did not.
  for (const auto& repeat : run.repeats) {
    if (any_fused(repeat)) return true;
  }
  return false;
}

bool fired_each_of(const PathRun& first, const std::vector<std::vector<std::string>>& lists) {
  if (!first.ok()) return false;
  for (const auto& names : lists) {
    bool fired = false;
    for (const auto& fuser : first.plans) {
      for (const auto* pass : {&fuser.forward, &fuser.backward}) {
        for (const auto& group : *pass) {
          fired = fired || (group.fused && std::find(names.begin(), names.end(), group.name) != names.end());
        }
      }
    }
    if (!fired) return false;
  }
  return true;
}

std::string describe_error(const PathRun& run) {
  return run.name + " raised " + run.error_kind + " during " + run.error_stage + ": " + run.error_message;
}

void run_guarded(PathRun& run, const std::function<void()>& body) {
  try {
    body();
    run.status = PathStatus::kOk;
    run.error_stage.clear();
    return;
  } catch (const Error& e) {
    run.error_kind = e.kind();
    run.error_message = e.what();
  } catch (const std::logic_error&) {
    throw;  // internal assertion failure: a gradfuzz bug, not a verdict
  } catch (const c10::Error& e) {
    run.error_kind = "c10-error";
    run.error_message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    run.error_kind = "std-exception";
    run.error_message = e.what();
  }
  run.status = PathStatus::kError;
}

}  // namespace gradfuzz::harness
