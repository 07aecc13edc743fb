#!/usr/bin/env bash
# Installs what Porthole needs on Debian, only if missing: runc (the OCI runtime), Node.js and Python 3
# (the interpreters sandboxes run, from the host's /usr). Safe to run again and again.
set -euo pipefail
need=()
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/bin/node ] || need+=(nodejs)
[ -x /usr/bin/python3 ] || need+=(python3)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "missing: ${need[*]}. Install them: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing ${need[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
