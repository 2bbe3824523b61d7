/**
 * The PostgreSQL backend against a real server from Debian's postgresql package (started once for this file, one
 * database per test): the shared conformance suite, then what only a shared backend has: several Auth Services
 * on one database, the change log's trimmed horizon, open errors by cause.
 */
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { openBackend, openPostgresBackend, type PostgresBackend, type WatchEvent } from '../../src/backend/index.js';
import type { GatewayError } from '../../src/errors.js';
import { createLogger } from '../../src/log.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { rootSuite } from '../helpers/root.js';
import { describeConformance } from './conformance.js';
import { postgresHarness, settle, type HarnessOptions } from './harness.js';
import { codeOf, ManualClock, rejection } from './helpers.js';

let server: PostgresServer;
const h = postgresHarness(() => server);

/** A PostgreSQL backend on a new database (closed after the test). */
async function fresh(location?: string, options: HarnessOptions = {}): Promise<PostgresBackend> {
  return (await h.open(location ?? (await h.location()), options)) as PostgresBackend;
}

async function openError(connString: string): Promise<GatewayError> {
  return rejection(openPostgresBackend({ connString, sweepIntervalMs: 0 }));
}

const keyOf = (e: WatchEvent): string => (e.type === 'put' ? e.item.key : e.key);
const revisionOf = (e: WatchEvent): number => (e.type === 'put' ? e.item.revision : e.revision);

rootSuite(['dbUsers'])('postgres backend (a real PostgreSQL server)', () => {
  beforeAll(async () => {
    server = await startPostgres({ port: await getPort({ host: '127.0.0.1' }), user: 'gwpg', password: 'pg-Secret-42' });
  });
  afterAll(async () => {
    await server?.stop();
  });

  describeConformance(h);

  describeSharedDatabase();

  describeChangeLog();

  describeOpening();
});

function describeSharedDatabase(): void {
  describe('postgres backend: several Auth Services on one database', () => {
    it('lets exactly one of two concurrent compare-and-swaps win', async () => {
      const location = await h.location();
      const one = await fresh(location);
      const two = await fresh(location);
      const item = await one.put('/tokens/t', '"unused"');
      for (let round = 0; round < 20; round++) {
        const current = (await one.get('/tokens/t'))!;
        const results = await Promise.allSettled([
          one.compareAndSwap('/tokens/t', current.revision, `"one ${round}"`),
          two.compareAndSwap('/tokens/t', current.revision, `"two ${round}"`),
        ]);
        const won = results.filter((r) => r.status === 'fulfilled');
        const lost = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
        expect(won.length, `round ${round}`).toBe(1);
        expect((lost[0]!.reason as GatewayError).code).toBe('GW_ERR_BACKEND_CONFLICT');
      }
      expect((await two.get('/tokens/t'))!.revision).toBe(item.revision + 20);
    });

    it('gives concurrent writers of two backends one gap-free revision sequence, seen in order by both', async () => {
      const location = await h.location();
      const one = await fresh(location);
      const two = await fresh(location);
      const seen: WatchEvent[][] = [[], []];
      one.watch('', (e) => seen[0]!.push(e));
      two.watch('', (e) => seen[1]!.push(e));
      const writes = Array.from({ length: 40 }, (_, i) => (i % 2 === 0 ? one : two).put(`/w/${i}`, String(i)));
      const revisions = (await Promise.all(writes)).map((item) => item.revision).sort((a, b) => a - b);
      expect(revisions).toEqual(Array.from({ length: 40 }, (_, i) => i + 1));
      await settle(one);
      await settle(two);
      for (const events of seen) expect(events.map(revisionOf)).toEqual(revisions);
      expect(seen[0]).toEqual(seen[1]);
    });

    it('sweeps each expired item once when two Auth Services sweep together', async () => {
      const clock = new ManualClock();
      const location = await h.location();
      const one = await fresh(location, { clock: clock.read });
      const two = await fresh(location, { clock: clock.read });
      const ops = Array.from({ length: 1500 }, (_, i) => ({ type: 'put' as const, key: `/n/${i}`, value: '1', ttlMs: 10 }));
      await one.atomicWrite([], ops);
      const deleted: WatchEvent[] = [];
      one.watch('/n/', (e) => deleted.push(e));
      clock.advance(10);
      const [a, b] = await Promise.all([one.sweepExpired(), two.sweepExpired()]);
      expect(a + b).toBe(1500);
      await settle(one);
      expect(deleted.length).toBe(1500);
      expect(new Set(deleted.map(keyOf)).size).toBe(1500);
    });
  });
}

function describeChangeLog(): void {
  describe('postgres backend: the change log', () => {
    it('tells a watcher that fell behind the trimmed horizon, which then re-lists; the others go on', async () => {
      const location = await h.location();
      const writer = await fresh(location);
      const lines: string[] = [];
      const logger = createLogger({ format: 'json', destination: { write: (l: string) => void lines.push(l) } });
      const reader = await fresh(`${location}?application_name=reader`, { logger });
      const errors: Array<{ code: string }> = [];
      const kept: WatchEvent[] = [];
      reader.watch('/k/', () => undefined, { onError: (err) => errors.push(err) });
      reader.watch('/k/', (e) => kept.push(e));
      await writer.put('/k/1', '1');
      await settle(reader);
      // The reader's connections stall (their server processes are stopped) while the writer writes and the log
      // is trimmed past those writes.
      const pids = (await server.sql(`SELECT pid FROM pg_stat_activity WHERE application_name = 'reader'`)).trim().split('\n').map(Number);
      expect(pids.length).toBeGreaterThan(0);
      for (const pid of pids) process.kill(pid, 'SIGSTOP');
      try {
        await writer.put('/k/2', '2');
        await writer.put('/k/3', '3');
        expect(await writer.compactChanges(3)).toBe(3);
        await writer.put('/k/4', '4');
      } finally {
        for (const pid of pids) process.kill(pid, 'SIGCONT');
      }
      await settle(reader);
      // The reader had delivered revision 1 and needed 2, which is gone: the watcher with onError is told and
      // ended, the other one is logged about and goes on after the horizon.
      expect(errors).toEqual([expect.objectContaining({ code: 'GW_ERR_BACKEND_COMPACTED' })]);
      expect(kept.map(keyOf)).toEqual(['/k/1', '/k/4']);
      expect(lines.map((l) => JSON.parse(l) as { level: number; msg: string })).toEqual([
        expect.objectContaining({ level: 50, msg: expect.stringContaining('without an error handler missed events') }),
      ]);
    });

    it('finds a change whose notification never came, by its poll', async () => {
      const location = await h.location();
      const b = (await openPostgresBackend({ connString: location, sweepIntervalMs: 0, pollIntervalMs: 50 })) as PostgresBackend;
      try {
        const events: WatchEvent[] = [];
        b.watch('', (e) => events.push(e));
        // A write done by hand, exactly as a backend writes, except for the NOTIFY.
        await server.sql(
          `UPDATE gateway_meta SET value = value + 1 WHERE name = 'revision';
           INSERT INTO gateway_kv VALUES ('/silent', '"x"', (SELECT value FROM gateway_meta WHERE name = 'revision'), NULL);
           INSERT INTO gateway_changes (revision, seq, key, value) VALUES ((SELECT value FROM gateway_meta WHERE name = 'revision'), 1, '/silent', '"x"');`,
          new URL(location).pathname.slice(1),
        );
        // No settle() here: that would ask for a catch-up itself.
        await vi.waitFor(() => expect(events).toEqual([{ type: 'put', item: { key: '/silent', value: '"x"', revision: 1 } }]), { timeout: 20_000 });
      } finally {
        await b.close();
      }
    });

    it('trims entries older than the retention, never past the head', async () => {
      const location = await h.location();
      const b = (await openPostgresBackend({ connString: location, sweepIntervalMs: 0, changeRetentionMs: 1 })) as PostgresBackend;
      try {
        await b.put('/a', '1');
        await b.put('/b', '2');
        await new Promise((r) => setTimeout(r, 20));
        expect(await b.trimChanges()).toBe(2);
        expect(await b.compactChanges(99)).toBe(2);
        const events: WatchEvent[] = [];
        b.watch('', (e) => events.push(e));
        await b.put('/c', '3');
        await settle(b);
        expect(events.map(keyOf)).toEqual(['/c']);
      } finally {
        await b.close();
      }
    });
  });
}

function describeOpening(): void {
  describe('postgres backend: opening', () => {
    it('names each cause with its own code, never showing the password', async () => {
      const closedPort = await getPort({ host: '127.0.0.1' });
      const base = server.url('gwpg');
      const cases: Array<[string, string, string]> = [
        [base.replace('pg-Secret-42', 'wrong-Secret'), 'GW_ERR_BACKEND_AUTH', 'wrong password'],
        [base.replace(`:${server.port}/`, `:${closedPort}/`), 'GW_ERR_BACKEND_UNREACHABLE', 'connection refused'],
        [base.replace(/\/gwpg$/, '/nosuchdb'), 'GW_ERR_BACKEND_OPEN', 'does not exist'],
        [`${base}?sslmode=require`, 'GW_ERR_BACKEND_TLS', 'does not accept TLS'],
        [base.replace(':pg-Secret-42@', '@'), 'GW_ERR_BACKEND_AUTH', 'none was given'],
        ['postgresql://gwpg:pg-Secret-42@127.0.0.1/gwpg?sslmode=prefer', 'GW_ERR_BACKEND_OPEN', 'sslmode=prefer'],
      ];
      for (const [connString, code, words] of cases) {
        const err = await openError(connString);
        expect(err.code, connString).toBe(code);
        expect(err.message, connString).toContain(words);
        const password = /^postgresql:\/\/[^:]+:([^@]+)@/.exec(connString)?.[1];
        if (password !== undefined) {
          expect(`${err.message} ${err.hint} ${JSON.stringify(err.details)} ${String(err.cause)}`).not.toContain(password);
          expect(err.message).toContain(':***@');
        }
      }
    });

    it('refuses a database that is not UTF8, and one written by a newer schema', async () => {
      await server.sql(`CREATE DATABASE latin OWNER ${server.user} ENCODING 'SQL_ASCII' TEMPLATE template0`);
      const latin = await openError(server.url('latin'));
      expect(latin.code).toBe('GW_ERR_BACKEND_OPEN');
      expect(latin.message).toContain('SQL_ASCII');
      const location = await h.location();
      await (await fresh(location)).close();
      await server.sql(`UPDATE gateway_meta SET value = 99 WHERE name = 'schema'`, new URL(location).pathname.slice(1));
      const newer = await openError(location);
      expect(newer.code).toBe('GW_ERR_BACKEND_OPEN');
      expect(newer.message).toContain('newer');
    });

    it('uses tables a DBA created for a user that may not create any', async () => {
      const location = await h.location();
      const database = new URL(location).pathname.slice(1);
      await (await fresh(location)).close();
      await server.sql(
        `CREATE ROLE gwlimited LOGIN PASSWORD 'limited-pw-1';
         GRANT CONNECT ON DATABASE ${database} TO gwlimited;
         GRANT SELECT, INSERT, UPDATE, DELETE ON gateway_meta, gateway_kv, gateway_changes TO gwlimited;`,
        database,
      );
      const limited = location.replace(/^postgresql:\/\/[^@]+@/, 'postgresql://gwlimited:limited-pw-1@');
      const b = await fresh(limited);
      expect((await b.put('/a', '1')).revision).toBe(1);
      // The same user cannot create the tables in a new database: that is a missing privilege, said as such.
      const empty = await h.location();
      await server.sql(`GRANT CONNECT ON DATABASE ${new URL(empty).pathname.slice(1)} TO gwlimited`);
      const err = await openError(empty.replace(/^postgresql:\/\/[^@]+@/, 'postgresql://gwlimited:limited-pw-1@'));
      expect(err.code).toBe('GW_ERR_BACKEND_OPEN');
      expect(err.message).toContain('privilege');
    });

    it('opens through openBackend and the configuration', async () => {
      const b = await openBackend({ type: 'postgres', connString: await h.location(), sweepIntervalMs: 0 });
      try {
        expect((await b.put('/a', '1')).revision).toBe(1);
      } finally {
        await b.close();
      }
      expect(await codeOf(openBackend({ type: 'postgres', connString: 'mysql://x' }))).toBe('GW_ERR_BACKEND_OPEN');
    });
  });
}
