#!/usr/bin/env bash
# Set up the sandbox engines for the test suite, or tear them down.
#   sandbox/engine.sh start   install docker.io + bubblewrap (as root, with apt), start a
#                             private dockerd; prints the DOCKER_HOST line to export
#   sandbox/engine.sh stop    stop that dockerd by its pid, if this run started it
# A DOCKER_HOST (or private dockerd) that already answers is used as it is and never stopped.
# Where nothing can be installed or started, it says so loudly and exits 0:
# the docker tests then skip with that reason, the bwrap ones run if they can.
set -u
STATE=${TRACE_GYM_DOCKERD_STATE:-/tmp/trace-gym-dockerd}
SOCK="unix://$STATE/docker.sock"
say() { echo "sandbox/engine.sh: $*" >&2; }

answers() { DOCKER_HOST="$1" timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

install_missing() {
  local missing=()
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  command -v dockerd >/dev/null || missing+=(docker.io)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "WARNING: ${missing[*]} missing and cannot be installed here (needs root and apt-get)"
    return 0
  fi
  say "installing ${missing[*]} with apt-get"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null 2>&1 \
    || say "WARNING: apt-get install ${missing[*]} failed"
}

start() {
  install_missing
  if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then echo "export DOCKER_HOST=$DOCKER_HOST"; return 0; fi
  if answers "$SOCK"; then echo "export DOCKER_HOST=$SOCK"; return 0; fi
  if ! command -v dockerd >/dev/null || [ "$(id -u)" != 0 ]; then
    say "WARNING: no Docker engine can be started here (dockerd missing or not root); docker tests will skip"
    return 0
  fi
  mkdir -p "$STATE"
  # No network for containers (they run with --network none), so no bridge and no iptables.
  nohup dockerd --data-root "$STATE/data" --exec-root "$STATE/exec" --pidfile "$STATE/docker.pid" \
    -H "$SOCK" --iptables=false --ip6tables=false --bridge=none >"$STATE/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    if answers "$SOCK"; then echo "export DOCKER_HOST=$SOCK TRACE_GYM_DOCKERD_OWNED=1"; return 0; fi
    sleep 0.5
  done
  say "WARNING: dockerd did not answer within 30 s; docker tests will skip. Its log ends:"
  tail -n 5 "$STATE/dockerd.log" >&2
  return 0
}

stop() {
  [ "${TRACE_GYM_DOCKERD_OWNED:-}" = 1 ] || return 0
  [ -f "$STATE/docker.pid" ] || return 0
  local pid; pid=$(cat "$STATE/docker.pid")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null
  return 0
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
