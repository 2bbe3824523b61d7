/**
 * Everything gateway-upgrade reads from the host, resolved once from the environment into a frozen object. Every
 * path sits under GATEWAY_UPGRADE_ROOT (default "/"), so tests (and unusual layouts) never touch the real /etc;
 * each can also be set on its own. The table in docs/upgrades.md lists them all.
 */
import { existsSync } from 'node:fs';
import { arch as osArch } from 'node:os';
import { isAbsolute, join, resolve } from 'node:path';
import { parseDuration } from '../duration.js';
import { GatewayError } from '../errors.js';

export type PackageManagerName = 'apt' | 'yum' | 'dnf' | 'zypper' | 'tarball';
export const PACKAGE_MANAGERS: readonly PackageManagerName[] = ['apt', 'yum', 'dnf', 'zypper', 'tarball'];

export type TarballArch = 'amd64' | 'arm64' | 'arm';

/** Placeholders for {repo_url} and {download_url} (docs/upgrades.md): set the real addresses in the environment. */
export const DEFAULT_APT_REPO_URL = 'https://apt.gateway.example';
export const DEFAULT_YUM_REPO_URL = 'https://yum.gateway.example';
export const DEFAULT_DOWNLOAD_URL = 'https://cdn.gateway.example';

export interface UpgraderSettings {
  root: string;
  /** /etc/gateway-upgrade.d: endpoint, schedule. */
  etcDir: string;
  endpointFile: string;
  scheduleFile: string;
  aptSourcesDir: string;
  /** /etc/apt/apt.conf.d: where `repo set-source proxy` tells apt which CA the Proxy's certificate chains to. */
  aptConfDir: string;
  /** The agent's stored cluster CA (<data_dir>/host/host-ca.pem), whether or not it exists yet. */
  hostCaFile: string;
  yumReposDir: string;
  zyppReposDir: string;
  lockFile: string;
  /** The agent's data directory: its host identity (host/identity.json: the host ID a rollout knows it by) and CA. */
  dataDir: string;
  /** The whole deadline of the rollout instruction request (src/upgrade/instruction.ts). */
  instructionTimeoutMs: number;
  /** The agent's systemd service. */
  service: string;
  /** 'auto' detects apt / dnf / yum / zypper from what installed the package, else a tarball install. */
  packageManager: PackageManagerName | 'auto';
  /** Shell command whose output carries the installed version (`gateway --version`). */
  versionCommand: string;
  /**
   * Shell command that restarts the agent: by default the hand-over (SIGUSR2 to the unit's main process, which
   * starts its successor and drains: docs/upgrades.md, "Restarts that keep sessions"), a plain restart when the
   * unit is not running.
   */
  restartCommand: string;
  /**
   * The agent's pid file (gateway start --pid-file): after the restart, the health wait wants a live process other
   * than the one it named before, so that the old process, still draining, is not taken for the new one. No file
   * before the restart: not checked.
   */
  pidFile: string;
  /** Shell command that exits 0 when the agent is up. */
  healthCommand: string;
  /** How long the agent has to come back after a restart. */
  healthTimeoutMs: number;
  healthPollMs: number;
  /** PEM files trusted for the version server and downloads, besides the system's. */
  caFiles: string[];
  /** {download_url} for tarball installs (unless artifacts is proxy). */
  downloadUrl: string;
  /**
   * GATEWAY_UPGRADE_ARTIFACTS: direct (the download site and repository as set) or proxy (both through the endpoint
   * file's Proxy: its /v1/webapi/autoupdate/artifacts and /repo routes; src/upgrade/artifacts.ts).
   */
  artifacts: 'direct' | 'proxy';
  /** Where a tarball install puts the binaries (handed to its install script as GATEWAY_BIN_DIR). */
  binDir: string;
  /** 'auto': FIPS when the version command's output says so. */
  fips: boolean | 'auto';
  /** The machine architecture (os.arch(), or GATEWAY_UPGRADE_ARCH); see tarballArch(). */
  arch: string;
  /** Package name override; default gateway, or gateway-ent-fips for FIPS installs. */
  packageName: string | undefined;
  aptRepoUrl: string;
  yumRepoUrl: string;
  /** Seconds before a package manager command is abandoned. */
  commandTimeoutMs: number;
  /**
   * Extra arguments given to every package manager command right after the program's name (GATEWAY_UPGRADE_PM_ARGS):
   * an alternate root (dnf --installroot=<dir>, zypper --root <dir>) or options (apt-get -o Key=Value).
   */
  pmArgs: string[];
}

type Env = Record<string, string | undefined>;

/** The tarball's <arch> for a machine architecture (node's os.arch() or uname -m spelling). */
export function tarballArch(nodeArch: string): TarballArch {
  switch (nodeArch) {
    case 'x64':
    case 'amd64':
      return 'amd64';
    case 'arm64':
    case 'aarch64':
      return 'arm64';
    case 'arm':
    case 'armv7l':
      return 'arm';
    default:
      throw new GatewayError('GW_ERR_UPGRADE_PACKAGE_MANAGER', `there is no gateway tarball for the machine architecture ${JSON.stringify(nodeArch)}`, {
        hint: 'Tarballs exist for amd64, arm64 and arm; set GATEWAY_UPGRADE_ARCH if the machine is one of them.',
      });
  }
}

/**
 * The hint of a bad GATEWAY_UPGRADE_* variable: these come from the environment (the systemd unit's Environment=),
 * not the command line, so the usage error's "--help" would point the wrong way.
 */
function envHint(name: string, expected: string): string {
  return `Set ${name} to ${expected} where gateway-upgrade's environment is set (its systemd unit's Environment=, or the shell), or unset it for the default (docs/upgrades.md lists them).`;
}

function bool(name: string, value: string): boolean | 'auto' {
  const v = value.trim().toLowerCase();
  if (['1', 'yes', 'true', 'on'].includes(v)) return true;
  if (['0', 'no', 'false', 'off'].includes(v)) return false;
  if (v === 'auto' || v === '') return 'auto';
  throw new GatewayError('GW_ERR_USAGE', `${name}=${JSON.stringify(value)}: expected yes, no or auto`, { hint: envHint(name, 'yes, no or auto') });
}

/**
 * GATEWAY_UPGRADE_PM_ARGS: words separated by blanks, no quoting (so no word holds a blank); each is one argument.
 * Quotes are refused rather than passed on, so that '--root "/srv/my root"' is not silently split in the wrong place.
 */
export function pmArgs(value: string | undefined): string[] {
  if (value === undefined) return [];
  if (/["'\\]/.test(value)) {
    throw new GatewayError('GW_ERR_USAGE', `GATEWAY_UPGRADE_PM_ARGS=${JSON.stringify(value)}: quotes and backslashes are not understood`, {
      hint: 'Give the arguments separated by blanks, without quotes (a path with a blank cannot be given here).',
    });
  }
  return value.split(/\s+/).filter(Boolean);
}

/** GATEWAY_UPGRADE_ARTIFACTS: direct (default) or proxy; proxy with GATEWAY_UPGRADE_DOWNLOAD_URL set too is ambiguous. */
function artifactsSource(value: string | undefined, downloadUrl: string | undefined): 'direct' | 'proxy' {
  const v = (value ?? 'direct').toLowerCase();
  if (v !== 'direct' && v !== 'proxy') {
    throw new GatewayError('GW_ERR_USAGE', `GATEWAY_UPGRADE_ARTIFACTS=${JSON.stringify(value)}: expected direct or proxy`, { hint: envHint('GATEWAY_UPGRADE_ARTIFACTS', 'proxy (releases through the Proxy in the endpoint file) or direct') });
  }
  if (v === 'proxy' && downloadUrl !== undefined) {
    throw new GatewayError('GW_ERR_USAGE', 'GATEWAY_UPGRADE_ARTIFACTS=proxy and GATEWAY_UPGRADE_DOWNLOAD_URL are both set: the first takes releases from the Proxy, the second from elsewhere', {
      hint: 'Unset GATEWAY_UPGRADE_DOWNLOAD_URL to fetch releases through the Proxy (or set it to https://<proxy>/v1/webapi/autoupdate/artifacts yourself), or unset GATEWAY_UPGRADE_ARTIFACTS.',
    });
  }
  return v;
}

export function resolveSettings(env: Env = process.env): Readonly<UpgraderSettings> {
  const get = (k: string): string | undefined => {
    const v = env[k];
    return v === undefined || v.trim() === '' ? undefined : v.trim();
  };
  const root = resolve(get('GATEWAY_UPGRADE_ROOT') ?? '/');
  const under = (p: string) => join(root, p);
  const path = (k: string, dflt: string): string => {
    const v = get(k);
    if (v === undefined) return dflt;
    if (!isAbsolute(v)) throw new GatewayError('GW_ERR_USAGE', `${k}=${JSON.stringify(v)}: expected an absolute path`, { hint: envHint(k, `an absolute path (${dflt})`) });
    return v;
  };
  const etcDir = path('GATEWAY_UPGRADE_DIR', under('etc/gateway-upgrade.d'));
  const service = get('GATEWAY_UPGRADE_SERVICE') ?? 'gateway';
  if (!/^[A-Za-z0-9@._:-]+$/.test(service)) {
    throw new GatewayError('GW_ERR_USAGE', `GATEWAY_UPGRADE_SERVICE=${JSON.stringify(service)} is not a systemd unit name`, { hint: envHint('GATEWAY_UPGRADE_SERVICE', "the agent's systemd unit (gateway, or gateway-agent.service)") });
  }
  const pm = (get('GATEWAY_UPGRADE_PACKAGE_MANAGER') ?? 'auto').toLowerCase();
  if (pm !== 'auto' && !PACKAGE_MANAGERS.includes(pm as PackageManagerName)) {
    throw new GatewayError('GW_ERR_UPGRADE_PACKAGE_MANAGER', `GATEWAY_UPGRADE_PACKAGE_MANAGER=${JSON.stringify(pm)} is not one the upgrader knows`);
  }
  const caFiles: string[] = [];
  const dataDir = path('GATEWAY_UPGRADE_DATA_DIR', under('var/lib/gateway'));
  const agentCa = join(dataDir, 'host', 'host-ca.pem');
  if (existsSync(agentCa)) caFiles.push(agentCa);
  for (const f of (get('GATEWAY_UPGRADE_CA_FILE') ?? '').split(':').filter(Boolean)) caFiles.push(f);
  const duration = (k: string, dflt: number) => {
    const v = get(k);
    return v === undefined ? dflt : parseDuration(v, k);
  };
  const settings: UpgraderSettings = {
    root,
    etcDir,
    endpointFile: join(etcDir, 'endpoint'),
    scheduleFile: join(etcDir, 'schedule'),
    aptSourcesDir: path('GATEWAY_UPGRADE_APT_SOURCES_DIR', under('etc/apt/sources.list.d')),
    aptConfDir: path('GATEWAY_UPGRADE_APT_CONF_DIR', under('etc/apt/apt.conf.d')),
    hostCaFile: agentCa,
    yumReposDir: path('GATEWAY_UPGRADE_YUM_REPOS_DIR', under('etc/yum.repos.d')),
    zyppReposDir: path('GATEWAY_UPGRADE_ZYPP_REPOS_DIR', under('etc/zypp/repos.d')),
    lockFile: path('GATEWAY_UPGRADE_LOCK_FILE', under('run/gateway-upgrade.lock')),
    dataDir,
    instructionTimeoutMs: duration('GATEWAY_UPGRADE_INSTRUCTION_TIMEOUT', 15_000),
    service,
    packageManager: pm as UpgraderSettings['packageManager'],
    versionCommand: get('GATEWAY_UPGRADE_VERSION_COMMAND') ?? 'gateway --version',
    restartCommand: get('GATEWAY_UPGRADE_RESTART_COMMAND') ?? defaultRestart(service),
    pidFile: path('GATEWAY_UPGRADE_PID_FILE', under('run/gateway.pid')),
    healthCommand: get('GATEWAY_UPGRADE_HEALTH_COMMAND') ?? `systemctl is-active --quiet ${service}`,
    healthTimeoutMs: duration('GATEWAY_UPGRADE_HEALTH_TIMEOUT', 60_000),
    healthPollMs: duration('GATEWAY_UPGRADE_HEALTH_POLL', 1_000),
    caFiles,
    downloadUrl: (get('GATEWAY_UPGRADE_DOWNLOAD_URL') ?? DEFAULT_DOWNLOAD_URL).replace(/\/+$/, ''),
    artifacts: artifactsSource(get('GATEWAY_UPGRADE_ARTIFACTS'), get('GATEWAY_UPGRADE_DOWNLOAD_URL')),
    binDir: path('GATEWAY_UPGRADE_BIN_DIR', under('usr/local/bin')),
    fips: bool('GATEWAY_UPGRADE_FIPS', get('GATEWAY_UPGRADE_FIPS') ?? 'auto'),
    arch: get('GATEWAY_UPGRADE_ARCH') ?? osArch(),
    packageName: get('GATEWAY_UPGRADE_PACKAGE'),
    aptRepoUrl: (get('GATEWAY_UPGRADE_APT_REPO_URL') ?? DEFAULT_APT_REPO_URL).replace(/\/+$/, ''),
    yumRepoUrl: (get('GATEWAY_UPGRADE_YUM_REPO_URL') ?? DEFAULT_YUM_REPO_URL).replace(/\/+$/, ''),
    commandTimeoutMs: duration('GATEWAY_UPGRADE_COMMAND_TIMEOUT', 15 * 60_000),
    pmArgs: pmArgs(get('GATEWAY_UPGRADE_PM_ARGS')),
  };
  return Object.freeze(settings);
}

/**
 * The hand-over when the unit runs (systemd re-reads PIDFile= when the main process exits, so it follows the
 * successor), else a plain restart. `service` goes into the shell as the operator gave it, as before.
 */
export function defaultRestart(service: string): string {
  return `if systemctl is-active --quiet ${service}; then systemctl kill --signal=SIGUSR2 --kill-whom=main ${service}; else systemctl restart ${service}; fi`;
}
