/**
 * gateway-upgrade on a systemd Linux host:
 *
 *   endpoint file ─► https://<endpoint>/version, /critical, and /webapi/ping (through the Dialer)
 *   version command (gateway --version) ─► installed version
 *   schedule file (exported by the agent) ─► inside a maintenance window now? when is the next one?
 *
 *   dry-run: prints "no upgrades available (<current> == <target>)" or "an upgrade is available (<current> ->
 *   <target>)", then the channel and the window; warnings (invalid schedule, cluster too old) go to stderr.
 *
 *   run: under a lock, when the versions differ and (critical, or inside a window): install the target with the
 *   package manager that installed the gateway (apt, dnf, yum, zypper) or from the release tarball, restart the
 *   service, and wait until it is healthy and reports the target version. Any failure puts the previous version
 *   back (reinstall it, or restore the tarball's binaries), restarts it, and reports what failed: never a
 *   half-upgrade. The restart is by default a hand-over (the old process drains while its successor serves): the
 *   health wait wants the pid file to name a new, live process, not the old one still running.
 */
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import semver from 'semver';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { processAlive } from '../proc.js';
import { fetchClusterVersion, fetchTarget, loadCaFiles, sameVersion, versionInOutput, type NoTarget, type Target } from './client.js';
import { checkClusterVersion, type Enrollment } from './enrollment.js';
import { readEndpointFile, type Endpoint } from './endpoint.js';
import { describeExit, lastLines, runCommand, runShell, which } from './exec.js';
import { acquireLock } from './lock.js';
import { fetchInstruction, instructionLine, readGroupFile, readHostId } from './instruction.js';
import type { AgentInstruction } from '../wire/autoupdate.js';
import { detectPackageManager, explainFailure, FIPS_PACKAGE, installCommands, installEnv, installStep, PACKAGE, packageSpec, refreshWarning, type PackageManager } from './packages.js';
import { channelHolds, movedLine, readRepo, repoPath, setChannel, ROLLING_CHANNEL, type RepoEntry } from './repo.js';
import { invalidScheduleWarning, readSchedule, type ScheduleStatus } from './schedule.js';
import { tarballArch, type PackageManagerName, type UpgraderSettings } from './settings.js';
import { downloadUrl, proxyRepoUrl } from './artifacts.js';
import { applySource, planSource, type RepoSource } from './reposource.js';
import { fetchVerifiedTarball, installTarball, tarballName, type TarballInstall } from './tarball.js';
import { formatIn, isoSeconds, nextWindowAfter, windowAt, type Window } from './windows.js';

export interface UpgraderContext {
  settings: Readonly<UpgraderSettings>;
  dialer: Dialer;
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream & { isTTY?: boolean };
  clock?: () => Date;
  /** Environment for child processes (package managers, commands). */
  env?: NodeJS.ProcessEnv;
}

export interface Installed {
  version: string;
  fips: boolean;
}

export interface Facts {
  endpoint: Endpoint;
  cluster: Enrollment;
  target: Target;
  installed: Installed;
  schedule: ScheduleStatus;
  now: Date;
  /** The window open now. */
  window: Window | undefined;
  /** The next window to open after now. */
  next: Window | undefined;
}

const env = (ctx: UpgraderContext) => ctx.env ?? process.env;
const now = (ctx: UpgraderContext) => (ctx.clock ?? (() => new Date()))();

function warn(ctx: UpgraderContext, message: string): void {
  ctx.stderr.write(`warning: ${message}\n`);
}

function say(ctx: UpgraderContext, line: string): void {
  ctx.stdout.write(`${line}\n`);
}

/** Runs the version command and finds the version in its output. Throws GW_ERR_UPGRADE_INSTALLED_VERSION. */
export async function installedVersion(ctx: UpgraderContext): Promise<Installed> {
  const cmd = ctx.settings.versionCommand;
  const r = await runShell(cmd, { env: env(ctx), timeoutMs: 30_000 });
  const output = `${r.stdout}\n${r.stderr}`;
  const version = r.code === 0 ? versionInOutput(r.stdout) ?? versionInOutput(output) : undefined;
  if (version === undefined) {
    throw new GatewayError(
      'GW_ERR_UPGRADE_INSTALLED_VERSION',
      r.code === 0
        ? `the version command \`${cmd}\` printed no version: ${JSON.stringify(output.trim().slice(0, 80))}`
        : `the version command \`${cmd}\` failed (${describeExit(cmd.split(' ')[0]!, r)}): ${lastLines(r, 3) || 'no output'}`,
      { details: { command: cmd } },
    );
  }
  const fips = ctx.settings.fips === 'auto' ? /\bfips\b|boringcrypto/i.test(output) : ctx.settings.fips;
  return { version, fips };
}

function httpDeps(ctx: UpgraderContext) {
  const ca = loadCaFiles(ctx.settings.caFiles);
  return { dialer: ctx.dialer, ...(ca.length ? { ca } : {}) };
}

/** What run and dry-run know when the version server advertises no version: nothing else is needed to do nothing. */
export interface NoTargetFacts {
  endpoint: Endpoint;
  installed: Installed;
  none: NoTarget;
}

/** The line run and dry-run print for "none" (upstream's clients log "version server did not advertise a version"). */
export function noVersionLine(f: NoTargetFacts): string {
  return `no upgrades available: the version server ${f.none.url} advertises no version ("none")${f.none.proxy ? ` (Proxy ${f.none.proxy})` : ''}; nothing to do until it names one (${f.installed.version} stays installed)`;
}

/** Everything dry-run and run decide on. */
export async function gatherFacts(ctx: UpgraderContext): Promise<Facts | NoTargetFacts> {
  const endpoint = await readEndpointFile(ctx.settings.endpointFile);
  const deps = httpDeps(ctx);
  const [target, ping, installed] = await Promise.all([fetchTarget(endpoint, deps), fetchClusterVersion(endpoint.origin, deps), installedVersion(ctx)]);
  if ('none' in target) return { endpoint, installed, none: target };
  if (target.criticalProblem) warn(ctx, target.criticalProblem);
  const cluster = checkClusterVersion(ping.version);
  if (!cluster.ok && ping.problem) cluster.reason = `${cluster.reason}: ${ping.problem}`;
  const t = now(ctx);
  const schedule = await readSchedule(ctx.settings.scheduleFile, t);
  const windows = schedule.state === 'ok' ? schedule.windows : [];
  return { endpoint, cluster, target, installed, schedule, now: t, window: windowAt(t, windows), next: nextWindowAfter(t, windows) };
}

/** The exact comparison message users see (docs/upgrades.md). */
export function comparisonLine(current: string, target: string): string {
  return sameVersion(current, target) ? `no upgrades available (${current} == ${target})` : `an upgrade is available (${current} -> ${target})`;
}

function windowLine(f: Facts): string {
  if (f.window) return `maintenance window: inside one now, until ${isoSeconds(f.window.stop)}`;
  if (f.next) return `maintenance window: not inside one now; the next starts at ${isoSeconds(f.next.start)} (${formatIn(f.next.start.getTime() - f.now.getTime())})`;
  if (f.schedule.state === 'empty') return 'maintenance window: none (the cluster has no cluster_maintenance_config)';
  return 'maintenance window: unknown (no valid schedule)';
}

function reportSchedule(ctx: UpgraderContext, s: ScheduleStatus): void {
  if (s.state === 'invalid') warn(ctx, invalidScheduleWarning(s.problem));
  else if (s.state === 'empty') warn(ctx, `the cluster has no maintenance window (${s.path} lists none); create a cluster_maintenance_config; until then only critical upgrades run`);
  else if (s.old) warn(ctx, `${s.path} was last written ${isoSeconds(s.written)}; the agent refreshes it every 10 minutes: is the agent running?`);
}

function tooOld(cluster: Extract<Enrollment, { ok: false }>): GatewayError {
  return new GatewayError('GW_ERR_UPGRADE_CLUSTER_TOO_OLD', `this agent is not enrolled in automatic upgrades: ${cluster.reason}`, {
    hint: `Upgrade the cluster's Auth and Proxy Services to ${cluster.needed}; the agent enrolls by itself afterwards.`,
  });
}

async function resolvePackageManager(ctx: UpgraderContext, pkg: string): Promise<PackageManagerName> {
  if (ctx.settings.packageManager !== 'auto') return ctx.settings.packageManager;
  return (await detectPackageManager([pkg], env(ctx))) ?? 'tarball';
}

function packageNameFor(ctx: UpgraderContext, installed: Installed): string {
  return ctx.settings.packageName ?? (installed.fips ? FIPS_PACKAGE : PACKAGE);
}

function repoMoveError(entry: RepoEntry, target: string, move: string): GatewayError {
  const line = movedLine(entry, move);
  return new GatewayError(
    'GW_ERR_UPGRADE_REPO',
    `the target ${target} is a new major version, and the repository ${entry.path} is on ${entry.channel}, which holds only v${/v(\d+)$/.exec(entry.channel ?? '')?.[1] ?? '?'}; it must move to ${move} (or ${ROLLING_CHANNEL}) before this host can upgrade`,
    {
      hint: `Run 'gateway-upgrade repo set-channel ${move}' (or ${ROLLING_CHANNEL}), or 'gateway-upgrade run --update-repo' to move it and upgrade${line ? `; ${entry.path} then reads: ${line}` : ''}.`,
      details: { path: entry.path, channel: entry.channel, move, ...(line ? { line } : {}) },
    },
  );
}

/**
 * A new major version the repository's channel cannot hold is announced on every run, in or out of a window, so
 * that a host waiting for its window is not silent about the move it will need: the message and the line to write.
 */
async function announceRepoMove(ctx: UpgraderContext, pm: PackageManagerName | undefined, target: string): Promise<void> {
  if (pm === undefined || pm === 'tarball') return;
  const entry = await readRepo(pm, ctx.settings).catch(() => undefined);
  if (!entry) {
    warn(ctx, `the package repository is not registered: ${repoPath(pm, ctx.settings)} does not exist`);
    return;
  }
  const holds = channelHolds(entry.channel, target);
  if (holds.ok) return;
  const e = repoMoveError(entry, target, holds.move);
  warn(ctx, `${e.message}\nhint: ${e.hint}`);
}

/**
 * What dry-run found, as `gateway-upgrade dry-run --format json|yaml` prints it (the text lines say the same).
 * Keys are snake_case like every JSON the CLIs print.
 */
export interface DryRunReport {
  installed_version: string;
  /** null when the version server advertises no version ("none"). */
  target_version: string | null;
  upgrade_available: boolean;
  channel: string;
  version_server: string;
  critical: boolean;
  /** The Proxy that answered (behind a load balancer), when it says. */
  answered_by: string | null;
  /** managed: a rollout decides when, not the windows of the channel's schedule. */
  maintenance_window: { state: 'inside' | 'scheduled' | 'none' | 'unknown' | 'managed'; until?: string; next_start?: string };
  /** How the upgrade would install, when one is available and the package manager is known. */
  install: { method: string; what: string } | null;
  /** The cluster's Auth and Proxy are too old for this agent to enroll: the version they need. */
  cluster_too_old: string | null;
  /**
   * The managed rollout's instruction for this host (managed true: it decided, not the channel), or why there is
   * none (managed false: the Proxy's reason, or no identity / an earlier Proxy). Absent before the question is asked.
   */
  rollout: { managed: boolean; reason: string; version?: string; update?: boolean; group?: string; canary?: boolean; critical?: boolean; rollout_id?: string } | null;
}

function windowReport(f: Facts): DryRunReport['maintenance_window'] {
  if (f.window) return { state: 'inside', until: isoSeconds(f.window.stop) };
  if (f.next) return { state: 'scheduled', next_start: isoSeconds(f.next.start) };
  return { state: f.schedule.state === 'empty' ? 'none' : 'unknown' };
}

/** dry-run's report when the version server advertises no version: nothing available, nothing to install. */
function noTargetReport(ctx: UpgraderContext, f: NoTargetFacts): DryRunReport {
  say(ctx, noVersionLine(f));
  return {
    installed_version: f.installed.version,
    target_version: null,
    upgrade_available: false,
    channel: f.endpoint.channel,
    version_server: `${f.endpoint.host}:${f.endpoint.port}`,
    critical: false,
    answered_by: f.none.proxy ?? null,
    maintenance_window: { state: 'unknown' },
    install: null,
    cluster_too_old: null,
    rollout: null,
  };
}

function rolloutReport(i: AgentInstruction): NonNullable<DryRunReport['rollout']> {
  const { managed, reason, version, update, group, canary, critical, rollout_id } = i;
  return { managed, reason, update, ...(version ? { version } : {}), ...(group !== undefined ? { group } : {}), ...(canary !== undefined ? { canary } : {}), ...(critical !== undefined ? { critical } : {}), ...(rollout_id ? { rollout_id } : {}) };
}

/** How `version` would install here (undefined when the package manager cannot be told). */
async function installPlan(ctx: UpgraderContext, endpoint: Endpoint, installed: Installed, version: string): Promise<DryRunReport['install']> {
  const pkg = packageNameFor(ctx, installed);
  const pm = await resolvePackageManager(ctx, pkg).catch((err: unknown) => {
    warn(ctx, toGatewayError(err).message);
    return undefined;
  });
  if (pm === undefined) return null;
  const install = pm === 'tarball'
    ? { method: 'tarball', what: `${downloadUrl(ctx.settings, endpoint)}/${tarballName(version, tarballArch(ctx.settings.arch), installed.fips)}` }
    : { method: pm, what: packageSpec(pm, pkg, version) };
  say(ctx, `install: ${install.method} ${install.what}`);
  if (pm !== 'tarball') await announceRepoMove(ctx, pm, version);
  return install;
}

/** dry-run under a managed rollout: the instruction, and what run would do with it. */
async function managedDryRun(ctx: UpgraderContext, i: AgentInstruction): Promise<DryRunReport> {
  const endpoint = await readEndpointFile(ctx.settings.endpointFile);
  const installed = await installedVersion(ctx);
  const d = managedDecision(i, installed.version);
  say(ctx, instructionLine(i));
  if (d.install === undefined) say(ctx, d.line);
  else say(ctx, d.downgrade ? `a rollback is due (${installed.version} -> ${d.install})` : comparisonLine(installed.version, d.install));
  const report: DryRunReport = {
    installed_version: installed.version,
    target_version: i.version ?? null,
    upgrade_available: d.install !== undefined,
    channel: endpoint.channel,
    version_server: `${endpoint.host}:${endpoint.port}`,
    critical: i.critical === true,
    answered_by: null,
    maintenance_window: { state: 'managed' },
    install: null,
    cluster_too_old: null,
    rollout: rolloutReport(i),
  };
  if (d.install !== undefined) report.install = await installPlan(ctx, endpoint, installed, d.install);
  return report;
}

export async function dryRun(ctx: UpgraderContext): Promise<DryRunReport> {
  const rollout = await askRollout(ctx);
  if (rollout.managed) return managedDryRun(ctx, rollout.managed);
  const report = await channelDryRun(ctx);
  if (rollout.unmanaged) report.rollout = rolloutReport(rollout.unmanaged);
  // Only when it was asked (this host has an identity): the output of a host in no rollout stays as it was.
  if (rollout.asked) say(ctx, `rollout: none, the channel decides: ${rollout.channelBecause}`);
  return report;
}

async function channelDryRun(ctx: UpgraderContext): Promise<DryRunReport> {
  const f = await gatherFacts(ctx);
  if ('none' in f) return noTargetReport(ctx, f);
  const report: DryRunReport = {
    installed_version: f.installed.version,
    target_version: f.target.version,
    upgrade_available: !sameVersion(f.installed.version, f.target.version),
    channel: f.endpoint.channel,
    version_server: `${f.endpoint.host}:${f.endpoint.port}`,
    critical: f.target.critical,
    answered_by: f.target.proxy ?? null,
    maintenance_window: windowReport(f),
    install: null,
    cluster_too_old: f.cluster.ok ? null : f.cluster.needed,
    rollout: null,
  };
  say(ctx, comparisonLine(f.installed.version, f.target.version));
  say(ctx, `channel: ${f.endpoint.channel} at ${f.endpoint.host}:${f.endpoint.port} (critical: ${f.target.critical ? 'yes' : 'no'})`);
  // Which Proxy answered: behind a load balancer, Proxies with different channels are what makes agents flip.
  if (f.target.proxy) say(ctx, `answered by: Proxy ${f.target.proxy}`);
  say(ctx, windowLine(f));
  reportSchedule(ctx, f.schedule);
  if (!f.cluster.ok) warn(ctx, `${tooOld(f.cluster).message}; 'gateway-upgrade run' will not upgrade (needs ${f.cluster.needed})`);
  if (!report.upgrade_available) return report;
  report.install = await installPlan(ctx, f.endpoint, f.installed, f.target.version);
  return report;
}

// --- installing ----------------------------------------------------------------------------------------------------

interface Installer {
  /** "apt-get (gateway=17.0.2)", "tarball gateway-ent-v17.0.2-linux-amd64-bin.tar.gz". */
  describe(version: string): string;
  /** Installs exactly `version`. Throws GW_ERR_UPGRADE_INSTALL / DOWNLOAD / CHECKSUM. */
  install(version: string, downgrade: boolean): Promise<void>;
  /** Puts `previous` back after a failed upgrade. */
  rollback(previous: string): Promise<void>;
  /** The upgrade went through: drops what was kept for a rollback. */
  finish?(): Promise<void>;
}

function packageInstaller(ctx: UpgraderContext, pm: PackageManager, pkg: string, repo: RepoEntry): Installer {
  const install = async (version: string, downgrade: boolean) => {
    const cmds = installCommands(pm, {
      pkg,
      version,
      downgrade,
      ...(pm === 'apt' ? { aptSourceList: repo.path } : {}),
      ...(repo.repoId ? { repoId: repo.repoId } : {}),
      args: ctx.settings.pmArgs,
    });
    for (const argv of cmds) {
      ctx.stderr.write(`+ ${argv.join(' ')}\n`);
      const r = await runCommand(argv, { env: { ...env(ctx), ...installEnv(pm) }, echo: ctx.stderr, timeoutMs: ctx.settings.commandTimeoutMs });
      // apt-get update only warns when metadata fails its signature check, and installs from the previous
      // index: an upgrade from a repository whose current metadata does not verify is refused instead.
      const unverified = r.code === 0 && installStep(argv) === 'refresh' ? refreshWarning(pm, `${r.stdout}\n${r.stderr}`) : undefined;
      if (unverified) {
        throw new GatewayError(unverified.code, `installing ${packageSpec(pm, pkg, version)} failed: ${unverified.reason} [\`${argv[0]}\` warned]`, { hint: unverified.hint, details: { command: argv, path: repo.path } });
      }
      if (r.code !== 0) {
        const spec = packageSpec(pm, pkg, version);
        const command = `\`${[argv[0], ...argv.slice(1 + ctx.settings.pmArgs.length, 2 + ctx.settings.pmArgs.length)].join(' ')}\` ${describeExit(argv[0]!, r, ctx.settings.commandTimeoutMs)}`;
        const cause = r.timedOut ? undefined : explainFailure(pm, installStep(argv), spec, `${r.stdout}\n${r.stderr}`);
        const details = { command: argv, code: r.code, path: repo.path };
        if (cause) throw new GatewayError(cause.code, `installing ${spec} failed: ${cause.reason} [${command}]`, { hint: cause.hint, details });
        throw new GatewayError('GW_ERR_UPGRADE_INSTALL', `installing ${spec} failed: ${command}: ${lastLines(r)}`, { details });
      }
    }
  };
  return {
    describe: (v) => `${pm} (${packageSpec(pm, pkg, v)})`,
    install,
    rollback: (previous) => install(previous, true),
  };
}

function tarballInstaller(ctx: UpgraderContext, endpoint: Endpoint, workDir: string, fips: boolean): Installer {
  const ca = loadCaFiles(ctx.settings.caFiles);
  const deps = {
    dialer: ctx.dialer,
    ...(ca.length ? { ca } : {}),
    stderr: ctx.stderr,
    downloadUrl: downloadUrl(ctx.settings, endpoint),
    arch: tarballArch(ctx.settings.arch),
    fips,
    binDir: ctx.settings.binDir,
    workDir,
    commandTimeoutMs: ctx.settings.commandTimeoutMs,
    env: env(ctx),
  };
  let done: TarballInstall | undefined;
  return {
    describe: (v) => `tarball ${tarballName(v, deps.arch, fips)}`,
    async install(version) {
      const file = await fetchVerifiedTarball(version, deps);
      done = await installTarball(file, deps);
    },
    async rollback() {
      if (!done) throw new GatewayError('GW_ERR_UPGRADE_INSTALL', 'nothing to roll back: the tarball was not installed');
      await done.restore();
    },
    finish: async () => done?.discard(),
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Restarts the service and waits until it is healthy and reports `expected`. Resolves with the reason on failure. */
async function restartAndCheck(ctx: UpgraderContext, expected: string): Promise<string | undefined> {
  const s = ctx.settings;
  // A hand-over leaves the old process running (draining): the new one must be another pid (docs/upgrades.md).
  const before = pidIn(s.pidFile);
  ctx.stderr.write(`+ ${s.restartCommand}\n`);
  const r = await runShell(s.restartCommand, { env: env(ctx), timeoutMs: s.healthTimeoutMs + 30_000, echo: ctx.stderr });
  if (r.code !== 0) return `the restart command \`${s.restartCommand}\` failed (${describeExit('sh', r)}): ${lastLines(r, 3) || 'no output'}`;
  const deadline = Date.now() + s.healthTimeoutMs;
  let why = 'no check ran';
  for (;;) {
    const h = await runShell(s.healthCommand, { env: env(ctx), timeoutMs: 30_000 });
    const moved = before === undefined ? undefined : newMainProcess(s.pidFile, before);
    if (moved !== undefined) {
      why = moved;
    } else if (h.code === 0) {
      try {
        const v = (await installedVersion(ctx)).version;
        if (sameVersion(v, expected)) return undefined;
        why = `the version command reports ${v}, not ${expected}`;
      } catch (err) {
        why = toGatewayError(err).message;
      }
    } else {
      why = `the health check \`${s.healthCommand}\` failed (${describeExit('sh', h)})${lastLines(h, 2) ? `: ${lastLines(h, 2)}` : ''}`;
    }
    if (Date.now() >= deadline) return `the service did not come back with ${expected} within ${Math.round(s.healthTimeoutMs / 1000)} s: ${why}`;
    await sleep(s.healthPollMs);
  }
}

/** The pid a pid file names, if it names one. */
function pidIn(path: string): number | undefined {
  try {
    const t = readFileSync(path, 'utf8').split('\n', 1)[0]!.trim();
    return /^\d{1,10}$/.test(t) && Number(t) > 0 ? Number(t) : undefined;
  } catch {
    return undefined;
  }
}

/** Why the service's main process is not yet a new one (the pid file names `before`, none, or a dead pid), or undefined. */
function newMainProcess(path: string, before: number): string | undefined {
  const now = pidIn(path);
  if (now === undefined) return `the pid file ${path} names no process yet`;
  if (now === before) return `the service's main process is still pid ${before} (${path}): no successor has taken over`;
  return processAlive(now) ? undefined : `the pid file ${path} names pid ${now}, which is not running`;
}

/** The installed binary's own check (the version command reports `expected`) before the service is restarted. */
async function selfCheck(ctx: UpgraderContext, expected: string): Promise<string | undefined> {
  try {
    const v = (await installedVersion(ctx)).version;
    return sameVersion(v, expected) ? undefined : `the version command reports ${v}, not ${expected}`;
  } catch (err) {
    return toGatewayError(err).message;
  }
}

// --- a managed rollout ----------------------------------------------------------------------------------------------

/** What the Proxy's rollout says of this host: an instruction that decides (managed), else why the channel decides. */
export interface RolloutAnswer {
  managed?: AgentInstruction;
  /** The channel decides: no host identity, an earlier Proxy (404), or managed:false (its reason). */
  channelBecause?: string;
  /** The managed:false answer itself, for dry-run's report. */
  unmanaged?: AgentInstruction;
  /** false: not asked (no host identity). */
  asked: boolean;
}

/**
 * Asks the Proxy of the endpoint file for this host's instruction (src/upgrade/instruction.ts). Throws
 * GW_ERR_UPGRADE_INSTRUCTION when it cannot be read: the caller must then do nothing (never the channel).
 */
export async function askRollout(ctx: UpgraderContext): Promise<RolloutAnswer> {
  const hostId = readHostId(ctx.settings.dataDir);
  if (hostId === undefined) return { asked: false, channelBecause: `this host has no agent identity in ${ctx.settings.dataDir}/host, so it is in no rollout` };
  const endpoint = await readEndpointFile(ctx.settings.endpointFile);
  const group = readGroupFile(ctx.settings.etcDir);
  const answer = await fetchInstruction(endpoint.origin, { hostId, ...(group ? { group } : {}) }, { ...httpDeps(ctx), deadlineMs: ctx.settings.instructionTimeoutMs });
  if (answer.kind === 'none') return { asked: true, channelBecause: answer.why };
  if (!answer.instruction.managed) return { asked: true, channelBecause: `no managed rollout (${answer.instruction.reason})`, unmanaged: answer.instruction };
  return { asked: true, managed: answer.instruction };
}

/** What a managed run does with its instruction: the version it installs now, or why nothing. Pure. */
export function managedDecision(i: AgentInstruction, current: string): { install: string; downgrade: boolean } | { install?: undefined; outcome: 'up-to-date' | 'waiting'; line: string } {
  if (i.version === undefined) return { outcome: 'waiting', line: `not upgrading: the rollout names no version yet (${i.reason})` };
  if (sameVersion(current, i.version)) return { outcome: 'up-to-date', line: comparisonLine(current, i.version) };
  if (!i.update) return { outcome: 'waiting', line: `not upgrading to ${i.version} now: ${i.reason}` };
  return { install: i.version, downgrade: semver.lt(i.version, current) };
}

/** run under a managed rollout: the instruction decides (no channel, no window); the install is the same as ever. */
async function runManaged(ctx: UpgraderContext, i: AgentInstruction, options: RunOptions, work: { dir?: string }): Promise<RunOutcome> {
  say(ctx, instructionLine(i));
  options.onRollout?.(i.rollout_id, i.reason);
  const installed = await installedVersion(ctx);
  if (i.version !== undefined) options.onVersions?.(installed.version, i.version);
  const d = managedDecision(i, installed.version);
  if (d.install === undefined) {
    say(ctx, d.line);
    return d.outcome;
  }
  say(ctx, d.downgrade ? `the rollout moves this host back (${installed.version} -> ${d.install}): ${i.reason}` : comparisonLine(installed.version, d.install));
  return installTarget(ctx, await readEndpointFile(ctx.settings.endpointFile), installed, d.install, options, work);
}

export interface RunOptions {
  /** Move a per-major repository to the target's major channel when needed ("updates it only when told to"). */
  updateRepo?: boolean;
  /** Told the versions the run compares, once it knows them (its last-run record keeps them). */
  onVersions?: (current: string, target: string) => void;
  /** Told the managed rollout's id and reason when an instruction decides the run (its last-run record keeps them). */
  onRollout?: (rolloutId: string | undefined, reason: string) => void;
}

export type RunOutcome = 'up-to-date' | 'no-version' | 'waiting' | 'upgraded';

export async function runUpgrade(ctx: UpgraderContext, options: RunOptions = {}): Promise<RunOutcome> {
  const lock = await acquireLock(ctx.settings.lockFile);
  const work: { dir?: string } = {};
  try {
    const rollout = await askRollout(ctx);
    if (rollout.managed) return await runManaged(ctx, rollout.managed, options, work);
    const f = await gatherFacts(ctx);
    if ('none' in f) {
      say(ctx, noVersionLine(f));
      return 'no-version';
    }
    const current = f.installed.version;
    const target = f.target.version;
    options.onVersions?.(current, target);
    say(ctx, comparisonLine(current, target));
    if (sameVersion(current, target)) return 'up-to-date';
    if (!f.cluster.ok) throw tooOld(f.cluster);
    reportSchedule(ctx, f.schedule);
    if (f.target.critical) say(ctx, `upgrading now: ${target} is a critical release, which does not wait for a maintenance window`);
    else if (f.window) say(ctx, `upgrading: inside the maintenance window (until ${isoSeconds(f.window.stop)})`);
    else {
      const when = f.next ? `; the next starts at ${isoSeconds(f.next.start)} (${formatIn(f.next.start.getTime() - f.now.getTime())})` : '';
      say(ctx, `not upgrading: outside the maintenance window${when}; critical releases go at once`);
      const pm = await resolvePackageManager(ctx, packageNameFor(ctx, f.installed)).catch(() => undefined);
      await announceRepoMove(ctx, pm, target);
      return 'waiting';
    }

    return await installTarget(ctx, f.endpoint, f.installed, target, options, work);
  } finally {
    await lock.release();
    if (work.dir) await rm(work.dir, { recursive: true, force: true }).catch(() => undefined);
  }
}

/**
 * Installs `target` over `installed` (an upgrade, or a downgrade for a rollout's rollback), with the self-check,
 * the restart and health wait, and the local rollback on any failure. Throws GW_ERR_UPGRADE_* with what failed.
 */
async function installTarget(ctx: UpgraderContext, endpoint: Endpoint, installed: Installed, target: string, options: RunOptions, work: { dir?: string }): Promise<'upgraded'> {
  const current = installed.version;
  const pkg = packageNameFor(ctx, installed);
  const pm = await resolvePackageManager(ctx, pkg);
  let installer: Installer;
  let movedFrom: string | undefined;
  let repo: RepoEntry | undefined;
  if (pm === 'tarball') {
    work.dir = await mkdtemp(join(tmpdir(), 'gateway-upgrade-'));
    installer = tarballInstaller(ctx, endpoint, work.dir, installed.fips);
  } else {
    repo = await readRepo(pm, ctx.settings);
    if (!repo) {
      throw new GatewayError('GW_ERR_UPGRADE_REPO', `the package repository is not registered: ${repoPath(pm, ctx.settings)} does not exist, and installing needs it`, {
        hint: `Register it with 'gateway-upgrade repo set-channel stable/v${semver.major(current)}' (and the repository's signing key), as the install guide shows.`,
      });
    }
    const holds = channelHolds(repo.channel, target);
    if (!holds.ok) {
      if (!options.updateRepo) throw repoMoveError(repo, target, holds.move);
      movedFrom = repo.channel;
      repo = await setChannel(pm, holds.move, ctx.settings);
      say(ctx, `moved the repository ${repo.path} from ${movedFrom} to ${holds.move}`);
    }
    installer = packageInstaller(ctx, pm, pkg, repo);
  }
  const downgrade = semver.lt(target, current);
  say(ctx, `installing ${installer.describe(target)}`);

  const putBack = async (why: string, code: 'GW_ERR_UPGRADE_INSTALL' | 'GW_ERR_UPGRADE_HEALTH', cause?: unknown, restart = true): Promise<never> => {
    let outcome: string;
    try {
      if (movedFrom !== undefined && pm !== 'tarball') {
        repo = await setChannel(pm, movedFrom, ctx.settings);
        installer = packageInstaller(ctx, pm, pkg, repo);
      }
      ctx.stderr.write(`rolling back to ${current}\n`);
      await installer.rollback(current);
      const back = restart ? await restartAndCheck(ctx, current) : await selfCheck(ctx, current);
      outcome = back === undefined ? `the previous version ${current} was put back ${restart ? 'and is running' : '(the service was not restarted)'}` : `the previous version ${current} was put back, but ${back}`;
    } catch (err) {
      outcome = `putting the previous version ${current} back failed too (${toGatewayError(err).message}); this host needs attention`;
    }
    throw new GatewayError(code, `the upgrade ${current} -> ${target} failed: ${why}; ${outcome}`, { ...(cause === undefined ? {} : { cause }) });
  };

  try {
    await installer.install(target, downgrade);
  } catch (err) {
    const e = toGatewayError(err);
    // Tarballs: a checksum or download failure changed nothing, and a failed install script was undone already.
    if (pm === 'tarball') throw e;
    // A package manager may fail before or after it touched the files: check what is installed now.
    const after = await installedVersion(ctx).catch(() => undefined);
    if (after && sameVersion(after.version, current)) {
      if (movedFrom !== undefined) await setChannel(pm, movedFrom, ctx.settings).catch(() => undefined);
      const code = e.code === 'GW_ERR_UPGRADE_REPO' || e.code === 'GW_ERR_UPGRADE_CHECKSUM' ? e.code : 'GW_ERR_UPGRADE_INSTALL';
      throw new GatewayError(code, `${e.message}; ${current} is still installed and the service was not restarted`, { cause: e, hint: e.hint });
    }
    return await putBack(e.message, 'GW_ERR_UPGRADE_INSTALL', e);
  }
  const broken = await selfCheck(ctx, target);
  if (broken !== undefined) await putBack(`the new binary failed its self-check, before any restart: ${broken}`, 'GW_ERR_UPGRADE_HEALTH', undefined, false);
  const problem = await restartAndCheck(ctx, target);
  if (problem !== undefined) await putBack(problem, 'GW_ERR_UPGRADE_HEALTH');
  await installer.finish?.();
  say(ctx, `upgraded ${pkg} ${current} -> ${target}; the service is running ${target}`);
  return 'upgraded';
}

/** `gateway-upgrade repo show`: the entry and its channel. */
export async function showRepo(ctx: UpgraderContext): Promise<{ path: string; registered: boolean; channel: string | null }> {
  const pm = await resolveRepoManager(ctx);
  const entry = await readRepo(pm, ctx.settings);
  if (!entry) {
    say(ctx, `${repoPath(pm, ctx.settings)}: not registered`);
    return { path: repoPath(pm, ctx.settings), registered: false, channel: null };
  }
  say(ctx, `${entry.path}: channel ${entry.channel ?? 'unknown'}`);
  return { path: entry.path, registered: true, channel: entry.channel ?? null };
}

/** `gateway-upgrade repo set-channel <channel>`: the explicit move. */
export async function setRepoChannel(ctx: UpgraderContext, channel: string): Promise<void> {
  const pm = await resolveRepoManager(ctx);
  const before = await readRepo(pm, ctx.settings);
  const s = ctx.settings.artifacts === 'proxy' && !before ? await throughProxy(ctx.settings) : ctx.settings;
  const after = await setChannel(pm, channel, s);
  say(ctx, before ? `${after.path}: channel ${before.channel ?? 'unknown'} -> ${after.channel ?? channel}` : `${after.path}: created on channel ${after.channel ?? channel}`);
}

/**
 * `gateway-upgrade repo set-source proxy|direct`: the entry fetches through the endpoint file's Proxy, or directly
 * (reposource.ts). With --ca-file, that file is the CA apt or dnf trust for the Proxy instead of the agent's host CA.
 */
export async function setRepoSource(ctx: UpgraderContext, source: RepoSource, caFile?: string): Promise<void> {
  const pm = await resolveRepoManager(ctx);
  const entry = await readRepo(pm, ctx.settings);
  if (!entry) {
    throw new GatewayError('GW_ERR_UPGRADE_REPO', `the package repository is not registered: ${repoPath(pm, ctx.settings)} does not exist`, {
      hint: "Run 'gateway-upgrade repo set-channel stable/v<major>' first (with GATEWAY_UPGRADE_ARTIFACTS=proxy it names the Proxy at once), or write the entry as the install guide shows.",
    });
  }
  const endpoint = await readEndpointFile(ctx.settings.endpointFile);
  const move = planSource(pm, entry, source, endpoint, ctx.settings, caFile);
  await applySource(move);
  say(ctx, `${move.path}: ${source === 'proxy' ? `through the Proxy ${endpoint.host}:${endpoint.port}` : 'direct'}${move.aptConf?.text !== undefined ? `; ${move.aptConf.path} trusts the cluster's CA for ${endpoint.host}` : ''}`);
}

/** The settings with the repository addresses of the endpoint file's Proxy (GATEWAY_UPGRADE_ARTIFACTS=proxy). */
async function throughProxy(s: UpgraderContext['settings']): Promise<UpgraderContext['settings']> {
  const url = proxyRepoUrl(await readEndpointFile(s.endpointFile));
  return { ...s, aptRepoUrl: url, yumRepoUrl: url };
}

async function resolveRepoManager(ctx: UpgraderContext): Promise<PackageManager> {
  const s = ctx.settings;
  let pm: PackageManagerName;
  if (s.packageManager !== 'auto') pm = s.packageManager;
  else {
    const installed = await installedVersion(ctx).catch(() => ({ version: '0.0.0', fips: s.fips === true }));
    pm = await resolvePackageManager(ctx, packageNameFor(ctx, installed));
    if (pm === 'tarball') {
      // Not installed from a package yet: pick the family by the tools present.
      for (const cand of ['apt-get', 'dnf', 'yum', 'zypper'] as const) {
        if (await which(cand, env(ctx))) {
          pm = cand === 'apt-get' ? 'apt' : cand;
          break;
        }
      }
    }
  }
  if (pm === 'tarball') {
    throw new GatewayError('GW_ERR_UPGRADE_PACKAGE_MANAGER', 'this host installs the gateway from tarballs, which have no package repository', {
      hint: 'Set GATEWAY_UPGRADE_PACKAGE_MANAGER to apt, yum, dnf or zypper to manage a repository entry anyway.',
    });
  }
  return pm;
}
