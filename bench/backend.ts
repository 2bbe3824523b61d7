/**
 * bench:backend — the cluster-state backends measured in one run, on this machine:
 *   SQLite      the embedded default: a file in a temp dir (WAL, synchronous=NORMAL)
 *   PostgreSQL  Debian's server started like the tests start it, but with fsync on and shared_buffers 128MB;
 *               one database with synchronous_commit=off (the durability SQLite's NORMAL gives: a crash keeps the
 *               data consistent but may lose the last commits) and one with the default synchronous_commit=on
 *
 * writes/s: puts of ~200-byte JSON values to distinct keys, one at a time and with BENCH_CONCURRENCY in flight, and
 * creates one at a time (the path every conditional write takes: read under the lock, check, write).
 * watch delivery latency: from calling put() until a watcher's listener has the event, one write at a time; on
 * the writing backend itself, and (PostgreSQL) on a second backend on the same database, as another Auth Service
 * would see it.
 *
 * Writes the figures, the machine and the load average to bench/RESULTS.md (section "backend").
 */
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { mkdtemp, rm } from 'node:fs/promises';
import { join } from 'node:path';
import getPort from 'get-port';
import { openPostgresBackend, openSqliteBackend, type Backend, type WatchEvent } from '../src/backend/index.js';
import { startPostgres, type PostgresServer } from '../test/helpers/databases.js';
import { envNumber, percentile } from './common.js';
import { recordSection } from './record.js';

const WRITES = envNumber('BENCH_WRITES', 3000);
const CONCURRENCY = envNumber('BENCH_CONCURRENCY', 16);
const SAMPLES = envNumber('BENCH_LATENCY_SAMPLES', 2000);

const VALUE = JSON.stringify({ kind: 'node', version: 'v17.0.0', spec: { hostname: 'node-000.example.com', addr: '10.0.0.1:3022', labels: { env: 'prod', team: 'infra' } }, status: 'online', pad: 'x'.repeat(40) });

interface Row {
  name: string;
  sequential: number;
  concurrent: number;
  creates: number;
  local: { p50: number; p99: number };
  remote?: { p50: number; p99: number };
}

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

/** Writes per second: count puts (or creates) of fresh keys, `inFlight` at a time. */
async function writesPerSecond(b: Backend, prefix: string, inFlight: number, op: 'put' | 'create' = 'put'): Promise<number> {
  let next = 0;
  const t0 = now();
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      for (let i = next++; i < WRITES; i = next++) await b[op](`${prefix}/${i}`, VALUE);
    }),
  );
  return WRITES / ((now() - t0) / 1000);
}

/** put() → the watcher on `watcher` has the event, one write at a time; p50 and p99 in ms. */
async function watchLatency(writer: Backend, watcher: Backend, prefix: string): Promise<{ p50: number; p99: number }> {
  let waiting: { key: string; resolve: () => void } | undefined;
  const stop = watcher.watch(prefix, (e: WatchEvent) => {
    if (e.type === 'put' && e.item.key === waiting?.key) waiting.resolve();
  });
  const times: number[] = [];
  try {
    for (let i = 0; i < SAMPLES + 50; i++) {
      const key = `${prefix}${i}`;
      const arrived = new Promise<void>((resolve) => (waiting = { key, resolve }));
      const t0 = now();
      await writer.put(key, VALUE);
      await arrived;
      if (i >= 50) times.push(now() - t0); // the first 50 warm up
    }
  } finally {
    stop();
  }
  times.sort((a, b) => a - b);
  return { p50: percentile(times, 50), p99: percentile(times, 99) };
}

async function measure(name: string, open: () => Promise<Backend>, second?: () => Promise<Backend>): Promise<Row> {
  const b = await open();
  const other = second ? await second() : undefined;
  try {
    await writesPerSecond(b, '/warmup', CONCURRENCY);
    const row: Row = {
      name,
      sequential: await writesPerSecond(b, '/seq', 1),
      concurrent: await writesPerSecond(b, '/con', CONCURRENCY),
      creates: await writesPerSecond(b, '/create', 1, 'create'),
      local: await watchLatency(b, b, '/lat/local/'),
    };
    if (other) row.remote = await watchLatency(b, other, '/lat/remote/');
    process.stdout.write(`${JSON.stringify(row)}\n`);
    return row;
  } finally {
    await b.close();
    await other?.close();
  }
}

async function main(): Promise<void> {
  const loadStart = loadavg()[0]!;
  const started = now();
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-backend-'));
  let pg: PostgresServer | undefined;
  try {
    pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }), settings: { fsync: 'on', shared_buffers: '128MB' } });
    await pg.sql(`CREATE DATABASE bench_async OWNER ${pg.user}`);
    await pg.sql(`ALTER DATABASE bench_async SET synchronous_commit = off`);
    await pg.sql(`CREATE DATABASE bench_sync OWNER ${pg.user}`);
    const version = (await pg.sql('SHOW server_version')).trim();
    const server = pg;
    const openPg = (db: string) => () => openPostgresBackend({ connString: server.url(db), sweepIntervalMs: 0 });
    const rows = [
      await measure('SQLite (WAL, synchronous=NORMAL)', async () => openSqliteBackend({ path: join(dir, 'backend.sqlite'), sweepIntervalMs: 0 })),
      await measure('PostgreSQL, synchronous_commit=off', openPg('bench_async'), openPg('bench_async')),
      await measure('PostgreSQL, synchronous_commit=on', openPg('bench_sync'), openPg('bench_sync')),
    ];
    const loadEnd = loadavg()[0]!;
    await recordSection('backend', report(rows, version, loadStart, loadEnd, (now() - started) / 1000));
  } finally {
    await pg?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

function report(rows: Row[], version: string, loadStart: number, loadEnd: number, seconds: number): string {
  const ms = (n: number) => n.toFixed(3);
  const [sqlite, pgAsync, pgSync] = rows as [Row, Row, Row];
  const cpu = cpus();
  const section = [
    '## backend',
    '',
    `Run ${new Date().toISOString()} with \`npm run bench:backend\` (${seconds.toFixed(0)} s): ${WRITES} puts (or creates) of ${VALUE.length}-byte JSON values to new keys for each writes/s figure, ` +
      `one at a time and ${CONCURRENCY} in flight (from one process); watch latency: ${SAMPLES} writes one at a time, from calling put() until the listener has the event. ` +
      `SQLite: a file in ${tmpdir()} (WAL, synchronous=NORMAL). PostgreSQL ${version} on 127.0.0.1, its data in ${tmpdir()} too, fsync on, shared_buffers 128MB, over TCP without TLS, ` +
      'the backend\'s pool of 10 connections; "other backend" is a second backend on the same database (another Auth Service), which gets events through the change log and LISTEN/NOTIFY.',
    `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}; load average ${loadStart.toFixed(2)} at the start, ${loadEnd.toFixed(2)} at the end (other work shared the machine).`,
    '',
    '| backend | puts/s, 1 in flight | puts/s, ' + CONCURRENCY + ' in flight | creates/s, 1 in flight | watch p50, same backend (ms) | p99 (ms) | watch p50, other backend (ms) | p99 (ms) |',
    '|---|---|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.name} | ${r.sequential.toFixed(0)} | ${r.concurrent.toFixed(0)} | ${r.creates.toFixed(0)} | ${ms(r.local.p50)} | ${ms(r.local.p99)} | ${r.remote ? ms(r.remote.p50) : '–'} | ${r.remote ? ms(r.remote.p99) : '–'} |`,
    ),
    '',
    `- PostgreSQL (synchronous_commit=off) against SQLite: puts/s ${(pgAsync.sequential / sqlite.sequential).toFixed(2)}x one at a time, ${(pgAsync.concurrent / sqlite.concurrent).toFixed(2)}x with ${CONCURRENCY} in flight, creates/s ${(pgAsync.creates / sqlite.creates).toFixed(2)}x; watch p99 on the same backend ${(pgAsync.local.p99 / sqlite.local.p99).toFixed(1)}x.`,
    `- synchronous_commit=on waits for the WAL flush at every commit: ${pgSync.sequential.toFixed(0)} writes/s one at a time against ${pgAsync.sequential.toFixed(0)} with it off, and ${pgSync.concurrent.toFixed(0)} with ${CONCURRENCY} in flight: each write holds the write lock through its flush, so writes cannot share a flush (no group commit) and more of them in flight do not help.`,
    '- Every PostgreSQL write takes the one write lock (the revision counter row) until it commits. A put is one statement, so one round trip, holding the lock only while the server runs and commits it; create (measured here), update, compareAndSwap, delete and atomicWrite are four round trips (BEGIN with the lock, a read of the live state, one statement for rows, counter, change log and NOTIFY, COMMIT) and hold the lock across them. Writes in flight overlap their round trips and queue on the lock. SQLite writes are synchronous calls in this process.',
    '- A watcher on PostgreSQL gets an event after the commit, a wake-up (the local write or NOTIFY) and a read of the change log; SQLite hands the event to the listeners before put() returns.',
    '',
  ].join('\n');
  process.stdout.write(`${section}\n`);
  return section;
}

await main();
