#!/bin/sh
# mqfed node entrypoint (PID 2, under tini). Runs `mqfed node`, which starts and supervises
# Mosquitto. If the sidecar itself crashes it is started again here, and it adopts the running
# Mosquitto (pid file + command line), so MQTT clients stay connected, as on a plain host.
# SIGTERM (docker stop, pod deletion) is passed to the sidecar: it leaves the cluster
# gracefully, stops Mosquitto, and the container exits.
set -u

CONFIG=${MQFED_CONFIG:-/etc/mqfed/node.toml}
: "${MQFED_NODE_ID:=$(hostname)}"
fqdn=$(hostname -f 2>/dev/null || hostname)
: "${MQFED_GRPC_LISTEN:=$fqdn:7001}"
: "${MQFED_ADMIN_LISTEN:=$fqdn:7101}"
export MQFED_NODE_ID MQFED_GRPC_LISTEN MQFED_ADMIN_LISTEN

if [ "$#" -gt 0 ]; then  # any other command: run it instead (e.g. `mqfed --help`, a shell)
    exec "$@"
fi

# The peer gRPC and admin listeners bind to the names they advertise (peers dial them): wait
# until both resolve (a compose/Kubernetes DNS record, or a second network attached after
# the container started, can take a moment).
waited=0
for host in "${MQFED_GRPC_LISTEN%:*}" "${MQFED_ADMIN_LISTEN%:*}"; do
    until getent hosts "$host" > /dev/null; do
        if [ "$waited" -ge "${MQFED_DNS_WAIT:-60}" ]; then
            echo "mqfed-entrypoint: $host does not resolve (MQFED_GRPC_LISTEN," \
                 "MQFED_ADMIN_LISTEN); giving up" >&2
            exit 2
        fi
        sleep 1
        waited=$((waited + 1))
    done
done

stopping=0
pid=
trap 'stopping=1; [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null' TERM INT
while :; do
    mqfed node --config "$CONFIG" &
    pid=$!
    # `wait` returns early when a trapped signal arrives: wait again until the sidecar is gone
    while :; do
        wait "$pid"
        rc=$?
        kill -0 "$pid" 2> /dev/null || break
    done
    pid=
    if [ "$stopping" = 1 ]; then
        exit "$rc"
    fi
    case "$rc" in
        0|2) exit "$rc" ;;  # clean stop, or a configuration/start-up error: let the runtime see it
    esac
    echo "mqfed-entrypoint: sidecar exited with status $rc; starting it again (Mosquitto keeps" \
         "running and is adopted)" >&2
    sleep 1
    if [ "$stopping" = 1 ]; then  # stopped while waiting: do not start it again
        exit 0
    fi
done
