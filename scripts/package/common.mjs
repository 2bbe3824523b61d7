// What every part of `npm run package` shares: names, versions, the architecture, running a program.
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { arch as nodeArch } from 'node:os';

export const ROOT = new URL('../../', import.meta.url).pathname;

/** The app's directory on the installed system (docs/install.md says why /usr/lib). */
export const APP_DIR = '/usr/lib/gateway';
/** The updater's own directory: its single-file bundle. */
export const UPDATER_DIR = '/usr/lib/gateway-ent-updater';

export const MAINTAINER = 'Gateway maintainers <maintainers@gateway.example>';
export const HOMEPAGE = 'https://gateway.example';

/** The packages: [name, fips]. The updater has no -fips name: it runs on whichever runtime is installed. */
export const SERVER_PACKAGES = [
  { name: 'gateway', fips: false },
  { name: 'gateway-ent-fips', fips: true },
];
export const UPDATER_PACKAGE = 'gateway-ent-updater';
/** The commands of the server packages, and the updater's. */
export const SERVER_COMMANDS = ['gateway', 'gwctl', 'gwsh'];
export const UPDATER_COMMAND = 'gateway-upgrade';

/** package.json's version (semver, e.g. 17.0.0-dev). */
export function sourceVersion() {
  return JSON.parse(readFileSync(`${ROOT}package.json`, 'utf8')).version;
}

/** A semver version must be checked before it is written into control files and scripts. */
export function checkVersion(v) {
  if (!/^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$/.test(v)) {
    throw new Error(`--version ${JSON.stringify(v)}: expected a semver version such as 17.0.1 or 17.1.0-rc.1 (no leading v, no build metadata)`);
  }
  return v;
}

/**
 * The version as Debian and RPM spell it (src/upgrade/packages.ts packageVersion): the pre-release's "-" becomes
 * "~", which both order before the release. No Debian revision and RPM release 1: the upgrader asks for
 * `gateway=<version>` (apt: the whole version) and `gateway-<version>` (dnf: version without release).
 */
export function packageVersion(v) {
  const dash = v.indexOf('-');
  return dash < 0 ? v : `${v.slice(0, dash)}~${v.slice(dash + 1)}`;
}

/** amd64 / arm64 / arm for the machine (the tarball's and Debian's spelling); RPM's spelling too. */
export function machineArch() {
  const a = { x64: 'amd64', arm64: 'arm64', arm: 'arm' }[nodeArch()];
  if (!a) throw new Error(`no package for the machine architecture ${nodeArch()}`);
  return a;
}
export function rpmArch(arch) {
  return { amd64: 'x86_64', arm64: 'aarch64', arm: 'armv7hl' }[arch];
}

export function tarballName(version, arch, fips) {
  return `gateway-ent-v${version}-linux-${arch}${fips ? '-fips' : ''}-bin.tar.gz`;
}

/** Runs a program; throws with its standard error when it fails. */
export function run(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 64 << 20, ...options });
  if (r.error) throw new Error(`${cmd}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (exit ${r.status}):\n${(r.stderr || r.stdout || '').slice(-4000)}`);
  return r.stdout;
}

export function have(cmd) {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
