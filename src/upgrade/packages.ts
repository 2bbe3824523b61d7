/**
 * Package managers: which one installed the gateway, and the exact command lines that install a version with
 * each (pure functions, unit-tested for the managers that cannot run on the test machine).
 *
 * Version spelling: the version server speaks semver (17.1.0-rc.1); Debian and RPM packages spell a
 * pre-release with "~" (17.1.0~rc.1), which both formats order before the release, as semver does. apt asks
 * for `pkg=version`, yum and dnf for `pkg-version`, zypper for `pkg=version`. Every manager is limited to the
 * gateway repository while it refreshes and installs, so an unrelated broken repository does not block upgrades.
 */
import { GatewayError } from '../errors.js';
import { runCommand, which } from './exec.js';
import type { PackageManagerName } from './settings.js';

export type PackageManager = Exclude<PackageManagerName, 'tarball'>;

export const PACKAGE = 'gateway';
export const FIPS_PACKAGE = 'gateway-ent-fips';
/** The repository id in gateway.repo (yum, dnf, zypper). */
export const DEFAULT_REPO_ID = 'gateway';

/** The version as the package formats spell it: semver pre-release "-" becomes "~"; build metadata is dropped. */
export function packageVersion(version: string): string {
  const bare = version.trim().replace(/^v/, '').replace(/\+.*$/, '');
  const dash = bare.indexOf('-');
  return dash < 0 ? bare : `${bare.slice(0, dash)}~${bare.slice(dash + 1)}`;
}

export interface InstallSpec {
  /** Package name: gateway, or gateway-ent-fips. */
  pkg: string;
  /** Target version, semver (no leading v needed). */
  version: string;
  /** The target is older than what is installed (a rollback, or a channel moved back). */
  downgrade: boolean;
  /** apt: the gateway.list to refresh alone. */
  aptSourceList?: string;
  /** yum / dnf / zypper: the repository id to use alone. */
  repoId?: string;
}

/** What the manager spells as "this package at this version". */
export function packageSpec(pm: PackageManager, pkg: string, version: string): string {
  const v = packageVersion(version);
  return pm === 'yum' || pm === 'dnf' ? `${pkg}-${v}` : `${pkg}=${v}`;
}

/** The commands, in order, that refresh the gateway repository and install exactly spec.version. */
export function installCommands(pm: PackageManager, spec: InstallSpec): string[][] {
  const target = packageSpec(pm, spec.pkg, spec.version);
  const repo = spec.repoId ?? DEFAULT_REPO_ID;
  switch (pm) {
    case 'apt': {
      const update = ['apt-get', 'update'];
      if (spec.aptSourceList) {
        update.push('-o', `Dir::Etc::SourceList=${spec.aptSourceList}`, '-o', 'Dir::Etc::SourceParts=-', '-o', 'APT::Get::List-Cleanup=0');
      }
      return [
        update,
        [
          'apt-get', 'install', '-y', '--allow-downgrades', '--no-install-recommends',
          '-o', 'Dpkg::Options::=--force-confdef', '-o', 'Dpkg::Options::=--force-confold',
          target,
        ],
      ];
    }
    case 'dnf':
      return [['dnf', spec.downgrade ? 'downgrade' : 'install', '-y', '--refresh', '--disablerepo=*', `--enablerepo=${repo}`, target]];
    case 'yum':
      return [
        ['yum', 'clean', 'expire-cache', '--disablerepo=*', `--enablerepo=${repo}`],
        ['yum', spec.downgrade ? 'downgrade' : 'install', '-y', '--disablerepo=*', `--enablerepo=${repo}`, target],
      ];
    case 'zypper':
      return [
        ['zypper', '--non-interactive', 'refresh', repo],
        ['zypper', '--non-interactive', 'install', '--oldpackage', '--from', repo, target],
      ];
  }
}

/** Environment additions for the manager (apt must never ask a question). */
export function installEnv(pm: PackageManager): Record<string, string> {
  return pm === 'apt' ? { DEBIAN_FRONTEND: 'noninteractive', NEEDRESTART_MODE: 'l' } : {};
}

/** The command that says whether a package is installed (exit 0 and, for dpkg, "install ok installed"). */
export function installedQuery(pm: 'apt' | 'rpm', pkg: string): string[] {
  return pm === 'apt' ? ['dpkg-query', '-W', '-f=${Status}', pkg] : ['rpm', '-q', pkg];
}

/**
 * Which manager installed `pkgs` on this host: apt when dpkg knows one of them, else dnf / yum / zypper (the
 * first present) when rpm does, else undefined (a tarball install). `env` is passed to the queries.
 */
export async function detectPackageManager(pkgs: readonly string[], env: NodeJS.ProcessEnv = process.env): Promise<PackageManager | undefined> {
  if (await which('dpkg-query', env)) {
    for (const pkg of pkgs) {
      const r = await runCommand(installedQuery('apt', pkg), { env, timeoutMs: 30_000 });
      if (r.code === 0 && r.stdout.includes('install ok installed')) {
        if (!(await which('apt-get', env))) break;
        return 'apt';
      }
    }
  }
  if (await which('rpm', env)) {
    for (const pkg of pkgs) {
      const r = await runCommand(installedQuery('rpm', pkg), { env, timeoutMs: 30_000 });
      if (r.code !== 0) continue;
      for (const pm of ['dnf', 'yum', 'zypper'] as const) if (await which(pm, env)) return pm;
      throw new GatewayError('GW_ERR_UPGRADE_PACKAGE_MANAGER', `${pkg} was installed with rpm, but none of dnf, yum or zypper is on PATH`);
    }
  }
  return undefined;
}
