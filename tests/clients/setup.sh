#!/usr/bin/env bash
# Installs the pinned client libraries that tests/clients.rs runs through respway: redis-py
# (requirements.txt) for python3, node-redis and ioredis (package.json + package-lock.json)
# in node_modules here. Idempotent; installs Debian's nodejs/npm only when they are missing.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq nodejs npm
fi

# node-redis 6.3.1 and ioredis 6.0.0 need node >= 20 (Debian 12's own nodejs is 18).
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "setup.sh: node $(node --version) is too old: the pinned node-redis and ioredis need node >= 20" >&2
  exit 1
fi

# Root on CI is expected; a Debian-managed python3 (PEP 668) is a test machine's too.
PIP_ROOT_USER_ACTION=ignore PIP_BREAK_SYSTEM_PACKAGES=1 \
  python3 -m pip install -q --disable-pip-version-check -r requirements.txt
want=$(sed -n 's/^redis==//p' requirements.txt)
python3 -c "import redis, sys; sys.exit(redis.__version__ != '$want')" \
  || { echo "setup.sh: python3 does not import redis $want after the install" >&2; exit 1; }

# Exactly what package-lock.json says (npm ci starts from an empty node_modules each time).
npm ci --no-audit --no-fund --loglevel=error
node -e 'require("redis"); require("ioredis")' \
  || { echo "setup.sh: node cannot load redis/ioredis from tests/clients/node_modules" >&2; exit 1; }
echo "setup.sh: redis-py $want, node-redis $(node -p 'require("redis/package.json").version'), ioredis $(node -p 'require("ioredis/package.json").version') ready"
