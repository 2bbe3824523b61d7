/**
 * Package managers: which one installed the gateway, and the exact command lines that install a version with
 * each, and why one failed, read from its output (pure functions; apt, dnf and zypper also run for real in
 * test/upgrade/, yum is only unit-tested: Debian has none).
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
  /** Inserted right after the program's name in every command (GATEWAY_UPGRADE_PM_ARGS: --installroot, --root). */
  args?: readonly string[];
}

/** What the manager spells as "this package at this version". */
export function packageSpec(pm: PackageManager, pkg: string, version: string): string {
  const v = packageVersion(version);
  return pm === 'yum' || pm === 'dnf' ? `${pkg}-${v}` : `${pkg}=${v}`;
}

/** The commands, in order, that refresh the gateway repository and install exactly spec.version. */
export function installCommands(pm: PackageManager, spec: InstallSpec): string[][] {
  const extra = spec.args ?? [];
  return managerCommands(pm, spec).map(([program, ...rest]) => [program!, ...extra, ...rest]);
}

function managerCommands(pm: PackageManager, spec: InstallSpec): string[][] {
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

/** The step of installCommands that failed: the refresh of the metadata, or the install itself. */
export type InstallStep = 'refresh' | 'install';

/** Which step a command of installCommands is (dnf refreshes and installs in one). */
export function installStep(argv: readonly string[]): InstallStep {
  return argv.includes('update') || argv.includes('refresh') || argv.includes('expire-cache') ? 'refresh' : 'install';
}

export interface FailureCause {
  code: 'GW_ERR_UPGRADE_REPO' | 'GW_ERR_UPGRADE_CHECKSUM' | 'GW_ERR_UPGRADE_INSTALL';
  /** What went wrong, in words, quoting the manager's line that says it. */
  reason: string;
  hint: string;
}

// The managers' own words (apt-get, dnf 4, yum, zypper), looked for in this order: dnf goes on after metadata it
// cannot read and then says "Unable to find a match", which must not read as a missing version.
const METADATA = /Failed to download metadata|Valid metadata not found|repomd\.xml parser error|Repository '[^']*' is invalid|Could not refresh the repositor|does not have a Release file|Release file .* is (?:not valid|invalid)|Unable to parse package file|Encountered a section with no Package: header|Problem (?:with|parsing) .*(?:Packages|repomd)|Cannot retrieve repository metadata/i;
const SIGNATURE = /NO_PUBKEY|BADSIG|signatures couldn't be verified|is not signed|GPG check FAILED|GPG signature verification error|Signature verification failed|signed with an unknown key|EXPKEYSIG/i;
const CHECKSUM = /incorrect checksum|Digest verification failed|Hash Sum mismatch|File has unexpected size|corrupted during transfer|checksum (?:mismatch|doesn't match|does not match)/i;
const MISSING = /Version '[^']*' for '[^']*' was not found|No match for argument|Unable to find a match|No provider of|not found in package names|No package .* available/i;

const QUOTE_MAX = 240;

/**
 * The manager's line that says it: the longest that matches and fits (apt's "E: Failed to fetch <file>  Hash Sum
 * mismatch" over its bare "Hash Sum mismatch"), else the shortest, cut.
 */
function quote(output: string, re: RegExp): string {
  const lines = output.split('\n').filter((l) => re.test(l)).map((l) => l.replace(/\s+/g, ' ').trim());
  const fitting = lines.filter((l) => l.length <= QUOTE_MAX);
  if (fitting.length > 0) return fitting.reduce((a, b) => (b.length > a.length ? b : a));
  return lines.reduce((a, b) => (b.length < a.length ? b : a), lines[0] ?? '').slice(0, QUOTE_MAX);
}

/**
 * Why a package manager command failed, when its output says so in words the upgrader knows: the repository's
 * signature does not verify, its metadata cannot be read, a package does not match the checksum in that metadata, or the version is not in the
 * repository. Undefined for anything else (the caller quotes the output). Pure; `output` is the command's tail.
 */
export function explainFailure(pm: PackageManager, step: InstallStep, spec: string, output: string): FailureCause | undefined {
  if (SIGNATURE.test(output)) {
    return {
      code: 'GW_ERR_UPGRADE_REPO',
      reason: `the gateway repository's signature does not verify with the key this host trusts for it (${pm}: ${quote(output, SIGNATURE)})`,
      hint: "Either the metadata was not signed by the repository's key (a mirror or proxy serving other metadata: nothing from it was used), or this host trusts another key for it: install the repository's key where the entry's signed-by / gpgkey names it, as the install guide shows.",
    };
  }
  const metadata = METADATA.test(output) || (step === 'refresh' && CHECKSUM.test(output));
  if (metadata) {
    return {
      code: 'GW_ERR_UPGRADE_REPO',
      reason: `the gateway repository's metadata cannot be read (${pm}: ${quote(output, METADATA.test(output) ? METADATA : CHECKSUM)})`,
      hint: 'The repository serves corrupt or incomplete metadata: a mirror in the middle of a sync, a proxy that alters files, or an address that is not a repository. Check the address in the repository entry, then run gateway-upgrade again.',
    };
  }
  if (CHECKSUM.test(output)) {
    return {
      code: 'GW_ERR_UPGRADE_CHECKSUM',
      reason: `the package ${spec} does not match the checksum the repository's metadata gives for it (${pm}: ${quote(output, CHECKSUM)})`,
      hint: 'The file was altered on the mirror or on the way (a caching proxy?); the package manager refused it. Run gateway-upgrade again later, and check the mirror if it persists.',
    };
  }
  if (MISSING.test(output)) {
    return {
      code: 'GW_ERR_UPGRADE_INSTALL',
      reason: `the gateway repository has no ${spec} (${pm}: ${quote(output, MISSING)})`,
      hint: "The version server's channel names a version the repository does not hold: check that the repository entry is on the right channel (gateway-upgrade repo show) and that the release has reached the mirror.",
    };
  }
  return undefined;
}

/**
 * A refresh that exited 0 but says the metadata failed its signature check (apt-get update: "W: GPG error ...",
 * then it keeps the previous index): the same cause as a failed one. Undefined when the refresh was clean.
 */
export function refreshWarning(pm: PackageManager, output: string): FailureCause | undefined {
  if (!SIGNATURE.test(output)) return undefined;
  return explainFailure(pm, 'refresh', '', output);
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
