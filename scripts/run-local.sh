#!/usr/bin/env bash
# Brings up the local Porthole stack: sandboxd on 127.0.0.1 with a data dir in ./.porthole, a first
# API key, and a printed example. Stays in the foreground; Ctrl-C stops everything and removes every
# sandbox. Settings come from the environment (PORTHOLE_API, PORTHOLE_DATA_DIR, ...).
set -euo pipefail
cd "$(dirname "$0")/.."

API="${PORTHOLE_API:-127.0.0.1:8080}"
DATA_DIR="${PORTHOLE_DATA_DIR:-$PWD/.porthole}"
PREVIEW_DOMAIN="${PORTHOLE_PREVIEW_DOMAIN:-preview.localhost}"
LOG="$DATA_DIR/sandboxd.log"

if [ "$(id -u)" != 0 ]; then
  echo "sandboxd creates namespaces and cgroups through runc and needs root: run 'sudo make run'" >&2
  exit 1
fi
mkdir -p "$DATA_DIR"

echo "starting sandboxd on $API (data in $DATA_DIR, log in $LOG) ..."
bin/sandboxd serve --listen "$API" --data-dir "$DATA_DIR" --preview-domain "$PREVIEW_DOMAIN" >>"$LOG" 2>&1 &
pid=$!
trap 'echo; echo "stopping sandboxd ..."; kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; echo stopped.' EXIT INT TERM

for i in $(seq 1 100); do
  if curl -fsS "http://$API/healthz" >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then echo "sandboxd exited; last log lines:" >&2; tail -20 "$LOG" >&2; exit 1; fi
  sleep 0.1
done
curl -fsS "http://$API/healthz" >/dev/null || { echo "sandboxd did not become healthy; see $LOG" >&2; exit 1; }

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

Previews (https://<port>-<sandboxId>.$PREVIEW_DOMAIN) arrive with sessions and the edge; see docs/.
Ctrl-C stops the stack.
TXT
wait $pid
