/**
 * systemd units for package-manager installs. `gateway install systemd` prints or writes them; docs/systemd.md
 * explains each line.
 *
 *   gateway.service          the agent: EnvironmentFile=-/etc/default/gateway (HTTPS_PROXY, NO_PROXY, ...),
 *                            Restart=always, RestartSec=5, LimitNOFILE=524288, PIDFile=/run/gateway.pid written by
 *                            `gateway start --pid-file`, reload = SIGHUP to the pid in that file; restarts that
 *                            keep sessions (docs/upgrades.md): SIGUSR2 to the main process hands over to a
 *                            successor, which rewrites the pid file, and systemd re-reads PIDFile= when the old
 *                            main process exits; KillMode=mixed (SIGTERM to the main process alone, which drains
 *                            only with gateway.drain_on_stop;
 *                            SIGKILL to what is left at the end), TimeoutStopSec = the drain limit + a margin
 *   gateway-upgrade.service  one run of `gateway-upgrade run` (same environment file, so the upgrader goes
 *                            through the same proxy)
 *   gateway-upgrade.timer    starts the upgrader every 30 minutes (so every 1-hour maintenance window sees at
 *                            least one run, even with the randomized delay); `systemctl disable --now
 *                            gateway-upgrade.timer` suspends upgrades
 *
 * Pure text: nothing here touches the file system except writeUnits().
 */
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { GatewayError } from '../errors.js';
import { writePublicFile } from '../fsutil.js';

export const AGENT_UNIT = 'gateway.service';
export const UPGRADE_SERVICE_UNIT = 'gateway-upgrade.service';
export const UPGRADE_TIMER_UNIT = 'gateway-upgrade.timer';
export const UNIT_NAMES = [AGENT_UNIT, UPGRADE_SERVICE_UNIT, UPGRADE_TIMER_UNIT] as const;
export type UnitName = (typeof UNIT_NAMES)[number];

/** Where package installs put units of their own (systemctl daemon-reload picks them up). */
export const SYSTEM_UNIT_DIR = '/etc/systemd/system';

export const SYSTEMD_DEFAULTS = Object.freeze({
  binDir: '/usr/local/bin',
  configPath: '/etc/gateway.yaml',
  pidFile: '/run/gateway.pid',
  environmentFile: '/etc/default/gateway',
  /** Seed, Limits: restart delay 5 seconds. */
  restartSec: 5,
  /** Seed, Limits: file-descriptor limit 524288. */
  limitNofile: 524288,
  /** Every 30 minutes, on the hour and the half hour. */
  onCalendar: '*:0/30',
  randomizedDelaySec: '5min',
  /** gateway.drain_limit's default: TimeoutStopSec is this plus stopMarginSec. */
  drainLimitMs: 30 * 60_000,
  /** What a stop may take beyond the drain: closing what is left, the pid file, the log. */
  stopMarginSec: 60,
});

export interface UnitOptions {
  /** Directory holding `gateway` and `gateway-upgrade`. Default /usr/local/bin. */
  binDir?: string;
  /** The configuration file `gateway start -c` reads. Default /etc/gateway.yaml. */
  configPath?: string;
  /** Default /run/gateway.pid. */
  pidFile?: string;
  /** Optional environment file (leading `-` in the unit: a missing file is fine). Default /etc/default/gateway. */
  environmentFile?: string;
  /** The agent's gateway.drain_limit (ms), which TimeoutStopSec covers. Default 30 minutes. */
  drainLimitMs?: number;
}

function resolved(options: UnitOptions): Required<Omit<UnitOptions, 'drainLimitMs'>> {
  const o = {
    binDir: options.binDir ?? SYSTEMD_DEFAULTS.binDir,
    configPath: options.configPath ?? SYSTEMD_DEFAULTS.configPath,
    pidFile: options.pidFile ?? SYSTEMD_DEFAULTS.pidFile,
    environmentFile: options.environmentFile ?? SYSTEMD_DEFAULTS.environmentFile,
  };
  for (const [key, value] of Object.entries(o)) {
    // systemd wants absolute paths; whitespace, quotes, % and $ would need escaping we choose not to do.
    if (!value.startsWith('/') || /[\s"'\\%$;]/.test(value)) {
      throw new GatewayError('GW_ERR_USAGE', `${key}: ${JSON.stringify(value)} must be an absolute path without spaces, quotes, %, $ or ;`, {
        hint: 'Give absolute paths such as /usr/local/bin or /etc/gateway.yaml.',
      });
    }
  }
  o.binDir = o.binDir.replace(/\/+$/, '') || '/';
  return o;
}

/** The agent unit: exactly the settings docs/systemd.md lists. */
export function agentUnit(options: UnitOptions = {}): string {
  const o = resolved(options);
  return [
    '# The gateway agent. Written by `gateway install systemd`; see docs/systemd.md.',
    '[Unit]',
    'Description=Gateway agent (infrastructure access gateway)',
    'After=network-online.target',
    'Wants=network-online.target',
    '',
    '[Service]',
    'Type=simple',
    '# HTTPS_PROXY, HTTP_PROXY, NO_PROXY and the like; the leading "-" makes the file optional.',
    `EnvironmentFile=-${o.environmentFile}`,
    `ExecStart=${o.binDir === '/' ? '' : o.binDir}/gateway start -c ${o.configPath} --pid-file=${o.pidFile}`,
    '# Reload = SIGHUP to the pid in the pid file: the gateway re-reads its configuration and keeps its tunnels.',
    `ExecReload=/bin/sh -c 'kill -HUP "$$(cat ${o.pidFile})"'`,
    '# systemd re-reads the pid file when the main process exits: after a hand-over (SIGUSR2) the successor, which',
    '# wrote its pid there, becomes the main process and the unit stays active (docs/upgrades.md).',
    `PIDFile=${o.pidFile}`,
    '# Stop: SIGTERM to the main process alone (which drains its sessions first only with gateway.drain_on_stop); whatever is',
    '# left (a process still draining from a hand-over, session shells) gets SIGKILL after TimeoutStopSec.',
    'KillMode=mixed',
    `TimeoutStopSec=${stopTimeoutSec(options.drainLimitMs)}`,
    'Restart=always',
    `RestartSec=${SYSTEMD_DEFAULTS.restartSec}`,
    `LimitNOFILE=${SYSTEMD_DEFAULTS.limitNofile}`,
    '',
    '[Install]',
    'WantedBy=multi-user.target',
    '',
  ].join('\n');
}

/** TimeoutStopSec for a drain limit: the drain and a margin, in whole seconds. */
export function stopTimeoutSec(drainLimitMs: number = SYSTEMD_DEFAULTS.drainLimitMs): number {
  if (!Number.isFinite(drainLimitMs) || drainLimitMs <= 0) {
    throw new GatewayError('GW_ERR_USAGE', `drain limit: ${drainLimitMs} ms is not a positive duration`, { hint: 'Give the agent\'s gateway.drain_limit, e.g. --drain-limit=30m.' });
  }
  return Math.ceil(drainLimitMs / 1000) + SYSTEMD_DEFAULTS.stopMarginSec;
}

/** One run of the upgrader, started by the timer (or by hand: `systemctl start gateway-upgrade.service`). */
export function upgradeServiceUnit(options: UnitOptions = {}): string {
  const o = resolved(options);
  return [
    '# One run of the gateway agent upgrader, started by gateway-upgrade.timer. See docs/systemd.md.',
    '[Unit]',
    'Description=Gateway agent upgrader',
    'After=network-online.target',
    'Wants=network-online.target',
    '',
    '[Service]',
    'Type=oneshot',
    '# The same proxy settings as the agent, so the upgrader reaches the version server the same way.',
    `EnvironmentFile=-${o.environmentFile}`,
    `ExecStart=${o.binDir === '/' ? '' : o.binDir}/gateway-upgrade run`,
    '',
  ].join('\n');
}

/** The timer that drives the upgrader. */
export function upgradeTimerUnit(): string {
  return [
    '# Starts gateway-upgrade.service every 30 minutes. `systemctl disable --now gateway-upgrade.timer` suspends',
    '# automatic upgrades; `systemctl enable --now gateway-upgrade.timer` resumes them. See docs/systemd.md.',
    '[Unit]',
    'Description=Check for gateway agent upgrades every 30 minutes',
    '',
    '[Timer]',
    `OnCalendar=${SYSTEMD_DEFAULTS.onCalendar}`,
    `RandomizedDelaySec=${SYSTEMD_DEFAULTS.randomizedDelaySec}`,
    'Persistent=true',
    `Unit=${UPGRADE_SERVICE_UNIT}`,
    '',
    '[Install]',
    'WantedBy=timers.target',
    '',
  ].join('\n');
}

export interface Unit {
  name: UnitName;
  content: string;
}

export function systemdUnits(options: UnitOptions = {}): Unit[] {
  return [
    { name: AGENT_UNIT, content: agentUnit(options) },
    { name: UPGRADE_SERVICE_UNIT, content: upgradeServiceUnit(options) },
    { name: UPGRADE_TIMER_UNIT, content: upgradeTimerUnit() },
  ];
}

/** All units as one text, each preceded by `# <dir>/<name>` (as `systemctl cat` shows them). */
export function formatUnits(units: readonly Unit[], dir: string = SYSTEM_UNIT_DIR): string {
  return units.map((u) => `# ${join(dir, u.name)}\n${u.content}`).join('\n');
}

/**
 * Where --output puts the units: a directory (an existing one, or a path ending in "/") receives each unit under
 * its own name; a file path receives the first unit (the agent unit, or the one chosen with --unit) and the
 * others go next to it under their own names.
 */
export function unitPaths(output: string, units: readonly Unit[]): Array<{ path: string; unit: Unit }> {
  const isDir = output.endsWith('/') || (existsSync(output) && statSync(output).isDirectory());
  const dir = isDir ? resolve(output) : dirname(resolve(output));
  return units.map((unit, i) => ({ unit, path: !isDir && i === 0 ? resolve(output) : join(dir, unit.name) }));
}

/**
 * Writes the units (mode 0644, atomically). Refuses to replace an existing file unless force is set, before
 * writing anything. Returns the paths written.
 */
export function writeUnits(output: string, units: readonly Unit[], options: { force?: boolean } = {}): string[] {
  const targets = unitPaths(output, units);
  if (!options.force) {
    const existing = targets.filter((t) => existsSync(t.path)).map((t) => t.path);
    if (existing.length > 0) {
      throw new GatewayError('GW_ERR_INSTALL_EXISTS', `${existing.join(', ')} already exist${existing.length === 1 ? 's' : ''}; nothing was written`, {
        details: { paths: existing },
      });
    }
  }
  for (const t of targets) {
    mkdirSync(dirname(t.path), { recursive: true, mode: 0o755 });
    writePublicFile(t.path, t.unit.content, 0o644);
  }
  return targets.map((t) => t.path);
}
