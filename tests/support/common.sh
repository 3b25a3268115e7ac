# Shared helpers for tests/run.sh and bench scripts. Source it; do not run it.
# Every service is started on 127.0.0.1 only, waited for by a readiness
# probe (never a fixed sleep), and stopped by the caller's trap.

# Where installed tools and venvs are cached between runs.
: "${BAGEL_TOOLS:=${XDG_CACHE_HOME:-$HOME/.cache}/bagel-tools}"
mkdir -p "$BAGEL_TOOLS"

# Where the workspace's debug binaries are (the readiness probes use them).
: "${BAGEL_BIN_DIR:=${CARGO_TARGET_DIR:-target}/debug}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

# A free TCP port on 127.0.0.1 (the kernel picks it; a tiny race is possible
# between closing the probe socket and the service binding it).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_until TIMEOUT_S DESCRIPTION CMD...: polls CMD until it succeeds.
wait_until() {
  local timeout=$1 what=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then die "$what not ready after ${timeout}s"; fi
    sleep 0.1
  done
}

# Debian packages, installed once.
apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  ((${#missing[@]} == 0)) && return 0
  log "apt-get install ${missing[*]}"
  if [ -z "${BAGEL_APT_UPDATED:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
    export BAGEL_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed"
}

# moto (the S3 server of tests and benches), pinned, in its own venv,
# installed once. Prints the venv's path.
MOTO_VERSION=5.2.5
moto_venv() {
  local venv="$BAGEL_TOOLS/venv-moto-$MOTO_VERSION"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import moto' 2>/dev/null; then
    log "installing moto[server]==$MOTO_VERSION into $venv"
    python3 -m venv "$venv" >&2 || die "python3 -m venv failed"
    "$venv/bin/pip" install -q "moto[server]==$MOTO_VERSION" >&2 || die "pip install moto failed"
  fi
  echo "$venv"
}
