#!/usr/bin/env bash
# What the report tests need beyond the build (scripts/setup.sh): headless Chromium for the
# HTML report test and Slurm with MUNGE for the nightly Slurm recipe's end-to-end test.
# Idempotent and quick on a ready machine (a dpkg query and a munge round trip).
#   scripts/ci-deps.sh          install the Debian packages if missing, then `munge` below
#   scripts/ci-deps.sh munge    only make sure munged runs (a key exists, a credential
#                               round-trips); the Slurm test calls this itself
# Needs root (or sudo) to install packages and start munged.
set -euo pipefail

debs=(chromium slurm-wlm munge)

log() { printf '[ci-deps] %s\n' "$*" >&2; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

install_packages() {
  local missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    as_root mkdir -p /etc/munge
    as_root dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    as_root chown munge:munge /etc/munge/munge.key
    as_root chmod 0400 /etc/munge/munge.key
  fi
  as_root mkdir -p /run/munge
  as_root chown munge:munge /run/munge
  log "starting munged"
  # As the munge user, as the package's service does; works without systemd (containers).
  as_root runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  log "munged does not answer: munge -n | unmunge fails"
  exit 1
}

case "${1:-all}" in
  all)
    install_packages
    ensure_munge
    ;;
  munge) ensure_munge ;;
  *)
    log "unknown step '$1' (all or munge)"
    exit 2
    ;;
esac
