/**
 * Restarts that keep sessions (docs/upgrades.md, "Restarts that keep sessions"): a running agent hands over to a
 * successor process and drains, instead of being stopped and started again.
 *
 *   ask        SIGUSR2 to the daemon (gateway-upgrade's default restart: `systemctl kill --signal=SIGUSR2
 *              --kill-whom=main gateway`; SIGHUP stays the configuration reload). One at a time: a second ask while one runs, or while the process drains, is refused with
 *              GW_ERR_HANDOVER_BUSY in the log (never two successors).
 *   successor  the command as installed now (the bin wrapper that started this process, GATEWAY_LAUNCHER, with
 *              this process's arguments: after an upgrade, the new version; without a wrapper, process.execPath,
 *              its flags and this process's arguments), the same environment plus GATEWAY_HANDOVER_FROM=<this pid>, and a
 *              readiness pipe on its fd 3. It takes the data directory's lock and the pid file from that pid
 *              (src/reload.ts takeFrom: only from its parent), and its tunnels' first hellos drain this process's
 *              tunnels on each Proxy for gateway.drain_limit (src/agent/pool.ts takeOver). It writes "ready" to
 *              the pipe once every tunnel of its pool is welcomed.
 *   meanwhile  this process holds its tunnels (they serve; one that closes is not dialled again: a redial would
 *              cut the successor's).
 *   ready      this process drains: new dials refused (GW_ERR_AGENT_DRAINING), the sessions in flight (SSH,
 *              database, app, Kubernetes upgrades: each one tunnel stream) go on until they end or the drain
 *              limit (then closed, GW_ERR_DRAIN_LIMIT in the log), then it exits.
 *   failed     the successor exits, closes the pipe without "ready", or is not ready by the deadline: it is
 *              killed, this process releases its tunnels and keeps serving, and logs GW_ERR_HANDOVER_FAILED with
 *              why (gateway-upgrade's health wait then fails and rolls back).
 *
 * The pipe is read by hand: it carries one word, and its end (EOF) is the successor's failure. SIGTERM drains the
 * same way without a successor (Kubernetes' pod replacement, systemctl stop); a second SIGTERM exits at once.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, writeSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { GatewayError, toGatewayError } from './errors.js';

export const HANDOVER_FROM_ENV = 'GATEWAY_HANDOVER_FROM';
/** The successor's readiness pipe (its fd 3). */
export const HANDOVER_FD = 3;
/** How long a successor may take to have every tunnel welcomed: below gateway-upgrade's health wait (60 s by default), so that a hand-over that fails has ended before the upgrader rolls back. */
export const HANDOVER_READY_TIMEOUT_MS = 45_000;
/** The most bytes read from a successor's pipe: it says "ready\n" and nothing else. */
const READY_LINE_MAX = 64;

/** The successor's side: the process it takes over from, and how it says it is ready. */
export interface Predecessor {
  pid: number;
  /** Writes "ready" to the pipe and closes it; once. */
  ready(): void;
}

/**
 * The predecessor named by the environment, only when it is this process's parent (a variable left in an
 * environment, or set by hand, takes nothing over). Undefined otherwise.
 */
export function predecessorOf(env: Record<string, string | undefined>, ppid: number, fd = HANDOVER_FD): Predecessor | undefined {
  const text = env[HANDOVER_FROM_ENV];
  if (text === undefined || !/^\d{1,10}$/.test(text) || Number(text) !== ppid || ppid <= 1) return undefined;
  let said = false;
  return {
    pid: ppid,
    ready() {
      if (said) return;
      said = true;
      try {
        writeSync(fd, 'ready\n');
        closeSync(fd);
      } catch {
        // The predecessor is gone or gave up: nothing to tell.
      }
    },
  };
}

/** The path of the bin wrapper that started this process (the packages' wrappers export it: scripts/package/stage.mjs). */
export const LAUNCHER_ENV = 'GATEWAY_LAUNCHER';

/**
 * What a successor runs: the command as installed now. A packaged gateway is started by its bin wrapper, which
 * runs the Node.js and the dist/ of one app directory; a tarball install keeps one app directory per version, so
 * after an upgrade this process's execPath and script are still the old version's, and only the wrapper (rewritten
 * by the install) names the new one. The wrapper exports its own path: when it is there (absolute), the successor
 * is the wrapper with this process's arguments; otherwise (a development checkout, `node dist/cli/gateway.js`),
 * this process's own command. Pure: a launcher that is gone fails the spawn, which fails the hand-over.
 */
export function successorCommand(env: Record<string, string | undefined>, execPath: string, execArgv: readonly string[], argv: readonly string[]): { command: string; args: string[] } {
  const launcher = env[LAUNCHER_ENV];
  if (launcher !== undefined && launcher.startsWith('/')) return { command: launcher, args: argv.slice(2) };
  return { command: execPath, args: [...execArgv, ...argv.slice(1)] };
}

export interface SuccessorOptions {
  command?: string;
  args?: string[];
  env?: Record<string, string | undefined>;
  readyTimeoutMs?: number;
}

/**
 * Starts the successor and resolves with it once it said "ready"; rejects with GW_ERR_HANDOVER_FAILED (the
 * successor killed) when it exits, closes the pipe, says anything else, or is not ready within the deadline.
 */
export function startSuccessor(options: SuccessorOptions = {}): Promise<ChildProcess> {
  const chosen = successorCommand(options.env ?? process.env, process.execPath, process.execArgv, process.argv);
  const command = options.command ?? chosen.command;
  const args = options.args ?? (options.command === undefined ? chosen.args : [...process.execArgv, ...process.argv.slice(1)]);
  const env = { ...(options.env ?? process.env), [HANDOVER_FROM_ENV]: String(process.pid) };
  const timeoutMs = options.readyTimeoutMs ?? HANDOVER_READY_TIMEOUT_MS;
  return new Promise((resolve, reject) => {
    // Its own process group: a terminal's ^C or a signal to this process's group does not reach it.
    const child = spawn(command, args, { env, detached: true, stdio: ['ignore', 'inherit', 'inherit', 'pipe'] });
    let settled = false;
    const fail = (why: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      reject(new GatewayError('GW_ERR_HANDOVER_FAILED', `the successor (pid ${child.pid ?? 'none'}) did not become ready: ${why}; this process keeps serving`, { details: { pid: child.pid ?? null } }));
    };
    const timer = setTimeout(() => fail(`not ready within ${timeoutMs} ms`), timeoutMs);
    child.once('error', (err) => fail(`it could not be started (${toGatewayError(err).message})`));
    child.once('exit', (code, signal) => fail(`it exited (${signal ?? `code ${code}`})`));
    const pipe = child.stdio[HANDOVER_FD] as Readable;
    let said = '';
    pipe.on('data', (chunk: Buffer) => {
      said += chunk.toString('latin1');
      if (said.length > READY_LINE_MAX) return fail('its readiness pipe carried more than a word');
      if (said === 'ready\n') {
        settled = true;
        clearTimeout(timer);
        child.unref();
        pipe.destroy();
        resolve(child);
      }
    });
    pipe.once('end', () => fail('it closed its readiness pipe without saying ready'));
    pipe.on('error', () => undefined);
  });
}

export type HandoverState = 'serving' | 'handing-over' | 'draining';

/** What a hand-over does to the daemon, given by start.ts. */
export interface HandoverHooks {
  /** The agent's tunnels: held while the successor starts (hold(false) again when it failed). */
  hold(on: boolean): void;
  /** Before the successor starts: what it must bind (the diag listener) is let go; undo() when it failed. */
  release?(): Promise<{ undo(): Promise<void> }>;
  startSuccessor(): Promise<ChildProcess>;
}

/** The decision on an ask, with the reason a log line prints. */
export type HandoverOutcome = { ok: true; pid: number } | { ok: false; error: GatewayError };

/** One hand-over at a time (see the file comment). */
export class Handover {
  private current: HandoverState = 'serving';

  constructor(private readonly hooks: HandoverHooks) {}

  get state(): HandoverState {
    return this.current;
  }

  /** The process stops (SIGTERM, a finished hand-over): no hand-over from now on. */
  draining(): void {
    this.current = 'draining';
  }

  async handOver(): Promise<HandoverOutcome> {
    if (this.current !== 'serving') {
      const why = this.current === 'handing-over' ? 'a hand-over is already in progress' : 'this process is draining';
      return { ok: false, error: new GatewayError('GW_ERR_HANDOVER_BUSY', `hand-over refused: ${why}; one successor at a time`) };
    }
    this.current = 'handing-over';
    this.hooks.hold(true);
    let undo: (() => Promise<void>) | undefined;
    try {
      undo = (await this.hooks.release?.())?.undo;
      const child = await this.hooks.startSuccessor();
      this.current = 'draining';
      return { ok: true, pid: child.pid ?? 0 };
    } catch (err) {
      if (this.current === 'handing-over') {
        this.current = 'serving';
        this.hooks.hold(false);
        await undo?.().catch(() => undefined);
      }
      return { ok: false, error: toGatewayError(err) };
    }
  }
}
