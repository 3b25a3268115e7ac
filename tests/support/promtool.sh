# /metrics of both side ports, linted by Prometheus's own tool. Source
# common.sh and python.sh first (it borrows py_server_start); needs the
# binaries built.
#   promtool_install: Debian's promtool (package prometheus), installed with
#                     apt-get if missing; stops the run if it is still missing.
#   metrics_lint:     `promtool check metrics` (parse and lint: HELP and TYPE
#                     of every family, counter and unit naming) on the
#                     default /metrics of a bagel-server that has granted,
#                     refused and batched, and of a `bagel metronome` that
#                     has closed bags. Any finding stops the run.
#   metrics_lint_stop: stops the metronome metrics_lint started (for the trap).

promtool_install() {
  command -v promtool >/dev/null 2>&1 || apt_install prometheus
  command -v promtool >/dev/null 2>&1 || die "promtool is missing after apt-get install prometheus"
  log "promtool: $(promtool --version 2>&1 | head -1)"
}

# promtool_check WHAT URL: lints the default answer of URL.
promtool_check() {
  local what=$1 url=$2 out findings
  out=$(curl -sf "$url") || die "$what: GET $url failed"
  if ! findings=$(promtool check metrics <<<"$out" 2>&1); then
    die "$what: promtool check metrics: $findings"
  fi
  log "$what: promtool check metrics clean ($(grep -c '^# TYPE' <<<"$out") families)"
}

metrics_lint() {
  promtool_install
  local bin_dir="${CARGO_TARGET_DIR:-target}/debug"

  # A server whose labelled series (by method, code, op) all have samples.
  py_server_start
  local server="http://$PY_GRPC" bagel="$bin_dir/bagel"
  "$bagel" --server "$server" acquire --ttl 5s --owner lint lint-a >/dev/null || die "bagel acquire failed"
  if "$bagel" --server "$server" acquire --ttl 5s --owner rival lint-a >/dev/null 2>&1; then
    die "a held name was granted twice"
  fi
  promtool_check bagel-server "http://$PY_HTTP/metrics"
  py_server_stop

  # A metronome that has closed bags of a log in a fresh directory.
  local store; store=$(mktemp -d -t bagel-lint-store.XXXXXX)
  local out; out=$(mktemp -t bagel-lint-metronome.XXXXXX)
  "$bagel" --unsafe-local-clock metronome --store "file://$store" --log lint \
    --grace 200ms --lookback 3s --http 127.0.0.1:0 >"$out" 2>"$out.err" &
  LINT_METRONOME_PID=$!
  wait_until 30 "bagel metronome's http line" grep -q '^http on ' "$out"
  local http; http=$(sed -n 's/^http on //p' "$out" | head -1)
  # Ready once it has closed every due bag: its counters have samples.
  wait_until 30 "bagel metronome ready (/readyz)" curl -sf "http://$http/readyz"
  promtool_check "bagel metronome" "http://$http/metrics"
  metrics_lint_stop
  rm -rf "$store" "$out" "$out.err"
}

metrics_lint_stop() {
  if [ -n "${LINT_METRONOME_PID:-}" ]; then
    kill "$LINT_METRONOME_PID" 2>/dev/null; wait "$LINT_METRONOME_PID" 2>/dev/null || true; LINT_METRONOME_PID=
  fi
}
