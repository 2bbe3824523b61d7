#!/usr/bin/env bash
# Installs the real components the tests start (Debian packages), skipping what is already there.
# Run as root (CI is); as another user it says what is missing and how to install it.
# test/deps.test.ts fails when a test or a benchmark spawns a program that this list does not cover.
set -euo pipefail

# command -> Debian package
declare -A NEED=(
  [squid]=squid-openssl  # the HTTP CONNECT proxy every dial test goes through; the OpenSSL build (Debian's squid
                         # package has no ssl_bump) so that it also inspects TLS as a corporate proxy does
  [socat]=socat          # the peer baseline in bench/ and a TLS front in tests
  [openssl]=openssl      # test certificate authorities
  [htpasswd]=apache2-utils  # squid basic-auth password files
  [haproxy]=haproxy      # a real L4 load balancer (send-proxy-v2) in front of the Proxy, and the mux benchmark's peer
  [apt-ftparchive]=apt-utils  # indexes the real apt repository the upgrader tests build (test/upgrade/helpers.ts)
  [dpkg-deb]=dpkg            # builds the .deb packages of that repository
  [rpmbuild]=rpm             # npm run package builds the .rpm packages (scripts/package/rpm.mjs); rpm -qp reads them
  [lintian]=lintian          # test/package/build.test.ts checks the .deb packages
  [strip]=binutils           # npm run package strips the Node.js runtime and the native modules
  # real rpm repositories and upgrades with dnf and zypper into a temporary root (test/upgrade/rpm-suite.ts,
  # packaged.test.ts); rpmbuild (above) also builds their fake packages
  [createrepo_c]=createrepo-c  # indexes them, one repository per channel
  [dnf]=dnf
  [zypper]=zypper
  [gpg]=gpg                  # signs the test repositories (InRelease, repomd.xml.asc) with a key of their own
  [gpgconf]=gpgconf          # ends the gpg agents of those keys
  [systemd-analyze]=systemd  # `systemd-analyze verify` of the units `gateway install systemd` writes
  # real databases behind an agent (test/helpers/databases.ts, test/e2e/tunnel.test.ts)
  [postgres]=postgresql      # the server: not on PATH, looked for in /usr/lib/postgresql/*/bin
  [psql]=postgresql-client
  [mariadbd]=mariadb-server
  [mariadb]=mariadb-client
  [redis-server]=redis-server
  [redis-cli]=redis-tools
  # OpenSSH: the real clients in the SSH tests, sshd as the peer of bench:tunnel and bench:ssh
  [ssh]=openssh-client       # also ssh-keygen, scp, sftp
  [sshd]=openssh-server
  # test hosts and firewalls in network namespaces (test/helpers/netns.ts, firewall.ts)
  [ip]=iproute2
  [nft]=nftables             # a silent DROP (no FIN, no RST) of a path in a namespace: dead-tunnel detection (test/e2e/netpaths.test.ts)
  [ps]=procps                # process trees in the SSH and reload tests
  # the SOCKS5 lab (test/helpers/dante.ts): Dante's server; useradd/chpasswd/userdel (passwd, on every Debian
  # system) make its throw-away account; unshare and mount (util-linux, mount) give it a hosts file of its own
  [danted]=dante-server
  [useradd]=passwd
  [chpasswd]=passwd
  [userdel]=passwd
  [unshare]=util-linux       # also runs the browser tests in a network namespace of their own (scripts/netns-run.sh)
  [nsenter]=util-linux       # the network stressor of the browser tests changes the machine's namespace (test/helpers/netstress.ts)
  [mount]=mount
  [unzip]=unzip              # scripts/install-kubetools.sh unpacks helm and kubectl (the chart tests) with it
  [curl]=curl                # HTTP requests through squid and to the version server, as a user would send them
  [tmux]=tmux                # a real terminal for the interactive SSH test
  [iperf3]=iperf3            # the native client and server of bench:tunnel's user path (iperf3 -> gwsh proxy app -> ...)
  [perf]=linux-perf         # bench:ssh follows keystrokes through every process of a path with `perf trace` (skipped when perf cannot run on this kernel)
  # the Web UI tests' real browser (test/helpers/browser.ts): Debian's Chromium driven by playwright-core (which
  # never downloads a browser), and the NSS tools that make the browser's own database trusting the test cluster's CA
  [chromium]=chromium
  [certutil]=libnss3-tools
  [nginx]=nginx-light        # bench:web's peer: the same dist/web/ files served by nginx over TLS + HTTP/2
  # the Kerberos proxy lab (test/helpers/kerberos.ts): an MIT KDC with a realm of the test's own, in front of
  # squid's negotiate_kerberos_auth (which comes with squid)
  [krb5kdc]=krb5-kdc         # also kdb5_util
  [kdb5_util]=krb5-kdc
  [kadmin.local]=krb5-admin-server
  [kinit]=krb5-user
  # the NTLM proxy lab (test/helpers/ntlm.ts): Samba's ntlm_auth as squid's helper, winbindd over a local tdbsam
  [ntlm_auth]=winbind        # also winbindd, wbinfo
  [winbindd]=winbind
  [wbinfo]=winbind
  [smbpasswd]=samba-common-bin
  # the generated shell completion scripts and manual pages (test/cli/completion.test.ts): the shells run them
  # (bash is on every Debian system), groff checks the pages as man(1) renders them
  [zsh]=zsh
  [fish]=fish
  [groff]=groff-base
  # the Ansible collection of deploy/ansible/ run against a real daemon (test/cli/ansible.test.ts)
  [ansible-playbook]=ansible-core
  [python3]=python3          # the interpreter the test gives Ansible for its modules (/usr/bin/python3, Debian's)
  # the metrics tests (test/e2e/metrics.test.ts, test/metrics/rules.test.ts): Prometheus scrapes real daemons,
  # promtool checks each /metrics body and unit-tests the alerting rules of deploy/prometheus/
  [prometheus]=prometheus
  [promtool]=prometheus
)

# file -> Debian package, for what the tests need that is not a command
declare -A NEED_FILES=(
  # a font for Chromium's pages, so that the screenshots the browser tests save are readable
  [/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf]=fonts-dejavu-core
  # squid's certificate generator for ssl_bump (test/helpers/squid.ts, bump): only in squid-openssl, so a machine
  # with Debian's plain squid gets squid-openssl in its place (the two packages replace each other)
  [/usr/lib/squid/security_file_certgen]=squid-openssl
  # GSSAPI headers, to build the optional `kerberos` npm package (Negotiate proxy authentication) from source: its
  # prebuilt binary is downloaded from GitHub, which CI cannot reach
  [/usr/include/gssapi/gssapi.h]=libkrb5-dev
)

missing=()
present() {
  case "$1" in
    postgres) compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null ;;
    /*) [ -e "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] ;;
  esac
}
for cmd in "${!NEED[@]}"; do
  if ! present "$cmd"; then
    missing+=("${NEED[$cmd]}")
  fi
done
for file in "${!NEED_FILES[@]}"; do
  if ! present "$file"; then
    missing+=("${NEED_FILES[$file]}")
  fi
done

# The optional `kerberos` npm package is skipped by `npm ci` on a machine without libkrb5-dev (npm drops an
# optional dependency whose build fails); once the headers are there, install it again from the lock file.
ensure_kerberos_module() {
  cd "$(dirname "$0")/.."
  if [ -e /usr/include/gssapi/gssapi.h ] && ! node -e "require('kerberos')" >/dev/null 2>&1; then
    echo "building the optional kerberos module (Negotiate proxy authentication)" >&2
    npm install --no-save --no-audit --no-fund --loglevel=error >/dev/null
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  ensure_kerberos_module
  "$(dirname "$0")/install-kubetools.sh"   # helm and kubectl into .cache/kubetools/ (the chart tests)
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
  # the same for the databases: the tests start their own, with their own data directories
  service postgresql stop >/dev/null 2>&1 || true
  service mariadb stop >/dev/null 2>&1 || true
  service redis-server stop >/dev/null 2>&1 || true
  service ssh stop >/dev/null 2>&1 || true   # the SSH tests and benchmarks start their own sshd
  service iperf3 stop >/dev/null 2>&1 || true  # bench:tunnel starts its own iperf3 -s
  service nginx stop >/dev/null 2>&1 || true   # bench:web starts its own nginx
  service prometheus stop >/dev/null 2>&1 || true  # the metrics tests start their own, with their own storage
  # the Kerberos and NTLM labs start their own KDC and winbindd (in a mount namespace of its own)
  service krb5-kdc stop >/dev/null 2>&1 || true
  service krb5-admin-server stop >/dev/null 2>&1 || true
  service winbind stop >/dev/null 2>&1 || true
fi
ensure_kerberos_module
"$(dirname "$0")/install-kubetools.sh"   # helm and kubectl into .cache/kubetools/ (the chart tests)
