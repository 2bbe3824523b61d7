/**
 * The maintenance schedule an agent exports to its upgrader.
 *
 * systemd agents: `/etc/gateway-upgrade.d/schedule`, plain text, documented in docs/upgrades.md:
 *
 *   # gateway-upgrade schedule v1: "<start> <stop>" per line, Unix seconds (UTC); written 2026-01-05T01:00:00Z
 *   1767578400 1767582000
 *   1767664800 1767668400
 *
 * The first line is a comment (it must start with `#`); every further line that is not blank or a comment is
 * one window. A file with the comment and no window says "the cluster has no maintenance window". Readers
 * accept any number of windows in any order; writers put the next DEFAULT_WINDOW_COUNT in time order.
 *
 * Kubernetes agents: the same windows as JSON ({"version":"v1","written":ISO,"windows":[{"start":ISO,"stop":ISO}]})
 * in the state file their updater reads.
 *
 * When the agent runs as a non-root user it cannot create files in /etc/gateway-upgrade.d: the file must exist
 * and belong to that user. checkScheduleFile says what is wrong and the command that fixes it. Writes are
 * atomic (temp file + rename) where the directory allows it, and in place otherwise (the non-root case).
 */
import { readFileSync } from 'node:fs';
import { chown, open, readFile, stat } from 'node:fs/promises';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import type { ClusterMaintenanceConfig } from '../auth/resources/types.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { recordNextWindow } from '../metrics/upgrade.js';
import { isoSeconds, nextWindows, type Window } from './windows.js';
import { checkClusterVersion } from './enrollment.js';
import { PUBLIC_DIR_MODE, writeFileAtomic } from '../fsutil.js';

export const SCHEDULE_FILE = 'schedule';
/** How many windows an export holds: the next week when every day is allowed, more weeks otherwise. */
export const DEFAULT_WINDOW_COUNT = 7;
/** How often an agent rewrites the schedule when nothing changed. */
export const DEFAULT_EXPORT_INTERVAL_MS = 10 * 60 * 1000;
/** A schedule older than this draws a warning (the agent refreshes it every 10 minutes). */
export const SCHEDULE_OLD_AFTER_MS = 24 * 60 * 60 * 1000;

const HEADER_PREFIX = '# gateway-upgrade schedule v1';

// --- the text format -------------------------------------------------------------------------------------------

/** The file's text for these windows (sorted by start). */
export function formatSchedule(windows: readonly Window[], written: Date = new Date()): string {
  const sorted = [...windows].sort((a, b) => a.start.getTime() - b.start.getTime());
  const lines = [`${HEADER_PREFIX}: "<start> <stop>" per line, Unix seconds (UTC); written ${isoSeconds(written)}`];
  if (sorted.length === 0) lines[0] += '; no maintenance window is configured';
  for (const w of sorted) lines.push(`${Math.floor(w.start.getTime() / 1000)} ${Math.floor(w.stop.getTime() / 1000)}`);
  return `${lines.join('\n')}\n`;
}

export type ParsedSchedule = { ok: true; windows: Window[] } | { ok: false; problem: string };

/** Parses the text format; never throws. */
export function parseSchedule(text: string): ParsedSchedule {
  const lines = text.split('\n').map((l) => l.replace(/\r$/, ''));
  if (text.trim() === '') return { ok: false, problem: 'the file is empty' };
  if (!lines[0]!.startsWith('#')) return { ok: false, problem: 'the first line is not the "#" comment line the agent writes' };
  const windows: Window[] = [];
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === '' || line.startsWith('#')) continue;
    const m = /^(\d{1,12})\s+(\d{1,12})$/.exec(line);
    if (!m) return { ok: false, problem: `line ${i + 1} is not "<start-unix> <stop-unix>": ${JSON.stringify(line.slice(0, 60))}` };
    const start = Number(m[1]) * 1000;
    const stop = Number(m[2]) * 1000;
    if (stop <= start) return { ok: false, problem: `line ${i + 1}: the window stops before it starts` };
    windows.push({ start: new Date(start), stop: new Date(stop) });
  }
  windows.sort((a, b) => a.start.getTime() - b.start.getTime());
  return { ok: true, windows };
}

/** What the upgrader knows about the schedule at `now`. */
export type ScheduleStatus =
  | { state: 'ok'; path: string; windows: Window[]; written: Date; old: boolean }
  | { state: 'empty'; path: string; written: Date }
  | { state: 'invalid'; path: string; problem: string };

/**
 * Reads the schedule file. Missing, unreadable, malformed, or holding no window that ends after `now` (stale) are
 * all "invalid" with the reason: the warning about an invalid upgrade schedule (docs/upgrades.md).
 */
export async function readSchedule(path: string, now: Date = new Date()): Promise<ScheduleStatus> {
  let text: string;
  let written: Date;
  try {
    const st = await stat(path);
    written = st.mtime;
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return { state: 'invalid', path, problem: code === 'ENOENT' ? `${path} does not exist` : `${path} cannot be read (${code ?? 'error'})` };
  }
  const parsed = parseSchedule(text);
  if (!parsed.ok) return { state: 'invalid', path, problem: `${path}: ${parsed.problem}` };
  if (parsed.windows.length === 0) return { state: 'empty', path, written };
  const future = parsed.windows.filter((w) => w.stop.getTime() > now.getTime());
  if (future.length === 0) {
    const last = parsed.windows[parsed.windows.length - 1]!;
    return { state: 'invalid', path, problem: `${path} is stale: its last window ended at ${isoSeconds(last.stop)}` };
  }
  return { state: 'ok', path, windows: parsed.windows, written, old: now.getTime() - written.getTime() > SCHEDULE_OLD_AFTER_MS };
}

/** The text of the warning for an invalid schedule. */
export function invalidScheduleWarning(problem: string): string {
  return (
    `invalid upgrade schedule: ${problem}. This is expected right after install, until the agent has exported ` +
    `the cluster's maintenance schedule; until then only critical upgrades run`
  );
}

// --- ownership (agent running as a non-root user) --------------------------------------------------------------

export interface ScheduleProblem {
  path: string;
  problem: string;
  /** The shell command(s) that fix it, run as root. */
  fix: string;
}

export interface CheckScheduleOptions {
  /** The agent's uid; process.getuid() by default. Root (0) can create the file, so it is always fine. */
  uid?: number;
  /** The agent user's name, for the fix command; looked up from the uid by default. */
  user?: string;
}

function userName(uid: number): string {
  try {
    if (typeof process.getuid === 'function' && process.getuid() === uid) return userInfo().username;
  } catch {
    // no passwd entry
  }
  try {
    for (const line of readFileSync('/etc/passwd', 'utf8').split('\n')) {
      const f = line.split(':');
      if (f[2] === String(uid) && f[0]) return f[0];
    }
  } catch {
    // no /etc/passwd
  }
  return String(uid);
}

/**
 * Checks that an agent running as `uid` can keep `<dir>/schedule` up to date: for a non-root agent the file must
 * exist, be a regular file, belong to that user and be writable by it. Undefined when all is well.
 */
export async function checkScheduleFile(dir: string, options: CheckScheduleOptions = {}): Promise<ScheduleProblem | undefined> {
  const uid = options.uid ?? (typeof process.getuid === 'function' ? process.getuid() : 0);
  if (uid === 0) return undefined;
  const path = join(dir, SCHEDULE_FILE);
  const user = options.user ?? userName(uid);
  const create = `sudo install -d -m 0755 ${dir} && sudo install -o ${user} -m 0644 /dev/null ${path}`;
  let st;
  try {
    st = await stat(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') {
      return {
        path,
        problem: `${path} does not exist, and the agent runs as ${user} (uid ${uid}), which cannot create it in ${dir}`,
        fix: create,
      };
    }
    return { path, problem: `${path} cannot be checked (${code ?? 'error'})`, fix: `sudo chmod 0755 ${dir}` };
  }
  if (!st.isFile()) return { path, problem: `${path} is not a regular file`, fix: `sudo rm -rf ${path} && ${create}` };
  if (st.uid !== uid) {
    return {
      path,
      problem: `${path} belongs to ${userName(st.uid)} (uid ${st.uid}), not to the agent user ${user} (uid ${uid})`,
      fix: `sudo chown ${user} ${path}`,
    };
  }
  if ((st.mode & 0o200) === 0) return { path, problem: `${path} is not writable by its owner ${user}`, fix: `sudo chmod u+w ${path}` };
  return undefined;
}

// --- writing ------------------------------------------------------------------------------------------------------

export interface WriteScheduleOptions {
  /** When running as root: give the file to this user (the agent user) after writing. */
  uid?: number;
  gid?: number;
  /** The "written" time in the comment line. */
  now?: Date;
}

function scheduleWriteError(path: string, err: unknown): GatewayError {
  const code = (err as NodeJS.ErrnoException | undefined)?.code ?? 'error';
  return new GatewayError('GW_ERR_UPGRADE_SCHEDULE', `cannot write the maintenance schedule ${path} (${code})`, { cause: err, details: { path } });
}

async function writeAtomicOrInPlace(path: string, data: string, mode: number): Promise<void> {
  try {
    writeFileAtomic(path, data, { mode, dirMode: PUBLIC_DIR_MODE });
    return;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'EACCES' && code !== 'EPERM') throw err;
  }
  // The directory is not ours (non-root agent): rewrite the file we own in place.
  const fh = await open(path, 'r+');
  try {
    await fh.truncate(0);
    await fh.write(data, 0, 'utf8');
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Writes `<dir>/schedule` with these windows. Throws GW_ERR_UPGRADE_SCHEDULE. */
export async function writeSchedule(dir: string, windows: readonly Window[], options: WriteScheduleOptions = {}): Promise<string> {
  const path = join(dir, SCHEDULE_FILE);
  try {
    await writeAtomicOrInPlace(path, formatSchedule(windows, options.now ?? new Date()), 0o644);
    const root = typeof process.getuid === 'function' && process.getuid() === 0;
    if (root && options.uid !== undefined) await chown(path, options.uid, options.gid ?? -1);
  } catch (err) {
    throw scheduleWriteError(path, err);
  }
  return path;
}

// --- the Kubernetes form ----------------------------------------------------------------------------------------------

export interface KubeScheduleState {
  version: 'v1';
  written: string;
  windows: Array<{ start: string; stop: string }>;
}

export function formatKubeSchedule(windows: readonly Window[], written: Date = new Date()): KubeScheduleState {
  return {
    version: 'v1',
    written: isoSeconds(written),
    windows: [...windows]
      .sort((a, b) => a.start.getTime() - b.start.getTime())
      .map((w) => ({ start: isoSeconds(w.start), stop: isoSeconds(w.stop) })),
  };
}

/** Parses the JSON the agent writes for the Kubernetes updater; throws GW_ERR_UPGRADE_SCHEDULE when it is not that. */
export function parseKubeSchedule(text: string): Window[] {
  const bad = (why: string) => new GatewayError('GW_ERR_UPGRADE_SCHEDULE', `the exported maintenance schedule is not valid: ${why}`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw bad('not JSON');
  }
  const v = value as Partial<KubeScheduleState> | null;
  if (!v || v.version !== 'v1' || !Array.isArray(v.windows)) throw bad('expected {"version":"v1","windows":[...]}');
  return v.windows.map((w, i) => {
    const start = new Date(String(w?.start));
    const stop = new Date(String(w?.stop));
    if (Number.isNaN(start.getTime()) || Number.isNaN(stop.getTime()) || stop <= start) throw bad(`window ${i} is not {"start": ISO, "stop": ISO}`);
    return { start, stop };
  });
}

/** Writes the Kubernetes form to `path` atomically (directory created when missing). */
export async function writeKubeSchedule(path: string, windows: readonly Window[], now: Date = new Date()): Promise<void> {
  try {
    writeFileAtomic(path, `${JSON.stringify(formatKubeSchedule(windows, now))}\n`, { mode: 0o644, dirMode: PUBLIC_DIR_MODE });
  } catch (err) {
    throw scheduleWriteError(path, err);
  }
}

// --- the agent's export loop ---------------------------------------------------------------------------------------

export interface ScheduleExportOptions {
  /** Reads the cluster's cluster_maintenance_config; undefined when the cluster has none. */
  fetchConfig: () => Promise<ClusterMaintenanceConfig | undefined>;
  /** The upgrader's directory, /etc/gateway-upgrade.d (systemd agents). Omit for a Kubernetes-only export. */
  dir?: string;
  /** Also (or instead) write the JSON form here: the state the Kubernetes updater reads. */
  kubeStatePath?: string;
  /** Or hand the JSON form to this writer (e.g. a PATCH of the updater's Secret key agent-maintenance-schedule). */
  writeKubeState?: (json: string) => Promise<void>;
  /** Rewrite this often even without a change (default 10 minutes). */
  intervalMs?: number;
  /** How many windows to export (default 7). */
  count?: number;
  /**
   * The cluster's version (its /webapi/ping server_version). When given and older than automatic upgrades need,
   * nothing is exported and a warning says which version is needed.
   */
  clusterVersion?: () => Promise<string | undefined>;
  /** The agent's uid (process.getuid() by default), for the ownership check at start. */
  uid?: number;
  /** When the export runs as root for an agent user: the owner given to the file. */
  fileUid?: number;
  fileGid?: number;
  clock?: () => Date;
}

export interface ScheduleExport {
  /** Exports now (call it after every change of cluster_maintenance_config); resolves when written. */
  refresh(): Promise<Window[] | undefined>;
  /** Stops the periodic refresh; a refresh in progress finishes. */
  stop(): void;
  /** The result of the ownership check made at start (non-root agents), if something is wrong. */
  readonly problem: ScheduleProblem | undefined;
  /** Resolves once the check at start and the first export are done (failures are logged, not thrown). */
  readonly ready: Promise<void>;
}

/**
 * Keeps the exported schedule up to date: at start, every intervalMs, and on refresh(). Failures (the Auth
 * Service unreachable, a file that cannot be written) are logged once per distinct message and never stop the
 * agent; the previous file stays as it was.
 */
export function startScheduleExport(options: ScheduleExportOptions): ScheduleExport {
  const log = logger('upgrade-schedule');
  const clock = options.clock ?? (() => new Date());
  const intervalMs = options.intervalMs ?? DEFAULT_EXPORT_INTERVAL_MS;
  const count = options.count ?? DEFAULT_WINDOW_COUNT;
  let lastError: string | undefined;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let chain: Promise<unknown> = Promise.resolve();
  let problem: ScheduleProblem | undefined;

  const once = async (): Promise<Window[] | undefined> => {
    try {
      if (options.clusterVersion) {
        const version = await options.clusterVersion();
        const enrolled = checkClusterVersion(version);
        if (!enrolled.ok) {
          const message = `not enrolled in automatic upgrades: ${enrolled.reason}`;
          if (lastError !== message) log.warn({ needed: enrolled.needed }, message);
          lastError = message;
          return undefined;
        }
      }
      const config = await options.fetchConfig();
      const now = clock();
      const windows = config ? nextWindows(config, now, count) : [];
      if (options.dir !== undefined) await writeSchedule(options.dir, windows, { now, ...(options.fileUid === undefined ? {} : { uid: options.fileUid }), ...(options.fileGid === undefined ? {} : { gid: options.fileGid }) });
      if (options.kubeStatePath !== undefined) await writeKubeSchedule(options.kubeStatePath, windows, now);
      if (options.writeKubeState !== undefined) await options.writeKubeState(JSON.stringify(formatKubeSchedule(windows, now)));
      recordNextWindow(options.dir !== undefined ? 'systemd' : 'kubernetes', windows[0]?.start);
      if (lastError !== undefined) log.info('maintenance schedule exported again');
      lastError = undefined;
      log.debug({ windows: windows.length, first: windows[0] ? isoSeconds(windows[0].start) : null }, 'maintenance schedule exported');
      return windows;
    } catch (err) {
      const e = toGatewayError(err);
      const message = `cannot export the maintenance schedule: ${e.message}`;
      if (lastError !== message) log.warn({ code: e.code }, message);
      lastError = message;
      return undefined;
    }
  };

  const refresh = (): Promise<Window[] | undefined> => {
    const next = chain.then(once, once);
    chain = next;
    return next;
  };

  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => {
      void refresh().finally(schedule);
    }, intervalMs);
    timer.unref?.();
  };

  const ready = (async () => {
    if (options.dir !== undefined) {
      problem = await checkScheduleFile(options.dir, options.uid === undefined ? {} : { uid: options.uid });
      if (problem) log.warn({ path: problem.path, fix: problem.fix }, `${problem.problem}; fix it with: ${problem.fix}`);
    }
    await refresh();
    schedule();
  })();

  return {
    refresh,
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
    },
    get problem() {
      return problem;
    },
    ready,
  };
}
