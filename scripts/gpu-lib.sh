# Sourced by scripts/gpu-te.sh and scripts/gpu-te-dist.sh (bash, set -uo pipefail): the
# summary and tarball of a call, and TransformerEngine's install from the carried parts.
# Before sourcing: out (where the call writes), tag, budget (seconds).
#
# The core wheel travels in pieces (../shared/te/fetch.sh lays out .te/c0..c3, 60 MiB each):
# a call carries at most 64 MiB with the tracked tree, and the tree (15 MiB on 2026-12-02,
# docs/gpu's logs included) no longer leaves room for a 60 MiB part. So carry 40 MiB pieces
# instead, one call each:
#   here:  mkdir -p .te/q && cat .te/c?/part? | split -b 40M -d -a 1 - .te/q/q && \
#          for i in 0 1 2 3 4 5; do mkdir -p .te/q$i && mv .te/q/q$i .te/q$i/; done
#   there: mkdir -p /tmp/teparts && cp .te/qN/qN /tmp/teparts/   (N = 0..5, carrying .te/qN)
# and, where the tree has grown so that .te/rest (40 MiB with part4) and the binary no longer
# fit a call beside it, part4 as a seventh piece: mkdir -p .te/q6 && mv .te/rest/part4 .te/q6/q6.
# gpu_te_setup joins them back into part0..part3 (or takes part0..3 copied as before).
start=$(date +%s)
work="$out/work"
mkdir -p "$work"
summary="$out/$tag.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }
pack() {
  # The device returns files of at most 16 MiB: the exported scripts' value files and the
  # known clusters' example cases stay behind (a call of 2026-12-02c packed 284 MiB and lost
  # every report); if it is still too large, the reports, logs and summaries alone.
  tar czf "$out/$tag.tar.gz" -C "$work" --exclude='*.values.pt' --exclude='examples' --exclude='inflight' . 2>/dev/null
  if [ "$(stat -c %s "$out/$tag.tar.gz")" -gt $((15 * 1024 * 1024)) ]; then
    (cd "$work" && find . -maxdepth 1 -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.txt' \) -print0 |
      tar czf "$out/$tag.tar.gz" --null -T -) 2>/dev/null
    say "the whole work folder is over 15 MiB packed: $tag.tar.gz holds its reports, case logs and logs only"
  fi
  say "packed $(du -h "$out/$tag.tar.gz" | cut -f1) in $(($(date +%s) - start)) s"
}
trap pack EXIT

# gpu_te_setup: TE installed once per lease (install.sh is idempotent), its environment
# exported (PYTHONPATH, the machine torch's lib/, GRADFUZZ_PYTHON); with DRY_RUN=1 the
# project's .venv instead. Sets `python`.
gpu_te_setup() {
  if [ "${DRY_RUN:-0}" = 1 ]; then
    export PATH="$PWD/.venv/bin:$PATH"
    python="$PWD/.venv/bin/python"
    return 0
  fi
  if [ ! -f /tmp/teparts/part3 ] && [ -f /tmp/teparts/q0 ]; then
    (cd /tmp/teparts && cat q[0-5] | split -b 60M -d -a 1 - part)
  fi
  # The core wheel's last part may travel as a seventh piece (q6) where the tree with .te/rest,
  # part4 in it, and the binary would pass 64 MiB.
  [ -e .te/rest/part4 ] || { [ -f /tmp/teparts/q6 ] && ln -sf /tmp/teparts/q6 .te/rest/part4; }
  local i t0
  for i in 0 1 2 3; do
    [ -e ".te/c$i/part$i" ] || { [ -f "/tmp/teparts/part$i" ] && mkdir -p ".te/c$i" && ln -sf "/tmp/teparts/part$i" ".te/c$i/part$i"; }
  done
  t0=$(date +%s)
  if ! bash .te/rest/install.sh >"$work/te-install.log" 2>&1; then
    say "TE install failed: $(tail -5 "$work/te-install.log")"
    exit 1
  fi
  say "TE install: $(tail -1 "$work/te-install.log") ($(($(date +%s) - t0)) s)"
  export PYTHONPATH=/tmp/te-site
  # TE's install carries no byte code: without it every adapter compiles TE's Python when it
  # imports it (4.2 s of each te worker's start in a profile of 2026-12-02c). Once per lease.
  if [ ! -f /tmp/te-site/.gradfuzz-compiled ]; then
    t0=$(date +%s)
    python3 -m compileall -q -j 0 /tmp/te-site >/dev/null 2>&1 && touch /tmp/te-site/.gradfuzz-compiled
    say "TE byte code: $(($(date +%s) - t0)) s"
  fi
  local torchlib
  torchlib="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$torchlib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export GRADFUZZ_PYTHON=python3
  python=python3
}

# gpu_gradfuzz: the binary (GRADFUZZ, default build/tools/gradfuzz) as `gf`, checked to run.
gpu_gradfuzz() {
  export GRADFUZZ_ADAPTER_DIR="$PWD/adapter"
  gf="${GRADFUZZ:-$PWD/build/tools/gradfuzz}"
  "$gf" list faults >/dev/null || { say "gradfuzz does not run: $(ldd "$gf" | grep 'not found')"; exit 1; }
}
