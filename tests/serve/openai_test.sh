#!/usr/bin/env bash
# openai_test.sh TERN MODEL TMP NPM_PREFIX — installs the official `openai` npm package into a
# test-local folder (once) and runs openai_test.cjs against a fresh tern serve. Exit 77 (skipped)
# when node or the npm registry is unavailable.
. "$(dirname "$0")/lib.sh"
NPM=${4:?npm prefix}
command -v node >/dev/null && command -v npm >/dev/null || { echo "skip: node/npm not installed"; exit 77; }
if [ ! -d "$NPM/node_modules/openai" ]; then
    mkdir -p "$NPM"
    timeout 180 npm install --prefix "$NPM" --no-audit --no-fund --loglevel=error openai >/dev/null 2>&1 \
        || { echo "skip: npm install openai failed (registry unreachable?)"; exit 77; }
fi
echo "openai npm $(node -e "console.log(require('$NPM/node_modules/openai/package.json').version)")"
start_server -np 4 --api-key sekrit
timeout 120 node "$(dirname "$0")/openai_test.cjs" "$U" "$NPM"
rc=$?
stop_server
[ "$SRV_RC" = 0 ] || { echo "FAIL: server exit $SRV_RC"; exit 1; }
exit $rc
