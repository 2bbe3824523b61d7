/**
 * The audit of the sessions a Proxy carries: database, TCP app and desktop connections (access.ts), HTTP app
 * sessions and Kubernetes connections (webapps.ts). The Proxy is the one emitter of these events: it is where the
 * user (its certificate or app session), the client address, the resource, the agent that serves it and the bytes
 * of every routed connection are all known. SSH sessions stay the agent's (src/agent/ssh.ts): the Proxy never sees
 * inside them.
 *
 *   <kind>.session.start   session, user, resource, node (the agent's nodename), client, proxy, time, plus what the
 *                          kind knows (protocol, db_user, db_name for databases; login for nothing else)
 *   <kind>.session.end     the same, with start, duration_ms, bytes_in (client to resource), bytes_out (resource
 *                          to client), and error when the session broke (a reset, a revocation, the Proxy stopping)
 *
 * Bounds (an authenticated user opening and dropping thousands of connections must not bury other events under
 * 30-day records, nor grow this Proxy's memory):
 *   - each user has a budget of sessions recorded one by one per kind (USER_BUDGET per minute, refilled
 *     continuously: a flood of app connections does not hide the same user's database session), and
 *     the Proxy as a whole GLOBAL_BUDGET; a session beyond either is not recorded by itself but coalesced: one
 *     `<kind>.session.end` per user and kind each minute with `coalesced: N`, summed bytes, the first start, the
 *     last end, a few of the resources and how many broke. Nothing is dropped silently: every session counts in a
 *     record, its own or a coalesced one.
 *   - at most MAX_COALESCED (user, kind) pairs are kept between flushes; beyond, user "*" takes them.
 *   - at most MAX_PENDING reports are in flight to the Auth Service (a slow or unreachable one); beyond, a session
 *     is coalesced instead of written by itself (its end too, when its start was written). A report that did not
 *     reach it is kept (at most MAX_RETRY) and sent again at the next flush and at stop; a refused one is not.
 *
 * HTTP (apps on the web port, Kubernetes) is audited per session, not per request: httpRequest() puts a request
 * into the session of its key. A request with a client certificate belongs to its TLS connection (and the resource
 * it reaches): the session ends when the connection closes. A request of the Web UI's app session (its cookie)
 * belongs to that app session, whose start the Auth Service recorded at the launch (app.session.start, with the
 * same app_session hash): the Proxy records its end, with the bytes and requests it carried, once it has seen no
 * request of it for HTTP_IDLE_MS, when the app session is refused (expired, signed out, locked), or when the Proxy
 * stops; behind several Proxies each records the end of its own share. At most MAX_HTTP_SESSIONS such sessions are
 * kept; beyond, the least recently used one is ended.
 *
 * stop() (the Proxy stopping) ends every open session with error "proxy stopping", flushes, and waits for the
 * reports to be written; after a kill -9 an open session has a start and no end.
 */
import { randomBytes } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { isGatewayError } from '../errors.js';
import { logger } from '../log.js';

export type SessionKind = 'db' | 'app' | 'desktop' | 'kube';

/** Per user and kind: this many sessions a minute are recorded one by one (and as a burst). */
export const USER_BUDGET = 60;
/** Per Proxy: this many sessions a minute are recorded one by one. */
export const GLOBAL_BUDGET = 600;
/** (user, kind) pairs coalesced between two flushes; beyond, they count under user "*". */
export const MAX_COALESCED = 200;
/** Reports in flight to the Auth Service. */
export const MAX_PENDING = 1000;
/** Reports kept to send again while the Auth Service cannot be reached. */
export const MAX_RETRY = 5000;
/** The failures of a report that are worth sending it again: the Auth Service was not reached or failed inside. */
const RETRIED: ReadonlySet<string> = new Set(['GW_ERR_AUTH_UNREACHABLE', 'GW_ERR_INTERNAL', 'GW_ERR_BACKEND_FAILED', 'GW_ERR_BACKEND_UNREACHABLE']);
/** How often coalesced sessions are written. */
export const FLUSH_INTERVAL_MS = 60_000;
/** An app session of the Web UI with no request for this long has ended, as far as this Proxy can tell. */
export const HTTP_IDLE_MS = 10 * 60_000;
/** App sessions of the Web UI followed at once. */
export const MAX_HTTP_SESSIONS = 10_000;
const MINUTE = 60_000;
/** Distinct resources named in a coalesced record. */
const COALESCED_RESOURCES = 10;

/** What a session is about; every value is already a short string (names, addresses). */
export interface SessionFields {
  user: string;
  resource: string;
  /** The agent that serves the resource (its nodename), as SSH session events name their node. */
  node?: string;
  client: string;
  /** e2e: true on an end-to-end stream (the Proxy saw only its TLS records: no db_user or db_name). */
  [extra: string]: string | number | boolean | undefined;
}

export interface SessionEnd {
  error?: string;
  /** When it ended, if earlier than now (an idle app session: its last request). */
  at?: number;
}

export interface AuditedSession {
  readonly id: string;
  /** Adds bytes: in from the client towards the resource, out from the resource to the client. */
  count(bytesIn: number, bytesOut: number): void;
  /**
   * Fields learnt after the dial (a database user and name from the startup message). With defer at the start,
   * the start record waits for this call (or the end), so that it carries them.
   */
  learn(fields: Record<string, string | number>): void;
  /** Records the end (once; later calls do nothing). */
  end(how?: SessionEnd): void;
}

/** What a connection-bound HTTP session ends with: anything that emits close once (a socket, an HTTP/2 session). */
export interface Connection {
  readonly destroyed: boolean;
  once(event: 'close', listener: () => void): unknown;
}

interface HttpEntry {
  session: AuditedSession;
  last: number;
  requests: number;
}

export interface HttpRequestOptions {
  /**
   * The request's connection, when the session is the connection's (a client certificate): its socket, or for
   * HTTP/2 its session (each request's socket is a stand-in of its own there).
   */
  connection?: Connection;
  /** The start was recorded by the Auth Service (an app launch): only the end is the Proxy's. */
  startRecorded?: boolean;
}

export interface SessionAuditOptions {
  /** Writes one event to the audit log (ProxyAuth.recordProxyEvent with this Proxy's ID). */
  report: (event: Record<string, unknown>) => Promise<void>;
  proxyId: string;
  clock?: () => number;
  /** Tests flush by hand; the Proxy flushes every FLUSH_INTERVAL_MS. */
  autoFlush?: boolean;
}

interface Bucket {
  tokens: number;
  at: number;
}

interface Coalesced {
  kind: SessionKind;
  user: string;
  count: number;
  errors: number;
  bytesIn: number;
  bytesOut: number;
  firstStart: number;
  lastEnd: number;
  resources: Set<string>;
}

interface Open {
  kind: SessionKind;
  fields: Record<string, string | number | boolean | undefined>;
  start: number;
  bytesIn: number;
  bytesOut: number;
  /** Recorded one by one (a start was written), else coalesced at its end. */
  own: boolean;
  ended: boolean;
  /** Whether the start record is still to be written (a deferred start). */
  startDue: boolean;
}

export class SessionAudit {
  private readonly log = logger('audit');
  private readonly clock: () => number;
  private readonly users = new Map<string, Bucket>();
  private readonly global: Bucket;
  private readonly coalesced = new Map<string, Coalesced>();
  private readonly open = new Set<AuditedSession>();
  private readonly pending = new Set<Promise<void>>();
  private readonly retry: Array<Record<string, unknown>> = [];
  private readonly byKey = new Map<string, HttpEntry>();
  private readonly byConnection = new WeakMap<Connection, Map<string, HttpEntry>>();
  private readonly timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(private readonly options: SessionAuditOptions) {
    this.clock = options.clock ?? Date.now;
    this.global = { tokens: GLOBAL_BUDGET, at: this.clock() };
    if (options.autoFlush !== false) {
      this.timer = setInterval(() => this.flush(), FLUSH_INTERVAL_MS);
      this.timer.unref();
    }
  }

  /** How many sessions are open (tests, and the Proxy's stop). */
  get openCount(): number {
    return this.open.size;
  }

  /**
   * Starts a session: its start is recorded now (with defer: at the first learn() or at the end) unless the budget
   * coalesces it.
   */
  start(kind: SessionKind, fields: SessionFields, options: { defer?: boolean; startRecorded?: boolean } = {}): AuditedSession {
    const now = this.clock();
    const own = !this.stopped && this.pending.size < MAX_PENDING && this.spend(`${kind}\u0000${fields.user}`, now);
    const state: Open = { kind, fields: { ...fields, proxy: this.options.proxyId }, start: now, bytesIn: 0, bytesOut: 0, own, ended: false, startDue: own && options.startRecorded !== true };
    const id = `${now.toString(36)}-${randomBytes(6).toString('hex')}`;
    const sendStart = () => {
      if (!state.startDue) return;
      state.startDue = false;
      this.send({ event: `${kind}.session.start`, session: id, ...state.fields, time: new Date(state.start).toISOString() });
    };
    if (options.defer !== true) sendStart();
    const session: AuditedSession = {
      id,
      count: (i, o) => {
        state.bytesIn += i;
        state.bytesOut += o;
      },
      learn: (more) => {
        if (state.ended) return;
        Object.assign(state.fields, more);
        sendStart();
      },
      end: (how = {}) => {
        if (state.ended) return;
        state.ended = true;
        sendStart();
        this.open.delete(session);
        this.finish(id, state, how);
      },
    };
    this.open.add(session);
    return session;
  }

  /**
   * A session over a client stream spliced to a resource stream: counts the bytes of both directions and records
   * the end when both have closed, with an error unless both ended cleanly (a reset, a destroy, an error event);
   * why, when it gives one, is the error (the Proxy closed it on purpose: a revocation).
   */
  spliced(session: AuditedSession, client: Duplex, resource: Duplex, why?: () => string | undefined): void {
    let error: string | undefined;
    let closed = 0;
    const onClose = () => {
      if (++closed < 2) return;
      error = why?.() ?? error;
      if (!error && (!client.readableEnded || !resource.readableEnded)) error = 'connection broken';
      session.end(error ? { error } : {});
    };
    client.on('data', (chunk: Buffer) => session.count(chunk.length, 0));
    resource.on('data', (chunk: Buffer) => session.count(0, chunk.length));
    client.once('error', (err: Error) => (error ??= `client: ${err.message}`));
    resource.once('error', (err: Error) => (error ??= `resource: ${err.message}`));
    for (const s of [client, resource]) {
      if (s.destroyed) onClose();
      else s.once('close', onClose);
    }
  }

  /**
   * The session of an HTTP request (key: the app session's hash, or the resource on the connection): a new one at
   * its first request, the same one after. Count the request's bytes on what it returns.
   */
  httpRequest(kind: SessionKind, key: string, fields: SessionFields, options: HttpRequestOptions = {}): AuditedSession {
    const now = this.clock();
    const table = options.connection ? this.connectionTable(options.connection) : this.byKey;
    let entry = table.get(key);
    if (entry) table.delete(key); // re-inserted below: the map's order is the least recently used first
    else {
      if (!options.connection && this.byKey.size >= MAX_HTTP_SESSIONS) this.endHttp(this.byKey.keys().next().value!);
      const session = this.start(kind, fields, { startRecorded: options.startRecorded === true });
      entry = { session, last: now, requests: 0 };
    }
    entry.last = now;
    entry.session.learn({ requests: ++entry.requests });
    table.set(key, entry);
    return entry.session;
  }

  /** Marks the HTTP session of key as in use (an upgraded connection of it moving bytes): the idle sweep spares it. */
  touchHttp(key: string): void {
    const entry = this.byKey.get(key);
    if (entry) entry.last = this.clock();
  }

  /** Ends the HTTP session of key (an app session that was refused, or idle). */
  endHttp(key: string, how: SessionEnd = {}): void {
    const entry = this.byKey.get(key);
    if (!entry) return;
    this.byKey.delete(key);
    entry.session.end(how);
  }

  private connectionTable(connection: Connection): Map<string, HttpEntry> {
    let table = this.byConnection.get(connection);
    if (!table) {
      const made = new Map<string, HttpEntry>();
      table = made;
      this.byConnection.set(connection, made);
      const close = () => {
        for (const entry of made.values()) entry.session.end();
        made.clear();
      };
      if (connection.destroyed) queueMicrotask(close);
      else connection.once('close', close);
    }
    return table;
  }

  /** Writes the coalesced sessions (one record per user and kind) and ends the app sessions idle for HTTP_IDLE_MS. */
  flush(): void {
    const now = this.clock();
    this.resend();
    for (const [key, entry] of this.byKey) if (now - entry.last >= HTTP_IDLE_MS) this.endHttp(key, { at: entry.last });
    for (const c of this.coalesced.values()) {
      this.send({
        event: `${c.kind}.session.end`,
        user: c.user,
        coalesced: c.count,
        resources: [...c.resources],
        bytes_in: c.bytesIn,
        bytes_out: c.bytesOut,
        errors: c.errors,
        start: new Date(c.firstStart).toISOString(),
        proxy: this.options.proxyId,
        time: new Date(c.lastEnd).toISOString(),
      });
    }
    this.coalesced.clear();
  }

  /** The Proxy is stopping: every open session ends with an error, coalesced ones are written, reports awaited. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.byKey.clear();
    for (const s of [...this.open]) s.end({ error: 'proxy stopping' });
    this.flush();
    await Promise.allSettled([...this.pending]);
    // One more try for what failed meanwhile (an Auth Service restarting with this Proxy); then it is the log's.
    this.resend();
    await Promise.allSettled([...this.pending]);
    if (this.retry.length > 0) this.log.error({ events: this.retry.length }, 'session events not recorded: the Auth Service is unreachable as the Proxy stops');
  }

  private finish(id: string, state: Open, how: SessionEnd): void {
    const now = Math.max(state.start, Math.min(this.clock(), how.at ?? Infinity));
    if (state.own && this.pending.size < MAX_PENDING) {
      this.send({
        event: `${state.kind}.session.end`,
        session: id,
        ...state.fields,
        start: new Date(state.start).toISOString(),
        duration_ms: Math.max(0, now - state.start),
        bytes_in: state.bytesIn,
        bytes_out: state.bytesOut,
        ...(how.error ? { error: how.error.slice(0, 200) } : {}),
        time: new Date(now).toISOString(),
      });
      return;
    }
    this.coalesce(state, now, how);
  }

  private coalesce(state: Open, now: number, how: SessionEnd): void {
    const user = String(state.fields.user);
    let key = `${state.kind}\u0000${user}`;
    if (!this.coalesced.has(key) && this.coalesced.size >= MAX_COALESCED) key = `${state.kind}\u0000*`;
    let c = this.coalesced.get(key);
    if (!c) {
      c = { kind: state.kind, user: key.endsWith('\u0000*') ? '*' : user, count: 0, errors: 0, bytesIn: 0, bytesOut: 0, firstStart: state.start, lastEnd: now, resources: new Set() };
      this.coalesced.set(key, c);
    }
    c.count++;
    if (how.error) c.errors++;
    c.bytesIn += state.bytesIn;
    c.bytesOut += state.bytesOut;
    c.firstStart = Math.min(c.firstStart, state.start);
    c.lastEnd = Math.max(c.lastEnd, now);
    if (c.resources.size < COALESCED_RESOURCES) c.resources.add(String(state.fields.resource));
  }

  /** Takes one token from the user's and the Proxy's budgets (refilled continuously), or none when either is empty. */
  private spend(user: string, now: number): boolean {
    // user: the kind and the user name (a budget per user and kind)
    const mine = this.users.get(user) ?? { tokens: USER_BUDGET, at: now };
    refill(mine, USER_BUDGET, now);
    refill(this.global, GLOBAL_BUDGET, now);
    if (mine.tokens < 1 || this.global.tokens < 1) return false;
    mine.tokens--;
    this.global.tokens--;
    // A full bucket is the default: only users that spent something are kept (the map stays small).
    if (mine.tokens < USER_BUDGET) this.users.set(user, mine);
    if (this.users.size > 10 * GLOBAL_BUDGET) this.forgetFull(now);
    return true;
  }

  private forgetFull(now: number): void {
    for (const [user, b] of this.users) {
      refill(b, USER_BUDGET, now);
      if (b.tokens >= USER_BUDGET) this.users.delete(user);
    }
  }

  /** A report to the Auth Service (the callers keep the number in flight near MAX_PENDING). */
  private send(event: Record<string, unknown>): void {
    const p = this.options.report(event).catch((err: unknown) => this.failed(event, err));
    this.pending.add(p);
    void p.finally(() => this.pending.delete(p));
  }

  /**
   * A report that did not reach the audit log: kept for the next flush when the Auth Service could not be reached
   * (at most MAX_RETRY; beyond, dropped with an error line), dropped with a warning when it was refused.
   */
  private failed(event: Record<string, unknown>, err: unknown): void {
    const code = isGatewayError(err) ? err.code : undefined;
    if (code !== undefined && !RETRIED.has(code)) {
      this.log.warn({ event: event.event, code, err: (err as Error).message }, 'a session event was refused');
      return;
    }
    if (this.retry.length < MAX_RETRY) this.retry.push(event);
    else this.log.error({ event: event.event, session: event.session, user: event.user, err: (err as Error).message }, 'cannot record a session event: the Auth Service is unreachable and the retry queue is full');
  }

  /** The reports kept while the Auth Service could not be reached, sent again in their order. */
  private resend(): void {
    const again = this.retry.splice(0);
    for (const event of again) this.send(event);
  }
}

function refill(b: Bucket, capacity: number, now: number): void {
  const gained = ((now - b.at) / MINUTE) * capacity;
  if (gained > 0) {
    b.tokens = Math.min(capacity, b.tokens + gained);
    b.at = now;
  }
}
