/**
 * What `gateway start` does for systemd (docs/systemd.md): the pid file, and reloading the configuration on
 * SIGHUP without dropping listeners, reverse tunnels or sessions.
 *
 *   pid file   acquirePidFile(path): written once at start (mode 0644, "<pid>\n", created atomically so nobody
 *              reads it half written); a file left by a process that is gone, or whose pid now belongs to a
 *              program that is not a gateway, is replaced; one held by a live gateway is GW_ERR_PID_FILE_BUSY.
 *              release() removes it on a clean exit, only while it still holds our pid. The data directory's
 *              lock (acquireDataDirLock) follows the same rules and also records when its process started, so
 *              that a dead holder's pid, reused, is not taken for the holder.
 *   SIGHUP     installReload(): re-reads and validates the file given with -c. Invalid → the error is logged
 *              with its code and hint and the running configuration stays as it is. Valid → planReload() sorts
 *              the changed keys into those applied now (LIVE_KEYS: log severity, the version server's
 *              channels, the PROXY header's trusted sources) and those that need a restart (logged as such);
 *              onReload applies the live ones.
 *              Nothing is closed or re-opened: the process, its listeners and its tunnels are the same.
 *
 * followLogLevel() makes a log severity change reach every child logger already handed out (pino children keep
 * the level they were created with); ReloadableVersionServer lets the Proxy swap its channels in place.
 */
import { processAlive, processStartTime } from './proc.js';
import { existsSync, linkSync, mkdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import type { Logger } from 'pino';
import { loadConfigFile, type GatewayConfig, type UpgradeChannelConfig } from './config/index.js';
import { GatewayError, toGatewayError } from './errors.js';
import { logger, type LogLevel } from './log.js';
import { VersionServer, type VersionServerOptions } from './proxy/versions.js';
import type { VersionRequest } from './wire/versions.js';

// --- pid file -------------------------------------------------------------------------------------------------

export interface PidFile {
  readonly path: string;
  readonly pid: number;
  /** Removes the file if it still holds our pid. Idempotent; never throws. */
  release(): void;
}

/**
 * Whether pid runs a gateway. On Linux /proc/<pid>/cmdline tells; where it cannot be read the answer is yes
 * (better a clear error than two daemons sharing one pid file).
 */
function runsGateway(pid: number): boolean {
  let cmdline: string;
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return true;
  }
  return cmdline.includes('gateway');
}

/** The pid on the first line of a pid file or lock. */
function parsePid(text: string): number | undefined {
  const t = text.split('\n', 1)[0]!.trim();
  if (!/^\d{1,10}$/.test(t)) return undefined;
  const pid = Number(t);
  return pid > 0 ? pid : undefined;
}

/** The start time a lock recorded for its pid (its "started <time>" line), if it did. */
function parseStarted(text: string): string | undefined {
  return /^started (\S{1,200})$/m.exec(text)?.[1];
}

/**
 * Whether the holder a file names still runs. A pid alone can have been reused by another program since its
 * process died (a container's pids are small and soon reused): where the file recorded the holder's start time and
 * /proc tells the pid's, they must agree; otherwise the pid must run a gateway (/proc/<pid>/cmdline).
 */
function holderRuns(holder: number, started: string | undefined): boolean {
  if (!processAlive(holder)) return false;
  const now = started === undefined ? undefined : processStartTime(holder);
  return now !== undefined ? now === started : runsGateway(holder);
}

function pidWriteError(path: string, err: unknown): GatewayError {
  const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
  return new GatewayError('GW_ERR_PID_FILE_WRITE', `cannot write the pid file ${path} (${code})`, { cause: err, details: { path } });
}

/**
 * Writes "<pid>\n" to path (mode 0644), replacing a stale file. Throws GW_ERR_PID_FILE_BUSY when a live gateway
 * holds it, GW_ERR_PID_FILE_WRITE when the file or its directory cannot be written.
 */
export function acquirePidFile(path: string, options: { pid?: number; log?: Logger; recordStart?: boolean; takeFrom?: number } = {}): PidFile {
  const pid = options.pid ?? process.pid;
  // A lock (not a pid file, which systemd reads as one number) also records when its process started: holderRuns.
  const started = options.recordStart ? processStartTime(pid) : undefined;
  const log = options.log ?? logger('gateway');
  const dir = dirname(path);
  try {
    mkdirSync(dir, { recursive: true, mode: 0o755 });
  } catch (err) {
    throw pidWriteError(path, err);
  }
  // The content goes to a temporary file first and is linked into place: link() fails when the name exists, so
  // the pid file appears whole or not at all.
  const tmp = join(dir, `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
  try {
    writeFileSync(tmp, `${pid}\n${started === undefined ? '' : `started ${started}\n`}`, { mode: 0o644, flag: 'wx' });
  } catch (err) {
    throw pidWriteError(path, err);
  }
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        linkSync(tmp, path);
        break;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || attempt >= 3) throw pidWriteError(path, err);
      }
      let content: string;
      try {
        content = readFileSync(path, 'utf8');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue; // removed meanwhile: try again
        throw pidWriteError(path, err);
      }
      const holder = parsePid(content);
      // takeFrom: a hand-over's successor takes the file from its parent, which goes on draining (src/handover.ts).
      if (holder !== undefined && holder !== pid && holder !== options.takeFrom && holderRuns(holder, parseStarted(content))) {
        throw new GatewayError('GW_ERR_PID_FILE_BUSY', `the pid file ${path} belongs to a running gateway (pid ${holder})`, {
          hint: `Stop that gateway first (kill ${holder}, or systemctl stop gateway), or give this one another --pid-file.`,
          details: { path, pid: holder },
        });
      }
      if (holder !== undefined && holder === options.takeFrom) log.info({ path, from_pid: holder }, 'hand-over: taking the file from the process before');
      else log.warn({ path, stale_pid: holder ?? null }, options.recordStart ? 'taking over a lock whose gateway is no longer running' : 'replacing a stale pid file');
      try {
        // Only the file we judged stale: if another starting gateway replaced it meanwhile, leave theirs alone.
        if (readFileSync(path, 'utf8') === content) unlinkSync(path);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw pidWriteError(path, err);
      }
    }
  } finally {
    try {
      unlinkSync(tmp);
    } catch {
      // already gone
    }
  }
  let released = false;
  return {
    path,
    pid,
    release() {
      if (released) return;
      released = true;
      try {
        if (existsSync(path) && parsePid(readFileSync(path, 'utf8')) === pid) unlinkSync(path);
      } catch {
        // best effort on the way out
      }
    },
  };
}

/**
 * One daemon per data directory: `<data_dir>/gateway.lock` holds the pid of the gateway using it and, where /proc
 * tells, when that process started ("started <ticks>@<boot id>"), so that a dead holder's pid reused by another
 * process is not taken for the holder. A lock whose holder is gone (killed, crashed) is taken over with a log
 * line; a second daemon on a directory whose holder runs is refused with GW_ERR_DATA_DIR_IN_USE, never allowed to
 * share it.
 */
export function acquireDataDirLock(dataDir: string, options: { pid?: number; log?: Logger; takeFrom?: number } = {}): PidFile {
  try {
    return acquirePidFile(join(dataDir, 'gateway.lock'), { ...options, recordStart: true });
  } catch (err) {
    if (!(err instanceof GatewayError) || err.code !== 'GW_ERR_PID_FILE_BUSY') throw err;
    const holder = (err.details as { pid?: number } | undefined)?.pid;
    throw new GatewayError('GW_ERR_DATA_DIR_IN_USE', `the data directory ${dataDir} is in use by a running gateway (pid ${holder})`, {
      hint: `Give this gateway a data directory of its own: set gateway.data_dir in its configuration or pass --data-dir (for an agent on this machine, e.g. --data-dir=/var/lib/gateway-agent). Or stop pid ${holder} first.`,
      details: { data_dir: dataDir, pid: holder },
    });
  }
}

// --- what a reload changes ------------------------------------------------------------------------------------

/** Configuration keys applied without a restart; every other change is logged as needing one. */
export const LIVE_KEYS = ['gateway.log.severity', 'proxy_service.automatic_upgrades_channels', 'proxy_service.proxy_protocol_trusted_sources'] as const;

export interface ReloadPlan {
  /** Changed key paths applied by this reload. */
  live: string[];
  /** Changed key paths that take effect only after a restart (compared with what the process started with). */
  restart: string[];
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Key paths (dotted) whose values differ; lists are compared whole and reported by their own path. */
export function changedKeys(a: unknown, b: unknown, prefix = ''): string[] {
  if (isPlainObject(a) && isPlainObject(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    return keys.flatMap((k) => changedKeys(a[k], b[k], prefix ? `${prefix}.${k}` : k));
  }
  if (JSON.stringify(a) === JSON.stringify(b)) return [];
  return [prefix];
}

function isLive(key: string): boolean {
  return LIVE_KEYS.some((live) => key === live || key.startsWith(`${live}.`));
}

/** Sorts the differences between the running configuration and the new one. Pure. */
export function planReload(running: GatewayConfig, next: GatewayConfig): ReloadPlan {
  const changed = changedKeys(running, next);
  return { live: changed.filter(isLive), restart: changed.filter((k) => !isLive(k)) };
}

export function channelsChanged(plan: ReloadPlan): boolean {
  return plan.live.some((k) => k === 'proxy_service.automatic_upgrades_channels' || k.startsWith('proxy_service.automatic_upgrades_channels.'));
}

/** Whether the balancers PROXY headers are believed from changed (a compromised one taken out needs no restart). */
export function trustedSourcesChanged(plan: ReloadPlan): boolean {
  return plan.live.includes('proxy_service.proxy_protocol_trusted_sources');
}

/** The running configuration once the live keys of next are applied: restart-only keys keep their old values. */
export function withLiveKeys(running: GatewayConfig, next: GatewayConfig): GatewayConfig {
  return Object.freeze({
    ...running,
    gateway: Object.freeze({ ...running.gateway, log: Object.freeze({ ...running.gateway.log, severity: next.gateway.log.severity }) }),
    proxy_service: Object.freeze({
      ...running.proxy_service,
      automatic_upgrades_channels: next.proxy_service.automatic_upgrades_channels,
      proxy_protocol_trusted_sources: next.proxy_service.proxy_protocol_trusted_sources,
    }),
  });
}

// --- SIGHUP ---------------------------------------------------------------------------------------------------

export type ReloadOutcome =
  | { status: 'reloaded'; plan: ReloadPlan }
  | { status: 'failed'; error: GatewayError }
  | { status: 'no-config-file' };

export interface ReloadOptions {
  /** The file given with -c; without one there is nothing to re-read (SIGHUP is then logged and ignored). */
  configPath: string | undefined;
  /** The configuration the process runs. */
  running: GatewayConfig;
  /**
   * Applies the live keys of a new, valid configuration. Throwing (or rejecting) keeps the previous
   * configuration: do the step that can fail first.
   */
  onReload(next: GatewayConfig, plan: ReloadPlan): void | Promise<void>;
  /** Default: loadConfigFile. */
  load?: (path: string) => GatewayConfig;
  /** Default SIGHUP; undefined listens to no signal (tests call reload()). */
  signal?: NodeJS.Signals | null;
  log?: Logger;
}

export interface ReloadHandle {
  /** One reload now (reloads asked for while one runs are merged into a single next one). */
  reload(): Promise<ReloadOutcome>;
  /** The configuration in force: the start-up one with the live keys of the last good reload. */
  readonly running: GatewayConfig;
  /** Stops listening to the signal. */
  close(): void;
}

export function installReload(options: ReloadOptions): ReloadHandle {
  const log = options.log ?? logger('gateway');
  const load = options.load ?? loadConfigFile;
  const signal = options.signal === undefined ? 'SIGHUP' : options.signal;
  let running = options.running;
  let current: Promise<ReloadOutcome> | undefined;
  let queued: Promise<ReloadOutcome> | undefined;

  const once = async (): Promise<ReloadOutcome> => {
    if (options.configPath === undefined) {
      log.warn('reload asked for, but the gateway was started without a configuration file (-c): nothing to re-read');
      return { status: 'no-config-file' };
    }
    const source = options.configPath;
    let next: GatewayConfig;
    let plan: ReloadPlan;
    try {
      next = load(source);
      plan = planReload(running, next);
      if (plan.live.length > 0) await options.onReload(next, plan);
    } catch (err) {
      const error = toGatewayError(err);
      log.error({ code: error.code, err: error.message, hint: error.hint, config: source }, 'configuration reload failed; still running the previous configuration');
      return { status: 'failed', error };
    }
    running = withLiveKeys(running, next);
    log.info({ config: source, applied: plan.live, restart_needed: plan.restart }, plan.live.length > 0 ? 'configuration reloaded' : 'configuration reloaded: nothing to apply');
    if (plan.restart.length > 0) {
      log.warn({ keys: plan.restart }, 'these configuration changes take effect only after a restart');
    }
    return { status: 'reloaded', plan };
  };

  const reload = (): Promise<ReloadOutcome> => {
    if (!current) {
      current = once().finally(() => (current = undefined));
      return current;
    }
    // One runs: everything asked for meanwhile shares a single run after it (it reads the newest file).
    queued ??= current.then(
      () => {
        queued = undefined;
        return reload();
      },
      () => {
        queued = undefined;
        return reload();
      },
    );
    return queued;
  };

  const onSignal = () => {
    log.info({ signal }, 'reloading the configuration');
    void reload();
  };
  if (signal) process.on(signal, onSignal);
  return {
    reload,
    get running() {
      return running;
    },
    close() {
      if (signal) process.off(signal, onSignal);
    },
  };
}

// --- live log severity ------------------------------------------------------------------------------------------

/**
 * Tracks every logger derived from root (children, their children) so that a new severity reaches all of them.
 * Call it before the first child is made; returns the function that sets the level everywhere.
 */
export function followLogLevel(root: Logger): (level: LogLevel) => void {
  const children = new Set<WeakRef<Logger>>();
  const registry = new FinalizationRegistry<WeakRef<Logger>>((ref) => children.delete(ref));
  // pino calls the parent's onChild for every child; children inherit this property from root, so
  // grandchildren are seen too.
  root.onChild = (child: Logger) => {
    const ref = new WeakRef(child);
    children.add(ref);
    registry.register(child, ref);
  };
  return (level) => {
    root.level = level;
    for (const ref of children) {
      const child = ref.deref();
      if (child) child.level = level;
      else children.delete(ref);
    }
  };
}

// --- the version server's channels, swapped in place -----------------------------------------------------------

/**
 * A VersionServer whose channels can be replaced while the Proxy serves: setChannels() builds a complete new
 * server first (so an invalid channel throws and changes nothing) and then answers every request with it.
 * Upstream answers cached for forward_url channels start afresh after a swap.
 */
export class ReloadableVersionServer extends VersionServer {
  private readonly base: Omit<VersionServerOptions, 'channels'>;
  private current: VersionServer | undefined;

  constructor(options: VersionServerOptions) {
    super(options);
    const { channels: _channels, ...base } = options;
    this.base = base;
  }

  setChannels(channels: Readonly<Record<string, UpgradeChannelConfig>>): void {
    this.current = new VersionServer({ ...this.base, channels });
  }

  override channelNames(): string[] {
    return this.current ? this.current.channelNames() : super.channelNames();
  }

  override handle(req: IncomingMessage, res: ServerResponse): boolean {
    return this.current ? this.current.handle(req, res) : super.handle(req, res);
  }

  override resolve(channel: string, what: VersionRequest): Promise<string> {
    return this.current ? this.current.resolve(channel, what) : super.resolve(channel, what);
  }
}
