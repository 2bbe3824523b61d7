/**
 * The one backoff of the gateway: how long a retry loop waits after a failure. Every caller (the agent's tunnel,
 * the remote-auth event stream, the PostgreSQL change feed, host certificate renewal) writes its policy where it
 * builds its Backoff, so the numbers are read where they are used; docs/retries.md lists them side by side.
 *
 *   sequence  the ceiling of the n-th delay (0-based) is min(maxMs, firstMs * 2^n): doubling, capped.
 *   jitter    'equal': the delay is drawn in [ceiling/2, ceiling]; 'none': the delay is the ceiling.
 *             Equal jitter, not full ([0, ceiling]) nor decorrelated: many agents that lost the same Proxy are
 *             spread over half of each step, yet none comes back at once (full jitter lets a retry follow the
 *             failure by a few ms, which a restarting server only pays for), and the n-th delay stays inside a
 *             known window (decorrelated jitter makes it depend on the previous draw, so the cap and the
 *             sequence can no longer be read from the policy). Jitter applies at the cap too.
 *   reset     up() says the connection succeeded. With resetAfterMs 0 the sequence starts again at the first
 *             delay right there; with resetAfterMs > 0 only if the connection stayed up that long (judged at
 *             the next failure), so a peer that accepts and drops at once does not earn a fast retry each time.
 *   stop      stop() cancels the pending retry; after it schedule() does nothing and wait() answers false,
 *             until resume().
 *
 * The clock, the timers and the randomness are injected (BackoffDeps), so tests run the sequence without
 * waiting and without asserting a timing. One pending retry at a time: schedule() replaces the one before.
 */
import { GatewayError } from './errors.js';

export interface BackoffPolicy {
  /** The ceiling of the first delay (ms). */
  firstMs: number;
  /** The ceiling of every delay (ms). */
  maxMs: number;
  jitter: 'equal' | 'none';
  /** After up(), how long the connection must have stayed up for the next failure to start again at firstMs. */
  resetAfterMs?: number;
}

export interface BackoffDeps {
  /** In [0, 1); default Math.random. */
  random?: () => number;
  /** Milliseconds; default Date.now. */
  now?: () => number;
  setTimer?: (fn: () => void, ms: number) => unknown;
  clearTimer?: (handle: unknown) => void;
  /** Default timers only: the pending retry does not keep the process alive. */
  unref?: boolean;
}

/** Doublings beyond this change nothing (2^40 ms is decades); it keeps firstMs * 2^n finite. */
const MAX_EXPONENT = 40;

export class Backoff {
  private failures = 0;
  private upSince: number | undefined;
  private timer: unknown;
  private pending = false;
  private stopped = false;
  private readonly random: () => number;
  private readonly now: () => number;
  private readonly setTimer: (fn: () => void, ms: number) => unknown;
  private readonly clearTimer: (handle: unknown) => void;
  /** The wait() in progress, answered false when cancelled. */
  private readonly waiters = new Set<(ok: boolean) => void>();

  constructor(
    readonly policy: Readonly<BackoffPolicy>,
    deps: BackoffDeps = {},
  ) {
    const { firstMs, maxMs, resetAfterMs = 0 } = policy;
    if (!(firstMs > 0) || !(maxMs >= firstMs) || !(resetAfterMs >= 0) || !Number.isFinite(maxMs)) {
      throw new GatewayError('GW_ERR_INTERNAL', `backoff policy: first ${firstMs} ms, max ${maxMs} ms, reset after ${resetAfterMs} ms`, {
        hint: 'A backoff needs 0 < firstMs <= maxMs (finite) and resetAfterMs >= 0.',
      });
    }
    this.random = deps.random ?? Math.random;
    this.now = deps.now ?? Date.now;
    const unref = deps.unref ?? false;
    this.setTimer =
      deps.setTimer ??
      ((fn, ms) => {
        const t = setTimeout(fn, ms);
        if (unref) t.unref();
        return t;
      });
    this.clearTimer = deps.clearTimer ?? ((h) => clearTimeout(h as NodeJS.Timeout));
  }

  /** Failures since the last reset: the n of the next delay. */
  get attempts(): number {
    return this.failures;
  }

  /** The delay after one more failure (ms, an integer), and counts that failure. */
  next(): number {
    if (this.upSince !== undefined) {
      if (this.now() - this.upSince >= (this.policy.resetAfterMs ?? 0)) this.failures = 0;
      this.upSince = undefined;
    }
    const ceiling = Math.min(this.policy.maxMs, this.policy.firstMs * 2 ** Math.min(this.failures, MAX_EXPONENT));
    this.failures++;
    if (this.policy.jitter === 'none') return Math.round(ceiling);
    const drawn = this.random();
    const r = drawn >= 0 && drawn <= 1 ? drawn : drawn > 1 ? 1 : 0; // NaN and below 0: 0
    return Math.round(ceiling / 2 + (r * ceiling) / 2);
  }

  /** The connection (or the call) succeeded: see `reset` in the file comment. */
  up(): void {
    if ((this.policy.resetAfterMs ?? 0) === 0) this.reset();
    else this.upSince = this.now();
  }

  /** Starts the sequence again at the first delay. */
  reset(): void {
    this.failures = 0;
    this.upSince = undefined;
  }

  /**
   * Runs fn after `delayMs` (default: next()) unless stopped or replaced first; answers the delay, or undefined
   * once stopped. A caller that retries at once passes 0 (the sequence does not advance).
   */
  schedule(fn: () => void, delayMs?: number): number | undefined {
    if (this.stopped) return undefined;
    const delay = delayMs ?? this.next();
    this.cancel();
    this.pending = true;
    this.timer = this.setTimer(() => {
      this.pending = false;
      if (!this.stopped) fn();
    }, delay);
    return delay;
  }

  /** Waits `delayMs` (default: next()): true, or false when stopped or cancelled before (or already). */
  wait(delayMs?: number): Promise<boolean> {
    if (this.stopped) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      this.schedule(() => {
        this.waiters.delete(resolve);
        resolve(true);
      }, delayMs ?? this.next());
      this.waiters.add(resolve);
    });
  }

  /** Cancels the pending retry, if any (a wait() in progress answers false). */
  cancel(): void {
    if (this.pending) this.clearTimer(this.timer);
    this.pending = false;
    this.timer = undefined;
    for (const resolve of this.waiters) resolve(false);
    this.waiters.clear();
  }

  /** No more retries: the pending one is cancelled, later ones are not scheduled. */
  stop(): void {
    this.stopped = true;
    this.cancel();
  }

  /** Retries may be scheduled again (a stopped tunnel started again); the sequence goes on where it was. */
  resume(): void {
    this.stopped = false;
  }

  get isStopped(): boolean {
    return this.stopped;
  }
}
