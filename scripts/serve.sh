#!/usr/bin/env bash
# `make serve`: examples/langgraph-server under LangGraph's server (`langgraph dev`),
# on 127.0.0.1:$PORT, $JOBS runs at once. Ctrl-C or SIGTERM stops it: the server
# leaves the example's checkpointer, which unmounts every shard (no mount and no
# daemon is left). The example's settings are its environment variables (the
# table "The example's settings" in docs/server.md; the example's module
# docstring lists their names).
#
# The server keeps its own records (threads, runs, assistants: `.langgraph_api/`)
# in its working directory; this script runs it in $VFSD_RUNS/langgraph-server,
# next to the threads' files and checkpoints, so a restart on the same VFSD_RUNS
# finds every thread and nothing is written into the checkout.
set -euo pipefail

PORT="${PORT:-2024}"
JOBS="${JOBS:-16}"
if ! [[ "$PORT" =~ ^[0-9]{1,5}$ ]] || ((10#$PORT < 1 || 10#$PORT > 65535)); then
    echo "serve: PORT must be a TCP port (1 to 65535), not '$PORT'" >&2
    exit 2
fi
if ! [[ "$JOBS" =~ ^[0-9]{1,4}$ ]] || ((10#$JOBS < 1)); then
    echo "serve: JOBS (runs at once) must be a whole number from 1 to 9999, not '$JOBS'" >&2
    exit 2
fi

# Relative paths are the caller's (resolved before the cd below).
export VFSD_RUNS="$(realpath -m -- "${VFSD_RUNS:-$HOME/.local/state/vfsd/langgraph-runs}")"
if [ -n "${VFSD_CONFIG:-}" ]; then
    export VFSD_CONFIG="$(realpath -m -- "$VFSD_CONFIG")"
fi
CHECKOUT="$(cd "$(dirname "$0")/.." && pwd)"
# langgraph dev moves to another port, saying so in one log line among many,
# when its own is taken: a client of PORT would reach the other server instead.
if ! "$CHECKOUT/.venv/bin/python" -c '
import socket, sys
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))' "$PORT" 2>/dev/null; then
    echo "serve: port $PORT of 127.0.0.1 is taken (another server?); give another: make serve PORT=..." >&2
    exit 2
fi
STATE="$VFSD_RUNS/langgraph-server"
mkdir -p "$STATE"
cd "$STATE"

export LANGGRAPH_CLI_NO_ANALYTICS="${LANGGRAPH_CLI_NO_ANALYTICS:-1}"
# Nothing leaves the machine unless asked for: no LangSmith traces by default.
export LANGSMITH_TRACING="${LANGSMITH_TRACING:-false}"
echo "serve: http://127.0.0.1:$PORT ($JOBS runs at once); threads' files in $VFSD_RUNS; Ctrl-C stops it" >&2
exec "$CHECKOUT/.venv/bin/langgraph" dev --no-browser --no-reload --host 127.0.0.1 \
    --port "$PORT" --n-jobs-per-worker "$JOBS" \
    --config "$CHECKOUT/examples/langgraph-server/langgraph.json"
