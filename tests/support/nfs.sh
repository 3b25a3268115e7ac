# NFS for tests: a real NFS server (nfs-ganesha 4, FSAL VFS) exporting a
# temp directory on 127.0.0.1 over NFSv3 and NFSv4.2, and a pair of bindfs
# FUSE mounts of one directory with 3 s attribute/entry/negative caches (two
# "NFS clients" that see each other late). Source common.sh first, and build
# the binaries first: readiness is `bagel-nfs ls` (our own userspace client)
# listing the export.
#
#   nfs_start:   installs if needed, starts rpcbind + ganesha, waits, exports
#                BAGEL_NFS_URL_V3, BAGEL_NFS_URL_V4 (the store URLs of the
#                export over each version) and BAGEL_NFS_EXPORT_DIR (the
#                exported directory itself, for tests that damage a file).
#   nfs_stop:    stops them.
#   bindfs_start / bindfs_stop: mounts / unmounts the pair and exports
#                BAGEL_BINDFS_A, BAGEL_BINDFS_B (two views of one directory).
#
# Why rpcbind runs in its own network namespace: ganesha will not start
# unless it can register NFSv3 and MOUNT with rpcbind, and Debian 12's
# rpcbind 1.2.6 aborts when told to bind 127.0.0.1 only (`-h 127.0.0.1`:
# "double free detected"; the same with sockets passed by socket
# activation). Started with `unshare -n`, rpcbind binds its wildcard
# sockets inside an empty network namespace, where nothing can reach them,
# and ganesha registers through the unix socket /run/rpcbind.sock, which
# lives in the file system and is shared. Our client never asks the
# portmapper: the URLs carry the NFS and MOUNT ports.

NFS_PSEUDO=/bagel

_nfs_rpcbind_up() { rpcinfo -p >/dev/null 2>&1; }

nfs_start() {
  apt_install nfs-ganesha nfs-ganesha-vfs rpcbind
  command -v unshare >/dev/null || die "unshare (util-linux) is missing"
  [ -x "$BAGEL_BIN_DIR/bagel-nfs" ] || die "$BAGEL_BIN_DIR/bagel-nfs is missing: build the binaries before nfs_start"

  NFS_TMP=$(mktemp -d -t bagel-nfs.XXXXXX)
  mkdir -p "$NFS_TMP/export" "$NFS_TMP/recovery"

  # rpcbind is one per machine (/run/rpcbind.sock): reuse a live one.
  if ! _nfs_rpcbind_up; then
    rm -f /run/rpcbind.sock /run/rpcbind.lock
    unshare -n rpcbind -f >"$NFS_TMP/rpcbind.log" 2>&1 &
    RPCBIND_PID=$!
    wait_until 20 "rpcbind (private network namespace)" _nfs_rpcbind_up
  fi

  local nfs_port mnt_port
  nfs_port=$(free_port)
  mnt_port=$(free_port)
  cat >"$NFS_TMP/ganesha.conf" <<EOF
NFS_CORE_PARAM {
  Bind_Addr = 127.0.0.1;
  NFS_Port = $nfs_port;
  MNT_Port = $mnt_port;
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Enable_UDP = false;
  Protocols = 3, 4;
  Mount_Path_Pseudo = true;
}
NFS_KRB5 { Active_krb5 = false; }
NFSv4 {
  Graceless = true;
  Minor_Versions = 1, 2;
  RecoveryBackend = fs;
  RecoveryRoot = $NFS_TMP/recovery;
}
EXPORT {
  Export_Id = 1;
  Path = $NFS_TMP/export;
  Pseudo = $NFS_PSEUDO;
  Protocols = 3, 4;
  Transports = TCP;
  Access_Type = RW;
  Squash = No_Root_Squash;
  SecType = sys;
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = EVENT; }
EOF
  # -F: foreground, our child. No dbus here: ganesha logs that and goes on.
  ganesha.nfsd -F -f "$NFS_TMP/ganesha.conf" -L "$NFS_TMP/ganesha.log" \
    -p "$NFS_TMP/ganesha.pid" -N NIV_EVENT >"$NFS_TMP/ganesha.out" 2>&1 &
  GANESHA_PID=$!

  export BAGEL_NFS_EXPORT_DIR="$NFS_TMP/export"
  export BAGEL_NFS_URL_V3="nfs://127.0.0.1:$nfs_port$NFS_PSEUDO?version=3&mountport=$mnt_port"
  export BAGEL_NFS_URL_V4="nfs://127.0.0.1:$nfs_port$NFS_PSEUDO?version=4"
  _nfs_ready() {
    "$BAGEL_BIN_DIR/bagel-nfs" ls "$BAGEL_NFS_URL_V3" && "$BAGEL_BIN_DIR/bagel-nfs" ls "$BAGEL_NFS_URL_V4"
  }
  local deadline=$((SECONDS + 60))
  until _nfs_ready >/dev/null 2>&1; do
    kill -0 "$GANESHA_PID" 2>/dev/null || die "ganesha exited; its log ends: $(tail -5 "$NFS_TMP/ganesha.log" 2>/dev/null)"
    ((SECONDS < deadline)) || die "NFS (ganesha) on 127.0.0.1:$nfs_port not ready after 60s: $(_nfs_ready 2>&1 | tail -2)"
    sleep 0.2
  done
  log "NFS ready: $BAGEL_NFS_URL_V3 and $BAGEL_NFS_URL_V4"
}

nfs_stop() {
  # `wait` returns the killed process's status: never let it end the
  # caller's cleanup under `set -e` before the other services are stopped.
  if [ -n "${GANESHA_PID:-}" ]; then kill "$GANESHA_PID" 2>/dev/null; wait "$GANESHA_PID" 2>/dev/null || true; GANESHA_PID=; fi
  if [ -n "${RPCBIND_PID:-}" ]; then kill "$RPCBIND_PID" 2>/dev/null; wait "$RPCBIND_PID" 2>/dev/null || true; RPCBIND_PID=; fi
  if [ -n "${NFS_TMP:-}" ]; then rm -rf "$NFS_TMP"; NFS_TMP=; fi
}

# Caches of 3 s for attributes, names and misses: each mount sees what the
# other did up to 3 s late, as two NFS clients do.
BINDFS_OPTS="attr_timeout=3,entry_timeout=3,negative_timeout=3"

bindfs_start() {
  apt_install bindfs
  [ -e /dev/fuse ] || die "/dev/fuse is missing: the bindfs tests need FUSE"
  BINDFS_TMP=$(mktemp -d -t bagel-bindfs.XXXXXX)
  mkdir -p "$BINDFS_TMP/src" "$BINDFS_TMP/a" "$BINDFS_TMP/b"
  bindfs -o "$BINDFS_OPTS" "$BINDFS_TMP/src" "$BINDFS_TMP/a" || die "bindfs mount a failed"
  bindfs -o "$BINDFS_OPTS" "$BINDFS_TMP/src" "$BINDFS_TMP/b" || die "bindfs mount b failed"
  wait_until 20 "bindfs mounts" mountpoint -q "$BINDFS_TMP/b"
  export BAGEL_BINDFS_A="$BINDFS_TMP/a" BAGEL_BINDFS_B="$BINDFS_TMP/b"
  log "bindfs pair ready: $BAGEL_BINDFS_A and $BAGEL_BINDFS_B ($BINDFS_OPTS)"
}

bindfs_stop() {
  if [ -n "${BINDFS_TMP:-}" ]; then
    for m in a b; do
      if mountpoint -q "$BINDFS_TMP/$m"; then fusermount -u "$BINDFS_TMP/$m" 2>/dev/null || umount "$BINDFS_TMP/$m" || true; fi
    done
    rm -rf "$BINDFS_TMP"
    BINDFS_TMP=
  fi
}
