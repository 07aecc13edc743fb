#!/usr/bin/env bash
# Brings up the local Porthole stack: sandboxd on 127.0.0.1 with a data dir in ./.porthole, the edge
# (bin/caddy with the root Caddyfile), a first API key, and a printed example. Stays in the
# foreground; Ctrl-C stops the edge and sandboxd (durable sessions keep running and are re-adopted by
# the next start). Settings come from the environment (PORTHOLE_API, PORTHOLE_DATA_DIR, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

API="${PORTHOLE_API:-127.0.0.1:8080}"
DATA_DIR="${PORTHOLE_DATA_DIR:-$PWD/.porthole}"
PREVIEW_DOMAIN="${PORTHOLE_PREVIEW_DOMAIN:-preview.localhost}"
HTTPS_PORT="${PORTHOLE_HTTPS_PORT:-8443}"
export PORTHOLE_DATA_DIR="$DATA_DIR" PORTHOLE_PREVIEW_DOMAIN="$PREVIEW_DOMAIN" PORTHOLE_HTTPS_PORT="$HTTPS_PORT" PORTHOLE_API="$API"
export XDG_DATA_HOME="$DATA_DIR/caddy-data" XDG_CONFIG_HOME="$DATA_DIR/caddy-config"
LOG="$DATA_DIR/sandboxd.log"
EDGE_LOG="$DATA_DIR/edge.log"

if [ "$(id -u)" != 0 ]; then
  echo "sandboxd creates namespaces and cgroups through runc and needs root: run 'sudo make run'" >&2
  exit 1
fi
mkdir -p "$DATA_DIR"

echo "starting sandboxd on $API (data in $DATA_DIR, log in $LOG) ..."
bin/sandboxd serve --listen "$API" --data-dir "$DATA_DIR" --preview-domain "$PREVIEW_DOMAIN" --preview-port "$HTTPS_PORT" >>"$LOG" 2>&1 &
pid=$!
edge=""
stop() {
  trap - EXIT INT TERM
  echo; echo "stopping the edge and sandboxd ..."
  [ -n "$edge" ] && kill -TERM "$edge" 2>/dev/null && wait "$edge" 2>/dev/null
  kill -TERM $pid 2>/dev/null; wait $pid $edge 2>/dev/null
  echo stopped.
  exit 0
}
trap stop EXIT INT TERM

for i in $(seq 1 100); do
  if curl -fsS "http://$API/healthz" >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "sandboxd exited; last log lines:" >&2; tail -20 "$LOG" >&2; exit 1; fi
  sleep 0.1
done
curl -fsS "http://$API/healthz" >/dev/null || { echo "sandboxd did not become healthy; see $LOG" >&2; exit 1; }

echo "starting the edge on https://*.$PREVIEW_DOMAIN:$HTTPS_PORT (log in $EDGE_LOG) ..."
bin/caddy run --config Caddyfile >>"$EDGE_LOG" 2>&1 &
edge=$!
for i in $(seq 1 100); do
  if [ -f "$XDG_DATA_HOME/caddy/pki/authorities/local/root.crt" ]; then break; fi
  if ! kill -0 $edge 2>/dev/null; then echo "the edge exited; last log lines:" >&2; tail -20 "$EDGE_LOG" >&2; exit 1; fi
  sleep 0.1
done
ROOT_CA="$XDG_DATA_HOME/caddy/pki/authorities/local/root.crt"

KEY=$(bin/sandboxd keys create --data-dir "$DATA_DIR" --owner local | tail -n 1)
echo "$KEY" > "$DATA_DIR/api-key"
chmod 600 "$DATA_DIR/api-key"

cat <<TXT

Porthole is up.
  API:      http://$API   (OpenAPI document: /api/v1/openapi.json, metrics: /metrics)
  API key:  $KEY   (also in $DATA_DIR/api-key)

Run code once in a fresh sandbox:

  curl -s http://$API/api/v1/sandbox/ephemeral \\
    -H 'x-api-key: $KEY' \\
    -d '{"language": "javascript", "source": "return { ok: true, n: 1 + 1 };"}'

  curl -s http://$API/api/v1/sandbox/ephemeral \\
    -H 'x-api-key: $KEY' \\
    -d '{"language": "python", "source": "print(\"hi\")\nreturn sum(range(10))"}'

A preview: a public session serving on its own 127.0.0.1:3000, reached through the edge:

  S=\$(curl -s http://$API/api/v1/sandbox/sessions -H 'x-api-key: $KEY' \\
        -d '{"language": "python", "previewAccess": "public"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  curl -s http://$API/api/v1/sandbox/sessions/\$S/processes -H 'x-api-key: $KEY' \\
    -d '{"cmd": ["python3", "-m", "http.server", "3000", "--bind", "127.0.0.1"]}'
  curl --cacert $ROOT_CA https://3000-\$S.$PREVIEW_DOMAIN:$HTTPS_PORT/

  (*.localhost names resolve to 127.0.0.1 in browsers and curl; trust $ROOT_CA to open
   previews in a browser.)
Ctrl-C stops the stack.
TXT
wait $pid $edge
