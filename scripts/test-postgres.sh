#!/usr/bin/env bash
# Starts a throw-away PostgreSQL cluster for the tests and prints the URL they reach it at.
#
#   eval "$(bash scripts/test-postgres.sh start DIR)"   # exports RING0_TEST_POSTGRES_URL
#   eval "$(bash scripts/test-postgres.sh start-durable DIR)"   # the same, durable
#   bash scripts/test-postgres.sh restart DIR          # a server restart, for failure tests
#   bash scripts/test-postgres.sh stop DIR
#
# Installs Debian's `postgresql` package when no server is found. The cluster lives in DIR
# (created), listens on 127.0.0.1 at a free port, runs as the `postgres` user (PostgreSQL refuses
# to run as root) and trades durability for speed (`fsync=off`): it holds test data only.
# `start-durable` keeps the server's durability (`fsync=on`, `synchronous_commit=on`,
# `full_page_writes=on`), so a COMMIT waits for its WAL flush as on a production server: for
# benchmarks of what a commit costs (bench/journal/run.sh). Put DIR on the disk to measure.
set -euo pipefail

usage="usage: test-postgres.sh start|start-durable|restart|stop DIR"
cmd=${1:?$usage}
dir=${2:?$usage}

bindir() {
    local initdb
    initdb=$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n1 || true)
    [ -n "$initdb" ] && dirname "$initdb"
}

run_as() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u "$pg_user" -- "$@"
    else
        "$@"
    fi
}

pg_user=postgres
if [ "$(id -u)" = 0 ] && ! id "$pg_user" >/dev/null 2>&1; then
    pg_user=nobody
fi

case "$cmd" in
start | start-durable)
    bin=$(bindir || true)
    if [ -z "$bin" ]; then
        echo "test-postgres: installing PostgreSQL" >&2
        apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        bin=$(bindir)
        if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then pg_user=postgres; fi
    fi
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown "$pg_user" "$dir"
    chmod 700 "$dir"
    run_as "$bin/initdb" -D "$dir/data" -U ring0 --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    if [ "$cmd" = start-durable ]; then
        durability="-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
    fi
    run_as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir $durability -c max_connections=400" \
        start >&2 || { cat "$dir/server.log" >&2; exit 1; }
    echo "export RING0_TEST_POSTGRES_URL=postgres://ring0@127.0.0.1:$port/postgres"
    echo "export RING0_TEST_POSTGRES_DIR=$dir"
    echo "export RING0_TEST_POSTGRES_BIN=$bin"
    ;;
restart)
    # The options given at start are kept (postmaster.opts); a fast shutdown drops every
    # client connection, as a crash of the server would.
    bin=$(bindir)
    [ "$(id -u)" = 0 ] && pg_user=$(stat -c %U "$dir")
    run_as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart >&2
    ;;
stop)
    bin=$(bindir)
    [ -d "$dir/data" ] && run_as "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac
