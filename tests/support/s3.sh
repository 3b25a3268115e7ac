# S3 for tests and benches: moto 5.2.5 in its own venv, served one request at
# a time (see s3_server.py). Source common.sh first.
#   s3_start: installs if needed, starts, waits, creates $BAGEL_S3_BUCKET, and
#             exports AWS_* so object_store's from_env finds the endpoint.
#   s3_stop:  stops it.

s3_start() {
  local venv; venv=$(moto_venv)
  local port; port=$(free_port)
  local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  # How to start another one (the fault-injection run starts its own, with
  # a journal, to kill and restart it).
  export BAGEL_S3_SERVER="$venv/bin/python $here/s3_server.py"
  S3_LOG=$(mktemp -t bagel-s3.XXXXXX.log)
  "$venv/bin/python" "$here/s3_server.py" 127.0.0.1 "$port" >"$S3_LOG" 2>&1 &
  S3_PID=$!
  export AWS_ENDPOINT="http://127.0.0.1:$port"
  export AWS_ENDPOINT_URL="$AWS_ENDPOINT"
  export AWS_ALLOW_HTTP=true
  export AWS_ACCESS_KEY_ID=bagel
  export AWS_SECRET_ACCESS_KEY=bagel-secret
  export AWS_REGION=us-east-1
  export AWS_DEFAULT_REGION=us-east-1
  export AWS_VIRTUAL_HOSTED_STYLE_REQUEST=false
  export BAGEL_S3_BUCKET=${BAGEL_S3_BUCKET:-bagel-test}
  wait_until 60 "S3 (moto) on $AWS_ENDPOINT" curl -sf "$AWS_ENDPOINT/moto-api/"
  curl -sf -X PUT "$AWS_ENDPOINT/$BAGEL_S3_BUCKET" >/dev/null || die "could not create bucket $BAGEL_S3_BUCKET"
  log "S3 ready at $AWS_ENDPOINT, bucket $BAGEL_S3_BUCKET"
}

s3_stop() {
  # `wait` returns the server's status (143 after SIGTERM); under `set -e`
  # in an EXIT trap that would become the script's exit status.
  if [ -n "${S3_PID:-}" ]; then kill "$S3_PID" 2>/dev/null; wait "$S3_PID" 2>/dev/null || true; S3_PID=; fi
}
