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
#       them, each with a folder for its host's /etc/bagel (server.env,
#       members, bagel-N.env installed as the README installs them) and
#       /var/lib: the unit's EnvironmentFile= lines read, its ExecStart=
#       run with %i, %S and /etc/bagel/ mapped there (--key in the state
#       directory, --server-id the member, --members-file the host's
#       members file; on 127.0.0.1 with a 1 s max TTL); each serves in the
#       members file's list (`bagel server-info --json`, .members);
#       deploy/etc/bagel/cluster.env filled in with the README's commands
#       (each member's key from `bagel server-info --json`, which must be
#       the key the server printed at start, as the journal shows it); with
#       that list names route to all three and one lease over them is
#       granted; a restarted member keeps its key, so the pinned list still
#       connects. Adding bagel-4 as the README says: (a) every member's
#       members file gets the next list and the unit's ExecReload= (kill
#       -HUP), and each member shows both lists (polled, bounded) with no
#       restart; (b) bagel-4 started with that file; (c) the clients' list
#       edits move names only to bagel-4, and a lease is granted while
#       migrating (a moved name by its old owner too); (d) every file's
#       next list becomes the list, a reload, each member shows it, the
#       old owner refuses the moved name (NAME_NOT_OWNED) and a lease over
#       four members is granted.
#     deploy_kubernetes_check: deploy/kubernetes rendered offline with
#       `kubectl kustomize` (Debian's kubernetes-client installed if no
#       kubectl is there): the base, overlays/example and the optional
#       ServiceMonitor, alone and added to the overlay as deploy/README.md
#       adds it. Every object validated against the Kubernetes API
#       schemas of the oldest and newest version we claim
#       (DEPLOY_K8S_VERSIONS) by kubernetes-validate --strict, a pinned PyPI
#       package that ships those schemas (kubeconform and kubeval are in
#       neither Debian, PyPI nor npm and download theirs; `kubectl
#       --dry-run=server` needs a cluster). A kind without a schema fails the check, except
#       the ServiceMonitor (a CRD), which the invariants check instead.
#       Then tests/support/k8s_invariants.py: ordinal = ID, the key on the
#       member's PVC, readiness = health on the side port, one member at a
#       time (rollout and PDB), the headless Service's SRV ports, flags
#       that `bagel-server --help` lists (no BAGEL_* variables), the
#       Containerfile's path and user, --members-file in the ConfigMap
#       bagel-members mounted whole (no subPath) and read-only, whose
#       lists (members, next-members) name exactly the pods
#       bagel-0..bagel-<replicas-1>. Copies broken on purpose (PDB
#       maxUnavailable 2, a renamed flag, a misspelt field, replicas
#       changed without the member list, the members file mounted by
#       subPath) must fail it. Last, the rendered command and args run the
#       built bagel-server as pod bagel-1 would (only addresses, the
#       volume's and the ConfigMap's places changed), as the pod's user
#       with a read-only root (unshare, setpriv), with the ConfigMap laid
#       out as the kubelet lays it out (keys linked through ..data): during
#       the restart wait /healthz is 200 while /readyz is 503 and a grant
#       is refused; then ready, serving in the ConfigMap's lists, a grant
#       of a name it owns writes the mark beside the key on the volume;
#       the ConfigMap updated as the kubelet updates it (a new folder,
#       ..data swapped) with a next list, and the member serves in both
#       lists with no restart (polled, bounded); a restart keeps the key
#       and waits again.
#   deploy_stop: stops the servers deploy_cluster_check and
#     deploy_kubernetes_check started (for the trap).

DEPLOY_UNIT=deploy/systemd/bagel-server@.service

deploy_checks() {
  deploy_verify_unit
  deploy_cluster_check
  deploy_kubernetes_check
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

# deploy_host ID: the folder that stands for member ID's host: its
# /etc/bagel is DIR/etc/bagel, its /var/lib (the unit's %S) DIR/var/lib.
deploy_host() { echo "$DEPLOY_DIR/host-$1"; }

# deploy_install ID: deploy/README.md's step 1 on member ID's host: the
# shared server.env and members, and the member's own env file.
deploy_install() {
  local etc; etc="$(deploy_host "$1")/etc/bagel"
  install -d "$etc"
  install -m 0644 deploy/etc/bagel/server.env deploy/etc/bagel/members "deploy/etc/bagel/$1.env" "$etc/"
}

# deploy_unit_value KEY: the values of the unit's KEY= lines, one a line.
deploy_unit_value() { sed -n "s/^$1=//p" "$DEPLOY_UNIT"; }

# deploy_member_start ID LISTEN: bagel-server as systemd starts
# bagel-server@ID.service on ID's host: the unit's EnvironmentFile= lines
# and ExecStart= (its %i, %S and /etc/bagel/ paths mapped into the host's
# folder, the binary the built one), on LISTEN.
deploy_member_start() {
  local id=$1 listen=$2 host cmd file argv=()
  host=$(deploy_host "$id")
  [ -d "$host/etc/bagel" ] || die "$id: its host has no /etc/bagel (deploy_install first)"
  cmd=$(deploy_unit_value ExecStart)
  cmd=${cmd//%S/$host/var/lib}
  cmd=${cmd//%i/$id}
  cmd=${cmd//\/etc\/bagel\//$host/etc/bagel/}
  cmd=${cmd/#\/usr\/local\/bin\/bagel-server /$BAGEL_BIN_DIR/bagel-server }
  case $cmd in
    "$BAGEL_BIN_DIR/bagel-server "*) ;;
    *) die "$DEPLOY_UNIT: ExecStart does not run /usr/local/bin/bagel-server: $cmd" ;;
  esac
  if grep -qE '%|(^| )/(etc|usr|var)/' <<<"$cmd"; then die "$DEPLOY_UNIT: ExecStart has a path or specifier the check does not map: $cmd"; fi
  read -ra argv <<<"$cmd"
  # StateDirectory=bagel/%i
  install -d -m 0700 "$host/var/lib/bagel/$id"
  (
    set -a
    while IFS= read -r file; do
      file=${file//%i/$id}
      case $file in
        -/etc/bagel/*) file="$host/etc/bagel/${file#-/etc/bagel/}"; if [ -f "$file" ]; then . "$file"; fi ;;
        /etc/bagel/*) file="$host/etc/bagel/${file#/etc/bagel/}"; . "$file" ;;
        *) die "$DEPLOY_UNIT: EnvironmentFile=$file is not in /etc/bagel" ;;
      esac
    done < <(deploy_unit_value EnvironmentFile)
    set +a
    # Local addresses, and a start that waits 1.5 s rather than 10.5 s.
    export BAGEL_LISTEN=$listen BAGEL_HTTP=127.0.0.1:0 BAGEL_MAX_TTL=1s
    exec "${argv[@]}"
  ) >>"$DEPLOY_DIR/$id.out" 2>>"$DEPLOY_DIR/$id.err" &
  DEPLOY_PIDS+=("$!")
  eval "DEPLOY_PID_${id//-/_}=$!"
}

# deploy_member_reload ID: `systemctl reload bagel-server@ID`, that is the
# unit's ExecReload= with $MAINPID the member's process.
deploy_member_reload() {
  local id=$1 pid cmd argv=()
  pid=$(eval "echo \$DEPLOY_PID_${id//-/_}")
  cmd=$(deploy_unit_value ExecReload)
  [ -n "$cmd" ] || die "$DEPLOY_UNIT: no ExecReload= (systemctl reload would fail)"
  cmd=${cmd//\$MAINPID/$pid}
  read -ra argv <<<"$cmd"
  "${argv[@]}" || die "$id: ExecReload ($cmd) failed"
}

# deploy_lists_are URL LISTS: the member at URL serves in LISTS (the JSON
# of `bagel server-info --json`'s .members, compact).
deploy_lists_are() {
  local got
  got=$("$BAGEL_BIN_DIR/bagel" --server "$1" server-info --json | jq -c '.members') || return 1
  [ "$got" = "$2" ]
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
  done
  # deploy/README.md, steps 1 and 2 on bagel-1..3's hosts.
  for i in 1 2 3; do
    deploy_install "bagel-$i"
    deploy_member_start "bagel-$i" "${urls[$i]}"
  done
  local three='[["bagel-1","bagel-2","bagel-3"]]'
  for i in 1 2 3; do
    wait_until 30 "bagel-$i ready" deploy_ready "http://${urls[$i]}"
    deploy_lists_are "http://${urls[$i]}" "$three" || die "bagel-$i does not serve in the members file's list $three"
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

  # deploy/README.md, "Add, remove or replace a member", adding bagel-4.
  # (a) Every member's members file gets the next list, and a reload: no
  # restart, so no restart wait.
  local both='[["bagel-1","bagel-2","bagel-3"],["bagel-1","bagel-2","bagel-3","bagel-4"]]'
  for i in 1 2 3; do
    sed -i 's/^members = \(.*\)$/&\nnext-members = \1,bagel-4/' "$(deploy_host "bagel-$i")/etc/bagel/members"
    deploy_member_reload "bagel-$i"
  done
  for i in 1 2 3; do
    wait_until 30 "bagel-$i serving in the next list too" deploy_lists_are "http://${urls[$i]}" "$both"
    kill -0 "$(eval "echo \$DEPLOY_PID_bagel_$i")" || die "bagel-$i exited at its reload"
  done
  for i in 1 2 3; do
    deploy_ready "http://${urls[$i]}" || die "bagel-$i is not ready after its reload"
  done
  # (b) bagel-4's host: step 1 with bagel-4.env and the members file of
  # (a), which names it in the next list; then step 2.
  install -d "$(deploy_host bagel-4)/etc/bagel"
  sed 's/192\.0\.2\.13/192.0.2.14/g; s/bagel-3/bagel-4/g' deploy/etc/bagel/bagel-3.env >"$(deploy_host bagel-4)/etc/bagel/bagel-4.env"
  install -m 0644 deploy/etc/bagel/server.env "$(deploy_host bagel-1)/etc/bagel/members" "$(deploy_host bagel-4)/etc/bagel/"
  deploy_member_start bagel-4 "${urls[4]}"
  wait_until 30 "bagel-4 ready" deploy_ready "http://${urls[4]}"
  deploy_lists_are "http://${urls[4]}" "$both" || die "bagel-4 does not serve in both lists"

  # (c) The clients: the next list, then the final one.
  local key4; key4=$(deploy_key "http://${urls[4]}")
  (
    . "$DEPLOY_DIR/cluster.env"
    echo "BAGEL_NEXT_SERVERS=\"$BAGEL_SERVERS,bagel-4=http://${urls[4]}#$key4\""
  ) >>"$DEPLOY_DIR/cluster.env"
  local migrating moved moved_name old_owner
  migrating=$(deploy_bagel route "${names[@]}" --json) || die "bagel route while migrating failed"
  moved=$(jq '[.[] | select(.next_member != .member)] | length' <<<"$migrating")
  ((moved > 0)) || die "adding bagel-4 moved none of 24 names"
  jq -e 'all(.[]; .next_member == .member or .next_member == "bagel-4")' <<<"$migrating" >/dev/null ||
    die "adding bagel-4 moved a name between the old members: $migrating"
  deploy_bagel acquire --ttl 1s --owner deploy-check "${names[@]}" --json >"$DEPLOY_DIR/lease.json" ||
    die "a lease while migrating was refused"
  deploy_bagel release --lease "$DEPLOY_DIR/lease.json" >/dev/null || die "bagel release while migrating failed"
  # A name moving to bagel-4 is still granted by its old owner, which
  # serves in both lists.
  moved_name=$(jq -r '[.[] | select(.next_member == "bagel-4")][0].name' <<<"$migrating")
  old_owner=$(jq -r --arg n "$moved_name" '.[] | select(.name == $n) | .member' <<<"$migrating")
  "$BAGEL_BIN_DIR/bagel" --server "http://${urls[${old_owner#bagel-}]}" acquire --ttl 1s --owner deploy-check \
    "$moved_name" --json >"$DEPLOY_DIR/moved.json" || die "$old_owner refused $moved_name while migrating"
  "$BAGEL_BIN_DIR/bagel" --server "http://${urls[${old_owner#bagel-}]}" release --lease "$DEPLOY_DIR/moved.json" \
    >/dev/null || die "bagel release of $moved_name failed"
  sed -i -e '/^BAGEL_SERVERS=/d' -e 's/^BAGEL_NEXT_SERVERS=/BAGEL_SERVERS=/' "$DEPLOY_DIR/cluster.env"
  route=$(deploy_bagel route "${names[@]}" --json) || die "bagel route after the migration failed"
  members=$(deploy_members "$route")
  [ "$members" = "bagel-1 bagel-2 bagel-3 bagel-4" ] || die "after adding bagel-4, names route to '$members'"
  jq -e 'all(.[]; has("next_member") | not)' <<<"$route" >/dev/null || die "still migrating after the last step"

  # (d) Every member's file: the next list becomes the list; reload.
  local four='[["bagel-1","bagel-2","bagel-3","bagel-4"]]'
  for i in 1 2 3 4; do
    sed -i -e '/^members = /d' -e 's/^next-members = /members = /' "$(deploy_host "bagel-$i")/etc/bagel/members"
    deploy_member_reload "bagel-$i"
  done
  for i in 1 2 3 4; do
    wait_until 30 "bagel-$i serving in the new list alone" deploy_lists_are "http://${urls[$i]}" "$four"
  done
  # The old owner now refuses the name that moved.
  if "$BAGEL_BIN_DIR/bagel" --server "http://${urls[${old_owner#bagel-}]}" acquire --ttl 1s --owner deploy-check \
    "$moved_name" >/dev/null 2>"$DEPLOY_DIR/refused"; then
    die "$old_owner granted $moved_name, which moved to bagel-4"
  fi
  # (NAME_NOT_OWNED, which the CLI words as this.)
  grep -qF "belongs to server bagel-4 under this server's member lists" "$DEPLOY_DIR/refused" ||
    die "$old_owner refused $moved_name for another reason: $(cat "$DEPLOY_DIR/refused")"
  deploy_bagel acquire --ttl 1s --owner deploy-check "${names[@]}" --json >"$DEPLOY_DIR/lease.json" ||
    die "a lease over four members was refused"
  log "deploy: bagel-4 added with reloads, no restart ($moved of 24 names moved to it; $old_owner refuses $moved_name now)"
  deploy_stop
}

deploy_stop() {
  local pid
  for pid in "${DEPLOY_PIDS[@]}"; do
    kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
  DEPLOY_PIDS=()
  if [ -n "${DEPLOY_DIR:-}" ]; then rm -rf "$DEPLOY_DIR"; DEPLOY_DIR=; fi
  if [ -n "${DEPLOY_K8S_OUT:-}" ]; then rm -rf "$DEPLOY_K8S_OUT"; DEPLOY_K8S_OUT=; fi
}

DEPLOY_K8S=deploy/kubernetes
# The validator, pinned; its release carries the API schemas of
# Kubernetes 1.25 to 1.37.
KUBERNETES_VALIDATE_VERSION=1.37.0
# The oldest Kubernetes the manifests use nothing newer than (StatefulSet
# minReadySeconds and persistentVolumeClaimRetentionPolicy, policy/v1
# PodDisruptionBudget), and the newest the validator knows.
DEPLOY_K8S_VERSIONS=(1.27.0 1.37.0)

# kubernetes-validate in its own venv, installed once. Prints the venv.
kubernetes_validate_venv() {
  local venv="$BAGEL_TOOLS/venv-kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
  if [ ! -x "$venv/bin/kubernetes-validate" ] || ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
    log "installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION into $venv"
    python3 -m venv "$venv" >&2 || die "python3 -m venv failed"
    "$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2 ||
      die "pip install kubernetes-validate failed"
  fi
  echo "$venv"
}

# deploy_k8s_render DIR OUT: `kubectl kustomize DIR` into OUT. Current
# kustomize's deprecation warnings (the overlay's `bases:`, which Debian's
# kubectl 1.20 needs) are dropped; any other stderr line is printed.
deploy_k8s_render() {
  local err rest
  err=$(kubectl kustomize "$1" 2>&1 >"$2") || { printf '%s\n' "$err"; return 1; }
  rest=$(grep -v "^# Warning: '[A-Za-z]*' is deprecated" <<<"$err" || true)
  if [ -n "$rest" ]; then printf '%s\n' "$rest" >&2; fi
}

# deploy_k8s_validate FILE [KIND_WITHOUT_SCHEMA]: every object of FILE
# against the API schemas of DEPLOY_K8S_VERSIONS, strictly (an unknown
# field fails). An object whose kind has no schema fails too, but for
# KIND_WITHOUT_SCHEMA. Prints what failed.
deploy_k8s_validate() {
  local file=$1 allowed=${2:-} v out rc
  for v in "${DEPLOY_K8S_VERSIONS[@]}"; do
    rc=0
    out=$("$DEPLOY_K8S_VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "$file" 2>&1) || rc=$?
    if ((rc != 0)); then printf '%s\n' "Kubernetes $v:" "$out"; return 1; fi
    if grep "Couldn't find schema" <<<"$out" | grep -v "for kind ${allowed:-(none)} " | grep -q .; then
      printf '%s\n' "Kubernetes $v: a kind without a schema:" "$out"
      return 1
    fi
  done
}

# deploy_k8s_all TREE OUT_DIR: renders and checks the base and the example
# overlay of TREE, a copy of deploy/kubernetes, and the ServiceMonitor alone
# and added to the overlay as deploy/README.md adds it. Prints what failed
# and returns 1 at the first failure.
deploy_k8s_all() {
  local tree=$1 out=$2 dir name
  cp -r "$tree/overlays/example" "$tree/overlays/with-servicemonitor"
  sed -i 's|^  - \.\./\.\./base$|&\n  - ../../servicemonitor|' "$tree/overlays/with-servicemonitor/kustomization.yaml"
  grep -q '^  - \.\./\.\./servicemonitor$' "$tree/overlays/with-servicemonitor/kustomization.yaml" ||
    { echo "overlays/example/kustomization.yaml: no '  - ../../base' line to add the ServiceMonitor after"; return 1; }
  for dir in base overlays/example servicemonitor overlays/with-servicemonitor; do
    name=${dir//\//-}
    deploy_k8s_render "$tree/$dir" "$out/$name.yaml" || return 1
  done
  for name in base overlays-example; do
    deploy_k8s_validate "$out/$name.yaml" || return 1
  done
  deploy_k8s_validate "$out/overlays-with-servicemonitor.yaml" ServiceMonitor || return 1
  "$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py check \
    "$out/base.yaml" "$out/help.txt" "$tree/Containerfile" "$out/servicemonitor.yaml" || return 1
  "$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py check \
    "$out/overlays-example.yaml" "$out/help.txt" "$tree/Containerfile" "$out/overlays-with-servicemonitor.yaml" ||
    return 1
}

# deploy_k8s_broken OUT_DIR WHAT FILE SED_EXPR EXPECTED: a copy of
# deploy/kubernetes with SED_EXPR applied to FILE must fail the checks,
# saying EXPECTED. Its renders go to a folder of their own.
deploy_k8s_broken() {
  local out=$1 what=$2 file=$3 expr=$4 expected=$5 tree renders findings
  tree="$out/broken" renders="$out/broken-renders"
  rm -rf "$tree" "$renders"; cp -r "$DEPLOY_K8S" "$tree"; mkdir "$renders"
  cp "$out/help.txt" "$renders/"
  sed -i "$expr" "$tree/$file"
  cmp -s "$tree/$file" "$DEPLOY_K8S/$file" && die "$file: '$expr' changed nothing to break"
  if findings=$(deploy_k8s_all "$tree" "$renders" 2>&1); then
    die "deploy/kubernetes with $what passed the checks"
  fi
  grep -qF -- "$expected" <<<"$findings" || die "deploy/kubernetes with $what failed for another reason: $findings"
  log "deploy/kubernetes with $what fails the check"
}

deploy_kubernetes_check() {
  command -v kubectl >/dev/null 2>&1 || apt_install kubernetes-client
  command -v kubectl >/dev/null 2>&1 || die "kubectl is missing after apt-get install kubernetes-client"
  command -v curl >/dev/null 2>&1 || apt_install curl
  DEPLOY_K8S_VENV=$(kubernetes_validate_venv)
  local out findings
  out=$(mktemp -d -t bagel-k8s.XXXXXX)
  DEPLOY_K8S_OUT=$out
  "$BAGEL_BIN_DIR/bagel-server" --help >"$out/help.txt" || die "bagel-server --help failed"
  cp -r "$DEPLOY_K8S" "$out/tree"
  findings=$(deploy_k8s_all "$out/tree" "$out" 2>&1) || die "$DEPLOY_K8S: $findings"
  log "$DEPLOY_K8S: rendered (kubectl $(kubectl version --client 2>/dev/null | grep -o "v[0-9][0-9.]*" | head -1)), valid for Kubernetes ${DEPLOY_K8S_VERSIONS[*]}, invariants hold"

  deploy_k8s_broken "$out" "PDB maxUnavailable 2" base/pdb.yaml \
    's/^  maxUnavailable: 1$/  maxUnavailable: 2/' "PDB maxUnavailable is 2, not 1"
  deploy_k8s_broken "$out" "a flag bagel-server lacks" base/statefulset.yaml \
    's/--max-ttl=/--max-lease-ttl=/' "--max-lease-ttl is not a flag of bagel-server"
  deploy_k8s_broken "$out" "a misspelt field" base/service.yaml \
    's/publishNotReadyAddresses:/publishNotReadyAddress:/' "'publishNotReadyAddress' was unexpected"

  deploy_k8s_broken "$out" "a member list that is not the pods" overlays/example/replicas.yaml \
    's/^  replicas: 3$/  replicas: 4/' "the member lists name ['bagel-0', 'bagel-1', 'bagel-2'], the pods are"
  deploy_k8s_broken "$out" "the members file mounted by subPath" base/statefulset.yaml \
    's|^              mountPath: /etc/bagel$|&\n              subPath: members|' "mounted by subPath, which the kubelet never updates"

  deploy_k8s_member_check "$out/overlays-example.yaml"
  rm -rf "$out"; DEPLOY_K8S_OUT=
}

# deploy_k8s_member_start: DEPLOY_K8S_CMD as the pod's container runs it:
# as the pod's user and group, with the root file system read-only and
# only the volume writable (a mount namespace of its own, gone with the
# process).
deploy_k8s_member_start() {
  unshare --mount bash -c '
    set -e
    mount --make-rprivate /
    mount --bind "$1" "$1"
    mount -o remount,bind,ro /
    uid=$2 gid=$3; shift 3
    exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"' \
    bagel-pod "$DEPLOY_DIR/volume" "$DEPLOY_K8S_UID" "$DEPLOY_K8S_GID" "${DEPLOY_K8S_CMD[@]}" \
    >>"$DEPLOY_DIR/bagel-1.out" 2>>"$DEPLOY_DIR/bagel-1.err" &
  DEPLOY_K8S_PID=$!
  DEPLOY_PIDS+=("$DEPLOY_K8S_PID")
}

# deploy_k8s_in_restart_wait HTTP GRPC: the member's probes and its lease
# port during the restart wait.
deploy_k8s_in_restart_wait() {
  local http=$1 grpc=$2 code
  wait_until 30 "pod bagel-1's /healthz" curl -sf "http://$http/healthz"
  code=$(curl -s -o "$DEPLOY_DIR/readyz" -w '%{http_code}' "http://$http/readyz")
  [ "$code" = 503 ] && grep -q "restart wait" "$DEPLOY_DIR/readyz" ||
    die "pod bagel-1 at its start: /readyz said $code $(cat "$DEPLOY_DIR/readyz"), not 503 (restart wait)"
  if "$BAGEL_BIN_DIR/bagel" --server "http://$grpc" acquire --ttl 1s --owner k8s-check "$DEPLOY_K8S_PROBE" \
    >/dev/null 2>"$DEPLOY_DIR/refused"; then
    die "pod bagel-1 granted a lease while /readyz said not ready"
  fi
  grep -q "not ready" "$DEPLOY_DIR/refused" ||
    die "pod bagel-1 refused a lease in its restart wait for another reason: $(cat "$DEPLOY_DIR/refused")"
}

# deploy_k8s_member_check RENDERED: the StatefulSet's command and args, as
# the kubelet runs them for pod bagel-1, with the built binary in place of
# the image's; only the listen addresses become local ones and the volume
# a temporary folder.
deploy_k8s_member_check() {
  local rendered=$1 arg mapped=0 grpc http read_only config
  command -v unshare >/dev/null 2>&1 && command -v setpriv >/dev/null 2>&1 || apt_install util-linux
  read -r DEPLOY_K8S_UID DEPLOY_K8S_GID read_only < <("$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py user "$rendered")
  [ "$read_only" = true ] || die "$rendered: the container's root file system is not read-only"
  DEPLOY_DIR=$(mktemp -d -t bagel-k8s-pod.XXXXXX)
  chmod 0755 "$DEPLOY_DIR"
  # The image (its one file, readable by the pod's user wherever the
  # checkout is) and the volume (the pod's group's, as fsGroup makes it).
  install -D -m 0755 "$BAGEL_BIN_DIR/bagel-server" "$DEPLOY_DIR/image/usr/local/bin/bagel-server"
  install -d -m 0770 -o "$DEPLOY_K8S_UID" -g "$DEPLOY_K8S_GID" "$DEPLOY_DIR/volume"
  grpc="127.0.0.1:$(free_port)"; http="127.0.0.1:$(free_port)"
  # The ConfigMap volume as the kubelet lays it out: the keys are links
  # through ..data, a link to a folder of the current contents; an update
  # writes a new folder and swaps ..data to it (deploy_k8s_config_update).
  config="$DEPLOY_DIR/configmap"
  install -d -m 0755 "$config/..1"
  "$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py members-file "$rendered" >"$config/..1/members" ||
    die "$rendered: no members file"
  chmod 0644 "$config/..1/members"
  ln -s ..1 "$config/..data"
  ln -s ..data/members "$config/members"
  DEPLOY_K8S_CMD=()
  while IFS= read -r arg; do
    case $arg in
      /usr/local/bin/bagel-server) arg="$DEPLOY_DIR/image$arg"; mapped=$((mapped + 1)) ;;
      --listen=*) arg="--listen=$grpc"; mapped=$((mapped + 1)) ;;
      --http=*) arg="--http=$http"; mapped=$((mapped + 1)) ;;
      --key=/var/lib/bagel/*) arg="--key=$DEPLOY_DIR/volume/${arg#--key=/var/lib/bagel/}"; mapped=$((mapped + 1)) ;;
      --members-file=/etc/bagel/members) arg="--members-file=$config/members"; mapped=$((mapped + 1)) ;;
    esac
    DEPLOY_K8S_CMD+=("$arg")
  done < <("$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py args "$rendered" bagel-1)
  ((mapped == 5)) ||
    die "$rendered: expected the binary, --listen, --http, --key=/var/lib/bagel/... and --members-file=/etc/bagel/members in: ${DEPLOY_K8S_CMD[*]}"
  # No bagel-server variable from the host: only what the manifest gives.
  DEPLOY_K8S_CMD=(env $(compgen -e | grep '^BAGEL_' | sed 's/^/-u /' || true) "${DEPLOY_K8S_CMD[@]}")
  local lists
  lists=$("$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py lists "$rendered") || die "$rendered: no member lists"
  # A name pod bagel-1 owns under its member lists: it refuses the others.
  DEPLOY_K8S_PROBE=$("$DEPLOY_K8S_VENV/bin/python" tests/support/k8s_invariants.py owned "$rendered" bagel-1 k8s-probe) ||
    die "$rendered: no name owned by bagel-1"

  deploy_k8s_member_start
  deploy_k8s_in_restart_wait "$http" "$grpc"
  wait_until 30 "pod bagel-1 ready (/readyz)" curl -sf "http://$http/readyz"
  local info id key
  info=$("$BAGEL_BIN_DIR/bagel" --server "http://$grpc" server-info --json) || die "bagel server-info failed"
  id=$(jq -r '.server_id' <<<"$info")
  [ "$id" = bagel-1 ] || die "pod bagel-1 signs as server id '$id'"
  [ "$(jq -c '.members' <<<"$info")" = "$lists" ] ||
    die "pod bagel-1 serves in $(jq -c '.members' <<<"$info"), not the ConfigMap's lists $lists"
  key=$(jq -r '.keys[0].ed25519_hex' <<<"$info")
  "$BAGEL_BIN_DIR/bagel" --server "http://$grpc" acquire --ttl 1s --owner k8s-check "$DEPLOY_K8S_PROBE" --json \
    >/dev/null || die "pod bagel-1 refused a lease once ready"
  [ -s "$DEPLOY_DIR/volume/key" ] || die "no key on pod bagel-1's volume"
  [ "$(stat -c '%u %a' "$DEPLOY_DIR/volume/key")" = "$DEPLOY_K8S_UID 600" ] ||
    die "pod bagel-1's key is not its user's alone: $(stat -c '%u %a' "$DEPLOY_DIR/volume/key")"
  wait_until 10 "the granted-until mark on pod bagel-1's volume" test -s "$DEPLOY_DIR/volume/key.granted-until"
  curl -sf "http://$http/metrics" >"$DEPLOY_DIR/metrics" || die "pod bagel-1's /metrics failed"
  grep -q '^bagel_' "$DEPLOY_DIR/metrics" || die "pod bagel-1's /metrics has no bagel_ series"

  # The ConfigMap edited as a scale-out's first step (a next list with one
  # more member): the kubelet swaps ..data, and the member serves in both
  # lists with no restart.
  local next
  next=$(jq -r '.[0] + ["bagel-" + (.[0] | length | tostring)] | join(",")' <<<"$lists")
  install -d -m 0755 "$config/..2"
  { cat "$config/..1/members"; echo "next-members = $next"; } >"$config/..2/members"
  chmod 0644 "$config/..2/members"
  ln -s ..2 "$config/..data_tmp"
  mv -T "$config/..data_tmp" "$config/..data"
  local both; both=$(jq -c --arg n "$next" '[.[0], ($n | split(","))]' <<<"$lists")
  wait_until 30 "pod bagel-1 serving in the updated ConfigMap's lists" \
    deploy_lists_are "http://$grpc" "$both"
  kill -0 "$DEPLOY_K8S_PID" || die "pod bagel-1 exited at the ConfigMap's update"
  curl -sf "http://$http/readyz" >/dev/null || die "pod bagel-1 is not ready after the ConfigMap's update"

  # The pod is replaced: SIGTERM, then the same args and volume.
  kill "$DEPLOY_K8S_PID"; wait "$DEPLOY_K8S_PID" 2>/dev/null || true
  deploy_k8s_member_start
  deploy_k8s_in_restart_wait "$http" "$grpc"
  wait_until 30 "pod bagel-1 ready after its restart (/readyz)" curl -sf "http://$http/readyz"
  info=$("$BAGEL_BIN_DIR/bagel" --server "http://$grpc" server-info --json) || die "bagel server-info failed"
  [ "$(jq -r '.keys[0].ed25519_hex' <<<"$info")" = "$key" ] || die "pod bagel-1 came back with another key"
  [ "$(jq -c '.members' <<<"$info")" = "$both" ] || die "pod bagel-1 restarted with lists $(jq -c '.members' <<<"$info"), not $both"
  log "deploy/kubernetes: pod bagel-1's command runs as $DEPLOY_K8S_UID:$DEPLOY_K8S_GID on a read-only root: restart wait not ready, then ready; the ConfigMap's lists $lists, then $both after its update with no restart; key kept on its volume ($key)"
  deploy_stop
}
