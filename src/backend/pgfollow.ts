/**
 * The PostgreSQL backend's change feed: one dedicated connection that LISTENs on the change channel and reads
 * the change log (gateway_changes) by revision, handing the events to the watchers in revision order.
 *
 * NOTIFY is only the wake-up. What is delivered is always read from the log: every event with a revision above
 * the last one delivered, in (revision, seq) order, in one REPEATABLE READ snapshot together with the head and
 * the trimmed horizon. Writers take revisions under one row lock and commit in that order, so a snapshot never
 * shows revision n+1 without n: reading "above the last delivered" can skip nothing. A lost notification, a
 * dropped connection or a server restart therefore only delays events: after (re)connecting the feed LISTENs
 * first and then catches up, so a change committed in between is either in the catch-up read or notified after
 * it. A slow poll (and every local write) asks for a catch-up too, which also finds a connection that died
 * without a word. When the log was trimmed past what was delivered (an outage longer than the retention), the
 * watchers get GW_ERR_BACKEND_COMPACTED and the feed goes on from the head.
 *
 * One loop does everything (connect, LISTEN, catch up, back off), so nothing here runs twice at once. It backs
 * off by FEED_RETRY; a request() (a local write, a notification) or close() cuts the wait short.
 */
import type pg from 'pg';
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { Item, WatchEvent } from './types.js';
import type { WatchHub } from './watchers.js';

export const CHANGE_CHANNEL = 'gateway_changes';

/** Revisions read per catch-up query; a longer backlog takes several. */
const REVISIONS_PER_READ = 1000;
/**
 * After a failed connect or read (docs/retries.md, "Retries"): 100 ms, doubling to 5 s; a catch-up that
 * succeeds resets it. No jitter: one feed per Auth Service, a handful at most against one database.
 */
export const FEED_RETRY: BackoffPolicy = { firstMs: 100, maxMs: 5_000, jitter: 'none' };

export interface FollowerOptions {
  /** A new, unconnected client for the feed's own connection. */
  newClient: () => pg.Client;
  hub: WatchHub;
  log: Logger;
  /** The revision the feed starts after: the head when the backend was opened. */
  startRevision: number;
  /** How often to catch up without a notification (0: never). */
  pollIntervalMs: number;
  /** Turns a connection failure into the backend's error: for open (thrown) and later (logged). */
  describe: (err: unknown, phase: 'open' | 'op') => GatewayError;
  /** The back-off's timers (tests drive them); default unref'd timers. */
  backoffDeps?: BackoffDeps;
}

interface ChangeRow {
  revision: string;
  key: string;
  value: string | null;
  expires_at: string | null;
}

/** The event a change-log row stands for. Pure. */
export function eventOf(row: ChangeRow): WatchEvent {
  const revision = Number(row.revision);
  if (row.value === null) return { type: 'delete', key: row.key, revision };
  const item: Item =
    row.expires_at === null
      ? { key: row.key, value: row.value, revision }
      : { key: row.key, value: row.value, revision, expiresAt: Number(row.expires_at) };
  return { type: 'put', item };
}

export class ChangeFollower {
  private delivered: number;
  private client: pg.Client | undefined;
  /** A client still connecting (close() ends it rather than wait for its timeout). */
  private connecting: pg.Client | undefined;
  private pending = true;
  private closed = false;
  private wake: (() => void) | undefined;
  private loop: Promise<void> | undefined;
  private poller: NodeJS.Timeout | undefined;
  private readonly retry: Backoff;
  private failures = 0;
  /** Bumped by every watch(): a catch-up that skipped reading events for lack of watchers must not skip past one. */
  private watchAdds = 0;
  private readonly waiters: Array<{ revision: number; resolve: () => void; reject: (err: Error) => void }> = [];

  constructor(private readonly o: FollowerOptions) {
    this.delivered = o.startRevision;
    this.retry = new Backoff(FEED_RETRY, { unref: true, ...o.backoffDeps });
  }

  /** The last revision whose events were handed to the watchers. */
  get position(): number {
    return this.delivered;
  }

  /** Connects and LISTENs (throwing the classified error if that fails), then runs the loop. */
  async start(): Promise<void> {
    try {
      await this.connect();
    } catch (err) {
      throw this.o.describe(err, 'open');
    }
    this.loop = this.run();
    if (this.o.pollIntervalMs > 0) {
      this.poller = setInterval(() => this.request(), this.o.pollIntervalMs);
      this.poller.unref();
    }
  }

  /** Asks for a catch-up (a write committed, a notification came, the poll timer fired). */
  request(): void {
    this.pending = true;
    this.wake?.();
  }

  watcherAdded(): void {
    this.watchAdds++;
  }

  /** Resolves once every event up to revision has been delivered. */
  waitFor(revision: number): Promise<void> {
    if (this.delivered >= revision) return Promise.resolve();
    if (this.closed) return Promise.reject(closedError());
    const p = new Promise<void>((resolve, reject) => this.waiters.push({ revision, resolve, reject }));
    this.request();
    return p;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.poller !== undefined) clearInterval(this.poller);
    this.wake?.();
    this.dropClient();
    this.connecting?.end().catch(() => undefined);
    for (const w of this.waiters.splice(0)) w.reject(closedError());
    await this.loop;
  }

  private async connect(): Promise<void> {
    const client = this.o.newClient();
    client.on('notification', (n) => {
      // The payload is the committed revision: one already delivered (say, this process's own write, which
      // asked for a catch-up itself) needs no read.
      if (n.payload === undefined || !(Number(n.payload) <= this.delivered)) this.request();
    });
    client.on('error', () => this.lost(client));
    client.on('end', () => this.lost(client));
    this.connecting = client;
    try {
      await client.connect();
      await client.query(`LISTEN ${CHANGE_CHANNEL}`);
    } catch (err) {
      client.removeAllListeners('end');
      client.on('error', () => undefined);
      void client.end().catch(() => undefined);
      throw err;
    } finally {
      this.connecting = undefined;
    }
    this.client = client;
    this.pending = true;
    if (this.closed) this.dropClient();
  }

  /** The connection failed or ended: forget it; the loop reconnects. */
  private lost(client: pg.Client): void {
    if (this.client !== client) return;
    this.dropClient();
    this.wake?.();
  }

  private dropClient(): void {
    const client = this.client;
    this.client = undefined;
    if (client === undefined) return;
    client.removeAllListeners('end');
    client.removeAllListeners('notification');
    client.on('error', () => undefined);
    void client.end().catch(() => undefined);
  }

  /** Until close: (re)connect, wait for a reason to look, catch up; back off after any failure. */
  private async run(): Promise<void> {
    while (!this.closed) {
      if (this.client === undefined) {
        try {
          await this.connect();
        } catch (err) {
          await this.backOff(err, 'cannot connect');
        }
        continue;
      }
      if (!this.pending) {
        await this.pause();
        continue;
      }
      this.pending = false;
      const client = this.client;
      try {
        await this.catchUp(client);
      } catch (err) {
        if (this.client === client) this.dropClient();
        this.pending = true;
        await this.backOff(err, 'read failed');
        continue;
      }
      if (this.failures > 0) this.o.log.info({ failures: this.failures }, 'backend change feed: connected again and caught up');
      this.failures = 0;
      this.retry.reset();
    }
  }

  /** Waits for request() or close(). */
  private async pause(): Promise<void> {
    await new Promise<void>((resolve) => (this.wake = resolve));
    this.wake = undefined;
  }

  /** Logs a failure (a warning for the first of a row, then at debug level) and waits before the next try. */
  private async backOff(err: unknown, what: string): Promise<void> {
    if (this.closed) return;
    const level = this.failures === 0 ? 'warn' : 'debug';
    const delay = this.retry.next();
    this.o.log[level]({ err: this.o.describe(err, 'op').message, retryInMs: delay }, `backend change feed: ${what}; retrying`);
    this.failures++;
    this.wake = () => this.retry.cancel(); // request() or close() cuts the wait short
    await this.retry.wait(delay);
    this.wake = undefined;
  }

  /** One snapshot: the head, the horizon and the next events; hands them out and moves on. */
  private async catchUp(client: pg.Client): Promise<void> {
    const adds = this.watchAdds;
    const wantEvents = this.o.hub.size > 0;
    await client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    let head: number;
    let compacted: number;
    let rows: ChangeRow[] = [];
    try {
      const meta = await client.query<{ head: string; compacted: string }>(
        `SELECT (SELECT value FROM gateway_meta WHERE name = 'revision') AS head,
                (SELECT value FROM gateway_meta WHERE name = 'compacted') AS compacted`,
      );
      head = Number(meta.rows[0]!.head);
      compacted = Number(meta.rows[0]!.compacted);
      const upTo = Math.min(head, this.delivered + REVISIONS_PER_READ);
      if (wantEvents && compacted <= this.delivered && upTo > this.delivered) {
        rows = (
          await client.query<ChangeRow>({
            name: 'gateway_changes_read',
            text: `SELECT revision, key, value, expires_at FROM gateway_changes
                   WHERE revision > $1 AND revision <= $2 ORDER BY revision, seq`,
            values: [this.delivered, upTo],
          })
        ).rows;
      }
    } finally {
      await client.query('COMMIT');
    }
    // Without watchers the events need no reading and the head counts as delivered, unless a watcher came while
    // we looked: then they are read next time round.
    this.advance(head, compacted, rows, !wantEvents && this.watchAdds === adds);
  }

  private advance(head: number, compacted: number, rows: ChangeRow[], skipToHead: boolean): void {
    if (compacted > this.delivered) {
      // The events up to the horizon are gone; those after it are still in the log, for the watchers that go on.
      const next = this.delivered + 1;
      this.delivered = compacted;
      this.o.hub.gap(
        new GatewayError('GW_ERR_BACKEND_COMPACTED', `backend watch: the change log was trimmed through revision ${compacted}, past revision ${next} that the watchers needed next`, {
          details: { compactedRevision: compacted, nextRevision: next, headRevision: head },
        }),
      );
    } else if (rows.length > 0) {
      this.o.hub.publish(rows.map(eventOf));
      this.delivered = Number(rows[rows.length - 1]!.revision);
    } else if (skipToHead) {
      this.delivered = Math.max(this.delivered, head);
    }
    if (this.delivered < head) this.pending = true;
    for (let i = this.waiters.length - 1; i >= 0; i--) {
      const w = this.waiters[i]!;
      if (w.revision <= this.delivered) {
        this.waiters.splice(i, 1);
        w.resolve();
      }
    }
  }
}

function closedError(): GatewayError {
  return new GatewayError('GW_ERR_BACKEND_CLOSED', 'the backend is closed');
}
