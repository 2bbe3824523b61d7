/**
 * Failed-attempt limiter (logins per user and source, joins per source), atomic under concurrency.
 *
 * An attempt first *reserves* a slot, synchronously, before any asynchronous work (the scrypt password check, the
 * token lookup): a reservation counts like a failure from that moment. When the attempt fails the slot stays a
 * failure; when it succeeds the slot is released and the settled failures of that key are forgiven. So at most
 * `maxFailures` attempts per key are ever in flight or failed within `windowMs`: 200 parallel wrong passwords
 * give at most `maxFailures` password checks, and the rest are refused at once, the right password included.
 *
 * A key is free again when its oldest slot leaves the window. The table is bounded (oldest keys are evicted
 * first) so a flood of made-up keys cannot grow memory without end.
 */
import { GatewayError } from '../errors.js';
import { sourceKey } from '../net/source.js';
import type { Logger } from '../log.js';
import { recordRateLimited } from '../metrics/ratelimit.js';

export interface RateLimiterOptions {
  maxFailures?: number;
  windowMs?: number;
  maxKeys?: number;
  clock?: () => number;
}

interface Slot {
  at: number;
  /** true while the attempt that reserved it is still running. */
  pending: boolean;
}

/** A reserved attempt: settle it exactly once (later calls do nothing). */
export interface Reservation {
  /** The attempt failed: the slot stays, as a failure, until it leaves the window. */
  fail(): void;
  /** The attempt succeeded: the slot is released and the key's settled failures are forgiven. */
  succeed(): void;
  /** The attempt ended without saying anything about the secret (a bad request): the slot is released. */
  release(): void;
}

export type ReserveResult = { ok: true; reservation: Reservation } | { ok: false; retryAfterMs: number; inFlight?: true };

export class AttemptLimiter {
  private readonly slots = new Map<string, Slot[]>();
  readonly maxFailures: number;
  readonly windowMs: number;
  private readonly maxKeys: number;
  private readonly clock: () => number;

  constructor(options: RateLimiterOptions = {}) {
    this.maxFailures = options.maxFailures ?? 5;
    this.windowMs = options.windowMs ?? 5 * 60_000;
    this.maxKeys = options.maxKeys ?? 100_000;
    this.clock = options.clock ?? Date.now;
  }

  private recent(key: string): Slot[] {
    const now = this.clock();
    const list = (this.slots.get(key) ?? []).filter((s) => s.pending || now - s.at < this.windowMs);
    if (list.length === 0) this.slots.delete(key);
    else this.slots.set(key, list);
    return list;
  }

  /** Reserves an attempt for key, or says how long to wait. Synchronous: the check and the count are one step. */
  reserve(key: string): ReserveResult {
    const list = this.recent(key);
    if (list.length >= this.maxFailures) {
      const settled = list.filter((s) => !s.pending).map((s) => s.at);
      // Only attempts in flight: they settle within moments, so a short wait (not a whole window).
      if (settled.length === 0) return { ok: false, retryAfterMs: 1000, inFlight: true };
      return { ok: false, retryAfterMs: Math.max(1000, Math.min(...settled) + this.windowMs - this.clock()) };
    }
    const slot: Slot = { at: this.clock(), pending: true };
    list.push(slot);
    this.slots.delete(key); // re-insert: Map order is our eviction order
    this.slots.set(key, list);
    while (this.slots.size > this.maxKeys) this.slots.delete(this.slots.keys().next().value!);
    let settled = false;
    const settle = (action: 'fail' | 'succeed' | 'release') => {
      if (settled) return;
      settled = true;
      const current = this.slots.get(key);
      if (!current) return;
      if (action === 'fail') {
        slot.pending = false;
        slot.at = this.clock();
        return;
      }
      const kept = current.filter((s) => s !== slot && (action === 'release' || s.pending));
      if (kept.length === 0) this.slots.delete(key);
      else this.slots.set(key, kept);
    };
    return {
      ok: true,
      reservation: { fail: () => settle('fail'), succeed: () => settle('succeed'), release: () => settle('release') },
    };
  }
}

/** Logins: keyed by (user, source); the source as connection caps count it (an IPv6 address by its /64). */
export function loginKey(user: string, source: string): string {
  return `${user}\u0000${sourceKey(source)}`;
}

/** Joins: keyed by source, an IPv6 address by its /64 (a site is given a whole /64: one key per address would let it guess 2^64 times as often). */
export function joinKey(source: string): string {
  return sourceKey(source);
}

/** Reserves an attempt, or throws GW_ERR_AUTH_RATE_LIMITED (429) saying how long to wait. */
export function reserveOrRefuse(limiter: AttemptLimiter, key: string, what: 'login' | 'join', fields: Record<string, string>, log: Logger): Reservation {
  const reserved = limiter.reserve(key);
  if (reserved.ok) return reserved.reservation;
  const wait = Math.ceil(reserved.retryAfterMs / 1000);
  recordRateLimited(what);
  log.warn({ ...fields }, `${what} refused: too many ${reserved.inFlight ? 'attempts in flight' : 'failed attempts'}`);
  const why = reserved.inFlight ? `${limiter.maxFailures} ${what}s${what === 'login' ? ' for this user' : ''} from this address are in flight already` : `too many failed ${what}s${what === 'login' ? ' for this user' : ''} from this address`;
  throw new GatewayError('GW_ERR_AUTH_RATE_LIMITED', `${why}; try again in ${wait} s`, {
    hint:
      what === 'login'
        ? `At most ${limiter.maxFailures} wrong passwords per user and address in ${limiter.windowMs / 60_000} minutes; wait, then use the right password.`
        : `At most ${limiter.maxFailures} failed joins per address in ${limiter.windowMs / 60_000} minutes; wait, then use a valid token from 'gwctl tokens add'.`,
    details: { retryAfterMs: reserved.retryAfterMs },
  });
}
