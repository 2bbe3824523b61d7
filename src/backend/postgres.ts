/**
 * The shared backend: PostgreSQL through the pg driver, for several Auth Services on one cluster
 * (docs/backend.md has the design; this is the short form).
 *
 *   gateway_meta(name, value)          'revision' (the cluster-wide counter, and the write lock), 'compacted' (the
 *                                      change log's trimmed horizon), 'schema' (the schema version)
 *   gateway_kv(key, value, revision, expires_at)                  one row per item; key COLLATE "C"
 *   gateway_changes(revision, seq, key, value, expires_at, written_at)   the change log, one row per event
 *
 * Every write is one READ COMMITTED transaction that first locks the counter row (SELECT ... FOR UPDATE; a put,
 * which needs no read, is one statement whose first part updates that row): that lock serialises all writers of
 * all Auth Services, so conditions and compare-and-swap are checked against the latest committed state,
 * revisions are taken without gaps, and commits become visible in revision order. The write reads the live
 * state it needs, works out its rows and events (plan.ts) and applies them in one statement: rows, counter,
 * change-log rows and a NOTIFY, which PostgreSQL sends at commit. Watch events come
 * from the change log, never from the write itself (pgfollow.ts), so this process's writes and every other
 * process's reach the watchers in one order.
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { GatewayError } from '../errors.js';
import { logger as componentLogger, type Logger } from '../log.js';
import {
  checkCondition,
  checkKey,
  checkLimit,
  checkPrefix,
  checkRevision,
  checkValue,
  checkWatch,
  checkWriteOp,
  compareKeys,
  expiryOf,
  prefixSuccessor,
} from './keys.js';
import { ConnStringError, parsePgConnString, tlsMode, tlsOptions, type PgConnSpec, type PgTlsFiles } from './pgconn.js';
import { isConnectionLoss, pgFailure, type PgErrorContext } from './pgerrors.js';
import { CHANGE_CHANNEL, ChangeFollower } from './pgfollow.js';
import { planWrite, type WritePlan } from './plan.js';
import type { Backend, Condition, Item, PutOptions, WatchEvent, WatchOptions, WriteOp } from './types.js';
import { WatchHub } from './watchers.js';

export interface PostgresBackendOptions {
  /** postgresql://user[:password]@host[:port]/database[?sslmode=...] (pgconn.ts). */
  connString: string;
  /** PEM file of the CA that signs the server's certificate. */
  caFile?: string;
  /** PEM client certificate and its key, for TLS client-certificate ("cert") authentication. */
  certFile?: string;
  keyFile?: string;
  /** ms since the epoch; Date.now by default. Expiry is judged by this clock (keep the Auth Services' in sync). */
  clock?: () => number;
  /** How often expired items are swept and the change log trimmed; 0 turns the timer off. */
  sweepIntervalMs?: number;
  /** How long change-log entries are kept: an Auth Service cut off for longer re-lists (GW_ERR_BACKEND_COMPACTED). */
  changeRetentionMs?: number;
  /** How often the change feed looks for changes without a notification; 0: only on notifications. */
  pollIntervalMs?: number;
  /** Connections of the operation pool (the change feed has one more of its own). */
  poolSize?: number;
  /** How long a write waits for the write lock held by another Auth Service before failing. */
  lockTimeoutMs?: number;
  /** How long connecting may take when the conn string sets no connect_timeout. */
  connectTimeoutMs?: number;
  logger?: Logger;
}

export const POSTGRES_BACKEND_DEFAULTS = Object.freeze({
  sweepIntervalMs: 10_000,
  changeRetentionMs: 3_600_000,
  pollIntervalMs: 5_000,
  poolSize: 10,
  lockTimeoutMs: 10_000,
  connectTimeoutMs: 10_000,
});

export interface PostgresBackend extends Backend {
  /** The connection string with its password as "***". */
  readonly display: string;
  /** Deletes every expired item (waiting for another Auth Service's sweep), emitting delete events; returns how many. */
  sweepExpired(): Promise<number>;
  /** Trims the change log through revision (at most the head); returns the new horizon. */
  compactChanges(throughRevision: number): Promise<number>;
  /** Trims the change-log entries older than the retention; returns the horizon. */
  trimChanges(): Promise<number>;
  /** Resolves once this backend's watchers have had every event up to the current revision, which it returns. */
  caughtUp(): Promise<number>;
}

export const POSTGRES_SCHEMA_VERSION = 1;
/** pg_advisory_xact_lock(GWAY, n): creating the schema, one sweep at a time, one trim at a time. */
const LOCK_SPACE = 0x47574159;
const LOCK = { schema: 1, sweep: 2, trim: 3 } as const;
const SWEEP_BATCH = 1000;
const TRIM_BATCH = 10_000;
/** Greater than every valid key (at most 1024 UTF-8 bytes): the upper bound of a range with no successor. */
const KEY_CEILING = '\u{10FFFF}'.repeat(257);

const SCHEMA = `
CREATE TABLE IF NOT EXISTS gateway_meta (
  name  text COLLATE "C" PRIMARY KEY,
  value bigint NOT NULL
);
INSERT INTO gateway_meta (name, value) VALUES ('revision', 0), ('compacted', 0), ('schema', ${POSTGRES_SCHEMA_VERSION})
  ON CONFLICT (name) DO NOTHING;
CREATE TABLE IF NOT EXISTS gateway_kv (
  key        text COLLATE "C" PRIMARY KEY,
  value      text   NOT NULL,
  revision   bigint NOT NULL,
  expires_at bigint
);
CREATE INDEX IF NOT EXISTS gateway_kv_expires ON gateway_kv (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS gateway_changes (
  revision   bigint  NOT NULL,
  seq        integer NOT NULL,
  key        text COLLATE "C" NOT NULL,
  value      text,
  expires_at bigint,
  written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (revision, seq)
);
`;

const LIVE = '(expires_at IS NULL OR expires_at > $2)';
const COLUMNS = 'key, value, revision, expires_at';

const SQL = {
  lock: `SELECT value FROM gateway_meta WHERE name = 'revision' FOR UPDATE`,
  head: `SELECT value FROM gateway_meta WHERE name = 'revision'`,
  get: `SELECT ${COLUMNS} FROM gateway_kv WHERE key = $1 AND ${LIVE}`,
  range: `SELECT ${COLUMNS} FROM gateway_kv WHERE key >= $1 AND key < $3 AND ${LIVE} ORDER BY key LIMIT $4::bigint`,
  /** The live revisions of the keys in $1, and (with the index of their range) the live keys in each range $3..$4. */
  state: `SELECT key, revision, 0::bigint AS range FROM gateway_kv WHERE key = ANY($1::text[]) AND ${LIVE}
          UNION ALL
          SELECT k.key, k.revision, r.i FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS r(lo, hi, i)
            CROSS JOIN LATERAL (SELECT key, revision FROM gateway_kv
                                WHERE key >= (r.lo COLLATE "C") AND key < (r.hi COLLATE "C") AND ${LIVE}) k`,
  /** One write's rows, counter, change log and notification, in one statement. */
  apply: `WITH
            d AS (DELETE FROM gateway_kv WHERE key = ANY($2::text[])),
            u AS (INSERT INTO gateway_kv (key, value, revision, expires_at)
                    SELECT k, v, $1::bigint, e FROM unnest($3::text[], $4::text[], $5::bigint[]) AS t(k, v, e)
                  ON CONFLICT (key) DO UPDATE
                    SET value = EXCLUDED.value, revision = EXCLUDED.revision, expires_at = EXCLUDED.expires_at),
            m AS (UPDATE gateway_meta SET value = $1::bigint WHERE name = 'revision'),
            c AS (INSERT INTO gateway_changes (revision, seq, key, value, expires_at)
                    SELECT $1::bigint, t.i, t.k, t.v, t.e FROM unnest($6::text[], $7::text[], $8::bigint[]) WITH ORDINALITY AS t(k, v, e, i))
          SELECT pg_notify('${CHANGE_CHANNEL}', ($1::bigint)::text)`,
  /** put() alone: counter, row, change log and notification in one statement (blindPut). */
  put: `WITH r AS (UPDATE gateway_meta SET value = value + 1 WHERE name = 'revision' RETURNING value),
             u AS (INSERT INTO gateway_kv (key, value, revision, expires_at) SELECT $1::text, $2::text, r.value, $3::bigint FROM r
                   ON CONFLICT (key) DO UPDATE
                     SET value = EXCLUDED.value, revision = EXCLUDED.revision, expires_at = EXCLUDED.expires_at),
             c AS (INSERT INTO gateway_changes (revision, seq, key, value, expires_at) SELECT r.value, 1, $1::text, $2::text, $3::bigint FROM r)
        SELECT value, pg_notify('${CHANGE_CHANNEL}', value::text) FROM r`,
  anyExpired: `SELECT 1 FROM gateway_kv WHERE expires_at <= $1 LIMIT 1`,
  sweep: `DELETE FROM gateway_kv WHERE key IN
            (SELECT key FROM gateway_kv WHERE expires_at <= $1 ORDER BY expires_at LIMIT ${SWEEP_BATCH})
          RETURNING key`,
  trimmable: `SELECT max(revision) AS upto FROM
                (SELECT revision, written_at FROM gateway_changes ORDER BY revision, seq LIMIT ${TRIM_BATCH}) t
              WHERE written_at < clock_timestamp() - $1::double precision * interval '1 millisecond'`,
  compact: `WITH h AS (SELECT LEAST($1::bigint, (SELECT value FROM gateway_meta WHERE name = 'revision')) AS upto),
                 d AS (DELETE FROM gateway_changes WHERE revision <= (SELECT upto FROM h))
            UPDATE gateway_meta SET value = GREATEST(value, (SELECT upto FROM h)) WHERE name = 'compacted' RETURNING value`,
};

interface Row {
  key: string;
  value: string;
  revision: string;
  expires_at: string | null;
}

function toItem(row: Row): Item {
  const revision = Number(row.revision);
  return row.expires_at === null
    ? { key: row.key, value: row.value, revision }
    : { key: row.key, value: row.value, revision, expiresAt: Number(row.expires_at) };
}

/** The key range [lower, upper) of a prefix. */
function bounds(prefix: string): [string, string] {
  return [prefix, prefixSuccessor(prefix) ?? KEY_CEILING];
}

interface LiveSnapshot {
  /** Every live key read (asked for by name or found in a range), with its revision. */
  revisions: Map<string, number>;
  ranges: Map<string, string[]>;
}

type WriteCheck = (live: ReadonlyMap<string, number>) => void;

interface Written {
  /** The revision the write took, or undefined when it changed nothing. */
  revision: number | undefined;
  head: number;
  plan: WritePlan;
}

class PostgresBackendImpl implements PostgresBackend {
  readonly display: string;
  private readonly pool: pg.Pool;
  private readonly clock: () => number;
  private readonly log: Logger;
  private readonly hub: WatchHub;
  private follower: ChangeFollower | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private closing: Promise<void> | undefined;
  /** The highest revision a write of this backend committed: a watcher that comes later skips it and all before. */
  private lastWritten = 0;

  constructor(
    private readonly spec: PgConnSpec,
    private readonly clientConfig: pg.ClientConfig,
    private readonly options: PostgresBackendOptions,
  ) {
    this.display = spec.display;
    this.clock = options.clock ?? Date.now;
    this.log = options.logger ?? componentLogger('backend');
    this.hub = new WatchHub(this.log);
    this.pool = new pg.Pool({ ...clientConfig, max: options.poolSize ?? POSTGRES_BACKEND_DEFAULTS.poolSize, idleTimeoutMillis: 30_000 });
    // An idle pooled connection that the server ends (restart, pg_terminate_backend) is dropped by the pool;
    // without a listener its error would be thrown.
    this.pool.on('error', (err) => this.log.debug({ err: err.message }, 'idle backend connection closed'));
  }

  // --- plumbing ------------------------------------------------------------------------------------------------

  private context(phase: 'open' | 'op'): PgErrorContext {
    return { display: this.spec.display, address: this.spec.address, user: this.spec.user, database: this.spec.database, phase };
  }

  private closedError(): GatewayError {
    return new GatewayError('GW_ERR_BACKEND_CLOSED', `the backend ${this.display} is closed`, { details: { backend: this.display } });
  }

  private failure(err: unknown, phase: 'open' | 'op' = 'op'): GatewayError {
    if (err instanceof GatewayError) return err;
    if (this.closed) return this.closedError();
    return pgFailure(err, this.context(phase));
  }

  private guard(): void {
    if (this.closed) throw this.closedError();
  }

  /** A read on any pooled connection, tried once more on a fresh one if the first had died. */
  private async query<R extends pg.QueryResultRow>(name: string, text: string, values: unknown[]): Promise<R[]> {
    this.guard();
    for (let attempt = 1; ; attempt++) {
      try {
        return (await this.pool.query<R>({ name, text, values })).rows;
      } catch (err) {
        if (attempt < 2 && isConnectionLoss(err) && !this.closed) continue;
        throw this.failure(err);
      }
    }
  }

  /**
   * One transaction on one pooled connection. A connection lost before COMMIT was sent rolled everything back,
   * so the body runs once more on a fresh connection; a loss during COMMIT leaves the outcome unknown and is
   * reported (GW_ERR_BACKEND_UNREACHABLE says so).
   */
  private async transaction<T>(body: (client: pg.PoolClient, head: number) => Promise<T>, lockFirst = true): Promise<T> {
    this.guard();
    for (let attempt = 1; ; attempt++) {
      let client: pg.PoolClient | undefined;
      let committing = false;
      try {
        client = await this.pool.connect();
        // BEGIN and the write lock in one round trip (a simple query may hold several statements).
        const begun = (await client.query(lockFirst ? `BEGIN; ${SQL.lock}` : 'BEGIN')) as unknown as pg.QueryResult<{ value: string }>[] | pg.QueryResult;
        const head = Array.isArray(begun) ? Number(begun[1]!.rows[0]!.value) : -1;
        const result = await body(client, head);
        committing = true;
        await client.query('COMMIT');
        client.release();
        return result;
      } catch (err) {
        const lost = isConnectionLoss(err);
        if (client !== undefined) {
          // A connection that cannot even roll back is not given back to the pool.
          let broken = lost;
          if (!lost && !committing) await client.query('ROLLBACK').catch(() => (broken = true));
          client.release(broken ? (err as Error) : undefined);
        }
        if (lost && !committing && attempt < 2 && !this.closed) continue;
        throw this.failure(err);
      }
    }
  }

  /** Takes the write lock (the counter row) inside a transaction begun without it; returns the current revision. */
  private async lock(client: pg.PoolClient): Promise<number> {
    const r = await client.query<{ value: string }>({ name: 'gateway_lock', text: SQL.lock });
    return Number(r.rows[0]!.value);
  }

  /**
   * put() in one statement, which is its own transaction: the counter row is updated first (the other parts
   * read its new value), so it takes the write lock first like every write, and holds it only while the
   * statement runs and commits. A connection lost while it runs leaves the outcome unknown.
   */
  private async blindPut(key: string, value: string, expiresAt: number | undefined): Promise<number> {
    this.guard();
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (err) {
      if (!isConnectionLoss(err) || this.closed) throw this.failure(err);
      client = await this.pool.connect().catch((again: unknown) => Promise.reject(this.failure(again)));
    }
    try {
      const r = await client.query<{ value: string }>({ name: 'gateway_put', text: SQL.put, values: [key, value, expiresAt ?? null] });
      client.release();
      const revision = Number(r.rows[0]!.value);
      this.committed(revision);
      return revision;
    } catch (err) {
      client.release(isConnectionLoss(err) ? (err as Error) : undefined);
      throw this.failure(err);
    }
  }

  private async liveState(client: pg.PoolClient, keys: string[], prefixes: string[], now: number): Promise<LiveSnapshot> {
    const snapshot: LiveSnapshot = { revisions: new Map(), ranges: new Map(prefixes.map((p) => [p, []])) };
    if (keys.length === 0 && prefixes.length === 0) return snapshot;
    const ranges = prefixes.map(bounds);
    const r = await client.query<{ key: string; revision: string; range: string }>({
      name: 'gateway_state',
      text: SQL.state,
      values: [keys, now, ranges.map((b) => b[0]), ranges.map((b) => b[1])],
    });
    for (const row of r.rows) {
      const index = Number(row.range);
      snapshot.revisions.set(row.key, Number(row.revision));
      if (index > 0) snapshot.ranges.get(prefixes[index - 1]!)!.push(row.key);
    }
    return snapshot;
  }

  /** Writes a plan's rows, the counter, the change log and the notification. */
  private async apply(client: pg.PoolClient, revision: number, plan: Pick<WritePlan, 'events' | 'upserts' | 'deletes'>): Promise<void> {
    const upserts = [...plan.upserts];
    await client.query({
      name: 'gateway_apply',
      text: SQL.apply,
      values: [
        revision,
        [...plan.deletes],
        upserts.map(([k]) => k),
        upserts.map(([, v]) => v.value),
        upserts.map(([, v]) => v.expiresAt ?? null),
        plan.events.map((e) => e.key),
        plan.events.map((e) => (e.type === 'put' ? e.value : null)),
        plan.events.map((e) => (e.type === 'put' ? (e.expiresAt ?? null) : null)),
      ],
    });
  }

  /**
   * The write path: under the write lock, read the live state of the keys and ranges the ops touch (and of
   * extraKeys), let check throw, plan, apply. The change feed is told after commit.
   */
  private async writeOps(now: number, ops: WriteOp[], check?: WriteCheck, extraKeys: string[] = []): Promise<Written> {
    const keys = [...new Set([...extraKeys, ...ops.flatMap((o) => (o.type === 'delete' ? [o.key] : []))])];
    const prefixes = [...new Set(ops.flatMap((o) => (o.type === 'deleteRange' ? [o.prefix] : [])))];
    const written = await this.transaction(async (client, head) => {
      const state = await this.liveState(client, keys, prefixes, now);
      check?.(state.revisions);
      const plan = planWrite(
        ops,
        { live: (k) => state.revisions.has(k), liveUnder: (p) => state.ranges.get(p) ?? [] },
        (ttlMs) => expiryOf(ttlMs, now),
      );
      if (plan.events.length === 0) return { revision: undefined, head, plan };
      await this.apply(client, head + 1, plan);
      return { revision: head + 1, head, plan };
    });
    if (written.revision !== undefined) this.committed(written.revision);
    return written;
  }

  private committed(revision: number): void {
    this.lastWritten = Math.max(this.lastWritten, revision);
    this.follower?.request();
  }

  private conflict(message: string, details: Record<string, unknown>): GatewayError {
    return new GatewayError('GW_ERR_BACKEND_CONFLICT', message, { details });
  }

  private async writeOne(mode: 'put' | 'create' | 'update' | 'cas', key: string, value: string, options: PutOptions | undefined, expected?: number): Promise<Item> {
    this.guard();
    checkKey(key);
    checkValue(value);
    if (mode === 'cas') checkRevision(expected);
    const now = this.clock();
    const ttlMs = options?.ttlMs;
    expiryOf(ttlMs, now);
    const check: WriteCheck = (live) => {
      const current = live.get(key);
      if (mode === 'create' && current !== undefined) {
        throw new GatewayError('GW_ERR_BACKEND_EXISTS', `backend key ${JSON.stringify(key)} already exists`, { details: { key } });
      }
      if (mode === 'update' && current === undefined) {
        throw new GatewayError('GW_ERR_BACKEND_NOT_FOUND', `backend key ${JSON.stringify(key)} does not exist`, { details: { key } });
      }
      if (mode === 'cas' && current !== expected) {
        const found = current === undefined ? 'absent' : `at revision ${current}`;
        throw this.conflict(`backend key ${JSON.stringify(key)} is ${found}, not at the expected revision ${expected}`, {
          key,
          expectedRevision: expected,
          actualRevision: current,
        });
      }
    };
    if (mode === 'put') {
      const expiresAt = expiryOf(ttlMs, now);
      const revision = await this.blindPut(key, value, expiresAt);
      return expiresAt === undefined ? { key, value, revision } : { key, value, revision, expiresAt };
    }
    const op: WriteOp = ttlMs === undefined ? { type: 'put', key, value } : { type: 'put', key, value, ttlMs };
    const { revision, plan } = await this.writeOps(now, [op], check, [key]);
    const put = plan.events[0] as Extract<WritePlan['events'][number], { type: 'put' }>;
    return put.expiresAt === undefined ? { key, value, revision: revision! } : { key, value, revision: revision!, expiresAt: put.expiresAt };
  }

  private sweepTick(): void {
    if (this.closed) return;
    (async () => {
      const swept = await this.sweep(true);
      const horizon = await this.trimChanges();
      if (swept > 0) this.log.debug({ deleted: swept, horizon }, 'expired backend items swept');
    })().catch((err: unknown) => {
      if (!this.closed) this.log.warn({ err: this.failure(err).message }, 'backend sweep or change-log trim failed; will retry');
    });
  }

  /** One sweep batch at a time under the write lock; with tryOnly, skips when another Auth Service is sweeping. */
  private async sweep(tryOnly: boolean): Promise<number> {
    this.guard();
    let total = 0;
    for (;;) {
      const now = this.clock();
      if (tryOnly && (await this.query('gateway_any_expired', SQL.anyExpired, [now])).length === 0) return total;
      const n = await this.transaction(async (client) => {
        // The advisory lock first: a process that finds another one sweeping does not queue for the write lock.
        if (tryOnly) {
          const got = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1, $2) AS ok', [LOCK_SPACE, LOCK.sweep]);
          if (!got.rows[0]!.ok) return undefined;
        } else {
          await client.query('SELECT pg_advisory_xact_lock($1, $2)', [LOCK_SPACE, LOCK.sweep]);
        }
        const head = await this.lock(client);
        const r = await client.query<{ key: string }>({ name: 'gateway_sweep', text: SQL.sweep, values: [now] });
        const keys = r.rows.map((row) => row.key).sort(compareKeys);
        if (keys.length === 0) return { n: 0, revision: undefined };
        await this.apply(client, head + 1, { events: keys.map((key) => ({ type: 'delete', key })), upserts: new Map(), deletes: new Set() });
        return { n: keys.length, revision: head + 1 };
      }, false);
      if (n === undefined) return total;
      if (n.revision !== undefined) this.committed(n.revision);
      total += n.n;
      if (n.n < SWEEP_BATCH) return total;
    }
  }

  // --- opening -----------------------------------------------------------------------------------------------------

  /** Checks the server, creates or checks the schema, starts the change feed and the sweep. */
  async init(): Promise<void> {
    let client: pg.PoolClient;
    try {
      client = await this.pool.connect();
    } catch (err) {
      throw this.failure(err, 'open');
    }
    let head: number;
    try {
      head = await this.prepareSchema(client);
      client.release();
    } catch (err) {
      client.release(err as Error);
      throw this.failure(err, 'open');
    }
    this.follower = new ChangeFollower({
      newClient: () => new pg.Client({ ...this.clientConfig, query_timeout: 30_000 }),
      hub: this.hub,
      log: this.log,
      startRevision: head,
      pollIntervalMs: this.options.pollIntervalMs ?? POSTGRES_BACKEND_DEFAULTS.pollIntervalMs,
      describe: (err, phase) => this.failure(err, phase),
    });
    await this.follower.start();
    const sweepIntervalMs = this.options.sweepIntervalMs ?? POSTGRES_BACKEND_DEFAULTS.sweepIntervalMs;
    if (sweepIntervalMs > 0) {
      this.sweepTimer = setInterval(() => this.sweepTick(), sweepIntervalMs);
      this.sweepTimer.unref();
    }
  }

  private async prepareSchema(client: pg.PoolClient): Promise<number> {
    const encoding = (await client.query<{ server_encoding: string }>('SHOW server_encoding')).rows[0]!.server_encoding;
    if (encoding !== 'UTF8') {
      throw new GatewayError('GW_ERR_BACKEND_OPEN', `cannot open the backend ${this.display}: the database's encoding is ${encoding}, not UTF8`, {
        hint: `Create the database with UTF8: createdb -E UTF8 -T template0 -O ${this.spec.user ?? 'USER'} ${this.spec.database}.`,
        details: { encoding },
      });
    }
    await client.query('BEGIN');
    await client.query('SELECT pg_advisory_xact_lock($1, $2)', [LOCK_SPACE, LOCK.schema]);
    // Tables a DBA created (or an earlier start) are used as they are: CREATE ... IF NOT EXISTS would still
    // need the CREATE privilege on the schema, which a least-privilege user does not have.
    const ready = await client.query<{ ready: boolean }>(
      `SELECT to_regclass('gateway_meta') IS NOT NULL AND to_regclass('gateway_kv') IS NOT NULL
              AND to_regclass('gateway_changes') IS NOT NULL AS ready`,
    );
    if (!ready.rows[0]!.ready) await client.query(SCHEMA);
    const meta = await client.query<{ name: string; value: string }>(`SELECT name, value FROM gateway_meta WHERE name IN ('schema', 'revision')`);
    await client.query('COMMIT');
    const value = (name: string) => Number(meta.rows.find((r) => r.name === name)?.value);
    if (value('schema') > POSTGRES_SCHEMA_VERSION) {
      throw new GatewayError('GW_ERR_BACKEND_OPEN', `cannot open the backend ${this.display}: it was written by a newer gateway (schema ${value('schema')}, this one knows up to ${POSTGRES_SCHEMA_VERSION})`, {
        hint: 'Run the newer gateway version, or restore a backup made by this version.',
      });
    }
    return value('revision');
  }

  // --- Backend -----------------------------------------------------------------------------------------------------

  async get(key: string): Promise<Item | undefined> {
    this.guard();
    checkKey(key);
    const rows = await this.query<Row>('gateway_get', SQL.get, [key, this.clock()]);
    return rows[0] === undefined ? undefined : toItem(rows[0]);
  }

  async range(prefix: string, options: { limit?: number } = {}): Promise<Item[]> {
    this.guard();
    checkPrefix(prefix);
    checkLimit(options.limit);
    const [lower, upper] = bounds(prefix);
    return (await this.query<Row>('gateway_range', SQL.range, [lower, this.clock(), upper, options.limit ?? null])).map(toItem);
  }

  put(key: string, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('put', key, value, options);
  }

  create(key: string, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('create', key, value, options);
  }

  update(key: string, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('update', key, value, options);
  }

  compareAndSwap(key: string, expectedRevision: number, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('cas', key, value, options, expectedRevision);
  }

  async delete(key: string): Promise<boolean> {
    this.guard();
    checkKey(key);
    return (await this.writeOps(this.clock(), [{ type: 'delete', key }])).revision !== undefined;
  }

  async deleteRange(prefix: string): Promise<number> {
    this.guard();
    checkPrefix(prefix, true);
    return (await this.writeOps(this.clock(), [{ type: 'deleteRange', prefix }])).plan.events.length;
  }

  async atomicWrite(conditions: Condition[], ops: WriteOp[]): Promise<number> {
    this.guard();
    if (!Array.isArray(conditions) || !Array.isArray(ops)) {
      throw new GatewayError('GW_ERR_BACKEND_INVALID', 'atomicWrite takes an array of conditions and an array of ops');
    }
    const now = this.clock();
    for (const c of conditions) checkCondition(c);
    for (const op of ops) checkWriteOp(op, now);
    const check: WriteCheck = (live) => {
      conditions.forEach((c, index) => {
        const current = live.get(c.key);
        const holds = 'revision' in c ? current === c.revision : c.exists === (current !== undefined);
        if (holds) return;
        const found = current === undefined ? 'absent' : `at revision ${current}`;
        const wanted = 'revision' in c ? `at revision ${c.revision}` : c.exists ? 'present' : 'absent';
        throw this.conflict(`atomic write condition ${index} failed: backend key ${JSON.stringify(c.key)} is ${found}, not ${wanted}`, {
          key: c.key,
          condition: index,
          actualRevision: current,
        });
      });
    };
    const written = await this.writeOps(now, ops, check, conditions.map((c) => c.key));
    return written.revision ?? written.head;
  }

  watch(prefix: string, onEvent: (event: WatchEvent) => void, options: WatchOptions = {}): () => void {
    this.guard();
    checkWatch(prefix, onEvent, options);
    this.follower?.watcherAdded();
    // Like SQLite, a watcher does not hear of writes this process made before it came; unlike SQLite, it may hear
    // of other processes' writes committed shortly before (those the change feed had not delivered yet).
    return this.hub.add(prefix, onEvent, options.onError, this.lastWritten);
  }

  sweepExpired(): Promise<number> {
    return this.sweep(false);
  }

  async compactChanges(throughRevision: number): Promise<number> {
    this.guard();
    checkRevision(throughRevision);
    const rows = await this.query<{ value: string }>('gateway_compact', SQL.compact, [throughRevision]);
    return Number(rows[0]!.value);
  }

  async trimChanges(): Promise<number> {
    this.guard();
    const retention = this.options.changeRetentionMs ?? POSTGRES_BACKEND_DEFAULTS.changeRetentionMs;
    let horizon = 0;
    for (;;) {
      const upto = await this.transaction(async (client) => {
        const got = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_xact_lock($1, $2) AS ok', [LOCK_SPACE, LOCK.trim]);
        if (!got.rows[0]!.ok) return undefined;
        const r = await client.query<{ upto: string | null }>({ name: 'gateway_trimmable', text: SQL.trimmable, values: [retention] });
        const upto = r.rows[0]?.upto;
        if (upto === null || upto === undefined) return undefined;
        const c = await client.query<{ value: string }>({ name: 'gateway_compact', text: SQL.compact, values: [Number(upto)] });
        return Number(c.rows[0]!.value);
      }, false);
      if (upto === undefined) return horizon;
      horizon = upto;
    }
  }

  async caughtUp(): Promise<number> {
    this.guard();
    const rows = await this.query<{ value: string }>('gateway_head', SQL.head, []);
    const head = Number(rows[0]!.value);
    await this.follower!.waitFor(head);
    return head;
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      this.closed = true;
      if (this.sweepTimer !== undefined) clearInterval(this.sweepTimer);
      this.hub.clear();
      await this.follower?.close();
      await this.pool.end().catch((err: unknown) => this.log.debug({ err }, 'closing the backend pool failed'));
    })();
    return this.closing;
  }
}

function readTlsFiles(options: PostgresBackendOptions, display: string): PgTlsFiles {
  const files: PgTlsFiles = {};
  const entries = [
    ['ca', 'ca_file', options.caFile],
    ['cert', 'cert_file', options.certFile],
    ['key', 'key_file', options.keyFile],
  ] as const;
  for (const [field, setting, file] of entries) {
    if (file === undefined) continue;
    try {
      files[field] = readFileSync(file, 'utf8');
    } catch (err) {
      throw new GatewayError('GW_ERR_BACKEND_TLS', `cannot open the backend ${display}: cannot read gateway.storage.${setting} ${file}: ${(err as Error).message}`, {
        hint: `Check that ${file} exists and that this user may read it.`,
        cause: err,
        details: { file },
      });
    }
  }
  if ((files.cert === undefined) !== (files.key === undefined)) {
    throw new GatewayError('GW_ERR_BACKEND_TLS', `cannot open the backend ${display}: a client certificate needs both cert_file and key_file`, {
      hint: 'Set gateway.storage.cert_file and gateway.storage.key_file together.',
    });
  }
  return files;
}

/** The pg client settings of a backend: address, login, TLS and the per-session limits. */
export function pgClientConfig(spec: PgConnSpec, files: PgTlsFiles, options: Pick<PostgresBackendOptions, 'lockTimeoutMs' | 'connectTimeoutMs'> = {}): pg.ClientConfig {
  const mode = tlsMode(spec, { ca: files.ca !== undefined, cert: files.cert !== undefined });
  const lockTimeoutMs = options.lockTimeoutMs ?? POSTGRES_BACKEND_DEFAULTS.lockTimeoutMs;
  return {
    host: spec.host,
    port: spec.port,
    ...(spec.user === undefined ? {} : { user: spec.user }),
    ...(spec.password === undefined ? {} : { password: spec.password }),
    database: spec.database,
    ssl: tlsOptions(mode, files),
    application_name: spec.applicationName ?? 'gateway',
    connectionTimeoutMillis: spec.connectTimeoutMs ?? options.connectTimeoutMs ?? POSTGRES_BACKEND_DEFAULTS.connectTimeoutMs,
    keepAlive: true,
    // A write waits this long for another Auth Service's write lock; a session stuck inside a transaction (a
    // hung process) is ended by the server so that it cannot hold the lock for ever.
    options: `-c lock_timeout=${lockTimeoutMs} -c idle_in_transaction_session_timeout=${Math.max(60_000, lockTimeoutMs * 6)}`,
  };
}

/** Connects, creates or checks the schema and starts the change feed. Throws GW_ERR_BACKEND_OPEN, _UNREACHABLE, _AUTH, _TLS. */
export async function openPostgresBackend(options: PostgresBackendOptions): Promise<PostgresBackend> {
  let spec: PgConnSpec;
  try {
    spec = parsePgConnString(options?.connString);
  } catch (err) {
    if (!(err instanceof ConnStringError)) throw err;
    throw new GatewayError('GW_ERR_BACKEND_OPEN', `cannot open the backend: ${err.message}`, { hint: err.hint });
  }
  const files = readTlsFiles(options, spec.display);
  const backend = new PostgresBackendImpl(spec, pgClientConfig(spec, files, options), options);
  try {
    await backend.init();
  } catch (err) {
    await backend.close();
    throw err;
  }
  return backend;
}
