#!/usr/bin/env bash
# The benchmark command. Installs what is missing (etcd 3.4 and Redis 7 from
# Debian, a font for the plots, moto for S3), builds bagel-server and
# bagel-bench in release mode, and runs the harness with the given arguments:
#
#   bench/run.sh --quick                 # short run, under 3 minutes
#   bench/run.sh --out bench-out         # the full run behind bench/README.md
#
# Every server is started by the harness on 127.0.0.1 and stopped at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tests/support/common.sh

apt_install etcd-server redis-server fonts-dejavu-core python3-venv curl
venv=$(moto_venv)

packages=(-p bagel-bench)
if [ -f server/Cargo.toml ]; then packages+=(-p bagel-server); fi
log "building ${packages[*]} (release)"
cargo build --release --locked "${packages[@]}"

target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export BAGEL_MOTO_PYTHON="$venv/bin/python"
export BAGEL_BENCH_COMMAND="bench/run.sh${*:+ $*}"
exec "$target_dir/release/bagel-bench" "$@"
