#!/usr/bin/env bash
# The main job, run by `./run demo`: the control plane up on the local platform,
# emojivoto deployed meshed, and a live view of what its proxies see -- success
# rate, requests per second, latency p50/p95/p99 and which connections are mTLS.
#
# On a terminal it runs until Ctrl-C and leaves the demo running (it says how to
# stop it). Without a terminal, or with CI=true, it shows the view for
# $TETHER_DEMO_DURATION seconds (default 30), checks that traffic flowed over
# mTLS, and removes everything it made (`tether down --purge`).
#
# Settings (environment):
#   TETHER_DEMO_HOME          state directory          (default ~/.tether-demo; never ~/.tether)
#   TETHER_DEMO_PREFIX        pod namespace/veth prefix (default tdemo; bridge <prefix>0)
#   TETHER_DEMO_POD_CIDR      pod range                 (default 10.215.0.0/24)
#   TETHER_DEMO_SERVICE_CIDR  service range             (default 10.216.0.0/24)
#   TETHER_DEMO_DURATION      seconds of live view when not interactive (default 30)
#   TETHER_DEMO_INTERACTIVE   1 or 0 to force either mode
#   TETHER_DEMO_PROMETHEUS_PORT  viz's Prometheus, on 127.0.0.1 (default 9091)
#   TETHER_DEMO_DISCOVERY_PORT   viz's discovery admin, on 127.0.0.1 (default 9999)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export TETHER_HOME="${TETHER_DEMO_HOME:-$HOME/.tether-demo}"
PREFIX="${TETHER_DEMO_PREFIX:-tdemo}"
POD_CIDR="${TETHER_DEMO_POD_CIDR:-10.215.0.0/24}"
SERVICE_CIDR="${TETHER_DEMO_SERVICE_CIDR:-10.216.0.0/24}"
DURATION="${TETHER_DEMO_DURATION:-30}"
NS=emojivoto

if [ -n "${TETHER_DEMO_INTERACTIVE:-}" ]; then
  INTERACTIVE=$TETHER_DEMO_INTERACTIVE
elif [ -t 0 ] && [ -t 1 ] && [ "${CI:-}" != "true" ]; then
  INTERACTIVE=1
else
  INTERACTIVE=0
fi

bold() { if [ -t 1 ]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }
step() { printf '\n'; bold "== $*"; }
fail() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] ||
  fail "needs root: the local platform makes network namespaces and iptables rules (try sudo ./run demo)"

STARTED=0
FRESH_HOME=0
[ -e "$TETHER_HOME" ] || FRESH_HOME=1

stop_hint() {
  local url
  url=$(tether get pods -n "$NS" -o json 2>/dev/null | python demo/checks.py web-url 2>/dev/null || true)
  cat <<EOF

The demo is still running.${url:+ Vote in a browser on this machine: $url}
Look around:
  export TETHER_HOME=$TETHER_HOME PATH=$ROOT/.venv/bin:\$PATH
  tether get pods -n $NS -o wide
  tether viz stat deploy -n $NS -w        # the live view again (from Prometheus)
  tether viz stat po -n $NS -o wide       # per pod, with byte rates and the mTLS share
  tether viz edges deploy -n $NS -o wide  # who talks to whom, with both identities
  tether viz dashboard                    # the web UI, on http://localhost:50750/ (live tap at the bottom)
  tether viz tap deploy/web -n $NS        # web's requests, live, as its proxy sees them (Ctrl-C ends it)
  tether logs -n $NS deploy/vote-bot -f   # the traffic generator's tally
  tether logs -n $NS deploy/web -c proxy  # web's proxy

Stop it and remove every namespace, veth, bridge and rule it made:
  sudo TETHER_HOME=$TETHER_HOME $ROOT/.venv/bin/tether down --purge
EOF
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$STARTED" = 1 ]; then
    if [ "$INTERACTIVE" = 1 ]; then
      stop_hint
    else
      step "stop: tether down --purge"
      tether down --purge || rc=1
      local left
      left=$( { ip -o netns list; ip -o link show; } 2>/dev/null | grep -E "(^|: )$PREFIX" || true)
      if [ -n "$left" ]; then
        printf 'demo: left behind:\n%s\n' "$left" >&2
        rc=1
      else
        echo "nothing left behind: no $PREFIX-* namespace, veth or bridge"
      fi
      if [ "$FRESH_HOME" = 1 ]; then rm -rf "$TETHER_HOME"; fi
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$INTERACTIVE" = 1 ]; then MODE="interactive: until Ctrl-C"; else MODE="non-interactive: ${DURATION}s, then cleaned up"; fi
step "state directory: $TETHER_HOME ($MODE)"
tether version

step "control plane: tether up (identity, destination, pod controller)"
STARTED=1
tether up --prefix "$PREFIX" --bridge "${PREFIX}0" --pod-cidr "$POD_CIDR" --service-cidr "$SERVICE_CIDR"

step "viz: Prometheus (loopback only) scraping every proxy, with Linkerd's scrape configuration"
tether viz install --prometheus-port "${TETHER_DEMO_PROMETHEUS_PORT:-9091}" --discovery-port \
  "${TETHER_DEMO_DISCOVERY_PORT:-9999}" --scrape-interval 2s

step "deploy emojivoto, meshed (namespace annotated linkerd.io/inject: enabled)"
python demo/render.py | tether apply -f -

step "waiting for the pods (app + linkerd-proxy each)"
# "<ready> <total> <summary>" for the namespace's pods.
pod_summary() { tether get pods -n "$NS" -o json 2>/dev/null | python demo/checks.py pods; }
deadline=$((SECONDS + 180))
last=""
while :; do
  read -r ready total summary <<<"$(pod_summary)"
  line="  $ready/$total ready: $summary"
  if [ -t 1 ]; then
    printf '\r\033[K%s' "$line"
  elif [ "$line" != "$last" ]; then
    echo "$line"
  fi
  last=$line
  if [ "$total" -ge 4 ] && [ "$ready" = "$total" ]; then
    [ -t 1 ] && echo
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    [ -t 1 ] && echo
    tether get pods -n "$NS" -o wide || true
    for deploy in emoji voting web vote-bot; do
      echo "--- $deploy (app, last lines)"; tether logs -n "$NS" "deploy/$deploy" --tail 5 2>&1 || true
      echo "--- $deploy (proxy, last lines)"; tether logs -n "$NS" "deploy/$deploy" -c proxy --tail 5 2>&1 || true
    done
    fail "the pods were not ready within 180s"
  fi
  sleep 1
done
tether get pods -n "$NS" -o wide

step "live: per workload, from Prometheus (inbound): success rate, RPS, latency, TCP connections, mTLS"
echo "(vote-bot calls web; web calls emoji and voting over gRPC; votes for :doughnut: fail on purpose)"
sleep 5  # a few scrapes before the first frame
if [ "$INTERACTIVE" = 1 ]; then
  # Ctrl-C ends the view (tether exits 0 on it), then the script goes on to say how to stop.
  trap ':' INT  # a handled (not ignored) INT: tether gets it, this script carries on
  tether viz stat deploy -n "$NS" -w -o wide -t 30s || true
  trap 'exit 130' INT
  exit 0
fi

rc=0
timeout -s INT "$DURATION" tether viz stat deploy -n "$NS" -w -o wide -t 30s --interval 5 || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 124 ] || fail "tether viz stat failed (exit $rc)"

step "check: traffic flowed between the meshed workloads over mTLS"
tether logs -n "$NS" deploy/vote-bot --tail 3
python demo/checks.py traffic <(tether viz stat deploy -n "$NS" -o json -t 30s) \
  <(tether viz edges deploy -n "$NS" -o json)
