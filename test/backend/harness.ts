/**
 * One set of backend tests, two implementations: a harness gives the conformance suite (conformance.ts) and the
 * model test (model.ts) fresh storage and backends on it, for SQLite (a file in a temp dir) or PostgreSQL (a
 * database of its own per test on a real server that the test file starts once).
 */
import path from 'node:path';
import { afterEach } from 'vitest';
import { openPostgresBackend, openSqliteBackend, type Backend } from '../../src/backend/index.js';
import type { Logger } from '../../src/log.js';
import type { PostgresServer } from '../helpers/databases.js';
import { tempDir } from './helpers.js';

/** What every backend under test has besides the Backend interface. */
export interface TestBackend extends Backend {
  sweepExpired(): Promise<number>;
}

export interface HarnessOptions {
  clock?: () => number;
  logger?: Logger;
  /** Off (0) unless given. */
  sweepIntervalMs?: number;
}

export interface BackendHarness {
  readonly name: 'sqlite' | 'postgres';
  /** New, empty storage: a SQLite file path, or a PostgreSQL connection string. */
  location(): Promise<string>;
  /** A backend on location, closed after the test. */
  open(location: string, options?: HarnessOptions): Promise<TestBackend>;
  /** Makes the storage itself refuse writes of key (a trigger), to fail a write half-way. Call after a first open. */
  refuseKey(location: string, key: string): Promise<void>;
}

const opened: Backend[] = [];

afterEach(async () => {
  for (const b of opened.splice(0)) await b.close();
});

/** Waits until every committed event has reached b's watchers (PostgreSQL delivers them asynchronously). */
export async function settle(b: Backend): Promise<void> {
  const caughtUp = (b as { caughtUp?: () => Promise<number> }).caughtUp;
  if (caughtUp !== undefined) await caughtUp.call(b);
}

export const sqliteHarness: BackendHarness = {
  name: 'sqlite',
  location: async () => path.join(tempDir(), 'backend.sqlite'),
  async open(location, options = {}) {
    const b = openSqliteBackend({ sweepIntervalMs: 0, ...options, path: location });
    opened.push(b);
    return b;
  },
  async refuseKey(location, key) {
    const { default: Database } = await import('better-sqlite3');
    const raw = new Database(location);
    raw.exec(`CREATE TRIGGER refuse BEFORE INSERT ON gateway_kv WHEN NEW.key = '${key}' BEGIN SELECT RAISE(ABORT, 'refused'); END`);
    raw.close();
  },
};

/** Databases on server(), one per location(). */
export function postgresHarness(server: () => PostgresServer): BackendHarness {
  let databases = 0;
  return {
    name: 'postgres',
    async location() {
      const s = server();
      const name = `t${process.pid}_${++databases}`;
      await s.sql(`CREATE DATABASE ${name} OWNER ${s.user}`);
      return s.url(name);
    },
    async open(location, options = {}) {
      const b = await openPostgresBackend({ sweepIntervalMs: 0, ...options, connString: location });
      opened.push(b);
      return b;
    },
    async refuseKey(location, key) {
      const database = new URL(location).pathname.slice(1);
      await server().sql(
        `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON gateway_kv FOR EACH ROW WHEN (NEW.key = '${key}') EXECUTE FUNCTION refuse();`,
        database,
      );
    },
  };
}
