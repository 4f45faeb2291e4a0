#!/usr/bin/env bash
# Build mqfed's container images: mqfed/node, mqfed/etcd, mqfed/haproxy, mqfed/prometheus
# (tag $MQFED_IMAGE_TAG).
#
#   deploy/docker/build.sh                      # on a local Debian base made with debootstrap
#   BASE_IMAGE=debian:bookworm-slim deploy/docker/build.sh   # on the public image (registry)
#
# Needs a running Docker engine and the project's virtualenv (`make install`): the Python
# wheels (mqfed and its pinned dependencies) are resolved on the host with the host's own pip
# configuration and copied into the build, so the image installs exactly the same packages and
# nothing inside the build contacts a Python index. apt inside the build reaches the Debian
# mirror through the host network (--network host).
#
# With no BASE_IMAGE given, the base is $LOCAL_BASE (mqfed-base:bookworm), built once with
# `debootstrap --variant=minbase bookworm` + `docker import` (needs root) and reused after.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TAG=${MQFED_IMAGE_TAG:-dev}
LOCAL_BASE=${MQFED_LOCAL_BASE:-mqfed-base:bookworm}
BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
VENV=${VENV:-$ROOT/.venv}
CTX=$ROOT/build/docker-context
export DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0}  # the classic builder: Debian's docker.io has no buildx

say() { echo "[images] $*"; }
started=$(date +%s)

build_local_base() {
    if docker image inspect "$LOCAL_BASE" > /dev/null 2>&1; then
        say "base image $LOCAL_BASE exists (cached)"
        return
    fi
    if [ "$(id -u)" != 0 ] || ! command -v debootstrap > /dev/null; then
        echo "build.sh: the base image $LOCAL_BASE is missing and building it needs root and" \
             "debootstrap (apt-get install debootstrap). Or use a registry:" \
             "BASE_IMAGE=debian:bookworm-slim $0" >&2
        exit 1
    fi
    local dir t0
    t0=$(date +%s)
    dir=$(mktemp -d /tmp/mqfed-rootfs.XXXXXX)
    say "building base image $LOCAL_BASE: debootstrap --variant=minbase bookworm $MIRROR"
    debootstrap --variant=minbase bookworm "$dir" "$MIRROR" > "$dir.log" 2>&1 || {
        tail -20 "$dir.log" >&2; rm -f "$dir.log"; exit 1; }
    rm -f "$dir.log"
    # like debian:bookworm-slim: updates and security suites, no package caches
    rm -f "$dir/etc/apt/sources.list"
    cat > "$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # and, like the slim image, no docs, man pages or translations (now or from later installs)
    cat > "$dir/etc/dpkg/dpkg.cfg.d/mqfed-slim" <<EOF
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    find "$dir/usr/share/doc" -type f ! -name copyright -delete
    rm -rf "$dir"/usr/share/{man,info}/* "$dir"/var/cache/apt/*.bin
    find "$dir/usr/share/locale" -mindepth 1 ! -name locale.alias -delete
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -c . | docker import -c 'CMD ["/bin/bash"]' - "$LOCAL_BASE" > /dev/null
    rm -rf "$dir"
    say "base image $LOCAL_BASE built in $(( $(date +%s) - t0 ))s"
}

stage_context() {
    rm -rf "$CTX"
    mkdir -p "$CTX/mosquitto-plugin" "$CTX/wheels" "$CTX/src"
    cp "$ROOT"/deploy/docker/{Dockerfile,node.toml,entrypoint.sh,health.py,haproxy.cfg} "$CTX/"
    cp "$ROOT"/deploy/prometheus/{prometheus.yml,alerts.yml} "$CTX/"
    cp -r "$ROOT"/deploy/mosquitto-plugin/{Makefile,src,third_party} "$CTX/mosquitto-plugin/"
    # the generated protobuf modules are part of the package: make sure they exist
    make -s -C "$ROOT" proto > /dev/null
    cp -r "$ROOT"/{pyproject.toml,README.md,sidecar} "$CTX/src/"
    find "$CTX/src" -name __pycache__ -prune -exec rm -rf {} +
    say "resolving Python wheels with the host's pip configuration"
    # a fixed SOURCE_DATE_EPOCH makes the mqfed wheel reproducible: unchanged code, cached layer
    SOURCE_DATE_EPOCH=315532800 \
        "$VENV/bin/pip" wheel -q --disable-pip-version-check -w "$CTX/wheels" "$CTX/src" \
        > "$CTX/pip.log" 2>&1 || { cat "$CTX/pip.log" >&2; exit 1; }
    rm -rf "$CTX/src" "$CTX/pip.log"
}

build_target() {  # target image
    local t0
    t0=$(date +%s)
    say "docker build --target $1 -t $2 (base $BASE_IMAGE)"
    if ! docker build --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" --target "$1" \
            -t "$2" "$CTX" > "$CTX/build-$1.log" 2>&1; then
        tail -40 "$CTX/build-$1.log" >&2
        echo "build.sh: building $2 failed; full log: $CTX/build-$1.log" >&2
        exit 1
    fi
    say "  $2 built in $(( $(date +%s) - t0 ))s, $(docker image inspect -f '{{.Size}}' "$2" \
        | awk '{printf "%.0f MB", $1/1000000}')"
}

if [ "$BASE_IMAGE" = "$LOCAL_BASE" ]; then
    build_local_base
fi
stage_context
build_target etcd "mqfed/etcd:$TAG"
build_target haproxy "mqfed/haproxy:$TAG"
build_target prometheus "mqfed/prometheus:$TAG"
build_target build "mqfed/build:$TAG"  # tagged, so its cache survives the clean-up below
build_target node "mqfed/node:$TAG"
# each rebuild leaves the previous images untagged: drop those of ours, nothing else
docker image prune -f --filter "label=org.mqfed.build=1" > /dev/null
say "done in $(( $(date +%s) - started ))s: mqfed/node:$TAG mqfed/etcd:$TAG mqfed/haproxy:$TAG" \
    "mqfed/prometheus:$TAG"
