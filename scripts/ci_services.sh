#!/usr/bin/env bash
# Local services for the scale-out tests: PostgreSQL (Optuna RDB storage) and a Ray head node.
# Both listen on 127.0.0.1 only. Idempotent: a service already up is left as it is.
#
#   eval "$(bash scripts/ci_services.sh start)"       # start both; exports DSV4_TUNE_STORAGE, DSV4_RAY_ADDRESS
#   bash scripts/ci_services.sh start postgres         # or only one of them
#   bash scripts/ci_services.sh stop [postgres|ray]
#
# stdout carries only `export NAME=VALUE` lines (for eval); progress goes to stderr. The storage URL holds
# a password generated here; it is written to $DSV4_SERVICES_DIR/pg.url (mode 600) and nowhere else.
# PostgreSQL comes from Debian's packages (installed with apt-get if missing). Ray comes from the venv
# (.venv/bin/ray; pip install 'dsv4-tune[ray]').
#
# Settings: DSV4_SERVICES_DIR (default /tmp/dsv4-services), DSV4_PG_PORT (55432), DSV4_RAY_PORT (6390),
#           DSV4_RAY_GPUS (logical GPUs of the head node, default 2), DSV4_RAY_CPUS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
ACTION=${1:-start}
WHICH=${2:-all}
DIR=${DSV4_SERVICES_DIR:-/tmp/dsv4-services}
PG_PORT=${DSV4_PG_PORT:-55432}
RAY_PORT=${DSV4_RAY_PORT:-6390}
RAY_GPUS=${DSV4_RAY_GPUS:-2}
RAY_CPUS=${DSV4_RAY_CPUS:-$(nproc)}
RAY_BIN=${RAY_BIN:-$REPO/.venv/bin/ray}
PG_DB=dsv4
PG_USER=dsv4

say() { echo "ci_services: $*" >&2; }
mkdir -p "$DIR"
chmod 755 "$DIR"

# -- PostgreSQL ------------------------------------------------------------------------------------
pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && { echo "$d"; return 0; }; done
  return 1
}

pg_install() {
  pg_bindir >/dev/null && return 0
  say "installing PostgreSQL from Debian's packages"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >&2
  # the package starts a cluster of its own on 5432; this script runs its own on 127.0.0.1:$PG_PORT
  pg_bindir >/dev/null
}

# As root, PostgreSQL refuses to run: use the `postgres` account the package created.
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_super() { if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi; }

pg_start() {
  pg_install
  local bin; bin=$(pg_bindir)
  mkdir -p "$DIR/pg"
  [ "$(id -u)" = 0 ] && chown postgres: "$DIR/pg"
  if [ ! -f "$DIR/pg/pgdata/PG_VERSION" ]; then
    say "initialising a PostgreSQL cluster in $DIR/pg/pgdata"
    as_pg "$bin/initdb" -D "$DIR/pg/pgdata" -U "$(pg_super)" --auth-local=peer --auth-host=scram-sha-256 \
      -E UTF8 >"$DIR/pg/initdb.log" 2>&1 || { cat "$DIR/pg/initdb.log" >&2; exit 1; }
  fi
  if ! as_pg "$bin/pg_ctl" -D "$DIR/pg/pgdata" status >/dev/null 2>&1; then
    say "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    as_pg "$bin/pg_ctl" -D "$DIR/pg/pgdata" -l "$DIR/pg/server.log" -w -t 60 start \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $DIR/pg" >&2
  fi
  if [ ! -s "$DIR/pg.url" ]; then
    local password
    password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    as_pg "$bin/psql" -q -h "$DIR/pg" -p "$PG_PORT" -U "$(pg_super)" -d postgres -v ON_ERROR_STOP=1 >&2 <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN CREATE ROLE $PG_USER LOGIN; END IF;
END \$\$;
ALTER ROLE $PG_USER PASSWORD '$password';
SQL
    if ! as_pg "$bin/psql" -tA -h "$DIR/pg" -p "$PG_PORT" -U "$(pg_super)" -d postgres \
        -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
      as_pg "$bin/createdb" -h "$DIR/pg" -p "$PG_PORT" -U "$(pg_super)" -O "$PG_USER" "$PG_DB"
    fi
    (umask 077; echo "postgresql://$PG_USER:$password@127.0.0.1:$PG_PORT/$PG_DB" >"$DIR/pg.url")
  fi
  echo "export DSV4_TUNE_STORAGE=$(cat "$DIR/pg.url")"
}

pg_stop() {
  local bin; bin=$(pg_bindir) || return 0
  if [ -f "$DIR/pg/pgdata/PG_VERSION" ]; then
    as_pg "$bin/pg_ctl" -D "$DIR/pg/pgdata" -m fast -w stop >&2 2>/dev/null || true
  fi
}

# -- Ray --------------------------------------------------------------------------------------------
# Ray replaces 127.0.0.1 by the host's outward address and listens on every interface unless this
# is off; with it off, the head (GCS, raylet, agents) binds and advertises 127.0.0.1 only.
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0

ray_running() {
  # a closed port answers at once; `ray status` alone waits ~50 s for a head that is not there
  (exec 3<>"/dev/tcp/127.0.0.1/$RAY_PORT") 2>/dev/null || return 1
  [ -x "$RAY_BIN" ] && "$RAY_BIN" status --address "127.0.0.1:$RAY_PORT" >/dev/null 2>&1
}

ray_start() {
  [ -x "$RAY_BIN" ] || { say "no $RAY_BIN; install it: .venv/bin/pip install 'ray[tune]'"; exit 1; }
  if ! ray_running; then
    say "starting a Ray head on 127.0.0.1:$RAY_PORT ($RAY_CPUS CPUs, $RAY_GPUS logical GPUs)"
    mkdir -p "$DIR/ray"
    "$RAY_BIN" start --head --node-ip-address 127.0.0.1 --port "$RAY_PORT" --num-cpus "$RAY_CPUS" \
      --num-gpus "$RAY_GPUS" --include-dashboard false --disable-usage-stats --temp-dir "$DIR/ray" \
      --object-store-memory 200000000 >"$DIR/ray-start.log" 2>&1 || { cat "$DIR/ray-start.log" >&2; exit 1; }
  fi
  echo "export DSV4_RAY_ADDRESS=127.0.0.1:$RAY_PORT"
  echo "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"
}

ray_pids() {
  # this cluster's processes only: those naming its temp dir, and their children (ray:: workers)
  local p c own=""
  for p in /proc/[0-9]*; do
    c=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
    case "$c" in *"$DIR/ray/"*) own="$own ${p#/proc/}" ;; esac
  done
  [ -n "$own" ] || return 0
  echo "$own"
  for p in $own; do pgrep -P "$p" || true; done
}

ray_stop() {
  local pids; pids=$(ray_pids | tr '\n' ' ')
  [ -n "${pids// /}" ] || return 0
  say "stopping the Ray head (pids $pids)"
  kill -TERM $pids 2>/dev/null || true
  local p alive
  for _ in $(seq 20); do
    alive=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -n "$alive" ] || return 0
    sleep 0.5
  done
  kill -KILL $alive 2>/dev/null || true
}

case "$ACTION:$WHICH" in
  start:all) pg_start; ray_start ;;
  start:postgres) pg_start ;;
  start:ray) ray_start ;;
  stop:all) ray_stop; pg_stop ;;
  stop:postgres) pg_stop ;;
  stop:ray) ray_stop ;;
  *) echo "usage: $0 start|stop [all|postgres|ray]" >&2; exit 2 ;;
esac
