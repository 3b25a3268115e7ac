# The JavaScript client example, tested against the real bagel-server.
# Source common.sh and python.sh first (it starts its servers with
# py_server_start, so the caller's py_server_stop cleans up after it too);
# needs the binaries built.
#   js_tests: installs Node and npm if either is missing (Debian's nodejs and
#             npm), the pinned packages of examples/js/package-lock.json into
#             examples/js/node_modules (npm ci, once per lock file), then,
#             against a fresh server on 127.0.0.1, runs
#             examples/js/bagel_client.js: acquire, renew, a rival's conflict
#             details decoded, a Merkle-batched Batch, release, every witness
#             signature verified with Node's crypto; and once more with a
#             wrong --key, which must fail. Any failure stops the run.

JS_DIR=examples/js

js_install() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
  fi
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
    || die "node and npm are needed for examples/js (Debian: apt-get install nodejs npm)"
  node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' \
    || die "node $(node --version) is too old for examples/js (needs 18 or later)"
  local hash; hash=$(sha256sum "$JS_DIR/package-lock.json" | cut -c1-12)
  local stamp="$JS_DIR/node_modules/.bagel-lock-$hash"
  if [ ! -f "$stamp" ]; then
    log "installing the JavaScript client's packages (npm ci) into $JS_DIR/node_modules"
    # No install scripts: none of the pinned packages needs one.
    (cd "$JS_DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2 \
      || die "npm ci in $JS_DIR failed"
    touch "$stamp"
  fi
  (cd "$JS_DIR" && node -e 'require("@grpc/grpc-js"); require("@grpc/proto-loader"); require("protobufjs")') \
    || die "the JavaScript client's packages are missing from $JS_DIR/node_modules"
}

js_tests() {
  declare -F py_server_start >/dev/null || die "source tests/support/python.sh before js_tests"
  js_install

  log "JavaScript client example (acquire, renew, conflict details, batch, release; witnesses verified in Node)"
  py_server_start
  node "$JS_DIR/bagel_client.js" --server "$PY_GRPC" --key "$PY_KEY" || die "$JS_DIR/bagel_client.js failed"

  log "JavaScript client example with a wrong --key: must fail"
  local wrong; wrong=$(printf '%064d' 1)
  local out rc=0
  out=$(node "$JS_DIR/bagel_client.js" --server "$PY_GRPC" --key "$wrong" 2>&1) || rc=$?
  [ "$rc" = 1 ] && grep -q 'does not announce the pinned key' <<<"$out" \
    || die "$JS_DIR/bagel_client.js with a wrong key: exit $rc, expected 1 and a refusal: $out"
  py_server_stop
}
