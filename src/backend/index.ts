/**
 * Cluster-state storage (docs/backend.md). Callers depend on the Backend interface only; openBackend picks the
 * implementation from the configuration.
 */
import path from 'node:path';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { openSqliteBackend, SQLITE_BACKEND_FILE, type SqliteBackend } from './sqlite.js';
import type { Backend } from './types.js';

export type { Backend, Condition, Item, PutOptions, WatchEvent, WriteOp } from './types.js';
export { compareKeys, prefixSuccessor, MAX_KEY_BYTES } from './keys.js';
export {
  openSqliteBackend,
  SQLITE_BACKEND_DEFAULTS,
  SQLITE_BACKEND_FILE,
  type SqliteBackend,
  type SqliteBackendOptions,
} from './sqlite.js';

export type BackendConfig =
  | { type: 'sqlite'; path: string; sweepIntervalMs?: number }
  /** The shared backend for several proxies on one cluster: not implemented yet. */
  | { type: 'postgres'; connString: string };

export interface OpenBackendOptions {
  /** ms since the epoch; Date.now by default. */
  clock?: () => number;
  logger?: Logger;
}

/** The embedded backend's file in a data directory: <data_dir>/backend.sqlite. */
export function defaultSqlitePath(dataDir: string): string {
  return path.join(dataDir, SQLITE_BACKEND_FILE);
}

/** Opens the backend the configuration names. Throws GW_ERR_BACKEND_OPEN. */
export function openBackend(config: BackendConfig, options: OpenBackendOptions = {}): Backend {
  const type = (config as { type?: unknown } | undefined)?.type;
  switch (type) {
    case 'sqlite': {
      const c = config as Extract<BackendConfig, { type: 'sqlite' }>;
      const backend: SqliteBackend = openSqliteBackend({
        path: c.path,
        ...(c.sweepIntervalMs === undefined ? {} : { sweepIntervalMs: c.sweepIntervalMs }),
        ...(options.clock === undefined ? {} : { clock: options.clock }),
        ...(options.logger === undefined ? {} : { logger: options.logger }),
      });
      return backend;
    }
    case 'postgres':
      throw new GatewayError('GW_ERR_BACKEND_OPEN', 'cannot open the backend: postgres is not implemented yet', {
        hint: 'Use the embedded sqlite backend (the default, in the data directory) until PostgreSQL support lands.',
        details: { type },
      });
    default:
      throw new GatewayError('GW_ERR_BACKEND_OPEN', `cannot open the backend: unknown backend type ${JSON.stringify(type)}`, {
        hint: 'Use type sqlite (embedded, the default) or postgres (shared, for several proxies; not implemented yet).',
        details: { type },
      });
  }
}
