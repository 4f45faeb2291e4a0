#!/usr/bin/env bash
# deploy/docker/with-engine.sh COMMAND...   (what `make test` runs the test suite with)
#
# 1. Makes sure a Docker engine answers: if none does and we are root with Debian's docker.io
#    installed, starts `dockerd` (log: build/dockerd.log).
# 2. Builds the images (deploy/docker/build.sh: base image cached, layers cached) so the build
#    shows in the log, and tells the tests it did (MQFED_IMAGES_BUILT=1).
# 3. Runs COMMAND, then stops dockerd again ONLY if step 1 started it: a CI machine is left as
#    it was found, and an engine a developer already runs is never touched.
# When no engine can be started the container tests skip with the reason given here, and this
# script prints a loud banner before and after COMMAND. MQFED_SKIP_CONTAINERS=1 skips them on
# purpose (no engine start, no image build; still announced).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LOG=$ROOT/build/dockerd.log
dockerd_pid=
reason=

engine_up() { timeout 10 docker info > /dev/null 2>&1; }

banner() {
    local bar
    bar=$(printf '!%.0s' {1..78})
    printf '%s\n!! CONTAINER TESTS WILL NOT RUN: %s\n%s\n' "$bar" "$reason" "$bar" >&2
}

stop_dockerd() {
    if [ -n "$dockerd_pid" ] && kill -0 "$dockerd_pid" 2> /dev/null; then
        echo "[engine] stopping the dockerd this run started (pid $dockerd_pid)"
        kill -TERM "$dockerd_pid"
        for _ in $(seq 1 100); do
            kill -0 "$dockerd_pid" 2> /dev/null || break
            sleep 0.2
        done
        kill -0 "$dockerd_pid" 2> /dev/null && kill -KILL "$dockerd_pid"
    fi
    dockerd_pid=
}
trap stop_dockerd EXIT
trap 'exit 130' INT TERM

if [ "${MQFED_SKIP_CONTAINERS:-0}" = 1 ]; then
    reason="MQFED_SKIP_CONTAINERS=1 was set"
elif ! command -v docker > /dev/null; then
    reason="no docker client installed (Debian package docker.io; make install as root)"
elif engine_up; then
    echo "[engine] using the running Docker engine"
elif [ "$(id -u)" != 0 ]; then
    reason="no Docker engine answers and starting dockerd needs root"
elif ! command -v dockerd > /dev/null; then
    reason="no Docker engine answers and dockerd is not installed (docker.io)"
else
    mkdir -p "$(dirname "$LOG")"
    echo "[engine] starting dockerd (log: $LOG)"
    setsid dockerd > "$LOG" 2>&1 < /dev/null &
    dockerd_pid=$!
    for _ in $(seq 1 60); do
        engine_up && break
        kill -0 "$dockerd_pid" 2> /dev/null || break
        sleep 0.5
    done
    if engine_up; then
        echo "[engine] dockerd is up; it is stopped again after the tests"
    else
        reason="dockerd did not start: $(tail -n 3 "$LOG" | tr '\n' ' ')"
        stop_dockerd
    fi
fi

if [ -z "$reason" ]; then
    if "$ROOT/deploy/docker/build.sh"; then
        export MQFED_IMAGES_BUILT=1
    else
        echo "[images] building the container images failed" >&2
        exit 1
    fi
else
    export MQFED_ENGINE_UNAVAILABLE="$reason"
    banner
fi

# Tests remove what they start, also on failure; this catches a test process that died
# without its teardown (killed, timed out): everything labelled or named with this session.
export MQFED_TEST_SESSION=${MQFED_TEST_SESSION:-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')}
sweep() {
    local s=$MQFED_TEST_SESSION ids
    ids=$( { docker ps -aq --filter "label=mqfed.test=$s"; docker ps -aq --filter "name=mqfed-t$s"; } \
        | sort -u)
    if [ -n "$ids" ]; then
        echo "[engine] removing containers the tests left behind: $(echo $ids)" >&2
        docker rm -f -v $ids > /dev/null
    fi
    ids=$( { docker network ls -q --filter "label=mqfed.test=$s"; \
             docker network ls -q --filter "name=mqfed-t$s"; } | sort -u)
    [ -n "$ids" ] && docker network rm $ids > /dev/null
    ids=$(docker volume ls -q --filter "name=mqfed-t$s")
    [ -n "$ids" ] && docker volume rm $ids > /dev/null
    return 0
}

"$@"
rc=$?
[ -z "$reason" ] && sweep
[ -n "$reason" ] && banner
exit "$rc"
