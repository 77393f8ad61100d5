#!/bin/sh
# The image's entrypoint, run by tini. `join` gets the container's defaults first, so that flags the
# user gives after them win (for an option given twice, the last one counts): listen on
# 0.0.0.0:31337, identity /id/key, checkpoints in /checkpoints, --device $GWTF_DEVICE (auto) and the
# heartbeat file the HEALTHCHECK reads. With GWTF_BOOTSTRAP_HEARTBEAT (a data holder's heartbeat file
# on a shared volume) and GWTF_BOOTSTRAP_ADDR (/dns4/HOST/tcp/PORT), a node joins the peer that file
# names: the file is fresh only while that peer runs, so no stale address is ever used (compose.yaml).
# Any other command goes to gwtf unchanged. `exec`: gwtf replaces this shell and gets tini's signals.
set -eu
if [ "${1:-}" = "join" ]; then
    shift
    if [ -n "${GWTF_BOOTSTRAP_HEARTBEAT:-}" ]; then
        peer_id=$(python -m gwtf_cli.heartbeat "$GWTF_BOOTSTRAP_HEARTBEAT" --print-peer-id) || {
            echo "gwtf-entrypoint: no live bootstrap peer in $GWTF_BOOTSTRAP_HEARTBEAT" >&2
            exit 1
        }
        set -- --initial-peers "${GWTF_BOOTSTRAP_ADDR:?set GWTF_BOOTSTRAP_ADDR to /dns4/HOST/tcp/PORT}/p2p/$peer_id" "$@"
    fi
    set -- join --host 0.0.0.0 --port 31337 --identity /id/key --checkpoint-dir /checkpoints \
        --device "${GWTF_DEVICE:-auto}" --heartbeat-file "${GWTF_HEARTBEAT_FILE:-/run/gwtf/heartbeat.json}" "$@"
fi
exec gwtf "$@"
