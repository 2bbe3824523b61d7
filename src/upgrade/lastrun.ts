/**
 * The upgrader's last run, kept for the agent's metrics (gateway_agent_upgrade_*): gateway-upgrade run writes it
 * at the end of every run into its directory (/etc/gateway-upgrade.d/last-run), and the agent reads it at each
 * scrape of /metrics. One small JSON object:
 *
 *   {"version":"v1","at":1767578400,"result":"failed","code":"GW_ERR_UPGRADE_HEALTH","current":"17.0.0","target":"17.1.0"}
 *
 * result is up-to-date, no-version (the version server advertises none), waiting, upgraded or failed (then code is
 * the error's stable code); current and target are the versions the run compared (absent when it failed before it knew them);
 * rollout_id and reason are a managed rollout's instruction's, when one decided the run. The reader is bounded (at most
 * LAST_RUN_MAX_BYTES read) and strict: a file it cannot read, not a regular file, too large or not this shape is no last run, never a
 * guess (the metric then says unknown).
 */
import { closeSync, constants, existsSync, fstatSync, openSync, readSync } from 'node:fs';
import { join } from 'node:path';
import { isErrorCode, toGatewayError } from '../errors.js';
import { PUBLIC_DIR_MODE, PUBLIC_FILE_MODE, writeFileAtomic } from '../fsutil.js';

export const LAST_RUN_FILE = 'last-run';
export const LAST_RUN_MAX_BYTES = 4096;
const RESULTS = ['up-to-date', 'no-version', 'waiting', 'upgraded', 'failed'] as const;
const VERSION = /^[0-9A-Za-z.+-]{1,64}$/;

export interface LastRun {
  /** Unix seconds. */
  at: number;
  result: (typeof RESULTS)[number];
  code?: string;
  current?: string;
  target?: string;
  /** A managed rollout's instruction decided the run: its id and reason (at most LAST_RUN_REASON_MAX characters). */
  rollout_id?: string;
  reason?: string;
}
export const LAST_RUN_REASON_MAX = 512;
const ROLLOUT_ID = /^[\x21-\x7e]{1,128}$/;

export function formatLastRun(run: LastRun): string {
  return `${JSON.stringify({ version: 'v1', ...run })}\n`;
}

/** The last run in text, or undefined when it is not one. */
export function parseLastRun(text: string): LastRun | undefined {
  if (text.length > LAST_RUN_MAX_BYTES) return undefined;
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(text) as Record<string, unknown>;
  } catch {
    return undefined;
  }
  if (!o || typeof o !== 'object' || o.version !== 'v1') return undefined;
  if (typeof o.at !== 'number' || !Number.isFinite(o.at) || o.at < 0) return undefined;
  if (!RESULTS.includes(o.result as LastRun['result'])) return undefined;
  const run: LastRun = { at: Math.floor(o.at), result: o.result as LastRun['result'] };
  if (o.code !== undefined) {
    if (!isErrorCode(o.code)) return undefined;
    run.code = o.code;
  }
  for (const k of ['current', 'target'] as const) {
    if (o[k] === undefined) continue;
    if (typeof o[k] !== 'string' || !VERSION.test(o[k])) return undefined;
    run[k] = o[k];
  }
  if (o.rollout_id !== undefined) {
    if (typeof o.rollout_id !== 'string' || !ROLLOUT_ID.test(o.rollout_id)) return undefined;
    run.rollout_id = o.rollout_id;
  }
  if (o.reason !== undefined) {
    if (typeof o.reason !== 'string' || o.reason.length > LAST_RUN_REASON_MAX || /[\x00-\x1f\x7f]/.test(o.reason)) return undefined;
    run.reason = o.reason;
  }
  return run;
}

export function writeLastRun(dir: string, run: LastRun): void {
  writeFileAtomic(join(dir, LAST_RUN_FILE), formatLastRun(run), { mode: PUBLIC_FILE_MODE, dirMode: PUBLIC_DIR_MODE });
}

/** The last run recorded in dir, reading at most LAST_RUN_MAX_BYTES + 1 bytes; undefined when there is none. */
export function readLastRun(dir: string): LastRun | undefined {
  let fd: number | undefined;
  try {
    // Non-blocking, and only a regular file: a FIFO put there would otherwise hold the scrape (and the agent) forever.
    fd = openSync(join(dir, LAST_RUN_FILE), constants.O_RDONLY | constants.O_NONBLOCK);
    if (!fstatSync(fd).isFile()) return undefined;
    const buf = Buffer.alloc(LAST_RUN_MAX_BYTES + 1);
    const n = readSync(fd, buf, 0, buf.length, 0);
    return parseLastRun(buf.subarray(0, n).toString('utf8'));
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/**
 * Runs one upgrade (run is told how to report the versions it compares) and records its result in dir when that
 * directory exists (the upgrader is enrolled). The record is for the metrics: failing to write it (a read-only
 * directory) changes neither the run's result nor its error.
 */
export async function recordingLastRun<R extends Exclude<LastRun['result'], 'failed'>>(
  dir: string,
  run: (onVersions: (current: string, target: string) => void, onRollout: (rolloutId: string | undefined, reason: string) => void) => Promise<R>,
  now: () => number = Date.now,
): Promise<R> {
  const versions: { current?: string; target?: string; rollout_id?: string; reason?: string } = {};
  const record = (r: Pick<LastRun, 'result' | 'code'>) => {
    if (!existsSync(dir)) return;
    try {
      writeLastRun(dir, { at: Math.floor(now() / 1000), ...r, ...versions });
    } catch {
      // best effort: see above
    }
  };
  try {
    const result = await run(
      (current, target) => Object.assign(versions, { current, target }),
      (rolloutId, reason) => Object.assign(versions, { ...(rolloutId ? { rollout_id: rolloutId } : {}), reason: reason.slice(0, LAST_RUN_REASON_MAX) }),
    );
    record({ result });
    return result;
  } catch (err) {
    record({ result: 'failed', code: toGatewayError(err).code });
    throw err;
  }
}
