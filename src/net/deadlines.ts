/**
 * Deadlines and caps for every connection the gateway accepts (docs/security.md lists them with their keys).
 *
 * ConnectionLimits holds the settings (`gateway.limits`) and one ListenerGuard per listener. A guard admits each
 * accepted socket against two caps, open connections on the listener and open connections from one source,
 * and gives it a Connection: the one place that holds that connection's deadline. A connection is in at most
 * one phase with a deadline at a time, and the code that drives its protocol moves it along:
 *
 *   detect ─► tls-handshake ─► http-headers ─► http-request ─► (answer) ─► http-headers ─► ...
 *         │                 └► route-header (databases, TCP, SSH over TLS: one JSON line)
 *         └► ssh-handshake (version, key exchange, authentication) ─► ssh-idle (authenticated, no channel open)
 *   peering (3021): tls-handshake ─► peer-idle (no request yet) ─► peer-request (its line) ─► (answer, bytes)
 *                   HTTP/2 peering: tls-handshake ─► peer-request (first stream) ─► peer-idle (no stream open)
 *
 * When a deadline passes the connection is closed, every stream layered on it down to the socket, and counted.
 * A stream layered on another (a TLS socket around the accepted socket) is linked to the same Connection, so
 * code holding either finds it with connectionOf().
 *
 * Half-close: once either side has ended its direction (the peer's FIN, or our end()), the other direction may
 * still carry data, but a connection that moves no bytes for half_close_linger is destroyed. So no socket waits
 * in CLOSE-WAIT for a library that never ends its side, nor in FIN-WAIT for a peer that never ends its own (the
 * listeners allow half-open connections so that spliced streams can pass a half-close through).
 */
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import { logger, type Logger } from '../log.js';
import { ListenerMetrics, refusalKind, type RouteMetrics } from '../metrics/listeners.js';
import { connectionBudget, readOpenFileLimit, sourceKey } from './source.js';

export type Phase =
  | 'detect'
  | 'tls-handshake'
  | 'http-headers'
  | 'http-request'
  | 'http-idle'
  | 'route-header'
  | 'ssh-handshake'
  | 'ssh-idle'
  | 'peer-request'
  | 'peer-idle'
  | 'half-close';

/** The settings, in milliseconds and connection counts (from gateway.limits). */
export interface LimitSettings {
  tlsHandshakeMs: number;
  headerMs: number;
  requestMs: number;
  idleMs: number;
  sshHandshakeMs: number;
  halfCloseLingerMs: number;
  maxConnections: number;
  maxConnectionsPerSource: number;
}

/**
 * The gateway.limits section: deadlines in milliseconds and caps in connections, for every listener
 * (docs/security.md). Declared here, where it is read; config/ (a higher layer) imports it for its types.
 */
export interface LimitsConfig {
  readonly tls_handshake_timeout: number;
  readonly header_timeout: number;
  readonly request_timeout: number;
  readonly idle_timeout: number;
  readonly ssh_handshake_timeout: number;
  readonly half_close_linger: number;
  readonly max_connections: number;
  readonly max_connections_per_source: number;
}

/** Any configuration with a gateway.limits section. */
export interface LimitsSection {
  readonly gateway: { readonly limits: LimitsConfig };
}

/** The settings of a configuration's gateway.limits section. */
export function limitSettings(config: LimitsSection): LimitSettings {
  const l = config.gateway.limits;
  return {
    tlsHandshakeMs: l.tls_handshake_timeout,
    headerMs: l.header_timeout,
    requestMs: l.request_timeout,
    idleMs: l.idle_timeout,
    sshHandshakeMs: l.ssh_handshake_timeout,
    halfCloseLingerMs: l.half_close_linger,
    maxConnections: l.max_connections,
    maxConnectionsPerSource: l.max_connections_per_source,
  };
}

export interface ListenerStats {
  open: number;
  accepted: number;
  /** Connections closed at once because a cap was reached. */
  refused: { total: number; per_source: number };
  /** Connections closed because the deadline of a phase passed. */
  deadlines: Partial<Record<Phase, number>>;
  /** Connections closed because the client broke a protocol's cap (HTTP/2: resets, floods, invalid frames). */
  closed: Partial<Record<ProtocolCap, number>>;
}

/** The protocol caps that close a connection (src/net/http2.ts for HTTP/2). */
export type ProtocolCap = 'h2-rapid-reset' | 'h2-flood' | 'h2-invalid-frames' | 'h2-protocol';

export type CapKind = keyof ListenerStats['refused'];

const connections = new WeakMap<object, Connection>();

/** The Connection a stream belongs to; a stream nobody admitted gets one of its own (deadlines, no accounting). */
export function connectionOf(stream: Duplex): Connection {
  return connections.get(stream) ?? new Connection(stream, undefined, DEFAULT_LINGER_MS);
}

const DEFAULT_LINGER_MS = 30_000;

/**
 * What happens when a phase's deadline passes. Called as methods of the object given to enter(), so an object
 * that already exists for the connection (the multiplexer's detection) can be passed as it is, without a closure.
 */
interface PhaseOptions {
  /** Instead of destroying the connection (the multiplexer refuses it with its own log line). */
  onExpire?(): void;
  /** Checked when the deadline passes: true means the phase is over after all, and nothing happens. */
  unless?(): boolean;
}

const NO_OPTIONS: PhaseOptions = Object.freeze({});

/**
 * One pending deadline: a node of the DeadlineList of its duration. A connection has at most two, its phase's
 * and its half-close linger's, each made once and linked and unlinked as phases come and go.
 */
class Deadline {
  due = 0;
  prev: Deadline | undefined;
  next: Deadline | undefined;
  list: DeadlineList | undefined;

  constructor(
    readonly conn: Connection,
    readonly linger: boolean,
  ) {}
}

/**
 * Every pending deadline of one duration, soonest first (appending keeps the order, since all have the same
 * duration), with one unref'd timer for the head. A deadline per connection and phase thus costs no Timeout, no
 * closure and no timer-list work of its own: entering and leaving a phase link and unlink one node.
 */
class DeadlineList {
  private head: Deadline | undefined;
  private tail: Deadline | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ms: number) {}

  add(d: Deadline): void {
    d.due = performance.now() + this.ms;
    d.list = this;
    d.prev = this.tail;
    d.next = undefined;
    if (this.tail) this.tail.next = d;
    else this.head = d;
    this.tail = d;
    if (!this.timer) this.arm(this.ms);
  }

  remove(d: Deadline): void {
    if (d.list !== this) return;
    if (d.prev) d.prev.next = d.next;
    else this.head = d.next;
    if (d.next) d.next.prev = d.prev;
    else this.tail = d.prev;
    d.prev = d.next = d.list = undefined;
  }

  private arm(ms: number): void {
    this.timer = setTimeout(this.fire, ms);
    this.timer.unref();
  }

  private readonly fire = (): void => {
    this.timer = undefined;
    const now = performance.now();
    for (let d = this.head; d && d.due <= now; d = this.head) {
      this.remove(d);
      d.conn.expired(d);
    }
    if (this.head) this.arm(Math.max(1, Math.ceil(this.head.due - now)));
  };
}

const deadlineLists = new Map<number, DeadlineList>();

function deadlineList(ms: number): DeadlineList {
  let list = deadlineLists.get(ms);
  if (!list) deadlineLists.set(ms, (list = new DeadlineList(ms)));
  return list;
}

/** A layer's events, one function each for every connection (no closure per layer). */
function onLayerEnded(this: Duplex): void {
  connections.get(this)?.linger();
}
function onLayerClose(this: Duplex): void {
  connections.get(this)?.closeAll();
}

export class Connection {
  private current: Phase | undefined;
  private options: PhaseOptions = NO_OPTIONS;
  private deadline: Deadline | undefined;
  private lingering: Deadline | undefined;
  /** Bytes moved (both ways, every layer) when the half-close linger last started. */
  private moved = 0;
  private readonly layers: Duplex[] = [];
  private closed = false;
  /** The source key this connection is counted under for the per-source cap; undefined until known. */
  source: string | undefined;
  /** The socket's bytes already added to the listener's byte counters (metrics). */
  private countedIn = 0;
  private countedOut = 0;
  /** The route the one port gave it (its bytes are added there too from then on), released when it closes. */
  private route: RouteMetrics | undefined;

  constructor(
    readonly socket: Duplex,
    private readonly guard: ListenerGuard | undefined,
    private readonly lingerMs: number,
  ) {
    this.link(socket);
  }

  get phase(): Phase | undefined {
    return this.current;
  }

  get listener(): string | undefined {
    return this.guard?.name;
  }

  /** Enters a phase: its deadline replaces the current one. */
  enter(phase: Phase, ms: number, options: PhaseOptions = NO_OPTIONS): void {
    this.leave();
    if (this.closed || !(ms > 0)) return;
    this.current = phase;
    this.options = options;
    deadlineList(ms).add((this.deadline ??= new Deadline(this, false)));
  }

  /** Leaves the current phase (only when it is `phase`, if given): no deadline until the next phase. */
  leave(phase?: Phase): void {
    if (phase !== undefined && this.current !== phase) return;
    this.deadline?.list?.remove(this.deadline);
    this.current = undefined;
    this.options = NO_OPTIONS;
  }

  /** Links a stream layered on this connection (a TLS socket around the socket). */
  link(stream: Duplex): void {
    connections.set(stream, this);
    this.layers.push(stream);
    stream.on('end', onLayerEnded);
    stream.on('finish', onLayerEnded);
    stream.on('close', onLayerClose);
  }

  /** Counts this connection against the per-source cap of its client's address (see ListenerGuard.attribute). */
  attribute(address: string): boolean {
    return this.guard ? this.guard.attribute(this, address) : true;
  }

  /** Counts a deadline that something else enforced (Node's own idle timer on an HTTP socket). */
  count(phase: Phase): void {
    this.guard?.counted(phase, this);
  }

  /**
   * Counts a refusal by the one port's multiplexer (its reason); a source over its cap was counted by attribute().
   */
  refusedBy(reason: string): void {
    if (reason !== 'source-cap') this.guard?.metrics.refused(refusalKind(reason));
  }

  /** Counts a close for a protocol cap the client broke (the protocol's code closes the connection). */
  closedFor(cap: ProtocolCap): void {
    this.guard?.closedFor(cap, this);
  }

  /** Destroys every layer, the outermost first, down to the socket. */
  destroy(): void {
    for (const layer of [...this.layers].reverse()) if (!layer.destroyed) layer.destroy();
  }

  /** For DeadlineList: a deadline of this connection passed. */
  expired(d: Deadline): void {
    if (this.closed) return;
    if (d.linger) return this.lingerExpired();
    const phase = this.current!;
    const options = this.options;
    this.current = undefined;
    this.options = NO_OPTIONS;
    if (options.unless?.()) return;
    this.guard?.counted(phase, this);
    if (options.onExpire) options.onExpire();
    else this.destroy();
  }

  /** Once one direction has ended: destroyed when a linger passes in which no byte moved either way. */
  linger(): void {
    if (this.lingering || this.closed || !(this.lingerMs > 0)) return;
    this.moved = this.bytesMoved();
    deadlineList(this.lingerMs).add((this.lingering = new Deadline(this, true)));
  }

  private lingerExpired(): void {
    const now = this.bytesMoved();
    if (now > this.moved) {
      this.moved = now;
      deadlineList(this.lingerMs).add(this.lingering!);
      return;
    }
    this.guard?.counted('half-close', this);
    this.destroy();
  }

  private bytesMoved(): number {
    let sum = 0;
    for (const l of this.layers as Array<Partial<net.Socket>>) sum += (l.bytesWritten ?? 0) + (l.bytesRead ?? 0);
    return sum;
  }

  /** Adds the socket's bytes since the last call to the listener's counters (at close and at each scrape). */
  flushBytes(metrics: ListenerMetrics): void {
    const s = this.socket as Partial<net.Socket>;
    const read = s.bytesRead ?? 0;
    const written = s.bytesWritten ?? 0;
    metrics.bytes(read - this.countedIn, written - this.countedOut);
    this.route?.bytes(read - this.countedIn, written - this.countedOut);
    this.countedIn = read;
    this.countedOut = written;
  }

  /** The multiplexer routed it (once): its bytes count for the route too, its close releases the route's open. */
  routed(route: RouteMetrics): void {
    // Without a guard nobody releases it; closed or already routed, nothing will: not open, then.
    if (!this.guard || this.route || this.closed) return route.released();
    this.route = route;
  }

  /** For the guard at close: the route's open count goes down (its last bytes were flushed just before). */
  releaseRoute(): void {
    this.route?.released();
    this.route = undefined;
  }

  /** A layer closed: the connection is over, whatever the others think. */
  closeAll(): void {
    if (this.closed) return;
    this.closed = true;
    this.leave();
    this.lingering?.list?.remove(this.lingering);
    this.destroy();
    this.guard?.release(this);
  }
}

/** Log lines at a bounded rate: the rest are counted, and the count is logged with the next line let through. */
class LogBudget {
  private windowStart = 0;
  private used = 0;
  private suppressed = 0;

  constructor(private readonly perMinute: number) {}

  /** undefined: do not log; else the number of lines suppressed since the last one. */
  take(now = Date.now()): number | undefined {
    if (now - this.windowStart >= 60_000) {
      this.windowStart = now;
      this.used = 0;
    }
    if (this.used >= this.perMinute) {
      this.suppressed++;
      return undefined;
    }
    this.used++;
    const s = this.suppressed;
    this.suppressed = 0;
    return s;
  }
}

export class ListenerGuard {
  readonly stats: ListenerStats = { open: 0, accepted: 0, refused: { total: 0, per_source: 0 }, deadlines: {}, closed: {} };
  private readonly bySource = new Map<string, number>();
  private readonly capLog = new LogBudget(10);
  readonly metrics: ListenerMetrics;
  /** The open connections, for their bytes at each scrape. */
  private readonly conns = new Set<Connection>();
  private readonly stopFlush: () => void;

  constructor(
    readonly name: string,
    private readonly limits: ConnectionLimits,
    /** false when the client's address is only known later (a PROXY header): the mux calls attribute(). */
    private readonly sourceAtAccept: boolean,
  ) {
    this.metrics = new ListenerMetrics(name);
    this.stopFlush = ListenerMetrics.onScrape(() => {
      for (const conn of this.conns) conn.flushBytes(this.metrics);
    });
  }

  /** Stops adding this listener's open connections' bytes at each scrape (its ConnectionLimits closed). */
  close(): void {
    this.stopFlush();
  }

  /** For a listener's 'connection' event: a Connection, or undefined when a cap refused (and closed) the socket. */
  admit(socket: net.Socket): Connection | undefined {
    const { maxConnections, maxConnectionsPerSource, halfCloseLingerMs } = this.limits.settings;
    const key = sourceKey(socket.remoteAddress ?? '');
    if (this.stats.open >= maxConnections) return this.refuse(socket, 'total', key);
    if (this.sourceAtAccept && (this.bySource.get(key) ?? 0) >= maxConnectionsPerSource) return this.refuse(socket, 'per_source', key);
    const conn = new Connection(socket, this, halfCloseLingerMs);
    this.stats.open++;
    this.stats.accepted++;
    this.opened(conn);
    if (this.sourceAtAccept) this.hold(conn, key);
    return conn;
  }

  /** Whether one more connection fits under the listener's total cap (asked before a connection upgrade's 101). */
  hasRoom(): boolean {
    return this.stats.open < this.limits.settings.maxConnections;
  }

  /**
   * Counts a stream that arrived inside an admitted connection (a connection upgrade) on this listener, under the
   * same total cap as an accepted socket (the per-source cap is the multiplexer's, once it routes the stream).
   * Undefined when the cap refused (and destroyed) the stream.
   */
  adopt(stream: Duplex): Connection | undefined {
    if (!this.hasRoom()) return this.refuse(stream, 'total', '');
    const conn = new Connection(stream, this, this.limits.settings.halfCloseLingerMs);
    this.stats.open++;
    this.stats.accepted++;
    this.opened(conn);
    return conn;
  }

  /**
   * Counts conn against the per-source cap of its client's address, once that is known. False when that
   * source is at its cap: the connection is then destroyed, counted and logged.
   */
  attribute(conn: Connection, address: string): boolean {
    if (conn.source !== undefined) return true;
    const key = sourceKey(address);
    const held = this.bySource.get(key) ?? 0;
    if (held >= this.limits.settings.maxConnectionsPerSource) {
      this.refuse(conn.socket, 'per_source', key);
      return false;
    }
    this.hold(conn, key);
    return true;
  }

  private hold(conn: Connection, key: string): void {
    conn.source = key;
    this.bySource.set(key, (this.bySource.get(key) ?? 0) + 1);
  }

  private opened(conn: Connection): void {
    this.conns.add(conn);
    this.metrics.admitted();
  }

  /** For Connection: it closed. */
  release(conn: Connection): void {
    this.stats.open--;
    this.conns.delete(conn);
    conn.flushBytes(this.metrics);
    conn.releaseRoute();
    this.metrics.released();
    if (conn.source === undefined) return;
    const left = (this.bySource.get(conn.source) ?? 1) - 1;
    if (left > 0) this.bySource.set(conn.source, left);
    else this.bySource.delete(conn.source);
  }

  /** For Connection: a deadline passed. */
  counted(phase: Phase, conn: Connection): void {
    this.stats.deadlines[phase] = (this.stats.deadlines[phase] ?? 0) + 1;
    this.metrics.closed(phase);
    this.limits.log.debug({ listener: this.name, phase, source: conn.source }, 'connection closed: deadline passed');
  }

  /** For Connection: a protocol cap closed it. */
  closedFor(cap: ProtocolCap, conn: Connection): void {
    this.stats.closed[cap] = (this.stats.closed[cap] ?? 0) + 1;
    this.metrics.closed(cap);
    this.limits.log.debug({ listener: this.name, cap, source: conn.source }, 'connection closed: protocol cap');
  }

  private refuse(socket: Duplex, cap: CapKind, source: string): undefined {
    this.stats.refused[cap]++;
    this.metrics.refused(cap === 'total' ? 'cap' : 'source_cap');
    const s = socket as Partial<net.Socket>;
    if (typeof s.resetAndDestroy === 'function' && s.readyState === 'open') s.resetAndDestroy();
    else socket.destroy();
    const suppressed = this.capLog.take();
    if (suppressed !== undefined) {
      const { maxConnections, maxConnectionsPerSource } = this.limits.settings;
      this.limits.log.warn(
        { listener: this.name, cap, limit: cap === 'total' ? maxConnections : maxConnectionsPerSource, source, refused: this.stats.refused[cap], ...(suppressed > 0 ? { not_logged: suppressed } : {}) },
        'connection refused: cap reached',
      );
    }
    return undefined;
  }
}

export interface ConnectionLimitsOptions {
  /** The open-file limit to size caps against; undefined reads it from /proc/self/limits, null means unknown. */
  openFiles?: number | null;
  log?: Logger;
}

/** The settings and the guard of every listener of this process. */
export class ConnectionLimits {
  readonly settings: LimitSettings;
  readonly log: Logger;
  private readonly guards = new Map<string, ListenerGuard>();
  /** Counters kept elsewhere (the one port's multiplexer), published in the same summary line under their name. */
  private readonly published = new Map<string, () => unknown>();
  private summaryTimer: NodeJS.Timeout | undefined;

  constructor(settings: LimitSettings, options: ConnectionLimitsOptions = {}) {
    this.log = options.log ?? logger('limits');
    this.settings = settings;
    // The defaults fit the open-file limit (src/config/schema.ts); values written in the file are used as
    // written, but an operator should know when a flood could then take every descriptor.
    const openFiles = options.openFiles === undefined ? readOpenFileLimit() : (options.openFiles ?? undefined);
    const budget = connectionBudget(openFiles);
    if (budget !== undefined && settings.maxConnections > budget) {
      this.log.warn(
        { open_files: openFiles, max_connections: settings.maxConnections, fits: budget },
        'gateway.limits.max_connections is more than the open-file limit can hold for one listener while the others still accept: raise the limit (LimitNOFILE) or lower the cap',
      );
    }
  }

  /** The guard of a listener (created on first use). sourceAtAccept: false when a PROXY header names the client. */
  listener(name: string, options: { sourceAtAccept?: boolean } = {}): ListenerGuard {
    let guard = this.guards.get(name);
    if (!guard) {
      guard = new ListenerGuard(name, this, options.sourceAtAccept ?? true);
      this.guards.set(name, guard);
    }
    return guard;
  }

  stats(): Record<string, ListenerStats> {
    return Object.fromEntries([...this.guards].map(([name, g]) => [name, structuredClone(g.stats)]));
  }

  /** Adds counters to the summary line, as `name` (e.g. the multiplexer's refusals by reason). */
  publish(name: string, read: () => unknown): void {
    this.published.set(name, read);
  }

  /** Logs the counters every intervalMs when they changed: the in-process metrics, in the log. */
  startSummary(intervalMs = 60_000): void {
    let last = '';
    this.summaryTimer = setInterval(() => {
      const line = { listeners: this.stats(), ...Object.fromEntries([...this.published].map(([name, read]) => [name, read()])) };
      const text = JSON.stringify(line);
      if (text === last) return;
      last = text;
      this.log.info(line, 'connection counters');
    }, intervalMs);
    this.summaryTimer.unref();
  }

  close(): void {
    if (this.summaryTimer) clearInterval(this.summaryTimer);
    for (const guard of this.guards.values()) guard.close();
  }
}
