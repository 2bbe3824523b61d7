// The file trees of the packages (what dpkg-deb and rpmbuild pack), from the staged app.
//
//   gateway, gateway-ent-fips   /usr/lib/gateway/{node,package.json,dist/,node_modules/}
//                               /usr/bin/{gateway,gwctl,gwsh}            wrappers (the -fips ones say FIPS)
//                               <unitdir>/gateway.service                src/upgrade/systemd.ts's text, bin dir /usr/bin
//                               /etc/default/gateway, /etc/gateway.yaml  configuration files (conffiles)
//                               /usr/share/doc/<name>/{copyright,changelog.gz}
//                               shell completion and manual pages of gateway, gwctl, gwsh (below)
//   gateway-ent-updater         /usr/lib/gateway-ent-updater/gateway-upgrade.mjs   one-file bundle
//                               /usr/bin/gateway-upgrade                 wrapper, on the gateway's runtime
//                               <unitdir>/gateway-upgrade.{service,timer}
//                               shell completion and manual page of gateway-upgrade
//
// Shell completion and manual pages are what the packaged programs print themselves (`<command> completion
// <shell>`, `<command> man`: src/cli/completion.ts), run here on the staged runtime, at the paths the shells and
// man look in (docs/cli.md): /usr/share/bash-completion/completions/<command>, /usr/share/zsh/vendor-completions/
// _<command>, /usr/share/fish/vendor_completions.d/<command>.fish, /usr/share/man/man1/<command>.1.gz.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { APP_DIR, HOMEPAGE, ROOT, run, SERVER_COMMANDS, UPDATER_COMMAND, UPDATER_DIR, UPDATER_PACKAGE } from './common.mjs';
import { wrapper, writeExecutable } from './stage.mjs';

/** Where each shell looks for a command's completion script (relative to the package root). */
export const COMPLETION_PATHS = {
  bash: (c) => `usr/share/bash-completion/completions/${c}`,
  zsh: (c) => `usr/share/zsh/vendor-completions/_${c}`,
  fish: (c) => `usr/share/fish/vendor_completions.d/${c}.fish`,
};
export const MAN_PATH = (c) => `usr/share/man/man1/${c}.1.gz`;

/** The completion scripts and the manual page of a command, from the command itself (node entry ...args). */
function commandDocs(root, command, node, entry, nodePath) {
  const env = { PATH: process.env.PATH, HOME: '/nonexistent', ...(nodePath ? { NODE_PATH: nodePath } : {}) };
  const say = (...args) => execFileSync(node, [entry, ...args], { encoding: 'utf8', env });
  for (const [shell, path] of Object.entries(COMPLETION_PATHS)) {
    mkdirSync(dirname(join(root, path(command))), { recursive: true });
    writeFileSync(join(root, path(command)), say('completion', shell));
  }
  mkdirSync(join(root, 'usr/share/man/man1'), { recursive: true });
  // gzip -9n, as for the changelog: lintian wants manual pages compressed at the best level, without a time stamp.
  writeFileSync(join(root, MAN_PATH(command)), gzipSync(say('man'), { level: 9 }));
}

/** The unit texts, from the built app itself (the same function `gateway install systemd` prints with). */
async function units() {
  const systemd = await import(join(ROOT, 'dist/upgrade/systemd.js'));
  const o = { binDir: '/usr/bin' };
  return {
    'gateway.service': systemd.agentUnit(o),
    'gateway-upgrade.service': systemd.upgradeServiceUnit(o),
    'gateway-upgrade.timer': systemd.upgradeTimerUnit(),
  };
}

export const ENV_FILE = [
  '# Environment of gateway.service and gateway-upgrade.service (EnvironmentFile=-/etc/default/gateway).',
  '# Outbound connections go through an HTTP CONNECT proxy when these are set (docs/dialing.md):',
  '#HTTPS_PROXY=http://proxy.internal:3128',
  '#NO_PROXY=localhost,127.0.0.1,.internal',
  '# A proxy that asks for NTLM: the account in the URL, the backslash as %5C. One that asks for Negotiate (Kerberos):',
  '# no credentials in the URL, and a keytab of the agent\'s own principal (libkrb5 gets its tickets from it).',
  '#HTTPS_PROXY=http://CORP%5Csvc-gateway:password@proxy.internal:3128',
  '#KRB5_CLIENT_KTNAME=/etc/gateway/agent.keytab',
  '#KRB5CCNAME=FILE:/var/lib/gateway/krb5cc',
  '# The upgrader (docs/upgrades.md, "Settings"), e.g. where release tarballs are downloaded from:',
  '#GATEWAY_UPGRADE_DOWNLOAD_URL=https://cdn.gateway.example',
  '',
].join('\n');

function copyright() {
  return [
    'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/',
    'Upstream-Name: gateway',
    `Source: ${HOMEPAGE}`,
    '',
    'Files: *',
    'Copyright: 2024-2026 The Gateway authors',
    'License: Apache-2.0',
    '',
    'Files: usr/lib/gateway/node',
    'Copyright: 2009-2026 Node.js contributors',
    'License: Expat',
    '',
    'Files: usr/lib/gateway/node_modules/*',
    'Copyright: 2009-2026 the authors of each package (its package.json and license file name them)',
    'License: various free licenses, named in each package.json',
    '',
    'License: Apache-2.0',
    ' On Debian systems, the full text of the Apache License, Version 2.0 is in',
    ' /usr/share/common-licenses/Apache-2.0.',
    '',
    'License: Expat',
    ' Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated',
    ' documentation files (the "Software"), to deal in the Software without restriction, including without limitation',
    ' the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and',
    ' to permit persons to whom the Software is furnished to do so, subject to the following conditions:',
    ' .',
    ' The above copyright notice and this permission notice shall be included in all copies or substantial portions of',
    ' the Software.',
    ' .',
    ' THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND.',
    '',
  ].join('\n');
}

function docs(root, name, version, date) {
  const dir = join(root, 'usr/share/doc', name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'copyright'), copyright());
  const changelog = `${name} (${version}) stable; urgency=medium\n\n  * Release ${version}.\n\n -- Gateway maintainers <maintainers@gateway.example>  ${date}\n`;
  // gzip -9n: lintian wants changelogs compressed at the best level and without a time stamp.
  writeFileSync(join(dir, 'changelog.gz'), gzipSync(changelog, { level: 9 }));
}

/**
 * The tree of one server package (gateway or gateway-ent-fips) under root. `app` is the staged app directory
 * (hard-linked in, not copied). Returns the configuration files (absolute paths on the target system).
 */
export async function serverTree(root, { name, fips, fipsMode, app, unitDir, debVersion, date }) {
  mkdirSync(join(root, 'usr/lib'), { recursive: true });
  run('cp', ['-al', app, join(root, APP_DIR.slice(1))]);
  for (const command of SERVER_COMMANDS) {
    writeExecutable(join(root, 'usr/bin', command), wrapper({ command, app: '"$here/../lib/gateway"', entry: `$app/dist/cli/${command}.js`, fips, fipsMode }));
    commandDocs(root, command, join(app, 'node'), join(app, 'dist/cli', `${command}.js`));
  }
  const u = await units();
  mkdirSync(join(root, unitDir.slice(1)), { recursive: true });
  writeFileSync(join(root, unitDir.slice(1), 'gateway.service'), u['gateway.service']);
  mkdirSync(join(root, 'etc/default'), { recursive: true });
  writeFileSync(join(root, 'etc/default/gateway'), ENV_FILE);
  const sample = execFileSync(join(app, 'node'), [join(app, 'dist/cli/gateway.js'), 'configure'], { encoding: 'utf8', env: { PATH: process.env.PATH, HOME: '/nonexistent' } });
  writeFileSync(join(root, 'etc/gateway.yaml'), sample.replace(/# nodename: \S+/, '# nodename: host'));
  docs(root, name, debVersion, date);
  return ['/etc/default/gateway', '/etc/gateway.yaml'];
}

/** The tree of gateway-ent-updater. */
export async function updaterTree(root, { bundle, app, unitDir, debVersion, date }) {
  mkdirSync(join(root, UPDATER_DIR.slice(1)), { recursive: true });
  cpSync(bundle, join(root, UPDATER_DIR.slice(1), 'gateway-upgrade.mjs'));
  writeExecutable(
    join(root, 'usr/bin', UPDATER_COMMAND),
    wrapper({ command: UPDATER_COMMAND, app: '"$here/../lib/gateway"', entry: '$here/../lib/gateway-ent-updater/gateway-upgrade.mjs', nodePath: '$app/node_modules' }),
  );
  // As its wrapper runs it: the bundle finds its external modules in the gateway package's node_modules.
  commandDocs(root, UPDATER_COMMAND, join(app, 'node'), bundle, join(app, 'node_modules'));
  const u = await units();
  mkdirSync(join(root, unitDir.slice(1)), { recursive: true });
  for (const n of ['gateway-upgrade.service', 'gateway-upgrade.timer']) writeFileSync(join(root, unitDir.slice(1), n), u[n]);
  docs(root, UPDATER_PACKAGE, debVersion, date);
  return [];
}

export { units };
