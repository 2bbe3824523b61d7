/**
 * The embedded backend: one SQLite file (by default <data_dir>/backend.sqlite) through better-sqlite3.
 *
 *   gateway_meta(name, value)                      'revision': the cluster-wide revision counter
 *   gateway_kv(key, value, revision, expires_at)   one row per item; WITHOUT ROWID, so the table is the key index
 *
 * Every write is one BEGIN IMMEDIATE transaction that takes the write lock first (so two processes on one file
 * wait on the busy timeout instead of failing to upgrade a read lock), bumps the revision and writes the rows;
 * its watch events are published after COMMIT. Reads are single statements, each its own snapshot. Prefixes
 * select the key range [prefix, successor(prefix)) (keys.ts), which the primary key serves as an index range
 * scan and which treats '%' and '_' as the plain characters they are.
 *
 * Watchers see the writes of this process only: a second process writing the same file (gwctl against a
 * stopped auth server, say) is safe for the data but invisible to watchers here.
 */
import fs from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { GatewayError, toGatewayError } from '../errors.js';
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
import type { Backend, Condition, Item, PutOptions, WatchEvent, WatchOptions, WriteOp } from './types.js';
import { WatchHub } from './watchers.js';

export interface SqliteBackendOptions {
  /** The database file; its directory is created (0700) if missing. ':memory:' for a throw-away backend. */
  path: string;
  /** ms since the epoch; Date.now by default. Expiry is judged by this clock. */
  clock?: () => number;
  /** How often expired items are deleted (and their delete events emitted); 0 turns the timer off. */
  sweepIntervalMs?: number;
  /** How long a write waits for the lock held by another connection before failing. */
  busyTimeoutMs?: number;
  logger?: Logger;
}

export const SQLITE_BACKEND_DEFAULTS = Object.freeze({
  sweepIntervalMs: 10_000,
  busyTimeoutMs: 5_000,
});

/** The file name of the embedded backend inside the data directory. */
export const SQLITE_BACKEND_FILE = 'backend.sqlite';

/** The SQLite backend also lets tests (and the auth server at shutdown) run the expiry sweep on demand. */
export interface SqliteBackend extends Backend {
  readonly path: string;
  /** Deletes every expired item, emitting its delete event; returns how many. */
  sweepExpired(): Promise<number>;
}

/** 'GWAY' in the SQLite header, so a gateway refuses to take over some other program's database. */
const APPLICATION_ID = 0x47574159;
const SCHEMA_VERSION = 1;
const SWEEP_BATCH = 1000;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS gateway_meta (
  name  TEXT    NOT NULL PRIMARY KEY,
  value INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
INSERT OR IGNORE INTO gateway_meta (name, value) VALUES ('revision', 0);
CREATE TABLE IF NOT EXISTS gateway_kv (
  key        TEXT    NOT NULL PRIMARY KEY,
  value      TEXT    NOT NULL,
  revision   INTEGER NOT NULL,
  expires_at INTEGER
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gateway_kv_expires ON gateway_kv (expires_at) WHERE expires_at IS NOT NULL;
`;

interface Row {
  key: string;
  value: string;
  revision: number;
  expires_at: number | null;
}

const LIVE = '(expires_at IS NULL OR expires_at > @now)';
const COLUMNS = 'key, value, revision, expires_at';

function toItem(row: Row): Item {
  return row.expires_at === null
    ? { key: row.key, value: row.value, revision: row.revision }
    : { key: row.key, value: row.value, revision: row.revision, expiresAt: row.expires_at };
}

function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Why a backend file cannot be opened, in words, with what to do about it. */
function describeOpenFailure(file: string, err: unknown): { reason: string; hint: string } {
  const code = errorCode(err) ?? '';
  const dir = path.dirname(file);
  if (code === 'EACCES' || code === 'EPERM' || code.startsWith('SQLITE_READONLY')) {
    return {
      reason: `permission denied (${errorMessage(err)})`,
      hint:
        `Give this user read and write access to ${file} and write access to ${dir} ` +
        `(SQLite creates ${path.basename(file)}-wal and -shm next to it).`,
    };
  }
  if (code === 'ENOTDIR' || code === 'ENOENT') {
    return {
      reason: `a parent of the path is missing or not a directory (${errorMessage(err)})`,
      hint: 'Point the backend (or gateway.data_dir) at a path inside a directory.',
    };
  }
  if (code === 'EROFS') {
    return { reason: 'the file system is read-only', hint: 'Put the data directory on a writable file system.' };
  }
  if (code === 'ENOSPC' || code === 'SQLITE_FULL') {
    return { reason: 'no space left on the device', hint: `Free some space on the file system holding ${dir}.` };
  }
  if (code === 'SQLITE_NOTADB' || code.startsWith('SQLITE_CORRUPT')) {
    return {
      reason: `the file is not a SQLite database or is damaged (${errorMessage(err)})`,
      hint: `Move ${file} aside (the gateway then starts with an empty cluster state) or restore it from a backup.`,
    };
  }
  if (code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED')) {
    return {
      reason: 'the database is locked by another process',
      hint: 'Stop the other gateway process that uses this data directory, or give each one its own.',
    };
  }
  if (code.startsWith('SQLITE_CANTOPEN')) {
    return {
      reason: `SQLite cannot open the file or its -wal/-shm files (${errorMessage(err)})`,
      hint: `Check that ${dir} is a writable directory on a local file system.`,
    };
  }
  return { reason: errorMessage(err), hint: 'Check the path, its permissions and the free space on its file system.' };
}

function openError(file: string, reason: string, hint: string, cause?: unknown): GatewayError {
  return new GatewayError('GW_ERR_BACKEND_OPEN', `cannot open the backend ${file}: ${reason}`, {
    hint,
    cause,
    details: { path: file },
  });
}

function openFailure(file: string, err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  const { reason, hint } = describeOpenFailure(file, err);
  return openError(file, reason, hint, err);
}

/** Creates the directory (0700) and the file (0600) ourselves, so SQLite never creates them with umask modes. */
function prepareFile(file: string): void {
  const dir = path.dirname(file);
  let created: string | undefined;
  try {
    created = fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  } catch (err) {
    throw openFailure(file, err);
  }
  if (created !== undefined) {
    // mkdir's mode passes through the umask; set it exactly on every directory we made.
    for (let d = dir; ; d = path.dirname(d)) {
      fs.chmodSync(d, 0o700);
      if (d === created || d === path.dirname(d)) break;
    }
  }
  let stat: fs.Stats | undefined;
  try {
    stat = fs.statSync(file);
  } catch (err) {
    if (errorCode(err) !== 'ENOENT') throw openFailure(file, err);
  }
  if (stat !== undefined && !stat.isFile()) {
    throw openError(
      file,
      stat.isDirectory() ? 'the path is a directory' : 'the path is not a regular file',
      `Give the path of a file, e.g. ${path.join(file, SQLITE_BACKEND_FILE)}.`,
    );
  }
  let fd: number | undefined;
  try {
    fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
    // The cluster state holds CA private keys: owner only, whatever the umask or an earlier chmod said.
    fs.fchmodSync(fd, 0o600);
  } catch (err) {
    throw openFailure(file, err);
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

class SqliteBackendImpl implements SqliteBackend {
  readonly path: string;
  private readonly db: Database.Database;
  private readonly clock: () => number;
  private readonly log: Logger;
  private readonly hub: WatchHub;
  private readonly sweepTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly s: ReturnType<typeof prepareStatements>;
  private readonly tx: Database.Transaction<(body: () => unknown) => unknown>;

  constructor(options: SqliteBackendOptions) {
    const memory = options.path === ':memory:';
    this.path = memory ? options.path : path.resolve(options.path);
    this.clock = options.clock ?? Date.now;
    this.log = options.logger ?? componentLogger('backend');
    this.hub = new WatchHub(this.log);
    const busyTimeoutMs = options.busyTimeoutMs ?? SQLITE_BACKEND_DEFAULTS.busyTimeoutMs;
    const sweepIntervalMs = options.sweepIntervalMs ?? SQLITE_BACKEND_DEFAULTS.sweepIntervalMs;

    if (!memory) prepareFile(this.path);
    let db: Database.Database | undefined;
    try {
      db = new Database(this.path, { timeout: busyTimeoutMs });
      initDatabase(db, this.path, this.log);
      this.s = prepareStatements(db);
    } catch (err) {
      db?.close();
      throw openFailure(this.path, err);
    }
    this.db = db;
    if (!memory) {
      // SQLite gives -wal and -shm the mode of the database file; make sure of it, independent of the umask.
      for (const suffix of ['-wal', '-shm']) {
        try {
          fs.chmodSync(this.path + suffix, 0o600);
        } catch (err) {
          if (errorCode(err) !== 'ENOENT') this.log.warn({ err, file: this.path + suffix }, 'cannot chmod 0600');
        }
      }
    }
    this.tx = db.transaction((body: () => unknown) => body());
    if (sweepIntervalMs > 0) {
      this.sweepTimer = setInterval(() => this.sweepTick(), sweepIntervalMs);
      this.sweepTimer.unref();
    }
  }

  // --- plumbing ------------------------------------------------------------------------------------------------

  /** Runs fn on the open database, turning SQLite failures into GW_ERR_BACKEND_FAILED. */
  private run<T>(fn: () => T): T {
    if (this.closed) {
      throw new GatewayError('GW_ERR_BACKEND_CLOSED', `the backend ${this.path} is closed`, {
        details: { path: this.path },
      });
    }
    try {
      return fn();
    } catch (err) {
      if (err instanceof GatewayError) throw err;
      if (errorCode(err)?.startsWith('SQLITE_')) throw this.failure(err);
      throw toGatewayError(err);
    }
  }

  private failure(err: unknown): GatewayError {
    const code = errorCode(err);
    const busy = code?.startsWith('SQLITE_BUSY') === true;
    return new GatewayError('GW_ERR_BACKEND_FAILED', `backend ${this.path}: ${errorMessage(err)}`, {
      cause: err,
      details: { path: this.path, ...(code === undefined ? {} : { sqliteCode: code }) },
      ...(busy ? { hint: 'Another process held the backend lock too long; make sure one gateway uses this data directory.' } : {}),
    });
  }

  /** One write transaction (BEGIN IMMEDIATE); its events go to the watchers after COMMIT, never on rollback. */
  private write<T>(body: (events: WatchEvent[]) => T): T {
    const events: WatchEvent[] = [];
    const result = this.run(() => this.tx.immediate(() => body(events)) as T);
    this.hub.publish(events);
    return result;
  }

  private bump(): number {
    return (this.s.bump.get() as { value: number }).value;
  }

  private live(key: string, now: number): Row | undefined {
    return this.s.get.get({ key, now }) as Row | undefined;
  }

  private putRow(key: string, value: string, revision: number, expiresAt: number | undefined, events: WatchEvent[]): Item {
    this.s.upsert.run({ key, value, revision, expires_at: expiresAt ?? null });
    const item: Item = expiresAt === undefined ? { key, value, revision } : { key, value, revision, expiresAt };
    events.push({ type: 'put', item: { ...item } });
    return item;
  }

  /** Deletes the live items under prefix; returns their keys in key order. */
  private deleteLiveRange(prefix: string, now: number): string[] {
    const upper = prefixSuccessor(prefix);
    const rows = (
      upper === undefined ? this.s.deleteFrom.all({ lower: prefix, now }) : this.s.deleteBetween.all({ lower: prefix, upper, now })
    ) as Array<{ key: string }>;
    return rows.map((r) => r.key).sort(compareKeys);
  }

  private conflict(message: string, details: Record<string, unknown>): GatewayError {
    return new GatewayError('GW_ERR_BACKEND_CONFLICT', message, { details });
  }

  private writeOne(
    mode: 'put' | 'create' | 'update' | 'cas',
    key: string,
    value: string,
    options: PutOptions | undefined,
    expectedRevision?: number,
  ): Item {
    return this.run(() => {
      checkKey(key);
      checkValue(value);
      if (mode === 'cas') checkRevision(expectedRevision);
      const now = this.clock();
      const expiresAt = expiryOf(options?.ttlMs, now);
      return this.write((events) => {
        if (mode !== 'put') {
          const current = this.live(key, now);
          if (mode === 'create' && current !== undefined) {
            throw new GatewayError('GW_ERR_BACKEND_EXISTS', `backend key ${JSON.stringify(key)} already exists`, {
              details: { key },
            });
          }
          if (mode === 'update' && current === undefined) {
            throw new GatewayError('GW_ERR_BACKEND_NOT_FOUND', `backend key ${JSON.stringify(key)} does not exist`, {
              details: { key },
            });
          }
          if (mode === 'cas' && current?.revision !== expectedRevision) {
            const found = current === undefined ? 'absent' : `at revision ${current.revision}`;
            throw this.conflict(
              `backend key ${JSON.stringify(key)} is ${found}, not at the expected revision ${expectedRevision}`,
              { key, expectedRevision, actualRevision: current?.revision },
            );
          }
        }
        return this.putRow(key, value, this.bump(), expiresAt, events);
      });
    });
  }

  private sweepTick(): void {
    if (this.closed) return;
    this.sweepExpired().then(
      (n) => {
        if (n > 0) this.log.debug({ deleted: n }, 'expired backend items swept');
      },
      (err: unknown) => this.log.warn({ err }, 'backend expiry sweep failed; will retry'),
    );
  }

  // --- Backend ---------------------------------------------------------------------------------------------------

  async get(key: string): Promise<Item | undefined> {
    return this.run(() => {
      checkKey(key);
      const row = this.live(key, this.clock());
      return row === undefined ? undefined : toItem(row);
    });
  }

  async range(prefix: string, options: { limit?: number } = {}): Promise<Item[]> {
    return this.run(() => {
      checkPrefix(prefix);
      checkLimit(options.limit);
      const now = this.clock();
      const limit = options.limit ?? -1; // a negative LIMIT is no limit in SQLite
      const upper = prefixSuccessor(prefix);
      const rows = (
        upper === undefined
          ? this.s.rangeFrom.all({ lower: prefix, now, limit })
          : this.s.rangeBetween.all({ lower: prefix, upper, now, limit })
      ) as Row[];
      return rows.map(toItem);
    });
  }

  async put(key: string, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('put', key, value, options);
  }

  async create(key: string, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('create', key, value, options);
  }

  async update(key: string, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('update', key, value, options);
  }

  async compareAndSwap(key: string, expectedRevision: number, value: string, options?: PutOptions): Promise<Item> {
    return this.writeOne('cas', key, value, options, expectedRevision);
  }

  async delete(key: string): Promise<boolean> {
    return this.run(() => {
      checkKey(key);
      const now = this.clock();
      return this.write((events) => {
        if (this.s.delete.run({ key, now }).changes === 0) return false;
        events.push({ type: 'delete', key, revision: this.bump() });
        return true;
      });
    });
  }

  async deleteRange(prefix: string): Promise<number> {
    return this.run(() => {
      checkPrefix(prefix, true);
      const now = this.clock();
      return this.write((events) => {
        const keys = this.deleteLiveRange(prefix, now);
        if (keys.length > 0) {
          const revision = this.bump();
          for (const key of keys) events.push({ type: 'delete', key, revision });
        }
        return keys.length;
      });
    });
  }

  async atomicWrite(conditions: Condition[], ops: WriteOp[]): Promise<number> {
    return this.run(() => {
      if (!Array.isArray(conditions) || !Array.isArray(ops)) {
        throw new GatewayError('GW_ERR_BACKEND_INVALID', 'atomicWrite takes an array of conditions and an array of ops');
      }
      const now = this.clock();
      for (const c of conditions) checkCondition(c);
      for (const op of ops) checkWriteOp(op, now);
      return this.write((events) => {
        conditions.forEach((c, index) => {
          const current = this.live(c.key, now);
          const holds = 'revision' in c ? current?.revision === c.revision : c.exists === (current !== undefined);
          if (holds) return;
          const found = current === undefined ? 'absent' : `at revision ${current.revision}`;
          const wanted = 'revision' in c ? `at revision ${c.revision}` : c.exists ? 'present' : 'absent';
          throw this.conflict(`atomic write condition ${index} failed: backend key ${JSON.stringify(c.key)} is ${found}, not ${wanted}`, {
            key: c.key,
            condition: index,
            actualRevision: current?.revision,
          });
        });
        let revision: number | undefined;
        const rev = (): number => (revision ??= this.bump());
        for (const op of ops) {
          if (op.type === 'put') {
            this.putRow(op.key, op.value, rev(), expiryOf(op.ttlMs, now), events);
          } else if (op.type === 'delete') {
            if (this.s.delete.run({ key: op.key, now }).changes > 0) events.push({ type: 'delete', key: op.key, revision: rev() });
          } else {
            for (const key of this.deleteLiveRange(op.prefix, now)) events.push({ type: 'delete', key, revision: rev() });
          }
        }
        return revision ?? (this.s.revision.get() as { value: number }).value;
      });
    });
  }

  watch(prefix: string, onEvent: (event: WatchEvent) => void, options: WatchOptions = {}): () => void {
    return this.run(() => {
      checkWatch(prefix, onEvent, options);
      // SQLite keeps no change log and never loses an event, so onError is never called.
      return this.hub.add(prefix, onEvent, options.onError);
    });
  }

  async sweepExpired(): Promise<number> {
    let total = 0;
    for (;;) {
      const n = this.write((events) => {
        const keys = (this.s.sweep.all({ now: this.clock(), limit: SWEEP_BATCH }) as Array<{ key: string }>)
          .map((r) => r.key)
          .sort(compareKeys);
        if (keys.length === 0) return 0;
        const revision = this.bump();
        for (const key of keys) events.push({ type: 'delete', key, revision });
        return keys.length;
      });
      total += n;
      if (n < SWEEP_BATCH) return total;
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.sweepTimer !== undefined) clearInterval(this.sweepTimer);
    this.hub.clear();
    try {
      this.db.close();
    } catch (err) {
      throw this.failure(err);
    }
  }
}

/** Checks that the file is ours (or empty), switches to WAL and creates or checks the schema. */
function initDatabase(db: Database.Database, file: string, log: Logger): void {
  // Reading the header first: a file that is not a database fails here (SQLITE_NOTADB), and a database of
  // another program is refused before anything (even the journal mode) is changed in it.
  const applicationId = db.pragma('application_id', { simple: true }) as number;
  const userVersion = db.pragma('user_version', { simple: true }) as number;
  if (applicationId !== APPLICATION_ID) {
    const { n } = db.prepare("SELECT count(*) AS n FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'").get() as {
      n: number;
    };
    if (applicationId !== 0 || n > 0) {
      throw openError(
        file,
        'the file is a SQLite database of some other program, not a gateway backend',
        `Point the backend at another path; the gateway does not take over ${file}.`,
      );
    }
  }
  if (userVersion > SCHEMA_VERSION) {
    throw openError(
      file,
      `the backend was written by a newer gateway (schema ${userVersion}, this one knows up to ${SCHEMA_VERSION})`,
      'Run the newer gateway version again, or restore a backup made by this version.',
    );
  }
  // WAL: readers never block the writer and a write is one append to the -wal file, not a rewrite of pages.
  const mode = db.pragma('journal_mode = WAL', { simple: true }) as string;
  if (mode !== 'wal' && file !== ':memory:') {
    log.warn({ path: file, journalMode: mode }, 'SQLite refused WAL mode (network file system?); writes will be slower');
  }
  // synchronous=NORMAL: in WAL mode SQLite then fsyncs at checkpoints, not at every commit. A crash of the
  // process loses nothing (the WAL is in the OS page cache) and a power cut or kernel crash never corrupts the
  // file, but may roll back the last commits before it. We take that for a large write-throughput gain (events,
  // node heartbeats), knowing the worst case is e.g. a certificate issued just before a power cut whose serial is
  // forgotten; FULL would fsync the WAL on every commit.
  db.pragma('synchronous = NORMAL');
  db.transaction(() => {
    db.exec(SCHEMA);
    db.pragma(`application_id = ${APPLICATION_ID}`);
    db.pragma(`user_version = ${SCHEMA_VERSION}`);
  }).immediate();
}

function prepareStatements(db: Database.Database) {
  return {
    get: db.prepare(`SELECT ${COLUMNS} FROM gateway_kv WHERE key = @key AND ${LIVE}`),
    rangeBetween: db.prepare(
      `SELECT ${COLUMNS} FROM gateway_kv WHERE key >= @lower AND key < @upper AND ${LIVE} ORDER BY key LIMIT @limit`,
    ),
    rangeFrom: db.prepare(`SELECT ${COLUMNS} FROM gateway_kv WHERE key >= @lower AND ${LIVE} ORDER BY key LIMIT @limit`),
    upsert: db.prepare(
      `INSERT INTO gateway_kv (key, value, revision, expires_at) VALUES (@key, @value, @revision, @expires_at)
       ON CONFLICT (key) DO UPDATE SET value = excluded.value, revision = excluded.revision, expires_at = excluded.expires_at`,
    ),
    delete: db.prepare(`DELETE FROM gateway_kv WHERE key = @key AND ${LIVE}`),
    deleteBetween: db.prepare(`DELETE FROM gateway_kv WHERE key >= @lower AND key < @upper AND ${LIVE} RETURNING key`),
    deleteFrom: db.prepare(`DELETE FROM gateway_kv WHERE key >= @lower AND ${LIVE} RETURNING key`),
    sweep: db.prepare(
      `DELETE FROM gateway_kv WHERE key IN
         (SELECT key FROM gateway_kv WHERE expires_at <= @now ORDER BY expires_at LIMIT @limit)
       RETURNING key`,
    ),
    bump: db.prepare(`UPDATE gateway_meta SET value = value + 1 WHERE name = 'revision' RETURNING value`),
    revision: db.prepare(`SELECT value FROM gateway_meta WHERE name = 'revision'`),
  };
}

/** Opens (creating if needed) the SQLite backend at options.path. Throws GW_ERR_BACKEND_OPEN. */
export function openSqliteBackend(options: SqliteBackendOptions): SqliteBackend {
  if (typeof options?.path !== 'string' || options.path === '') {
    throw openError(String(options?.path), 'no path given', 'Give the path of the backend file.');
  }
  return new SqliteBackendImpl(options);
}
