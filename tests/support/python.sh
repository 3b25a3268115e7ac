# Any-language clients, tested from Python against the real bagel-server.
# Source common.sh first; needs the binaries built.
#   python_tests: installs the pinned packages of examples/python/requirements.txt
#                 into a venv under $BAGEL_TOOLS (once), then, each against a
#                 fresh server on 127.0.0.1:
#                 * examples/python/bagel_client.py: acquire, renew, a batch,
#                   release, every witness signature verified in Python;
#                 * tests/python/reflection_test.py: discovery by v1alpha
#                   reflection (grpcio-reflection) and calls with no
#                   generated code;
#                 * tests/python/metrics_test.py: /metrics counter deltas of
#                   a known call sequence, parsed by prometheus-client.
#                 Any failure, or a missing package, stops the run.
#   python_package_tests: builds the `bagel` Python package (client/python)
#                 into a wheel with maturin from PyPI (no system protoc),
#                 installs it into a venv, and runs its pytest suite against
#                 the real server, the S3 and Roughtime services s3_start
#                 and roughtime_start exported, and a directory store; the
#                 suite also checks the gRPC modules the package ships
#                 (bagel.v1) against proto/ and runs
#                 examples/python/bagel_client.py with the wheel installed.

python_venv() {
  local reqs=examples/python/requirements.txt
  local hash; hash=$(sha256sum "$reqs" | cut -c1-12)
  PY_VENV="$BAGEL_TOOLS/venv-python-client-$hash"
  if [ ! -x "$PY_VENV/bin/python" ] \
    || ! "$PY_VENV/bin/python" -c 'import grpc, grpc_tools, grpc_reflection, grpc_status, nacl, prometheus_client' 2>/dev/null; then
    log "installing the Python client's packages into $PY_VENV"
    rm -rf "$PY_VENV"
    python3 -m venv "$PY_VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$PY_VENV/bin/pip" install -q -r "$reqs" >&2 || die "pip install -r $reqs failed"
  fi
  "$PY_VENV/bin/python" -c 'import grpc, grpc_tools, grpc_reflection, grpc_status, nacl, prometheus_client' \
    || die "the Python client's packages are missing from $PY_VENV"
}

# py_server_start: a bagel-server granting at once, with the HTTP side port;
# sets PY_GRPC, PY_HTTP, PY_KEY, PY_SERVER_PID.
py_server_start() {
  local bin="${CARGO_TARGET_DIR:-target}/debug/bagel-server"
  [ -x "$bin" ] || die "$bin not built; build the binaries before python_tests"
  PY_SERVER_OUT=$(mktemp -t bagel-py-server.XXXXXX)
  "$bin" --listen 127.0.0.1:0 --http 127.0.0.1:0 --unsafe-skip-restart-wait \
    >"$PY_SERVER_OUT" 2>"$PY_SERVER_OUT.err" &
  PY_SERVER_PID=$!
  wait_until 30 "bagel-server's start-up lines" grep -q ' listening on ' "$PY_SERVER_OUT"
  PY_GRPC=$(sed -n 's/.* listening on \([0-9.:]*\),.*/\1/p' "$PY_SERVER_OUT")
  PY_HTTP=$(sed -n 's/^http on \([0-9.:]*[0-9]\):.*/\1/p' "$PY_SERVER_OUT")
  PY_KEY=$(sed -n 's/^public key \([0-9a-f]*\) .*/\1/p' "$PY_SERVER_OUT")
  [ -n "$PY_GRPC" ] && [ -n "$PY_HTTP" ] && [ -n "$PY_KEY" ] \
    || die "could not read bagel-server's addresses: $(cat "$PY_SERVER_OUT")"
  wait_until 30 "bagel-server ready (/readyz)" curl -sf "http://$PY_HTTP/readyz"
}

py_server_stop() {
  if [ -n "${PY_SERVER_PID:-}" ]; then kill "$PY_SERVER_PID" 2>/dev/null; wait "$PY_SERVER_PID" 2>/dev/null || true; PY_SERVER_PID=; fi
  rm -f "${PY_SERVER_OUT:-}" "${PY_SERVER_OUT:-}.err"
}

python_tests() {
  python_venv
  local py="$PY_VENV/bin/python"
  export PYTHONDONTWRITEBYTECODE=1

  log "Python client example (acquire, renew, batch, release; witnesses verified in Python)"
  py_server_start
  "$py" examples/python/bagel_client.py --server "$PY_GRPC" --key "$PY_KEY" || die "examples/python/bagel_client.py failed"
  py_server_stop

  log "Python: discovery by gRPC reflection (v1alpha) and calls without generated code"
  py_server_start
  "$py" tests/python/reflection_test.py --server "$PY_GRPC" --key "$PY_KEY" || die "tests/python/reflection_test.py failed"
  py_server_stop

  log "Python: /metrics counter deltas, parsed by prometheus-client"
  py_server_start
  "$py" tests/python/metrics_test.py --server "$PY_GRPC" --http "$PY_HTTP" || die "tests/python/metrics_test.py failed"
  py_server_stop
}

# The venv of the `bagel` package's build, tests and bench: the example's
# packages plus maturin, pytest and redis-py; sets PKG_VENV.
python_package_venv() {
  local reqs=client/python/requirements-dev.txt base=examples/python/requirements.txt
  local hash; hash=$(cat "$base" "$reqs" | sha256sum | cut -c1-12)
  PKG_VENV="$BAGEL_TOOLS/venv-python-package-$hash"
  if [ ! -x "$PKG_VENV/bin/maturin" ] || ! "$PKG_VENV/bin/python" -c 'import pytest, redis, grpc' 2>/dev/null; then
    log "installing maturin, pytest and the bench's packages into $PKG_VENV"
    rm -rf "$PKG_VENV"
    python3 -m venv "$PKG_VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$PKG_VENV/bin/pip" install -q -r "$base" -r "$reqs" >&2 || die "pip install -r $reqs failed"
  fi
}

# Builds the wheel (debug profile, in the workspace's target directory, so
# it reuses the workspace build) and installs it into PKG_VENV.
python_package_install() {
  python_package_venv
  local out; out=$(mktemp -d -t bagel-wheel.XXXXXX)
  log "building the bagel wheel (maturin)"
  (cd client/python && "$PKG_VENV/bin/maturin" build --locked --interpreter "$PKG_VENV/bin/python" --out "$out") >&2 \
    || die "maturin build failed"
  "$PKG_VENV/bin/pip" install -q --force-reinstall --no-deps "$out"/bagel-*.whl >&2 || die "installing the bagel wheel failed"
  rm -rf "$out"
}

python_package_tests() {
  python_package_install
  log "Python package: pytest client/python/tests (leases, leader failover, bags, the CLI on one log)"
  PYTHONDONTWRITEBYTECODE=1 "$PKG_VENV/bin/python" -m pytest -q -p no:cacheprovider client/python/tests \
    || die "the bagel Python package's tests failed"
}
