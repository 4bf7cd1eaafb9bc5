# Sourced by ./run: installs the Debian packages and the Python environment the
# project needs. Re-runs only when this file or pyproject.toml/setup.py change.
DEBIAN_PACKAGES="iptables iproute2 openssl nginx-light procps wrk prometheus chromium chromium-driver nghttp2-client gcc"

stamp_input() { cat dev/setup.sh pyproject.toml setup.py proto/*.proto proto/generate.py 2>/dev/null | sha256sum | cut -c1-16; }

_missing_debs() {
  local p missing=""
  for p in $DEBIAN_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
  echo "$missing"
}

_setup() {
  local want; want=$(stamp_input)
  if [ -x .venv/bin/tether ] && [ "$(cat .stamp-setup 2>/dev/null)" = "$want" ] && [ -z "$(_missing_debs)" ]; then
    return 0
  fi
  local missing; missing=$(_missing_debs)
  if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
  local py; py=$(command -v python3.11 || command -v python3)
  if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv 2>/dev/null || {
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && "$py" -m venv .venv; }
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  echo "$want" > .stamp-setup
}
_setup
# The proxy's hot modules compiled with mypyc (src/tether/proxy/native.py); a no-op when the build matches the
# sources or TETHER_PURE_PYTHON is set.
.venv/bin/python dev/build_native.py
