#!/usr/bin/env bash
# Runs a command in a network namespace of its own, with its loopback and one veth pair of its own: the browser tests
# (scripts/test.sh runs them through this). Chromium watches the machine's interfaces through netlink and aborts page loads and requests
# with ERR_NETWORK_CHANGED whenever an address or a link changes, which other work on a shared machine does all the
# time (network-namespace tests add veth pairs and addresses). In a namespace of its own it sees only its own links, and
# so do the daemons and the test servers it talks to (all on 127.0.0.1), which are started inside it too. The veth pair
# (gwisol0/gwisol1, both ends inside, 198.18.255.253/30 from RFC 2544's block: nothing is reached through it) is there
# because with loopback alone Chromium believes it is offline and fails a redirect to a name the test serves through
# request routing (sso-browser's SAML provider) with ERR_INTERNET_DISCONNECTED.
# Needs root (unshare --net); as another user the command runs in this machine's namespace as before, and says so.
set -uo pipefail
if [ "$(id -u)" -eq 0 ] && unshare --net -- true 2>/dev/null; then
  # This shell stays in the machine's namespace while the command runs, so that GW_MACHINE_NETNS names it (the browser
  # tests' network stressor changes the machine's network there: test/helpers/netstress.ts).
  GW_MACHINE_NETNS=/proc/$$/ns/net unshare --net -- sh -c 'ip link set lo up &&
    ip link add gwisol0 type veth peer name gwisol1 && ip addr add 198.18.255.253/30 dev gwisol0 &&
    ip link set gwisol0 up && ip link set gwisol1 up && exec "$@"' netns-run "$@"
  exit $?
fi
echo "netns-run: not root, so the browser tests run in this machine's network namespace: a change of its interfaces" \
  "during the run (e.g. network-namespace tests running alongside) can fail page loads with ERR_NETWORK_CHANGED" >&2
exec "$@"
