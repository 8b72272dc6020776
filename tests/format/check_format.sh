#!/usr/bin/env bash
# The formatters every change goes through (issue 15): clang-format with the project's
# .clang-format on every tracked C++ file, ruff (pinned in the venv by scripts/setup.sh) on
# the adapter and the Python scripts. Fails naming each file that differs; fix with
#   git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i
#   (cd adapter && ../.venv/bin/ruff format . && ../.venv/bin/ruff check --fix .)
# Usage: check_format.sh clang-format|ruff
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: the tracked files cannot be listed"; exit 1; }
case "${1:-}" in
  clang-format)
    command -v clang-format >/dev/null || { echo "clang-format is not installed (scripts/setup.sh installs it)"; exit 1; }
    mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu')
    [ ${#files[@]} -gt 0 ] || { echo "no C++ file is tracked"; exit 1; }
    bad=()
    for f in "${files[@]}"; do
      [ -f "$f" ] || continue
      clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
    done
    if [ ${#bad[@]} -gt 0 ]; then
      printf 'not formatted with .clang-format (%d of %d files):\n' "${#bad[@]}" "${#files[@]}"
      printf '  %s\n' "${bad[@]}"
      exit 1
    fi
    echo "clang-format: ${#files[@]} files formatted"
    ;;
  ruff)
    ruff="${GRADFUZZ_RUFF:-$root/.venv/bin/ruff}"
    [ -x "$ruff" ] || { echo "ruff not found at $ruff (scripts/setup.sh installs it)"; exit 1; }
    mapfile -t scripts < <(git ls-files 'scripts/*.py' 'tests/scripts/*.py')
    (cd adapter && "$ruff" check . && "$ruff" format --check .)
    if [ ${#scripts[@]} -gt 0 ]; then
      "$ruff" check --config adapter/pyproject.toml "${scripts[@]}"
      "$ruff" format --check --config adapter/pyproject.toml "${scripts[@]}"
    fi
    ;;
  *) echo "usage: $0 clang-format|ruff"; exit 2 ;;
esac
