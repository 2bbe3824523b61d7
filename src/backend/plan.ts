/**
 * What a write does, worked out before anything is written (the PostgreSQL backend applies the result in one
 * statement). Given the live keys the write can touch (read under the write lock) and its ops in order, each op
 * seeing the earlier ones: the events in order, and per key its final row (upsert or delete). Pure.
 */
import { compareKeys } from './keys.js';
import type { WriteOp } from './types.js';

export type PlannedEvent =
  | { type: 'put'; key: string; value: string; expiresAt: number | undefined }
  | { type: 'delete'; key: string };

export interface WritePlan {
  events: PlannedEvent[];
  /** Final rows to write, by key. */
  upserts: Map<string, { value: string; expiresAt: number | undefined }>;
  /** Keys whose rows go. Disjoint from upserts. */
  deletes: Set<string>;
}

export interface LiveState {
  /** Whether key holds a live item before the write (asked for every key of a put or delete op). */
  live(key: string): boolean;
  /** The live keys under prefix before the write (for a deleteRange op). */
  liveUnder(prefix: string): readonly string[];
}

export function planWrite(ops: readonly WriteOp[], state: LiveState, expiryOf: (ttlMs: number | undefined) => number | undefined): WritePlan {
  const events: PlannedEvent[] = [];
  const upserts = new Map<string, { value: string; expiresAt: number | undefined }>();
  const deletes = new Set<string>();
  /** Keys this write has made live (true) or removed (false). */
  const overlay = new Map<string, boolean>();
  const isLive = (key: string): boolean => overlay.get(key) ?? state.live(key);
  const remove = (key: string): void => {
    events.push({ type: 'delete', key });
    overlay.set(key, false);
    upserts.delete(key);
    deletes.add(key);
  };
  for (const op of ops) {
    if (op.type === 'put') {
      const expiresAt = expiryOf(op.ttlMs);
      events.push({ type: 'put', key: op.key, value: op.value, expiresAt });
      overlay.set(op.key, true);
      deletes.delete(op.key);
      upserts.set(op.key, { value: op.value, expiresAt });
    } else if (op.type === 'delete') {
      if (isLive(op.key)) remove(op.key);
    } else {
      const keys = new Set(state.liveUnder(op.prefix));
      for (const [key, live] of overlay) if (live && key.startsWith(op.prefix)) keys.add(key);
      for (const key of [...keys].filter(isLive).sort(compareKeys)) remove(key);
    }
  }
  return { events, upserts, deletes };
}
