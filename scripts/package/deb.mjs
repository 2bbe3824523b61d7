// .deb packages: dpkg-deb, gzip level 1 (fast: most of the size is the Node.js runtime, which compresses little).
//
// Maintainer scripts, as dh_installsystemd would write them with --no-enable --no-start: systemd re-reads the units
// after install and removal; an installed service is never enabled or started; an upgrade restarts the service only
// if it was running (try-restart); removal stops and disables it. They do nothing to systemd when DPKG_ROOT is set
// (an install into another root: `dpkg --root=... --force-script-chrootless`), nor on a host without systemd.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { APP_DIR, HOMEPAGE, MAINTAINER, run } from './common.mjs';

const GUARD = 'if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then';

export function debScripts(units) {
  const main = units[0];
  const list = units.join(' ');
  return {
    postinst: [
      '#!/bin/sh',
      'set -e',
      '# The units are never enabled nor started here: the operator does it once configured (docs/install.md).',
      'if [ "$1" = configure ]; then',
      `  ${GUARD}`,
      '    systemctl --system daemon-reload >/dev/null || true',
      '    # An upgrade restarts a running service, as Debian packages do; a stopped one stays stopped.',
      `    if [ -n "$2" ]; then systemctl try-restart ${main} >/dev/null || true; fi`,
      '  fi',
      'fi',
      '',
    ].join('\n'),
    prerm: [
      '#!/bin/sh',
      'set -e',
      'if [ "$1" = remove ]; then',
      `  ${GUARD}`,
      `    systemctl disable --now ${list} >/dev/null 2>&1 || true`,
      '  fi',
      'fi',
      '',
    ].join('\n'),
    postrm: [
      '#!/bin/sh',
      'set -e',
      'case "$1" in',
      '  remove|purge)',
      `    ${GUARD}`,
      '      systemctl --system daemon-reload >/dev/null || true',
      '    fi ;;',
      'esac',
      '# The data directory (/var/lib/gateway: the cluster state, its CA keys) is never removed, not even on purge.',
      '',
    ].join('\n'),
  };
}

/** Installed-Size in KiB, as dpkg counts it. */
function installedSize(root) {
  return run('du', ['-sk', '--exclude=DEBIAN', root]).split(/\s/)[0];
}

export function debControl({ name, debVersion, arch, root, depends, recommends, conflicts, description }) {
  const fields = [
    `Package: ${name}`,
    `Version: ${debVersion}`,
    `Architecture: ${arch}`,
    `Maintainer: ${MAINTAINER}`,
    `Installed-Size: ${installedSize(root)}`,
    ...(depends ? [`Depends: ${depends}`] : []),
    ...(recommends ? [`Recommends: ${recommends}`] : []),
    ...(conflicts ? [`Conflicts: ${conflicts}`, `Replaces: ${conflicts}`] : []),
    'Section: net',
    'Priority: optional',
    `Homepage: ${HOMEPAGE}`,
    `Description: ${description[0]}`,
    ...description.slice(1).map((l) => (l === '' ? ' .' : ` ${l}`)),
    '',
  ];
  return fields.join('\n');
}

/** Writes DEBIAN/ into root and packs it into out. */
export function buildDeb(root, out, { control, conffiles, scripts, overrides, name }) {
  const debian = join(root, 'DEBIAN');
  mkdirSync(debian, { recursive: true });
  writeFileSync(join(debian, 'control'), control);
  if (conffiles.length > 0) writeFileSync(join(debian, 'conffiles'), `${conffiles.join('\n')}\n`);
  for (const [script, text] of Object.entries(scripts)) writeFileSync(join(debian, script), text, { mode: 0o755 });
  if (overrides) {
    const dir = join(root, 'usr/share/lintian/overrides');
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, name), overrides);
  }
  // dpkg --verify checks installed files against md5sums (what dh_md5sums writes).
  const sums = run('sh', ['-c', "find . -path ./DEBIAN -prune -o -type f -printf '%P\\0' | LC_ALL=C sort -z | xargs -0r md5sum"], { cwd: root });
  writeFileSync(join(debian, 'md5sums'), sums);
  run('dpkg-deb', ['--root-owner-group', '-Zgzip', '-z1', '--build', root, out]);
  return out;
}

export { APP_DIR };
