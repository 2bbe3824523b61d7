#!/usr/bin/env bash
# `npm test`: every test file, in two runs. The browser tests (Debian's Chromium) run on their own after the others,
# in a network namespace of their own (scripts/netns-run.sh): Chromium aborts page loads and requests with
# ERR_NETWORK_CHANGED whenever an address or link changes on the machine, which the network-namespace tests do all
# the time (veth pairs, addresses), and so does other work on a shared machine.
# Arguments go to both runs (e.g. --reporter=verbose); to run some files only, call `npx vitest run <files>` (browser
# files: `bash scripts/netns-run.sh npx vitest run <files>`, which `npm run test:browser` does for all of them).
set -uo pipefail
cd "$(dirname "$0")/.."
npx vitest run --exclude 'test/**/*browser.test.ts' "$@"
first=$?
# Every file whose name ends in browser.test.ts (vitest matches the filter against the path).
bash scripts/netns-run.sh npx vitest run browser.test.ts "$@"
second=$?
if [ "$first" -ne 0 ] || [ "$second" -ne 0 ]; then exit 1; fi
