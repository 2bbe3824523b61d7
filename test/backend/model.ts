/**
 * Model test: random sequences of operations run against a backend and against a plain Map with the semantics
 * of docs/backend.md written out again, independently. Every result (item, boolean, count, revision or error
 * code), every watch event and the final state must agree, also across close and reopen. The test files
 * (model.test.ts for SQLite, postgres-model.test.ts) run it with their harness; the PostgreSQL fault tests use
 * the Model to check what watchers saw across a server restart.
 */
import fc from 'fast-check';
import { expect } from 'vitest';
import type { Condition, Item, WatchEvent, WriteOp } from '../../src/backend/index.js';
import { settle, type BackendHarness, type TestBackend } from './harness.js';
import { ManualClock } from './helpers.js';

const byBytes = (a: string, b: string): number => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));

type Outcome = { ok: unknown } | { err: string };

export class ModelError extends Error {
  constructor(readonly code: string) {
    super(code);
  }
}

interface Stored {
  value: string;
  revision: number;
  expiresAt?: number;
}

export class Model {
  readonly items = new Map<string, Stored>();
  revision = 0;
  events: WatchEvent[] = [];
  constructor(private readonly clock: ManualClock) {}

  private item(key: string, s: Stored): Item {
    return s.expiresAt === undefined
      ? { key, value: s.value, revision: s.revision }
      : { key, value: s.value, revision: s.revision, expiresAt: s.expiresAt };
  }

  live(key: string): Stored | undefined {
    const s = this.items.get(key);
    return s !== undefined && (s.expiresAt === undefined || s.expiresAt > this.clock.now) ? s : undefined;
  }

  private liveKeys(prefix: string): string[] {
    return [...this.items.keys()].filter((k) => k.startsWith(prefix) && this.live(k)).sort(byBytes);
  }

  private store(key: string, value: string, revision: number, ttlMs: number | undefined): Item {
    const s: Stored = ttlMs === undefined ? { value, revision } : { value, revision, expiresAt: this.clock.now + ttlMs };
    this.items.set(key, s);
    this.events.push({ type: 'put', item: this.item(key, s) });
    return this.item(key, s);
  }

  get(key: string): Item | undefined {
    const s = this.live(key);
    return s && this.item(key, s);
  }

  range(prefix: string, limit?: number): Item[] {
    return this.liveKeys(prefix)
      .slice(0, limit)
      .map((k) => this.item(k, this.items.get(k)!));
  }

  put(mode: 'put' | 'create' | 'update' | 'cas', key: string, value: string, ttlMs?: number, expected?: number): Item {
    const cur = this.live(key);
    if (mode === 'create' && cur) throw new ModelError('GW_ERR_BACKEND_EXISTS');
    if (mode === 'update' && !cur) throw new ModelError('GW_ERR_BACKEND_NOT_FOUND');
    if (mode === 'cas' && cur?.revision !== expected) throw new ModelError('GW_ERR_BACKEND_CONFLICT');
    return this.store(key, value, ++this.revision, ttlMs);
  }

  delete(key: string): boolean {
    if (!this.live(key)) return false;
    this.items.delete(key);
    this.events.push({ type: 'delete', key, revision: ++this.revision });
    return true;
  }

  deleteRange(prefix: string): number {
    if (prefix === '') throw new ModelError('GW_ERR_BACKEND_INVALID');
    const keys = this.liveKeys(prefix);
    if (keys.length === 0) return 0;
    this.revision++;
    for (const k of keys) {
      this.items.delete(k);
      this.events.push({ type: 'delete', key: k, revision: this.revision });
    }
    return keys.length;
  }

  atomicWrite(conditions: Condition[], ops: WriteOp[]): number {
    if (ops.some((o) => o.type === 'deleteRange' && o.prefix === '')) throw new ModelError('GW_ERR_BACKEND_INVALID');
    for (const c of conditions) {
      const cur = this.live(c.key);
      const holds = 'revision' in c ? cur?.revision === c.revision : c.exists === (cur !== undefined);
      if (!holds) throw new ModelError('GW_ERR_BACKEND_CONFLICT');
    }
    const next = this.revision + 1;
    let changed = false;
    for (const op of ops) {
      if (op.type === 'put') {
        this.store(op.key, op.value, next, op.ttlMs);
        changed = true;
      } else {
        const keys = op.type === 'delete' ? (this.live(op.key) ? [op.key] : []) : this.liveKeys(op.prefix);
        for (const k of keys) {
          this.items.delete(k);
          this.events.push({ type: 'delete', key: k, revision: next });
          changed = true;
        }
      }
    }
    if (changed) this.revision = next;
    return this.revision;
  }

  sweep(): number {
    const expired = [...this.items.keys()].filter((k) => !this.live(k)).sort(byBytes);
    if (expired.length === 0) return 0;
    this.revision++;
    for (const k of expired) {
      this.items.delete(k);
      this.events.push({ type: 'delete', key: k, revision: this.revision });
    }
    return expired.length;
  }
}

// --- operations --------------------------------------------------------------------------------------------------

// Edges of the key range: LIKE wildcards, the surrogate gap (U+D7FF | U+E000), the BMP's end, the last code point.
const KEYS = ['/a', '/a/', '/a/b', '/a/c', '/a%', '/a_', '/ab', '/é', '/😀', '/\uD7FFx', '/\uE000', '/\uFFFF', '/\u{10FFFF}', '/\u{10FFFF}z', '/b'];
const PREFIXES = ['', '/', '/a', '/a/', '/a%', '/a_', '/\uD7FF', '/\uFFFF', '/\u{10FFFF}', '/😀', '/é', '/z'];

const key = fc.constantFrom(...KEYS);
const prefix = fc.constantFrom(...PREFIXES);
const value = fc.json({ maxDepth: 1 });
const ttl = fc.option(fc.integer({ min: 1, max: 50 }), { nil: undefined });
const revision = fc.oneof(fc.constant('current' as const), fc.integer({ min: 0, max: 40 }));

const condition = fc.record({ key, kind: fc.constantFrom('exists', 'absent', 'revision'), revision });
const writeOp = fc.oneof(
  fc.record({ type: fc.constant('put' as const), key, value, ttl }),
  fc.record({ type: fc.constant('delete' as const), key }),
  fc.record({ type: fc.constant('deleteRange' as const), prefix }),
);

export const op = fc.oneof(
  fc.record({ t: fc.constantFrom('put' as const, 'create' as const, 'update' as const), key, value, ttl }),
  fc.record({ t: fc.constant('cas' as const), key, value, ttl, revision }),
  fc.record({ t: fc.constant('delete' as const), key }),
  fc.record({ t: fc.constant('deleteRange' as const), prefix }),
  fc.record({
    t: fc.constant('atomic' as const),
    conditions: fc.array(condition, { maxLength: 3 }),
    ops: fc.array(writeOp, { maxLength: 4 }),
  }),
  fc.record({ t: fc.constant('get' as const), key }),
  fc.record({ t: fc.constant('range' as const), prefix, limit: fc.option(fc.integer({ min: 0, max: 4 }), { nil: undefined }) }),
  fc.record({ t: fc.constant('advance' as const), ms: fc.integer({ min: 1, max: 40 }) }),
  fc.record({ t: fc.constant('sweep' as const) }),
  fc.record({ t: fc.constant('reopen' as const) }),
);
export type Op = typeof op extends fc.Arbitrary<infer T> ? T : never;

export async function outcome(run: () => unknown): Promise<Outcome> {
  try {
    return { ok: await run() };
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    if (typeof code !== 'string') throw err;
    return { err: code };
  }
}

function ttlOpt(ttlMs: number | undefined): { ttlMs?: number } {
  return ttlMs === undefined ? {} : { ttlMs };
}

export async function runSequence(h: BackendHarness, ops: Op[]): Promise<void> {
  const location = await h.location();
  const clock = new ManualClock();
  const model = new Model(clock);
  const seen: WatchEvent[] = [];
  const seenUnderA: WatchEvent[] = [];
  const openOne = async (): Promise<TestBackend> => {
    const b = await h.open(location, { clock: clock.read });
    b.watch('', (e) => seen.push(e));
    b.watch('/a/', (e) => seenUnderA.push(e));
    return b;
  };
  let b = await openOne();
  try {
    for (const o of ops) {
      const resolve = (r: number | 'current', k: string): number => (r === 'current' ? (model.live(k)?.revision ?? 0) : r);
      let got: Outcome;
      let want: Outcome;
      switch (o.t) {
        case 'put':
        case 'create':
        case 'update':
          got = await outcome(() => b[o.t](o.key, o.value, ttlOpt(o.ttl)));
          want = await outcome(() => model.put(o.t, o.key, o.value, o.ttl));
          break;
        case 'cas': {
          const expected = resolve(o.revision, o.key);
          got = await outcome(() => b.compareAndSwap(o.key, expected, o.value, ttlOpt(o.ttl)));
          want = await outcome(() => model.put('cas', o.key, o.value, o.ttl, expected));
          break;
        }
        case 'delete':
          got = await outcome(() => b.delete(o.key));
          want = await outcome(() => model.delete(o.key));
          break;
        case 'deleteRange':
          got = await outcome(() => b.deleteRange(o.prefix));
          want = await outcome(() => model.deleteRange(o.prefix));
          break;
        case 'atomic': {
          const conditions: Condition[] = o.conditions.map((c) =>
            c.kind === 'revision' ? { key: c.key, revision: resolve(c.revision, c.key) } : { key: c.key, exists: c.kind === 'exists' },
          );
          const writeOps: WriteOp[] = o.ops.map((w) =>
            w.type === 'put' ? { type: 'put', key: w.key, value: w.value, ...ttlOpt(w.ttl) } : w,
          );
          got = await outcome(() => b.atomicWrite(conditions, writeOps));
          want = await outcome(() => model.atomicWrite(conditions, writeOps));
          break;
        }
        case 'get':
          got = await outcome(() => b.get(o.key));
          want = await outcome(() => model.get(o.key));
          break;
        case 'range':
          got = await outcome(() => b.range(o.prefix, o.limit === undefined ? {} : { limit: o.limit }));
          want = await outcome(() => model.range(o.prefix, o.limit));
          break;
        case 'advance':
          clock.advance(o.ms);
          continue;
        case 'sweep':
          got = await outcome(() => b.sweepExpired());
          want = await outcome(() => model.sweep());
          break;
        case 'reopen':
          await b.close();
          b = await openOne();
          continue;
      }
      expect(got, JSON.stringify(o)).toStrictEqual(want);
      await settle(b);
      expect(seen).toStrictEqual(model.events);
    }
    expect(seenUnderA).toStrictEqual(
      model.events.filter((e) => (e.type === 'put' ? e.item.key : e.key).startsWith('/a/')),
    );
    // Final state, including items that expired but were not swept yet, straight from the storage.
    await b.close();
    b = await openOne();
    expect(await b.range('')).toStrictEqual(model.range(''));
    const next = await b.put('/final', '0');
    expect(next.revision).toBe(model.revision + 1);
  } finally {
    await b.close();
  }
}

