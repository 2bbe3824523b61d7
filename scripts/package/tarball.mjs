// The release tarball gateway-ent-v<version>-linux-<arch>[-fips]-bin.tar.gz and its .sha256, as
// src/upgrade/tarball.ts downloads, checks and installs it: one top directory `gateway/` holding
//
//   install                         the install script tarball.ts runs from that directory (GATEWAY_BIN_DIR set)
//   gateway gwctl gwsh gateway-upgrade   wrappers: run from the extracted directory as they are; `install` writes
//                                   copies into GATEWAY_BIN_DIR that point at the installed app
//   lib/                            the app (Node.js runtime, dist/, node_modules/) and gateway-upgrade.mjs
//   README
//
// `install` puts the app into GATEWAY_LIB_DIR/<version> (default /usr/local/lib/gateway/<version>) and only then
// replaces the commands, so the upgrader's rollback (it copies the commands aside first and puts them back) brings
// back commands that point at the previous version's directory, which `install` keeps.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { run, SERVER_COMMANDS, tarballName, UPDATER_COMMAND } from './common.mjs';
import { wrapper, writeExecutable } from './stage.mjs';

export function installScript(version) {
  return `#!/bin/sh
# Installs gateway ${version} from this tarball (docs/install.md, "From the release tarball"):
#   the app into $GATEWAY_LIB_DIR/${version}   (default: /usr/local/lib/gateway/${version})
#   gateway, gwctl, gwsh, gateway-upgrade into $GATEWAY_BIN_DIR   (default: /usr/local/bin)
# The previous release's app directory is kept (a rollback puts its commands back); older ones are removed.
set -eu
version='${version}'
bin="\${GATEWAY_BIN_DIR:-/usr/local/bin}"
lib="\${GATEWAY_LIB_DIR:-$(dirname "$bin")/lib/gateway}"
case "$bin$lib" in *"'"*|*'|'*|*'\\'*) echo "install: refusing paths with quotes, | or backslashes: $bin $lib" >&2; exit 1 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
dest="$lib/$version"
previous=""
if [ -f "$bin/gateway" ]; then previous=$(sed -n "s/^app='\\(.*\\)'$/\\1/p" "$bin/gateway"); fi
mkdir -p "$lib" "$bin"
rm -rf "$dest.new"
cp -R "$here/lib" "$dest.new"
# The new runtime must run the new app before anything the host uses changes.
got=$("$dest.new/node" "$dest.new/dist/cli/gateway.js" --version)
if [ "$got" != "$version" ]; then echo "install: the new gateway says '$got', not $version; nothing was changed" >&2; rm -rf "$dest.new"; exit 1; fi
if [ -d "$dest" ] && [ "$dest" != "$previous" ]; then rm -rf "$dest"; fi
if [ -d "$dest" ]; then mv "$dest" "$dest.old"; fi
mv "$dest.new" "$dest"
for c in ${[...SERVER_COMMANDS, UPDATER_COMMAND].join(' ')}; do
  sed "s|^app=.*|app='$dest'|" "$here/$c" > "$bin/.$c.new"
  chmod 0755 "$bin/.$c.new"
  mv -f "$bin/.$c.new" "$bin/$c"
done
rm -rf "$dest.old"
# Keep this release and the previous one; remove older releases.
for d in "$lib"/*; do
  [ -d "$d" ] || continue
  if [ "$d" != "$dest" ] && [ "$d" != "$previous" ]; then rm -rf "$d"; fi
done
echo "installed gateway $version: commands in $bin, the app in $dest"
`;
}

/** Builds the tarball from the staged app; returns its path and the .sha256 path. */
export function buildTarball({ app, bundle, version, arch, fips, fipsMode, work, outDir, mtime }) {
  const top = join(work, 'gateway');
  mkdirSync(top, { recursive: true });
  run('cp', ['-al', app, join(top, 'lib')]);
  run('cp', [bundle, join(top, 'lib', 'gateway-upgrade.mjs')]);
  for (const command of SERVER_COMMANDS) {
    writeExecutable(join(top, command), wrapper({ command, app: '"$here/lib"', entry: `$app/dist/cli/${command}.js`, fips, fipsMode }));
  }
  writeExecutable(join(top, UPDATER_COMMAND), wrapper({ command: UPDATER_COMMAND, app: '"$here/lib"', entry: '$app/gateway-upgrade.mjs', nodePath: '$app/node_modules' }));
  writeExecutable(join(top, 'install'), installScript(version));
  writeFileSync(
    join(top, 'README'),
    `Gateway ${version}${fips ? ' (FIPS package)' : ''} for linux-${arch}.\n\nInstall: sudo ./install   (GATEWAY_BIN_DIR, GATEWAY_LIB_DIR move it; see docs/install.md)\nsystemd units: gateway install systemd --output /etc/systemd/system/\n`,
  );
  const name = tarballName(version, arch, fips);
  const out = join(outDir, name);
  run('tar', ['--sort=name', '--owner=0', '--group=0', '--numeric-owner', `--mtime=@${mtime}`, '-I', 'gzip -1', '-cf', out, '-C', work, 'gateway']);
  const sha = createHash('sha256').update(readFileSync(out)).digest('hex');
  writeFileSync(`${out}.sha256`, `${sha}  ${name}\n`);
  return { tarball: out, sha256: `${out}.sha256` };
}
