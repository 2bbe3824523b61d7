#!/usr/bin/env node
// `npm run package`: the packages users install, for this machine's architecture (docs/install.md).
//
//   node scripts/package/build.mjs [--version 17.0.1] [--out dist/packages] [--no-rpm] [--no-tarball]
//
// Needs a built dist/ (`npm run package` builds it first), dpkg-deb, rpmbuild (Debian's rpm package), strip, tar.
// Writes into --out (emptied first):
//   gateway_<v>_<arch>.deb  gateway-ent-fips_<v>_<arch>.deb  gateway-ent-updater_<v>_<arch>.deb
//   gateway-<v>-1.<rpmarch>.rpm  gateway-ent-fips-...  gateway-ent-updater-...
//   gateway-ent-v<version>-linux-<arch>[-fips]-bin.tar.gz and .sha256
//   manifest.json: every path above, the versions, the time each step took
// <v> is the package version (17.0.0~dev for 17.0.0-dev); --version builds the same app as another version.
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { checkVersion, machineArch, packageVersion, ROOT, rpmArch, SERVER_PACKAGES, sourceVersion, UPDATER_PACKAGE } from './common.mjs';
import { buildDeb, debControl, debScripts } from './deb.mjs';
import { serverTree, updaterTree } from './layout.mjs';
import { LINTIAN_OVERRIDES } from './lintian.mjs';
import { buildRpm, RPM_UNIT_DIR } from './rpm.mjs';
import { bundleUpdater, runtimeHasFips, stageApp } from './stage.mjs';
import { buildTarball } from './tarball.mjs';

const DEB_UNIT_DIR = '/lib/systemd/system';
/** The kerberos package's native binding in the staged app, when it was installed (an optional dependency). */
const KERBEROS_BINDING = 'node_modules/kerberos/build/Release/kerberos.node';
// Extended descriptions: lines of at most 79 characters (lintian).
const SERVER_DESCRIPTION = [
  'Infrastructure access gateway: daemon and command-line tools',
  'gateway runs the Auth Service, the Proxy Service and the agents (SSH,',
  'databases, applications, Kubernetes, desktops) that reach the Proxy',
  'through reverse tunnels; gwctl administers a cluster, gwsh signs users in',
  'and opens resources. The package carries its own Node.js runtime and the',
  'systemd unit gateway.service.',
];
const UPDATER_DESCRIPTION = [
  'Automatic upgrades of the gateway agent',
  'gateway-upgrade and the systemd timer gateway-upgrade.timer, which upgrade',
  'the gateway package inside the cluster\'s maintenance windows.',
];

function options() {
  const { values } = parseArgs({
    options: {
      version: { type: 'string' },
      out: { type: 'string' },
      'no-rpm': { type: 'boolean' },
      'no-tarball': { type: 'boolean' },
    },
  });
  return {
    version: checkVersion(values.version ?? sourceVersion()),
    out: resolve(values.out ?? join(ROOT, 'dist/packages')),
    rpm: !values['no-rpm'],
    tarball: !values['no-tarball'],
  };
}

function timer() {
  const times = {};
  let last = Date.now();
  return {
    times,
    lap(name) {
      const now = Date.now();
      times[name] = (now - last) / 1000;
      last = now;
    },
  };
}

async function serverPackages(ctx, pkg) {
  const conflicts = SERVER_PACKAGES.filter((p) => p.name !== pkg.name).map((p) => p.name).join(', ');
  const common = { name: pkg.name, fips: pkg.fips, fipsMode: ctx.fipsMode, app: ctx.app, debVersion: ctx.debVersion, date: ctx.date };
  const debRoot = join(ctx.work, `deb-${pkg.name}`);
  const conffiles = await serverTree(debRoot, { ...common, unitDir: DEB_UNIT_DIR });
  const description = pkg.fips ? [SERVER_DESCRIPTION[0] + ' (FIPS)', ...SERVER_DESCRIPTION.slice(1), '', 'This is the FIPS package: docs/install.md says what it changes.'] : SERVER_DESCRIPTION;
  // The kerberos module (Negotiate proxy authentication), staged when it was installed, links libgssapi_krb5.so.2:
  // recommended, not depended on, so that the package still installs into an empty root and runs there (a proxy
  // asking for Negotiate then fails with GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE naming the fix).
  const recommends = existsSync(join(ctx.app, KERBEROS_BINDING)) ? 'libgssapi-krb5-2' : undefined;
  const control = debControl({ name: pkg.name, debVersion: ctx.debVersion, arch: ctx.arch, root: debRoot, conflicts, recommends, description });
  const out = { deb: buildDeb(debRoot, join(ctx.out, `${pkg.name}_${ctx.debVersion}_${ctx.arch}.deb`), { control, conffiles, scripts: debScripts(['gateway.service']), overrides: LINTIAN_OVERRIDES.server, name: pkg.name }) };
  if (ctx.rpm) {
    const rpmRoot = join(ctx.work, `rpm-${pkg.name}`);
    await serverTree(rpmRoot, { ...common, unitDir: RPM_UNIT_DIR });
    out.rpm = buildRpm(rpmRoot, ctx.out, join(ctx.work, `rpmbuild-${pkg.name}`), {
      name: pkg.name, rpmVersion: ctx.debVersion, arch: rpmArch(ctx.arch), summary: description[0], description: description.slice(1).join('\n'),
      conflicts, units: ['gateway.service'], conffiles, ownDirs: ['/usr/lib/gateway', '/usr/share/doc/' + pkg.name],
    });
  }
  return out;
}

async function updaterPackages(ctx) {
  const common = { bundle: ctx.bundle, app: ctx.app, debVersion: ctx.debVersion, date: ctx.date };
  const debRoot = join(ctx.work, `deb-${UPDATER_PACKAGE}`);
  await updaterTree(debRoot, { ...common, unitDir: DEB_UNIT_DIR });
  const units = ['gateway-upgrade.timer', 'gateway-upgrade.service'];
  const depends = SERVER_PACKAGES.map((p) => p.name).join(' | ');
  const control = debControl({ name: UPDATER_PACKAGE, debVersion: ctx.debVersion, arch: ctx.arch, root: debRoot, depends, description: UPDATER_DESCRIPTION });
  const out = { deb: buildDeb(debRoot, join(ctx.out, `${UPDATER_PACKAGE}_${ctx.debVersion}_${ctx.arch}.deb`), { control, conffiles: [], scripts: debScripts(units), overrides: LINTIAN_OVERRIDES.updater, name: UPDATER_PACKAGE }) };
  if (ctx.rpm) {
    const rpmRoot = join(ctx.work, `rpm-${UPDATER_PACKAGE}`);
    await updaterTree(rpmRoot, { ...common, unitDir: RPM_UNIT_DIR });
    out.rpm = buildRpm(rpmRoot, ctx.out, join(ctx.work, `rpmbuild-${UPDATER_PACKAGE}`), {
      name: UPDATER_PACKAGE, rpmVersion: ctx.debVersion, arch: rpmArch(ctx.arch), summary: UPDATER_DESCRIPTION[0], description: UPDATER_DESCRIPTION.slice(1).join('\n'),
      requires: `(${SERVER_PACKAGES.map((p) => p.name).join(' or ')})`, units, conffiles: [], ownDirs: ['/usr/lib/gateway-ent-updater', '/usr/share/doc/' + UPDATER_PACKAGE],
    });
  }
  return out;
}

async function main() {
  const o = options();
  const t = timer();
  // The staging trees live outside --out: its default, dist/packages/, is inside the dist/ they copy.
  const work = mkdtempSync(join(tmpdir(), 'gateway-package-'));
  rmSync(o.out, { recursive: true, force: true });
  mkdirSync(o.out, { recursive: true });
  const ctx = {
    ...o,
    work,
    arch: machineArch(),
    debVersion: packageVersion(o.version),
    app: join(work, 'app'),
    bundle: join(work, 'gateway-upgrade.mjs'),
    fipsMode: runtimeHasFips(),
    date: new Date().toUTCString().replace(/GMT$/, '+0000'),
    mtime: Math.floor(Date.now() / 1000),
  };
  try {
    await buildAll(ctx, o, t);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

async function buildAll(ctx, o, t) {
  stageApp(ctx.app, o.version);
  await bundleUpdater(ctx.bundle, o.version);
  t.lap('stage');
  const manifest = { version: o.version, packageVersion: ctx.debVersion, arch: ctx.arch, fipsMode: ctx.fipsMode, node: process.version, packages: {}, tarballs: {}, seconds: t.times };
  for (const pkg of SERVER_PACKAGES) manifest.packages[pkg.name] = await serverPackages(ctx, pkg);
  manifest.packages[UPDATER_PACKAGE] = await updaterPackages(ctx);
  t.lap('packages');
  if (o.tarball) {
    for (const fips of [false, true]) {
      manifest.tarballs[fips ? 'fips' : 'default'] = buildTarball({ ...ctx, fips, work: join(ctx.work, `tarball${fips ? '-fips' : ''}`), outDir: o.out });
    }
    t.lap('tarballs');
  }
  writeFileSync(join(o.out, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  process.stdout.write(`${JSON.stringify(manifest, null, 2)}\n`);
}

main().catch((err) => {
  process.stderr.write(`error: ${err.message}\n`);
  process.exitCode = 1;
});
