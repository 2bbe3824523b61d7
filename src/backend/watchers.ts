/**
 * Delivery of watch events, shared by backend implementations. Events are published after their write commits
 * and go through one queue, so every listener sees them in revision order even when a listener itself writes
 * to the backend (its write's events are queued behind the ones being delivered, not delivered in between).
 */
import type { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { WatchEvent, WatchOptions } from './types.js';

interface Watcher {
  readonly prefix: string;
  readonly onEvent: (event: WatchEvent) => void;
  readonly onError: WatchOptions['onError'];
  /** Events at or below this revision are not for this watcher (their writes committed before it came). */
  readonly after: number;
  active: boolean;
}

function keyOf(event: WatchEvent): string {
  return event.type === 'put' ? event.item.key : event.key;
}

function revisionOf(event: WatchEvent): number {
  return event.type === 'put' ? event.item.revision : event.revision;
}

export class WatchHub {
  private readonly watchers = new Set<Watcher>();
  private queue: WatchEvent[] = [];
  private delivering = false;

  constructor(private readonly log: Logger) {}

  get size(): number {
    return this.watchers.size;
  }

  /** after: the revision of a write known to have committed before this watcher came (its events are skipped). */
  add(prefix: string, onEvent: (event: WatchEvent) => void, onError?: WatchOptions['onError'], after = 0): () => void {
    const watcher: Watcher = { prefix, onEvent, onError, after, active: true };
    this.watchers.add(watcher);
    return () => {
      watcher.active = false;
      this.watchers.delete(watcher);
    };
  }

  /** Delivers events (of committed writes, in revision order) to the matching listeners. */
  publish(events: readonly WatchEvent[]): void {
    if (events.length === 0 || this.watchers.size === 0) return;
    for (const e of events) this.queue.push(deepFreeze(e));
    if (this.delivering) return; // an outer publish, up the stack, drains the queue
    this.delivering = true;
    try {
      for (let i = 0; i < this.queue.length; i++) {
        const event = this.queue[i]!;
        const key = keyOf(event);
        for (const w of [...this.watchers]) {
          if (!w.active || !key.startsWith(w.prefix) || revisionOf(event) <= w.after) continue;
          try {
            w.onEvent(event);
          } catch (err) {
            this.log.error({ err, prefix: w.prefix, key }, 'backend watch listener threw; event skipped for it');
          }
        }
      }
    } finally {
      this.queue = [];
      this.delivering = false;
    }
  }

  /**
   * Events were lost (err says why, e.g. GW_ERR_BACKEND_COMPACTED): watchers with onError get it and are ended
   * (they re-list and watch again); the others are told in the log and go on with the events that follow.
   */
  gap(err: GatewayError): void {
    let unwarned = 0;
    for (const w of [...this.watchers]) {
      if (!w.active) continue;
      if (w.onError === undefined) {
        unwarned++;
        continue;
      }
      w.active = false;
      this.watchers.delete(w);
      try {
        w.onError(err);
      } catch (e) {
        this.log.error({ err: e, prefix: w.prefix }, 'backend watch error handler threw');
      }
    }
    if (unwarned > 0) {
      this.log.error({ err, watchers: unwarned }, 'backend watchers without an error handler missed events; they go on with the events after the gap');
    }
  }

  clear(): void {
    for (const w of this.watchers) w.active = false;
    this.watchers.clear();
    this.queue = [];
  }
}

function deepFreeze(event: WatchEvent): WatchEvent {
  if (event.type === 'put') Object.freeze(event.item);
  return Object.freeze(event);
}
