#!/usr/bin/env bash
# Installs the real components the tests start (Debian packages), skipping what is already there.
# Run as root (CI is); as another user it says what is missing and how to install it.
set -euo pipefail

# command -> Debian package
declare -A NEED=(
  [squid]=squid          # the HTTP CONNECT proxy every dial test goes through
  [socat]=socat          # the peer baseline in bench/ and a TLS front in tests
  [openssl]=openssl      # test certificate authorities
  [htpasswd]=apache2-utils  # squid basic-auth password files
  [haproxy]=haproxy      # a real L4 load balancer (send-proxy-v2) in front of the Proxy, and the mux benchmark's peer
)

missing=()
for cmd in "${!NEED[@]}"; do
  if ! command -v "$cmd" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$cmd" ]; then
    missing+=("${NEED[$cmd]}")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "error: the tests need these Debian packages: ${missing[*]}" >&2
  echo "hint: run 'sudo apt-get install -y ${missing[*]}' (or run the tests as root)" >&2
  exit 1
fi

echo "installing test dependencies: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts squid as a system service on install where an init system runs; the tests run their own.
if command -v service >/dev/null 2>&1; then
  service squid stop >/dev/null 2>&1 || true
  service haproxy stop >/dev/null 2>&1 || true
fi
