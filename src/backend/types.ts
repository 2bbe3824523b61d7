/**
 * The cluster-state storage interface the Auth Service keeps users, roles, tokens, certificate authorities,
 * nodes and events in. Two implementations: SQLite, embedded (src/backend/sqlite.ts), and PostgreSQL, shared by
 * several Auth Services of one cluster (src/backend/postgres.ts); docs/backend.md.
 *
 * Semantics every implementation keeps (the model test in test/backend/model.test.ts pins them down):
 * - One cluster-wide `revision` counter, persisted, increased by one for every write that changes something;
 *   every item written by that write carries its revision (like etcd's mod_revision). Writes that change
 *   nothing (delete of an absent key, deleteRange matching nothing, an atomicWrite whose ops change nothing)
 *   do not increase it.
 * - Keys are non-empty, well-formed strings without NUL of at most 1024 UTF-8 bytes; they are ordered by
 *   Unicode code point (= UTF-8 byte order, PostgreSQL's "C" collation). A prefix matches by plain string
 *   prefix: no wildcards, '/users/' never matches '/usersx'. Keys are not secret: they may appear in errors
 *   and logs, so never use a secret (a join token) as a key; use a hash of it.
 * - Values are JSON text, stored and returned byte for byte (no normalisation).
 * - Each write replaces the whole item, TTL included: a put without ttlMs makes the item permanent.
 * - An item whose expiresAt is at or before the clock's now is invisible at once to every read, condition and
 *   write (create succeeds over it, update/compareAndSwap/delete do not see it); a periodic sweep deletes it
 *   and emits its delete event.
 */

export interface Item {
  key: string;
  /** JSON text. */
  value: string;
  /** The cluster revision of the write that last changed this item. */
  revision: number;
  /** ms since the epoch; absent for items without a TTL. */
  expiresAt?: number;
}

export interface PutOptions {
  /** Time to live in ms (positive); the item expires at now + ttlMs. */
  ttlMs?: number;
}

export type Condition =
  /** The item exists (and has not expired) at exactly this revision. */
  | { key: string; revision: number }
  | { key: string; exists: false }
  | { key: string; exists: true };

export type WriteOp =
  | { type: 'put'; key: string; value: string; ttlMs?: number }
  | { type: 'delete'; key: string }
  | { type: 'deleteRange'; prefix: string };

export type WatchEvent = { type: 'put'; item: Item } | { type: 'delete'; key: string; revision: number };

export interface WatchOptions {
  /**
   * Called (once) when the backend can no longer give this watcher every event in order, after which the watcher
   * is ended: GW_ERR_BACKEND_COMPACTED when the backend fell behind the change log's trimmed horizon (PostgreSQL,
   * after a connection outage longer than the log's retention). The caller re-lists with range() and watches
   * again. Without onError such a gap is logged as an error and the watcher goes on with the events after it.
   */
  onError?: (err: Error & { code: string }) => void;
}

export interface Backend {
  /** The live item at key, or undefined. */
  get(key: string): Promise<Item | undefined>;
  /** Live items whose key starts with prefix, ordered by key (code point order); '' lists everything. */
  range(prefix: string, options?: { limit?: number }): Promise<Item[]>;
  /** Creates or replaces the item. */
  put(key: string, value: string, options?: PutOptions): Promise<Item>;
  /** Creates the item; GW_ERR_BACKEND_EXISTS if a live item is at key. */
  create(key: string, value: string, options?: PutOptions): Promise<Item>;
  /** Replaces the item; GW_ERR_BACKEND_NOT_FOUND if no live item is at key. */
  update(key: string, value: string, options?: PutOptions): Promise<Item>;
  /** Replaces the item if it is live at exactly expectedRevision; else GW_ERR_BACKEND_CONFLICT (also when absent). */
  compareAndSwap(key: string, expectedRevision: number, value: string, options?: PutOptions): Promise<Item>;
  /** true if a live item was deleted. */
  delete(key: string): Promise<boolean>;
  /** Deletes the live items under prefix (which must not be empty); returns how many. */
  deleteRange(prefix: string): Promise<number>;
  /**
   * All conditions hold, then all ops apply, atomically; else nothing changes and GW_ERR_BACKEND_CONFLICT names
   * the first failed condition. Returns the new revision. Ops apply in order with one revision, so a later op
   * sees the effect of an earlier one; when no op changes anything, the current revision is returned.
   */
  atomicWrite(conditions: Condition[], ops: WriteOp[]): Promise<number>;
  /**
   * Events for keys under prefix ('' for all), delivered after commit, in revision order (events of one
   * write in the order of its ops; a deleteRange or sweep in key order), of every write committed after watch()
   * returned (PostgreSQL: by any process sharing the database, and possibly a few committed just before).
   * Returns an unsubscribe function. A listener that throws is logged and does not affect the write or other
   * listeners.
   */
  watch(prefix: string, onEvent: (event: WatchEvent) => void, options?: WatchOptions): () => void;
  /** Stops the sweep and the watchers and releases the storage; idempotent. Later calls give GW_ERR_BACKEND_CLOSED. */
  close(): Promise<void>;
}
