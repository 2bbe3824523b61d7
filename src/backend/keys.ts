/**
 * Key and argument rules shared by every backend implementation: validation, code point ordering and the
 * key range [prefix, successor(prefix)) that selects exactly the keys starting with prefix (no LIKE, so '%'
 * and '_' in keys are plain characters, and an index range scan serves it).
 */
import { GatewayError } from '../errors.js';
import type { Condition, WatchEvent, WatchOptions, WriteOp } from './types.js';

export const MAX_KEY_BYTES = 1024;

const LONE_SURROGATE = /\p{Surrogate}/u;

function invalid(message: string, details: Record<string, unknown> = {}): GatewayError {
  return new GatewayError('GW_ERR_BACKEND_INVALID', message, { details });
}

/** A string a backend can store and give back unchanged, in SQLite as in PostgreSQL (no NUL, no lone surrogate). */
function checkText(what: string, text: unknown): asserts text is string {
  if (typeof text !== 'string') throw invalid(`backend ${what} must be a string, got ${typeof text}`);
  if (text.includes('\0')) throw invalid(`backend ${what} must not contain a NUL character`);
  if (LONE_SURROGATE.test(text)) throw invalid(`backend ${what} must not contain an unpaired UTF-16 surrogate`);
}

export function checkKey(key: unknown): asserts key is string {
  checkText('key', key);
  if (key.length === 0) throw invalid('backend key must not be empty');
  const bytes = Buffer.byteLength(key, 'utf8');
  if (bytes > MAX_KEY_BYTES) {
    throw invalid(`backend key is ${bytes} bytes long, more than the ${MAX_KEY_BYTES} allowed`, {
      key: `${key.slice(0, 64)}…`,
    });
  }
}

/** A prefix for range/watch ('' allowed: everything) or, with nonEmpty, for deleteRange. */
export function checkPrefix(prefix: unknown, nonEmpty = false): asserts prefix is string {
  checkText('prefix', prefix);
  if (nonEmpty && prefix.length === 0) {
    throw invalid('deleteRange needs a non-empty prefix (deleting the whole cluster state is refused)');
  }
}

export function checkWatch(prefix: unknown, onEvent: unknown, options: unknown): asserts onEvent is (event: WatchEvent) => void {
  checkPrefix(prefix);
  if (typeof onEvent !== 'function') throw invalid('watch needs a listener function');
  const onError = (options as WatchOptions | undefined)?.onError;
  if (onError !== undefined && typeof onError !== 'function') throw invalid('watch: onError must be a function');
}

export function checkValue(value: unknown): asserts value is string {
  checkText('value', value);
}

/** The expiry for a write at now, or undefined for a permanent item. */
export function expiryOf(ttlMs: unknown, now: number): number | undefined {
  if (ttlMs === undefined) return undefined;
  if (typeof ttlMs !== 'number' || !Number.isFinite(ttlMs) || ttlMs <= 0) {
    throw invalid(`backend ttlMs must be a positive number of ms, got ${String(ttlMs)}`);
  }
  // Whole ms, and always after now, however small the TTL or large the clock value.
  return Math.ceil(now) + Math.ceil(ttlMs);
}

export function checkRevision(revision: unknown): asserts revision is number {
  if (typeof revision !== 'number' || !Number.isSafeInteger(revision) || revision < 0) {
    throw invalid(`backend revision must be a non-negative integer, got ${String(revision)}`);
  }
}

export function checkLimit(limit: unknown): asserts limit is number | undefined {
  if (limit === undefined) return;
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 0) {
    throw invalid(`backend range limit must be a non-negative integer, got ${String(limit)}`);
  }
}

export function checkCondition(c: unknown): asserts c is Condition {
  if (typeof c !== 'object' || c === null) throw invalid('atomicWrite condition must be an object');
  const cond = c as Record<string, unknown>;
  checkKey(cond.key);
  if ('revision' in cond) checkRevision(cond.revision);
  else if (cond.exists !== true && cond.exists !== false) {
    throw invalid('atomicWrite condition needs either revision or exists: true/false', { key: cond.key });
  }
}

export function checkWriteOp(o: unknown, now: number): asserts o is WriteOp {
  if (typeof o !== 'object' || o === null) throw invalid('atomicWrite op must be an object');
  const op = o as Record<string, unknown>;
  switch (op.type) {
    case 'put':
      checkKey(op.key);
      checkValue(op.value);
      expiryOf(op.ttlMs, now);
      return;
    case 'delete':
      checkKey(op.key);
      return;
    case 'deleteRange':
      checkPrefix(op.prefix, true);
      return;
    default:
      throw invalid(`atomicWrite op type must be put, delete or deleteRange, got ${String(op.type)}`);
  }
}

/**
 * Compares well-formed strings by Unicode code point, which is the order of their UTF-8 bytes (SQLite's BINARY
 * collation, PostgreSQL's "C"). JavaScript's own < compares UTF-16 code units, which puts U+10000..U+10FFFF
 * before U+E000..U+FFFF. The fix-up moves surrogates above every other code unit (the ICU trick).
 */
export function compareKeys(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x === y) continue;
    if (x >= 0xd800 && y >= 0xd800) {
      x = x >= 0xe000 ? x - 0x800 : x + 0x2000;
      y = y >= 0xe000 ? y - 0x800 : y + 0x2000;
    }
    return x < y ? -1 : 1;
  }
  return a.length === b.length ? 0 : a.length < b.length ? -1 : 1;
}

/**
 * The least string greater than every string that starts with prefix (in code point order), or undefined when
 * there is none ('' or a prefix of only U+10FFFF). Keys k with prefix <= k < successor are exactly the keys that
 * start with prefix.
 */
export function prefixSuccessor(prefix: string): string | undefined {
  const cps = Array.from(prefix);
  while (cps.length > 0) {
    const last = cps.pop()!.codePointAt(0)!;
    if (last < 0x10ffff) {
      const next = last + 1 === 0xd800 ? 0xe000 : last + 1;
      return cps.join('') + String.fromCodePoint(next);
    }
  }
  return undefined;
}
