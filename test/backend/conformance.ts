/**
 * The Backend contract (src/backend/types.ts, docs/backend.md), run against every implementation: each test
 * file calls describeConformance with its harness. Watch assertions first settle(): PostgreSQL delivers events
 * after the write's promise resolves, SQLite before.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { WatchEvent } from '../../src/backend/index.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger } from '../../src/log.js';
import { settle, type BackendHarness, type HarnessOptions, type TestBackend } from './harness.js';
import { codeOf, ManualClock, rejection } from './helpers.js';

const v = (x: unknown): string => JSON.stringify(x);

/** A backend on new, empty storage. */
type Fresh = (options?: HarnessOptions) => Promise<TestBackend>;

export function describeConformance(h: BackendHarness): void {
  const fresh: Fresh = async (options) => h.open(await h.location(), options);
  describeCrud(h, fresh);
  describeRange(h, fresh);
  describeAtomicWrite(h, fresh);
  describeAtomicRollback(h, fresh);
  describePersistence(h, fresh);
  describeClosed(h, fresh);
  describeTtl(h, fresh);
  describeWatch(h, fresh);
  describeWatchLifecycle(h, fresh);
}

function describeCrud(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: CRUD`, () => {
    it('puts, gets, replaces and deletes items, with revisions from one counter', async () => {
      const b = await fresh();
      expect(await b.get('/users/alice')).toBeUndefined();
      const a1 = await b.put('/users/alice', v({ n: 1 }));
      expect(a1).toEqual({ key: '/users/alice', value: '{"n":1}', revision: 1 });
      const bob = await b.put('/users/bob', v({ n: 2 }));
      expect(bob.revision).toBe(2);
      const a2 = await b.put('/users/alice', v({ n: 3 }));
      expect(a2.revision).toBe(3);
      expect(await b.get('/users/alice')).toEqual(a2);
      expect(await b.delete('/users/alice')).toBe(true);
      expect(await b.delete('/users/alice')).toBe(false);
      expect(await b.get('/users/alice')).toBeUndefined();
      // The delete took revision 4; a failed delete takes none.
      expect((await b.put('/x', '1')).revision).toBe(5);
    });

    it('stores values byte for byte', async () => {
      const b = await fresh();
      const value = '{ "b": 1,  "a": "é😀\\u0000" }\n';
      await b.put('/k', value);
      expect((await b.get('/k'))?.value).toBe(value);
    });

    it('create refuses an existing key, update refuses a missing one', async () => {
      const b = await fresh();
      const c = await b.create('/roles/admin', '1');
      expect(c.revision).toBe(1);
      const err = await rejection(b.create('/roles/admin', '2'));
      expect(err).toBeInstanceOf(GatewayError);
      expect(err.code).toBe('GW_ERR_BACKEND_EXISTS');
      expect(err.details.key).toBe('/roles/admin');
      expect(await codeOf(b.update('/roles/nobody', '1'))).toBe('GW_ERR_BACKEND_NOT_FOUND');
      const u = await b.update('/roles/admin', '3');
      expect(u).toEqual({ key: '/roles/admin', value: '3', revision: 2 });
      // Failed writes changed nothing, not even the revision.
      expect((await b.put('/z', '0')).revision).toBe(3);
    });

    it('compareAndSwap writes only at the expected revision', async () => {
      const b = await fresh();
      const item = await b.put('/tokens/t1', '1');
      const swapped = await b.compareAndSwap('/tokens/t1', item.revision, '2');
      expect(swapped.revision).toBe(2);
      const stale = await rejection(b.compareAndSwap('/tokens/t1', item.revision, '3'));
      expect(stale.code).toBe('GW_ERR_BACKEND_CONFLICT');
      expect(stale.details).toMatchObject({ key: '/tokens/t1', expectedRevision: 1, actualRevision: 2 });
      expect(await codeOf(b.compareAndSwap('/tokens/none', 0, '1'))).toBe('GW_ERR_BACKEND_CONFLICT');
      expect(await codeOf(b.compareAndSwap('/tokens/none', 2, '1'))).toBe('GW_ERR_BACKEND_CONFLICT');
      expect((await b.get('/tokens/t1'))?.value).toBe('2');
    });

    it('rejects invalid keys, values and options', async () => {
      const b = await fresh();
      const bad = [
        () => b.get(''),
        () => b.put('/a\0b', '1'),
        () => b.put('/a\uD800', '1'),
        () => b.put('/k', 'x\0'),
        () => b.put('/k', '\uDC00'),
        () => b.put('/' + 'x'.repeat(1024), '1'),
        () => b.put('/k', '1', { ttlMs: 0 }),
        () => b.put('/k', '1', { ttlMs: -5 }),
        () => b.put('/k', '1', { ttlMs: Number.NaN }),
        () => b.range('/', { limit: -1 }),
        () => b.range('/', { limit: 1.5 }),
        () => b.compareAndSwap('/k', 1.5, '1'),
        () => b.deleteRange(''),
        () => b.atomicWrite([{ key: '/k' } as never], []),
        () => b.atomicWrite([], [{ type: 'deleteRange', prefix: '' }]),
        () => b.atomicWrite([], [{ type: 'nope', key: '/k' } as never]),
        () => b.put(42 as never, '1'),
        () => b.put('/k', { a: 1 } as never),
      ];
      for (const call of bad) expect(await codeOf(call)).toBe('GW_ERR_BACKEND_INVALID');
      expect(() => b.watch('\uD800', () => {})).toThrowError(expect.objectContaining({ code: 'GW_ERR_BACKEND_INVALID' }));
      expect(await b.range('')).toEqual([]);
      // 1024 UTF-8 bytes is the limit: 512 two-byte characters fit, 1023 'x' plus 'é' does not.
      await b.put('é'.repeat(512), '1');
      expect(await codeOf(b.put('x'.repeat(1023) + 'é', '1'))).toBe('GW_ERR_BACKEND_INVALID');
    });
  });
}

function describeRange(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: range`, () => {
    it('lists live items under a prefix in key order, with a limit', async () => {
      const b = await fresh();
      for (const k of ['/users/carol', '/users/alice', '/usersx', '/users', '/users/bob', '/roles/a', '/users/alice/x']) {
        await b.put(k, v(k));
      }
      expect((await b.range('/users/')).map((i) => i.key)).toEqual([
        '/users/alice',
        '/users/alice/x',
        '/users/bob',
        '/users/carol',
      ]);
      expect((await b.range('/users/', { limit: 2 })).map((i) => i.key)).toEqual(['/users/alice', '/users/alice/x']);
      expect(await b.range('/users/', { limit: 0 })).toEqual([]);
      expect((await b.range('/users')).map((i) => i.key)).toEqual([
        '/users',
        '/users/alice',
        '/users/alice/x',
        '/users/bob',
        '/users/carol',
        '/usersx',
      ]);
      expect((await b.range('')).length).toBe(7);
      expect(await b.range('/nothing/')).toEqual([]);
    });

    it('treats % and _ as plain characters', async () => {
      const b = await fresh();
      for (const k of ['/a%/1', '/a%b', '/ab/1', '/a_/1', '/aX/1', '/a\\/1', '/a\\x']) await b.put(k, '1');
      expect((await b.range('/a%')).map((i) => i.key)).toEqual(['/a%/1', '/a%b']);
      expect((await b.range('/a%/')).map((i) => i.key)).toEqual(['/a%/1']);
      expect((await b.range('/a_')).map((i) => i.key)).toEqual(['/a_/1']);
      expect((await b.range('/a\\')).map((i) => i.key)).toEqual(['/a\\/1', '/a\\x']);
      expect(await b.deleteRange('/a_')).toBe(1);
      expect(await b.get('/aX/1')).toBeDefined();
    });

    it('orders and matches unicode keys by code point', async () => {
      const b = await fresh();
      const keys = ['/u/z', '/u/é', '/u/\uFFFF', '/u/😀', '/u/\u{10FFFF}', '/u/\u{10FFFF}x', '/u/日本', '/u/日', '/v'];
      for (const k of keys) await b.put(k, '1');
      // Code point order: U+FFFF sorts before U+1F600 (JavaScript's default sort would put the emoji first).
      expect((await b.range('/u/')).map((i) => i.key)).toEqual([
        '/u/z',
        '/u/é',
        '/u/日',
        '/u/日本',
        '/u/\uFFFF',
        '/u/😀',
        '/u/\u{10FFFF}',
        '/u/\u{10FFFF}x',
      ]);
      expect((await b.range('/u/日')).map((i) => i.key)).toEqual(['/u/日', '/u/日本']);
      expect((await b.range('/u/\u{10FFFF}')).map((i) => i.key)).toEqual(['/u/\u{10FFFF}', '/u/\u{10FFFF}x']);
      expect((await b.range('/u/\uD83D\uDE00')).map((i) => i.key)).toEqual(['/u/😀']);
    });

    it('deleteRange deletes the live items under the prefix only', async () => {
      const b = await fresh();
      for (const k of ['/nodes/a', '/nodes/b', '/nodesx', '/other']) await b.put(k, '1');
      expect(await b.deleteRange('/nodes/')).toBe(2);
      expect((await b.range('')).map((i) => i.key)).toEqual(['/nodesx', '/other']);
      expect(await b.deleteRange('/nodes/')).toBe(0);
      expect((await b.put('/n', '1')).revision).toBe(6); // 4 puts, one deleteRange, not the empty one
    });
  });
}

function describeAtomicWrite(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: atomicWrite`, () => {
    it('applies all ops with one revision when every condition holds', async () => {
      const b = await fresh();
      const alice = await b.put('/users/alice', '1');
      await b.put('/old/1', '1');
      await b.put('/old/2', '1');
      const rev = await b.atomicWrite(
        [
          { key: '/users/alice', revision: alice.revision },
          { key: '/users/bob', exists: false },
          { key: '/old/1', exists: true },
        ],
        [
          { type: 'put', key: '/users/bob', value: '2' },
          { type: 'put', key: '/users/alice', value: '3', ttlMs: 1000 },
          { type: 'deleteRange', prefix: '/old/' },
          { type: 'delete', key: '/absent' },
        ],
      );
      expect(rev).toBe(4);
      expect(await b.range('')).toEqual([
        { key: '/users/alice', value: '3', revision: 4, expiresAt: expect.any(Number) },
        { key: '/users/bob', value: '2', revision: 4 },
      ]);
    });

    it('changes nothing and notifies no watcher when a condition fails, naming the first failed one', async () => {
      const b = await fresh();
      await b.put('/a', '1');
      await b.put('/b', '1');
      const events: WatchEvent[] = [];
      b.watch('', (e) => events.push(e));
      const err = await rejection(
        b.atomicWrite(
          [
            { key: '/a', exists: true },
            { key: '/b', revision: 99 },
            { key: '/a', exists: false },
          ],
          [
            { type: 'put', key: '/c', value: '1' },
            { type: 'delete', key: '/a' },
            { type: 'deleteRange', prefix: '/b' },
          ],
        ),
      );
      expect(err.code).toBe('GW_ERR_BACKEND_CONFLICT');
      expect(err.details).toMatchObject({ key: '/b', condition: 1, actualRevision: 2 });
      await settle(b);
      expect(events).toEqual([]);
      expect((await b.range('')).map((i) => [i.key, i.revision])).toEqual([
        ['/a', 1],
        ['/b', 2],
      ]);
      expect((await b.put('/d', '1')).revision).toBe(3);
    });

    it('applies ops in order, so a later op sees an earlier one', async () => {
      const b = await fresh();
      const rev = await b.atomicWrite(
        [],
        [
          { type: 'put', key: '/k', value: '1' },
          { type: 'delete', key: '/k' },
          { type: 'put', key: '/j', value: '1' },
        ],
      );
      expect(rev).toBe(1);
      expect((await b.range('')).map((i) => i.key)).toEqual(['/j']);
    });

    it('returns the current revision when nothing changes', async () => {
      const b = await fresh();
      await b.put('/a', '1');
      expect(await b.atomicWrite([{ key: '/a', exists: true }], [])).toBe(1);
      expect(await b.atomicWrite([], [{ type: 'delete', key: '/none' }])).toBe(1);
    });
  });
}

function describePersistence(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: persistence`, () => {
    it('keeps items and the revision counter across close and reopen', async () => {
      const f = await h.location();
      const b1 = await h.open(f);
      await b1.put('/a', '1');
      await b1.put('/b', '2', { ttlMs: 3_600_000 });
      await b1.delete('/a'); // revision 3, and no item carries it
      await b1.close();
      const b2 = await h.open(f);
      expect(await b2.range('')).toEqual([{ key: '/b', value: '2', revision: 2, expiresAt: expect.any(Number) }]);
      expect((await b2.put('/c', '3')).revision).toBe(4);
      await b2.close();
      const b3 = await h.open(f);
      expect((await b3.put('/d', '4')).revision).toBe(5);
    });

    it('shares the revision counter between two backends on one storage', async () => {
      const f = await h.location();
      const one = await h.open(f);
      const two = await h.open(f);
      const revisions: number[] = [];
      for (let i = 0; i < 5; i++) {
        revisions.push((await one.put(`/one/${i}`, '1')).revision);
        revisions.push((await two.put(`/two/${i}`, '1')).revision);
      }
      expect(revisions).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      expect(await one.atomicWrite([{ key: '/two/4', revision: 10 }], [{ type: 'delete', key: '/two/4' }])).toBe(11);
      expect(await two.get('/two/4')).toBeUndefined();
      expect(await codeOf(two.create('/one/0', '1'))).toBe('GW_ERR_BACKEND_EXISTS');
    });
  });
}

function describeClosed(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: closed`, () => {
    it('refuses every operation after close, and close is idempotent', async () => {
      const b = await fresh();
      await b.put('/a', '1');
      await b.close();
      await b.close();
      const calls = [
        () => b.get('/a'),
        () => b.range('/'),
        () => b.put('/a', '1'),
        () => b.create('/b', '1'),
        () => b.update('/a', '1'),
        () => b.compareAndSwap('/a', 1, '1'),
        () => b.delete('/a'),
        () => b.deleteRange('/'),
        () => b.atomicWrite([], []),
        () => b.sweepExpired(),
      ];
      for (const call of calls) expect(await codeOf(call)).toBe('GW_ERR_BACKEND_CLOSED');
      expect(() => b.watch('/', () => {})).toThrowError(expect.objectContaining({ code: 'GW_ERR_BACKEND_CLOSED' }));
    });
  });
}

function describeTtl(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: TTL`, () => {
    it('hides an expired item at once from reads, conditions and writes; the sweep deletes it and emits delete', async () => {
      const clock = new ManualClock();
      const b = await fresh({ clock: clock.read });
      const t = await b.put('/tokens/t', '1', { ttlMs: 1000 });
      expect(t.expiresAt).toBe(clock.now + 1000);
      await b.put('/tokens/keep', '1');
      const events: WatchEvent[] = [];
      b.watch('/tokens/', (e) => events.push(e));

      clock.advance(999);
      expect(await b.get('/tokens/t')).toEqual(t);
      clock.advance(1); // now === expiresAt: expired
      expect(await b.get('/tokens/t')).toBeUndefined();
      expect((await b.range('/tokens/')).map((i) => i.key)).toEqual(['/tokens/keep']);
      expect(await codeOf(b.update('/tokens/t', '2'))).toBe('GW_ERR_BACKEND_NOT_FOUND');
      expect(await codeOf(b.compareAndSwap('/tokens/t', t.revision, '2'))).toBe('GW_ERR_BACKEND_CONFLICT');
      expect(await codeOf(b.atomicWrite([{ key: '/tokens/t', exists: true }], []))).toBe('GW_ERR_BACKEND_CONFLICT');
      expect(await codeOf(b.atomicWrite([{ key: '/tokens/t', revision: t.revision }], []))).toBe('GW_ERR_BACKEND_CONFLICT');
      expect(await b.atomicWrite([{ key: '/tokens/t', exists: false }], [])).toBe(2);
      expect(await b.delete('/tokens/t')).toBe(false);
      await settle(b);
      expect(events).toEqual([]);

      expect(await b.sweepExpired()).toBe(1);
      await settle(b);
      expect(events).toEqual([{ type: 'delete', key: '/tokens/t', revision: 3 }]);
      expect(await b.sweepExpired()).toBe(0);
      await settle(b);
      expect(events.length).toBe(1);
    });

    it('lets create take an expired key, and a put without ttl makes an item permanent', async () => {
      const clock = new ManualClock();
      const b = await fresh({ clock: clock.read });
      await b.put('/k', '1', { ttlMs: 10 });
      clock.advance(10);
      const c = await b.create('/k', '2');
      expect(c).toEqual({ key: '/k', value: '2', revision: 2 });
      clock.advance(1_000_000);
      expect(await b.get('/k')).toEqual(c);
      expect(await b.sweepExpired()).toBe(0);
    });

    it('sweeps many expired items in batches, in key order per batch', async () => {
      const clock = new ManualClock();
      const b = await fresh({ clock: clock.read });
      const ops = Array.from({ length: 2500 }, (_, i) => ({
        type: 'put' as const,
        key: `/events/${String(2500 - i).padStart(5, '0')}`,
        value: '1',
        ttlMs: 5,
      }));
      await b.atomicWrite([], ops);
      const deleted: WatchEvent[] = [];
      b.watch('/events/', (e) => deleted.push(e));
      clock.advance(5);
      expect(await b.sweepExpired()).toBe(2500);
      await settle(b);
      expect(deleted.length).toBe(2500);
      expect(await b.range('')).toEqual([]);
      expect(new Set(deleted.map((e) => e.type === 'delete' && e.revision))).toEqual(new Set([2, 3, 4]));
    });

    it('runs the sweep on its timer', async () => {
      vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
      try {
        const clock = new ManualClock();
        const b = await fresh({ clock: clock.read, sweepIntervalMs: 60_000 });
        await b.put('/n/1', '1', { ttlMs: 1000 });
        const events: WatchEvent[] = [];
        b.watch('/n/', (e) => events.push(e));
        clock.advance(1000);
        vi.advanceTimersByTime(59_999);
        await settle(b);
        expect(events).toEqual([]);
        vi.advanceTimersByTime(1);
        await vi.waitFor(() => expect(events).toEqual([{ type: 'delete', key: '/n/1', revision: 2 }]));
        await b.close();
        expect(vi.getTimerCount()).toBe(0);
      } finally {
        vi.useRealTimers();
      }
    });
  });
}

function describeWatch(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: watch`, () => {
    afterEach(() => vi.restoreAllMocks());

    it('delivers events under the prefix after commit, in revision order, until unsubscribed', async () => {
      const b = await fresh();
      const users: WatchEvent[] = [];
      const all: WatchEvent[] = [];
      const stopUsers = b.watch('/users/', (e) => users.push(e));
      b.watch('', (e) => all.push(e));
      await b.put('/users/alice', '1');
      await b.put('/usersx', '1');
      await b.create('/users/bob', '1');
      await b.update('/users/bob', '2');
      await b.compareAndSwap('/users/alice', 1, '3', { ttlMs: 60_000 });
      await b.delete('/users/bob');
      await b.put('/users/zed', '1');
      await b.put('/users/carol', '1');
      await b.deleteRange('/users/');
      await settle(b);
      stopUsers();
      stopUsers(); // idempotent
      await b.put('/users/dave', '1');
      await settle(b);

      expect(users.map((e) => [e.type, e.type === 'put' ? e.item.key : e.key, e.type === 'put' ? e.item.revision : e.revision])).toEqual([
        ['put', '/users/alice', 1],
        ['put', '/users/bob', 3],
        ['put', '/users/bob', 4],
        ['put', '/users/alice', 5],
        ['delete', '/users/bob', 6],
        ['put', '/users/zed', 7],
        ['put', '/users/carol', 8],
        ['delete', '/users/alice', 9],
        ['delete', '/users/carol', 9],
        ['delete', '/users/zed', 9],
      ]);
      expect(users[3]).toEqual({
        type: 'put',
        item: { key: '/users/alice', value: '3', revision: 5, expiresAt: expect.any(Number) },
      });
      const revisions = all.map((e) => (e.type === 'put' ? e.item.revision : e.revision));
      expect(revisions).toEqual([...revisions].sort((x, y) => x - y));
      expect(all.length).toBe(users.length + 2);
    });

    it('keeps revision order when a listener writes, and survives a listener that throws', async () => {
      const lines: string[] = [];
      const b = await fresh({ logger: createLogger({ format: 'json', destination: { write: (l: string) => void lines.push(l) } }) });
      const seen: Array<[string, number]> = [];
      const record = (e: WatchEvent): void => {
        seen.push(e.type === 'put' ? [e.item.key, e.item.revision] : [e.key, e.revision]);
      };
      b.watch('/', () => {
        throw new Error('listener bug');
      });
      let written: Promise<unknown> | undefined;
      b.watch('/a', (e) => {
        if (e.type === 'put' && e.item.key === '/a') written = b.put('/a2', 'from listener');
      });
      b.watch('/', record);
      await b.put('/a', '1');
      await b.put('/b', '1');
      await vi.waitFor(() => expect(written).toBeDefined());
      await written;
      await settle(b);
      // SQLite delivers /a before put('/a') resolves, so the listener's write comes second; PostgreSQL delivers
      // later and /b may come first. Either way every watcher sees the revisions in order.
      expect(seen.map(([, revision]) => revision)).toEqual([1, 2, 3]);
      expect(seen.map(([key]) => key).sort()).toEqual(['/a', '/a2', '/b']);
      if (h.name === 'sqlite') expect(seen.map(([key]) => key)).toEqual(['/a', '/a2', '/b']);
      expect(lines.length).toBe(3);
      expect(JSON.parse(lines[0]!)).toMatchObject({ level: 50, key: '/a', err: { message: 'listener bug' } });
    });
  });
}

function describeAtomicRollback(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: atomicWrite rollback`, () => {
    it('rolls back the ops already applied when a later op fails', async () => {
      // A write the storage refuses half-way through the transaction: a trigger on one key.
      const f = await h.location();
      const b2 = await h.open(f);
      await b2.put('/keep', '1');
      await b2.close();
      await h.refuseKey(f, '/boom');
      const b3 = await h.open(f);
      const events: WatchEvent[] = [];
      b3.watch('', (e) => events.push(e));
      const err = await rejection(
        b3.atomicWrite([], [
          { type: 'put', key: '/first', value: '1' },
          { type: 'delete', key: '/keep' },
          { type: 'put', key: '/boom', value: '1' },
        ]),
      );
      expect(err.code).toBe('GW_ERR_BACKEND_FAILED');
      await settle(b3);
      expect(events).toEqual([]);
      expect((await b3.range('')).map((i) => i.key)).toEqual(['/keep']);
      expect((await b3.put('/next', '1')).revision).toBe(2);
    });
  });
}

function describeWatchLifecycle(h: BackendHarness, fresh: Fresh): void {
  describe(`${h.name} backend: watch lifecycle`, () => {
    it('delivers frozen events', async () => {
      const b = await fresh();
      let event: WatchEvent | undefined;
      b.watch('', (e) => (event = e));
      const item = await b.put('/a', '1');
      await settle(b);
      expect(Object.isFrozen(event)).toBe(true);
      expect(event?.type === 'put' && Object.isFrozen(event.item)).toBe(true);
      item.value = 'mutated by caller';
      expect(event?.type === 'put' && event.item.value).toBe('1');
    });

    it('stops delivering on close', async () => {
      const f = await h.location();
      const b = await h.open(f);
      const events: WatchEvent[] = [];
      b.watch('', (e) => events.push(e));
      await b.close();
      const again = await h.open(f);
      const other: WatchEvent[] = [];
      again.watch('', (e) => other.push(e));
      await again.put('/a', '1');
      await settle(again);
      expect(other.length).toBe(1);
      expect(events).toEqual([]);
    });
  });
}
