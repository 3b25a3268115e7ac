# The deployment in deploy/ (deploy/README.md), checked. Source common.sh
# first; needs the binaries built.
#   deploy_checks: both checks below; any failure stops the run.
#     deploy_verify_unit: `systemd-analyze verify` of an instance of
#       deploy/systemd/bagel-server@.service (systemd installed with apt-get
#       if systemd-analyze is missing; the run stops if it is still
#       missing), with ExecStart pointed at the built bagel-server, since
#       verify checks that the binary exists. systemd-analyze only warns
#       about a misspelt directive or a value it cannot parse and exits 0,
#       so any line of its output that names the unit fails the check too;
#       and a copy of the unit with a misspelt directive must fail it, or
#       the check itself is broken.
#     deploy_cluster_check: members bagel-1..3 started as the unit starts
#       them (deploy/etc/bagel/server.env and bagel-N.env, --key in a state
#       directory, --server-id the member; on 127.0.0.1 with a 1 s max TTL);
#       deploy/etc/bagel/cluster.env filled in with the README's commands
#       (each member's key from `bagel server-info --json`, which must be
#       the key the server printed at start, as the journal shows it); with
#       that list names route to all three and one lease over them is
#       granted; a restarted member keeps its key, so the pinned list still
#       connects; adding bagel-4 with the README's list edits moves names
#       only to bagel-4, and a lease is granted while migrating and after.
#   deploy_stop: stops the servers deploy_cluster_check started (for the
#     trap).

DEPLOY_UNIT=deploy/systemd/bagel-server@.service

deploy_checks() {
  deploy_verify_unit
  deploy_cluster_check
}

# deploy_verify UNIT_FILE: verifies the instance bagel-1 of UNIT_FILE, with
# ExecStart on the built binary. Prints what systemd-analyze said and
# returns 1 if it exited non-zero or any line names the unit.
deploy_verify() {
  local unit=$1 server dir out rc=0
  server=$(realpath "$BAGEL_BIN_DIR/bagel-server") || die "no bagel-server in $BAGEL_BIN_DIR: build it first"
  dir=$(mktemp -d -t bagel-unit.XXXXXX)
  sed "s|^ExecStart=/usr/local/bin/bagel-server |ExecStart=$server |" "$unit" >"$dir/bagel-server@.service"
  if ! grep -q "^ExecStart=$server " "$dir/bagel-server@.service"; then
    rm -rf "$dir"
    die "$unit: no 'ExecStart=/usr/local/bin/bagel-server ' line to point at the built binary"
  fi
  out=$(cd "$dir" && systemd-analyze verify ./bagel-server@bagel-1.service 2>&1) || rc=$?
  rm -rf "$dir"
  if ((rc != 0)) || grep -q 'bagel-server@' <<<"$out"; then
    printf '%s\n' "systemd-analyze verify exited $rc:" "$out"
    return 1
  fi
}

deploy_verify_unit() {
  command -v systemd-analyze >/dev/null 2>&1 || apt_install systemd
  command -v systemd-analyze >/dev/null 2>&1 || die "systemd-analyze is missing after apt-get install systemd"
  local findings
  findings=$(deploy_verify "$DEPLOY_UNIT") || die "$DEPLOY_UNIT: $findings"
  log "$DEPLOY_UNIT: systemd-analyze verify clean ($(systemd-analyze --version | head -1))"

  # The check must catch what systemd-analyze only warns about.
  local broken; broken=$(mktemp -t bagel-unit-broken.XXXXXX)
  sed 's/^NoNewPrivileges=/NoNewPrivilege=/' "$DEPLOY_UNIT" >"$broken"
  grep -q '^NoNewPrivilege=' "$broken" || die "$DEPLOY_UNIT: no NoNewPrivileges= line to misspell"
  if findings=$(deploy_verify "$broken"); then
    rm -f "$broken"
    die "a unit with a misspelt directive passed the check"
  fi
  rm -f "$broken"
  grep -q "Unknown key 'NoNewPrivilege'" <<<"$findings" || die "the misspelt unit failed for another reason: $findings"
  log "a misspelt directive fails the check"
}

DEPLOY_PIDS=()

# deploy_member_start ID LISTEN: bagel-server as bagel-server@ID.service
# runs it, with the example env files, on LISTEN.
deploy_member_start() {
  local id=$1 listen=$2
  mkdir -p "$DEPLOY_DIR/$id"
  (
    set -a
    . deploy/etc/bagel/server.env
    if [ -f "deploy/etc/bagel/$id.env" ]; then . "deploy/etc/bagel/$id.env"; fi
    set +a
    # Local addresses, and a start that waits 1.5 s rather than 10.5 s.
    export BAGEL_LISTEN=$listen BAGEL_HTTP=127.0.0.1:0 BAGEL_MAX_TTL=1s
    exec "$BAGEL_BIN_DIR/bagel-server" --key "$DEPLOY_DIR/$id/key" --server-id "$id"
  ) >>"$DEPLOY_DIR/$id.out" 2>>"$DEPLOY_DIR/$id.err" &
  DEPLOY_PIDS+=("$!")
  eval "DEPLOY_PID_${id//-/_}=$!"
}

deploy_ready() {
  "$BAGEL_BIN_DIR/bagel" --server "$1" server-info --json 2>/dev/null | jq -e '.ready == true' >/dev/null
}

# deploy_key URL: the member's public key, as deploy/README.md reads it.
deploy_key() {
  "$BAGEL_BIN_DIR/bagel" --server "$1" server-info --json | jq -r '.keys[0].ed25519_hex'
}

# deploy_bagel ARGS...: the CLI with the client list loaded as the README
# loads it.
deploy_bagel() {
  (set -a; . "$DEPLOY_DIR/cluster.env"; set +a; "$BAGEL_BIN_DIR/bagel" "$@")
}

# deploy_members JSON: the distinct members of `bagel route --json`.
deploy_members() {
  jq -r '[.[].member] | unique | join(" ")' <<<"$1"
}

deploy_cluster_check() {
  command -v jq >/dev/null 2>&1 || apt_install jq
  DEPLOY_DIR=$(mktemp -d -t bagel-deploy.XXXXXX)
  local i url key printed
  declare -A urls
  cp deploy/etc/bagel/cluster.env "$DEPLOY_DIR/cluster.env"
  for i in 1 2 3 4; do
    urls[$i]="127.0.0.1:$(free_port)"
    # The example's addresses become local ones.
    sed -i "s|http://192.0.2.1$i:7420|http://${urls[$i]}|" "$DEPLOY_DIR/cluster.env"
    deploy_member_start "bagel-$i" "${urls[$i]}"
  done
  for i in 1 2 3 4; do
    wait_until 30 "bagel-$i ready" deploy_ready "http://${urls[$i]}"
  done

  # deploy/README.md, "Write the server list".
  for i in 1 2 3; do
    key=$(deploy_key "http://${urls[$i]}")
    sed -i "s/KEY_OF_BAGEL_$i/$key/" "$DEPLOY_DIR/cluster.env"
    printed=$(sed -n 's/^public key \([0-9a-f]*\) .*/\1/p' "$DEPLOY_DIR/bagel-$i.out" | tail -1)
    [ "$key" = "$printed" ] || die "bagel-$i: server-info says key $key, its start printed $printed"
  done
  if grep -q "#KEY_OF_" "$DEPLOY_DIR/cluster.env"; then die "cluster.env: a KEY_OF_ placeholder is left"; fi

  local names=() n
  for n in $(seq 1 24); do names+=("tenant-$n"); done
  local route members
  route=$(deploy_bagel route "${names[@]}" --json) || die "bagel route with cluster.env failed"
  members=$(deploy_members "$route")
  [ "$members" = "bagel-1 bagel-2 bagel-3" ] || die "24 names route to members '$members', not to all three"
  deploy_bagel server-info >/dev/null || die "bagel server-info with the pinned list failed"
  deploy_bagel acquire --ttl 1s --owner deploy-check "${names[@]}" --json >"$DEPLOY_DIR/lease.json" ||
    die "a lease over all three members was refused"
  deploy_bagel release --lease "$DEPLOY_DIR/lease.json" >/dev/null || die "bagel release failed"

  # Restart one member: it keeps its key, so the pinned list connects.
  local before after
  before=$(deploy_key "http://${urls[2]}")
  kill "$DEPLOY_PID_bagel_2"; wait "$DEPLOY_PID_bagel_2" 2>/dev/null || true
  deploy_member_start bagel-2 "${urls[2]}"
  wait_until 30 "bagel-2 ready after its restart" deploy_ready "http://${urls[2]}"
  after=$(deploy_key "http://${urls[2]}")
  [ "$before" = "$after" ] || die "bagel-2 came back with key $after, not $before"
  deploy_bagel server-info >/dev/null || die "the pinned list refused bagel-2 after its restart"
  log "deploy: bagel-2 restarted with its key ($after)"

  # deploy/README.md, "Add a member": the next list, then the final one.
  local key4; key4=$(deploy_key "http://${urls[4]}")
  (
    . "$DEPLOY_DIR/cluster.env"
    echo "BAGEL_NEXT_SERVERS=\"$BAGEL_SERVERS,bagel-4=http://${urls[4]}#$key4\""
  ) >>"$DEPLOY_DIR/cluster.env"
  local migrating moved
  migrating=$(deploy_bagel route "${names[@]}" --json) || die "bagel route while migrating failed"
  moved=$(jq '[.[] | select(.next_member != .member)] | length' <<<"$migrating")
  ((moved > 0)) || die "adding bagel-4 moved none of 24 names"
  jq -e 'all(.[]; .next_member == .member or .next_member == "bagel-4")' <<<"$migrating" >/dev/null ||
    die "adding bagel-4 moved a name between the old members: $migrating"
  deploy_bagel acquire --ttl 1s --owner deploy-check "${names[@]}" --json >"$DEPLOY_DIR/lease.json" ||
    die "a lease while migrating was refused"
  deploy_bagel release --lease "$DEPLOY_DIR/lease.json" >/dev/null || die "bagel release while migrating failed"
  sed -i -e '/^BAGEL_SERVERS=/d' -e 's/^BAGEL_NEXT_SERVERS=/BAGEL_SERVERS=/' "$DEPLOY_DIR/cluster.env"
  route=$(deploy_bagel route "${names[@]}" --json) || die "bagel route after the migration failed"
  members=$(deploy_members "$route")
  [ "$members" = "bagel-1 bagel-2 bagel-3 bagel-4" ] || die "after adding bagel-4, names route to '$members'"
  jq -e 'all(.[]; has("next_member") | not)' <<<"$route" >/dev/null || die "still migrating after the last step"
  deploy_bagel acquire --ttl 1s --owner deploy-check "${names[@]}" --json >"$DEPLOY_DIR/lease.json" ||
    die "a lease over four members was refused"
  log "deploy: bagel-4 added ($moved of 24 names moved to it)"
  deploy_stop
}

deploy_stop() {
  local pid
  for pid in "${DEPLOY_PIDS[@]}"; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  DEPLOY_PIDS=()
  if [ -n "${DEPLOY_DIR:-}" ]; then rm -rf "$DEPLOY_DIR"; DEPLOY_DIR=; fi
}
