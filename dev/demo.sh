#!/usr/bin/env bash
# The main job, run by `./run demo`: the most end-to-end path Tether has today.
# It uses a fresh state directory so it never touches an existing ~/.tether.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export TETHER_HOME="${TETHER_DEMO_HOME:-$(mktemp -d /tmp/tether-demo.XXXXXX)}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "state directory: $TETHER_HOME"
tether version

step "apply the emojivoto manifests (Linkerd's own resource kinds, unchanged)"
tether apply -f examples/emojivoto

step "what the store holds"
tether get svc -n emojivoto -o wide
tether get deploy,sp -A
tether get server -n emojivoto

step "the ServiceProfile comes back with nothing lost"
tether get sp web-svc.emojivoto.svc.cluster.local -n emojivoto -o yaml

step "re-applying is a no-op"
tether apply -f examples/emojivoto
