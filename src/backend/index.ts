/**
 * Cluster-state storage (docs/backend.md). Callers depend on the Backend interface only; openBackend picks the
 * implementation from the configuration. The PostgreSQL one (and its client library, pg) is loaded only when it
 * is opened: a cluster on SQLite, and every process without the Auth Service, never needs it.
 */
import path from 'node:path';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { PostgresBackend, PostgresBackendOptions } from './postgres.js';
import { instrumentBackend } from './instrument.js';
import { openSqliteBackend, SQLITE_BACKEND_FILE, type SqliteBackend } from './sqlite.js';
import type { Backend, WatchEvent } from './types.js';

export type { Backend, Condition, Item, PutOptions, WatchEvent, WatchOptions, WriteOp } from './types.js';
export { compareKeys, prefixSuccessor, MAX_KEY_BYTES } from './keys.js';
export {
  openSqliteBackend,
  SQLITE_BACKEND_DEFAULTS,
  SQLITE_BACKEND_FILE,
  type SqliteBackend,
  type SqliteBackendOptions,
} from './sqlite.js';
export type { PostgresBackend, PostgresBackendOptions } from './postgres.js';

/** src/backend/postgres.ts's openPostgresBackend, loaded on first use. */
export async function openPostgresBackend(options: PostgresBackendOptions): Promise<PostgresBackend> {
  return (await import('./postgres.js')).openPostgresBackend(options);
}

export type BackendConfig =
  | { type: 'sqlite'; path: string; sweepIntervalMs?: number }
  /** The shared backend for several Auth Services of one cluster. */
  | { type: 'postgres'; connString: string; caFile?: string; certFile?: string; keyFile?: string; sweepIntervalMs?: number };

export interface OpenBackendOptions {
  /** ms since the epoch; Date.now by default. */
  clock?: () => number;
  logger?: Logger;
}

/** The embedded backend's file in a data directory: <data_dir>/backend.sqlite. */
export function defaultSqlitePath(dataDir: string): string {
  return path.join(dataDir, SQLITE_BACKEND_FILE);
}

/**
 * The part of the configuration (GatewayConfig) that says where the state is. Written out here rather than
 * imported: config/ uses the backend's connection-string parser, and the two must not import each other.
 */
export interface StorageSource {
  readonly gateway: {
    readonly data_dir: string;
    readonly storage: {
      readonly type: 'sqlite' | 'postgres';
      readonly conn_string: string | undefined;
      readonly ca_file: string | undefined;
      readonly cert_file: string | undefined;
      readonly key_file: string | undefined;
    };
  };
}

/** The backend gateway.storage names: SQLite in the data directory, or PostgreSQL with its TLS files. Pure. */
export function backendConfigOf(config: StorageSource): BackendConfig {
  const { storage, data_dir: dataDir } = config.gateway;
  if (storage.type === 'sqlite') return { type: 'sqlite', path: defaultSqlitePath(dataDir) };
  return {
    type: 'postgres',
    connString: storage.conn_string ?? '',
    ...(storage.ca_file === undefined ? {} : { caFile: storage.ca_file }),
    ...(storage.cert_file === undefined ? {} : { certFile: storage.cert_file }),
    ...(storage.key_file === undefined ? {} : { keyFile: storage.key_file }),
  };
}

/**
 * Opens the backend the configuration names. Throws GW_ERR_BACKEND_OPEN, and for PostgreSQL also
 * GW_ERR_BACKEND_UNREACHABLE, GW_ERR_BACKEND_AUTH, GW_ERR_BACKEND_TLS or a TLS verification code.
 */
export async function openBackend(config: BackendConfig, options: OpenBackendOptions = {}): Promise<Backend> {
  const type = (config as { type?: unknown } | undefined)?.type;
  const common = {
    ...(config?.sweepIntervalMs === undefined ? {} : { sweepIntervalMs: config.sweepIntervalMs }),
    ...(options.clock === undefined ? {} : { clock: options.clock }),
    ...(options.logger === undefined ? {} : { logger: options.logger }),
  };
  switch (type) {
    case 'sqlite': {
      const c = config as Extract<BackendConfig, { type: 'sqlite' }>;
      const backend: SqliteBackend = openSqliteBackend({ path: c.path, ...common });
      return instrumentBackend(backend, 'sqlite');
    }
    case 'postgres': {
      const { type: _type, sweepIntervalMs: _sweep, ...c } = config as Extract<BackendConfig, { type: 'postgres' }>;
      const backend: PostgresBackend = await openPostgresBackend({ ...c, ...common });
      return instrumentBackend(backend, 'postgres');
    }
    default:
      throw new GatewayError('GW_ERR_BACKEND_OPEN', `cannot open the backend: unknown backend type ${JSON.stringify(type)}`, {
        hint: 'Use type sqlite (embedded, the default) or postgres (shared by several Auth Services).',
        details: { type },
      });
  }
}

/** openBackend(backendConfigOf(config)): what `gateway start` opens for the auth role. */
export function openConfiguredBackend(config: StorageSource, options: OpenBackendOptions = {}): Promise<Backend> {
  return openBackend(backendConfigOf(config), options);
}

/**
 * Watches prefix until the returned function is called, across a gap in the backend's change log: when the
 * backend can no longer give every event (GW_ERR_BACKEND_COMPACTED, after an outage longer than the log's
 * retention), onGap runs, so that the caller re-reads whatever it derives from the watched keys, and the watch
 * starts again from now. Events are never silently missed.
 */
export function watchAcrossGaps(backend: Backend, prefix: string, onEvent: (event: WatchEvent) => void, onGap: (err: Error & { code: string }) => void): () => void {
  let stopped = false;
  let unsubscribe = (): void => undefined;
  const start = (): void => {
    unsubscribe = backend.watch(prefix, onEvent, {
      onError: (err) => {
        if (stopped) return;
        onGap(err);
        start();
      },
    });
  };
  start();
  return () => {
    stopped = true;
    unsubscribe();
  };
}
