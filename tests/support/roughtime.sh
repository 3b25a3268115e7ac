# Roughtime for tests: roughenough-server 2.2 on 127.0.0.1 with a key made
# for this run. Source common.sh first; needs the `bagel` binary built (its
# `time-check` is the readiness probe: a query verified with the key).
#   roughtime_start: installs if needed, starts, waits, and exports
#                    BAGEL_ROUGHTIME_ADDR (HOST:PORT) and BAGEL_ROUGHTIME_KEY
#                    (hex) for the tests. These names are read by the tests
#                    only; the binaries' own env vars are BAGEL_ROUGHTIME and
#                    BAGEL_ROUGHTIME_KEYS, so no other test picks Roughtime up
#                    by accident.
#   roughtime_stop:  stops it and removes the seed.

ROUGHENOUGH_VERSION=2.2.0

# The crate installs its server as `roughenough_server`; take one already on
# PATH under either spelling.
roughtime_bin() {
  local name
  for name in roughenough_server roughenough-server; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return
    fi
  done
  local root="$BAGEL_TOOLS/roughenough-$ROUGHENOUGH_VERSION"
  if [ ! -x "$root/bin/roughenough_server" ]; then
    log "installing roughenough-server $ROUGHENOUGH_VERSION into $root (cargo install, once)"
    cargo install --locked --quiet --root "$root" roughenough-server --version "$ROUGHENOUGH_VERSION" >&2 \
      || die "cargo install roughenough-server failed"
  fi
  echo "$root/bin/roughenough_server"
}

# A free UDP port on 127.0.0.1.
free_udp_port() {
  python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

roughtime_start() {
  local bin; bin=$(roughtime_bin)
  local bagel="$BAGEL_BIN_DIR/bagel"
  [ -x "$bagel" ] || die "$bagel not built; build the binaries before roughtime_start"
  ROUGHTIME_DIR=$(mktemp -d -t bagel-roughtime.XXXXXX)
  # The 2.2 server reads a 32-byte seed (hex) and refuses a seed file that
  # group or others can read.
  (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$ROUGHTIME_DIR/seed")
  chmod 600 "$ROUGHTIME_DIR/seed"
  local port; port=$(free_udp_port)
  ROUGHTIME_LOG="$ROUGHTIME_DIR/server.log"
  "$bin" -i 127.0.0.1 -p "$port" -j 1 --seed-file "$ROUGHTIME_DIR/seed" >"$ROUGHTIME_LOG" 2>&1 &
  ROUGHTIME_PID=$!
  # It logs its long-term public key at start: "Long term public key: PUBK(<hex>)".
  wait_until 30 "roughenough_server key line in $ROUGHTIME_LOG" grep -q 'Long term public key: PUBK(' "$ROUGHTIME_LOG"
  local key
  key=$(sed -n 's/.*Long term public key: PUBK(\([0-9a-f]\{64\}\)).*/\1/p' "$ROUGHTIME_LOG" | head -n1)
  [ -n "$key" ] || die "no public key in $ROUGHTIME_LOG: $(cat "$ROUGHTIME_LOG")"
  export BAGEL_ROUGHTIME_ADDR="127.0.0.1:$port"
  export BAGEL_ROUGHTIME_KEY="$key"
  # Ready when a query verifies with that key.
  wait_until 30 "Roughtime on $BAGEL_ROUGHTIME_ADDR" \
    "$bagel" time-check --roughtime "$BAGEL_ROUGHTIME_ADDR" --roughtime-key "$BAGEL_ROUGHTIME_KEY"
  log "Roughtime ready at $BAGEL_ROUGHTIME_ADDR, key $BAGEL_ROUGHTIME_KEY"
}

roughtime_stop() {
  if [ -n "${ROUGHTIME_PID:-}" ]; then kill "$ROUGHTIME_PID" 2>/dev/null; wait "$ROUGHTIME_PID" 2>/dev/null || true; ROUGHTIME_PID=; fi
  if [ -n "${ROUGHTIME_DIR:-}" ]; then rm -rf "$ROUGHTIME_DIR"; ROUGHTIME_DIR=; fi
}
