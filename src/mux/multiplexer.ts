/**
 * One port, every protocol. Each accepted connection is sniffed (sniff.ts) within a deadline, then:
 *
 *   PROXY v1/v2 header ─► (only with proxy_protocol on, at most one, and only from a trusted source: trust.ts
 *                          decides by the socket's peer) client address taken from it, sniff again; else closed,
 *                          counted and logged at a limited rate, before the header is even parsed
 *   TLS  ─► ClientHello parsed here (clienthello.ts), routed BEFORE the handshake by SNI / ALPN to one of the
 *           routes the caller gave (routes.ts decides which); a hello no route takes gets the TLS alert
 *           no_application_protocol and is closed. The route gets the socket with the hello bytes pushed back,
 *           and terminates TLS itself (its own certificate, client-certificate policy and ALPN) or passes the
 *           bytes through untouched
 *   SSH  ─► the route that takes sniffed ssh
 *   HTTP ─► the route that takes sniffed http
 *   GWDATA1 / GWE2E1 ─► the routes that take them (end-to-end streams' data connections and client streams)
 *   else ─► closed, logged at a limited rate
 *
 * The multiplexer knows no protocol by name: which ALPN, server name or first bytes lead where is the caller's
 * list of routes (the Proxy's comes from src/proxy/protocols.ts).
 *
 * A client that sends nothing, or trickles bytes, is closed when the deadline passes (the connection's "detect"
 * phase, src/net/deadlines.ts); nothing is buffered beyond the largest ClientHello allowed. Once the client's
 * address is known (after a PROXY header, if any) the connection is counted against its source's cap.
 */
import type { Duplex } from 'node:stream';
import type net from 'node:net';
import { GatewayError, isGatewayError, type ErrorCode } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { recordRouted } from '../metrics/listeners.js';
import { connectionOf, type Connection } from '../net/deadlines.js';
import { parseClientHello, DEFAULT_MAX_HELLO_BYTES } from './clienthello.js';
import { setClientAddress } from '../stream/meta.js';
import { parseProxyHeader } from './proxyproto.js';
import { RouteTable, type Route } from './routes.js';
import { sniffProtocol } from './sniff.js';
import { decideProxyHeader, proxyHeaderPolicy, type ProxyHeaderPolicy } from './trust.js';

/**
 * A TLS 1.2-framed fatal alert record (RFC 8446 section 6: level 2, the description), valid before any handshake
 * message from us, which every TLS version reads: what a route that takes no TLS of its own answers a ClientHello.
 */
export function fatalTlsAlert(description: number): Buffer {
  return Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, description]);
}

/** Fatal alert 120 (no_application_protocol). */
export const NO_APPLICATION_PROTOCOL_ALERT = fatalTlsAlert(120);

/** The client's address of a routed connection, "ip:port", as logs and audit name it. */
export function clientOf(info: Pick<ConnInfo, 'remoteAddress' | 'remotePort'>): string {
  return `${info.remoteAddress}:${info.remotePort}`;
}

export interface ConnInfo {
  /** The client's address: from the PROXY header when one was accepted, else the socket's peer. */
  remoteAddress: string;
  remotePort: number;
  /** The address the client connected to (from the PROXY header when present). */
  localAddress: string;
  localPort: number;
  /** For TLS routes: the ALPN protocol chosen for the client (exactly as offered, "-ping" included). */
  alpn?: string;
  /** The name of the route that took the connection ("gateway-postgres" for "gateway-postgres-ping"). */
  route: string;
  serverName?: string;
  clientAlpn?: string[];
  /** Whether the proxy must send keep-alive pings inside the stream (a "-ping" ALPN). */
  ping?: boolean;
  /** Set when the stream came through /webapi/connectionupgrade. */
  upgraded?: boolean;
}

/**
 * Why the connection took its route, in routes.ts's terms, for a span or a log line: "ALPN gateway-proxy-ssh",
 * "TLS without a chosen ALPN (server name …)" (a server-name or no-ALPN route), "first bytes" (plain SSH or
 * HTTP), with " (through /webapi/connectionupgrade)" when upgraded.
 */
export function routeReason(info: ConnInfo): string {
  const tls = info.clientAlpn !== undefined;
  const how = info.alpn ? `ALPN ${info.alpn}` : tls ? `TLS without a chosen ALPN${info.serverName ? ` (server name ${info.serverName})` : ''}` : 'first bytes';
  return info.upgraded ? `${how} (through /webapi/connectionupgrade)` : how;
}

export type RouteHandler = (stream: Duplex, info: ConnInfo) => void;
export type MuxRoute = Route<RouteHandler>;

export interface MultiplexerOptions {
  /** Every route this port serves, with what each matches (see routes.ts for how one is chosen). */
  routes: readonly MuxRoute[];
  proxyProtocol: boolean;
  /**
   * With proxyProtocol: the sources a PROXY header is believed from (addresses and CIDR networks, as
   * proxy_service.proxy_protocol_trusted_sources; trust.ts). Empty or absent: any source.
   */
  proxyProtocolTrusted?: readonly string[];
  detectTimeoutMs: number;
  maxHelloBytes?: number;
  log?: Logger;
  /** Lines per minute for refused connections (garbage, bad hellos): the rest are counted, not logged. */
  refusalLogsPerMinute?: number;
}

export interface MultiplexerStats {
  accepted: number;
  detecting: number;
  routed: Record<string, number>;
  refused: Record<string, number>;
}

interface Source {
  remoteAddress: string;
  remotePort: number;
  localAddress: string;
  localPort: number;
}

/** What a route is handed besides the client's address and the route's name. */
type RouteDetails = Omit<ConnInfo, keyof Source | 'route'>;

/** What one connection's detection needs from its multiplexer. */
interface MuxContext {
  readonly routes: RouteTable<RouteHandler>;
  /** Replaced whole by setProxyProtocolTrusted (SIGHUP); each header is judged by the policy of its moment. */
  proxyHeaders: ProxyHeaderPolicy;
  readonly detectTimeoutMs: number;
  readonly maxHello: number;
  readonly stats: MultiplexerStats;
  readonly log: Logger;
  readonly refusals: RefusalLog;
}

export class Multiplexer {
  /** The routes, as the routing decision reads them. */
  readonly routes: RouteTable<RouteHandler>;
  private readonly stats: MultiplexerStats = { accepted: 0, detecting: 0, routed: {}, refused: {} };
  private readonly context: MuxContext;

  constructor(options: MultiplexerOptions) {
    const log = options.log ?? logger('mux');
    this.routes = new RouteTable(options.routes);
    this.context = {
      routes: this.routes,
      proxyHeaders: proxyHeaderPolicy(options.proxyProtocol, options.proxyProtocolTrusted),
      detectTimeoutMs: options.detectTimeoutMs,
      maxHello: options.maxHelloBytes ?? DEFAULT_MAX_HELLO_BYTES,
      stats: this.stats,
      log,
      refusals: new RefusalLog(log, options.refusalLogsPerMinute ?? 60),
    };
  }

  getStats(): MultiplexerStats {
    return structuredClone(this.stats);
  }

  /**
   * New trusted sources for PROXY headers (a reload): headers that arrive from now on are judged by them;
   * connections whose header was already taken keep their client. proxy_protocol itself is not changed here
   * (off stays off: the listeners count sources at accept then). The list must have passed the config's check.
   */
  setProxyProtocolTrusted(sources: readonly string[]): ProxyHeaderPolicy {
    if (this.context.proxyHeaders.mode !== 'off') this.context.proxyHeaders = proxyHeaderPolicy(true, sources);
    return this.context.proxyHeaders;
  }

  /** For net.Server 'connection'. The socket's addresses are read when they are needed (routing, a refusal). */
  handleSocket = (socket: net.Socket): void => {
    socket.setNoDelay(true);
    new Detection(this.context, socket, undefined, undefined).start();
  };

  /**
   * Sniffs and routes any duplex stream (a socket, or a stream that arrived through a connection upgrade).
   * `upgrade`: the stream came through a connection upgrade (no PROXY header is taken inside it); with a route,
   * only that route may take it, without one it is routed by its first bytes as a new connection on the port.
   */
  handleStream(stream: Duplex, source: Source, upgrade?: { route?: string }): void {
    new Detection(this.context, stream, source, upgrade).start();
  }
}

/**
 * The detection in progress on each stream. Its listeners are the four functions below, shared by every
 * connection: a connection in detection holds this one object and no closure, timer or once() wrapper of its own
 * (its deadline is a node on its Connection's list, src/net/deadlines.ts).
 */
const detections = new WeakMap<Duplex, Detection>();

function onReadable(this: Duplex): void {
  detections.get(this)?.read();
}
function onEnd(this: Duplex): void {
  detections.get(this)?.refuse('closed-early');
}
function onError(this: Duplex): void {
  detections.get(this)?.refuse('socket-error');
}
function onClose(this: Duplex): void {
  detections.get(this)?.refuse('closed-early');
}

/** The addresses of an accepted socket, as ConnInfo gives them. */
function sourceOf(socket: Duplex): Source {
  const s = socket as Partial<net.Socket>;
  return { remoteAddress: s.remoteAddress ?? '', remotePort: s.remotePort ?? 0, localAddress: s.localAddress ?? '', localPort: s.localPort ?? 0 };
}

/**
 * One connection from its first byte to its route (or its refusal). Every byte read is kept until the decision
 * (the first read as it came, without a copy), then the bytes after any PROXY header are pushed back onto the
 * stream for the route. The stream is read in paused mode ('readable'), so that once detection lets go of it the
 * route finds it as a fresh stream: the first 'data' listener or pipe() starts its flow.
 */
class Detection {
  private buffered: Buffer | undefined;
  /** Bytes of PROXY header already taken off the front (more than 0 once a header was taken). */
  private consumed = 0;
  private done = false;
  private readonly conn: Connection;

  constructor(
    private readonly mux: MuxContext,
    private readonly stream: Duplex,
    /** The client, once known: given with the stream, or from a PROXY header; else the socket's own addresses. */
    private client: Source | undefined,
    /** A connection upgrade's stream; with route, only that route may take it (else any, by its first bytes). */
    private readonly upgrade: { route?: string } | undefined,
  ) {
    this.conn = connectionOf(stream);
  }

  start(): void {
    this.mux.stats.accepted++;
    this.mux.stats.detecting++;
    detections.set(this.stream, this);
    this.conn.enter('detect', this.mux.detectTimeoutMs, this);
    this.stream.on('readable', onReadable);
    this.stream.on('end', onEnd);
    this.stream.on('error', onError);
    this.stream.on('close', onClose);
  }

  /** For the detect phase of the Connection: its deadline passed. */
  onExpire(): void {
    this.refuse('detect-timeout', `no decision within ${this.mux.detectTimeoutMs} ms (${this.buffered?.length ?? 0} bytes)`);
  }

  read(): void {
    let chunk: Buffer | null;
    while (!this.done && (chunk = this.stream.read() as Buffer | null) !== null) {
      const buffered = this.buffered === undefined ? chunk : Buffer.concat([this.buffered, chunk]);
      this.buffered = buffered;
      this.decide(buffered);
      if (!this.done && buffered.length - this.consumed > this.mux.maxHello + 5) {
        // Larger than any acceptable first message (the hello parser would say so too): stop buffering now.
        this.refuse('too-large', `${buffered.length} bytes without a decision`);
      }
    }
  }

  /** Looks at what has arrived (after any PROXY header) and routes, refuses, or waits for more. */
  private decide(buffered: Buffer): void {
    for (;;) {
      const view = this.consumed === 0 ? buffered : buffered.subarray(this.consumed);
      const sniffed = sniffProtocol(view);
      switch (sniffed.kind) {
        case 'need-more':
          return;
        case 'unknown':
          return this.refuse('unknown-protocol', JSON.stringify(view.subarray(0, 8).toString('latin1')));
        case 'proxy-v1':
        case 'proxy-v2':
          if (!this.takeProxyHeader(view)) return;
          continue;
        case 'ssh':
        case 'http':
        case 'gwdata':
        case 'gwe2e': {
          const route = this.mux.routes.forSniffed(sniffed.kind, this.upgrade?.route);
          if (!route) return this.refuse(`${sniffed.kind}-not-served`);
          return this.route(route, undefined, view);
        }
        case 'tls':
          return this.routeTls(view);
      }
    }
  }

  /**
   * Takes a PROXY header off the front; false when the connection was refused or the header is incomplete.
   * Whether a header may come from this peer is decided (trust.ts) before a byte of it is parsed.
   */
  private takeProxyHeader(view: Buffer): boolean {
    const peer = (this.client ?? sourceOf(this.stream)).remoteAddress;
    // No peer address: the socket was reset before its first bytes were read (a balancer's health check sends
    // its header and resets). It is gone, whoever it was: not a header from an untrusted source.
    if (peer === '') {
      this.refuse('closed-early', 'the peer was gone before its PROXY header was read');
      return false;
    }
    const verdict = decideProxyHeader(this.mux.proxyHeaders, { peer, headersTaken: this.consumed > 0 ? 1 : 0, upgraded: this.upgrade !== undefined });
    if (!verdict.take) {
      this.refuse(verdict.refusal, verdict.reason, undefined, verdict.code);
      return false;
    }
    let header;
    try {
      header = parseProxyHeader(view);
    } catch (err) {
      this.refuse('bad-proxy-header', isGatewayError(err) ? err.message : String(err));
      return false;
    }
    if (header.kind === 'need-more') return false;
    this.consumed += header.length;
    if (header.command === 'PROXY' && header.source && header.destination) {
      this.client = {
        remoteAddress: header.source.address,
        remotePort: header.source.port,
        localAddress: header.destination.address,
        localPort: header.destination.port,
      };
    }
    return true;
  }

  private routeTls(view: Buffer): void {
    let hello;
    try {
      hello = parseClientHello(view, { maxBytes: this.mux.maxHello });
    } catch (err) {
      const e = err as GatewayError;
      return this.refuse(e.code === 'GW_ERR_MUX_HELLO_TOO_LARGE' ? 'hello-too-large' : 'bad-hello', e.message);
    }
    if (hello.kind === 'need-more') return;
    const choice = this.mux.routes.forHello(hello, this.upgrade?.route);
    if (!choice) return this.refuse('no-application-protocol', `offered ${JSON.stringify(hello.alpn)}`, NO_APPLICATION_PROTOCOL_ALERT);
    const details: RouteDetails = { clientAlpn: hello.alpn };
    if (hello.serverName) details.serverName = hello.serverName;
    if (choice.alpn !== undefined) {
      details.alpn = choice.alpn;
      details.ping = choice.ping === true;
    }
    this.route(choice.route, details, view);
  }

  /** Hands the stream to its route, with `rest` (what arrived after any PROXY header) pushed back onto it. */
  private route(route: MuxRoute, details: RouteDetails | undefined, rest: Buffer): void {
    if (this.done) return;
    const { stream } = this;
    const given = this.client;
    const client = given ?? sourceOf(stream);
    // The client's address is known now (a PROXY header names it): count it against its source's cap.
    if (!this.conn.attribute(client.remoteAddress)) return this.refuse('source-cap', `${client.remoteAddress} holds as many connections as it may`);
    if (!this.finish()) return;
    const { name } = route;
    const { stats, log } = this.mux;
    stats.routed[name] = (stats.routed[name] ?? 0) + 1;
    this.conn.routed(recordRouted(name));
    if (rest.length > 0) stream.unshift(rest);
    // Only a stream that is not the client's own socket needs the address recorded (clientAddress() falls back to
    // the socket's peer).
    if (given) setClientAddress(stream, client.remoteAddress, client.remotePort);
    if (log.isLevelEnabled('debug')) {
      log.debug({ route: name, client: `${client.remoteAddress}:${client.remotePort}`, alpn: details?.alpn, sni: details?.serverName }, 'connection routed');
    }
    const info: ConnInfo = { ...client, ...details, route: name };
    if (this.upgrade) info.upgraded = true;
    try {
      route.handler(stream, info);
    } catch (err) {
      log.error({ err, route: name }, 'route handler failed');
      stream.destroy();
    }
  }

  refuse(reason: string, detail?: string, reply?: Buffer, code?: ErrorCode): void {
    if (!this.finish()) return;
    this.mux.stats.refused[reason] = (this.mux.stats.refused[reason] ?? 0) + 1;
    this.conn.refusedBy(reason);
    this.mux.refusals.note(reason, this.client ?? (this.stream as Partial<net.Socket>), detail, code);
    if (reply) this.stream.end(reply);
    this.stream.destroy();
  }

  /** Ends detection once: false when it had already ended. */
  private finish(): boolean {
    if (this.done) return false;
    this.done = true;
    this.buffered = undefined;
    this.conn.leave('detect');
    detections.delete(this.stream);
    this.stream.off('readable', onReadable);
    this.stream.off('end', onEnd);
    this.stream.off('error', onError);
    this.stream.off('close', onClose);
    this.mux.stats.detecting--;
    return true;
  }
}

/**
 * Refused connections are logged at most `perMinute` a minute (and as many with a code); the rest are counted
 * by reason and summed up in one line at the first refusal of a later minute.
 */
class RefusalLog {
  private windowStart = 0;
  /**
   * Lines logged this minute, in two budgets of perMinute each: refusals with a code (a PROXY header from an
   * unlisted source: an operator should look) and the rest (scanners, garbage), so that a flood of the second
   * cannot hide the first.
   */
  private readonly logged = { coded: 0, other: 0 };
  /** Refusals not logged this minute, by reason (a fixed set of words: bounded). */
  private suppressed: Record<string, number> = {};

  constructor(
    private readonly log: Logger,
    private readonly perMinute: number,
  ) {}

  /** client: the client's address, or the socket it is read from (only when the line is logged). */
  note(reason: string, client: { remoteAddress?: string | undefined; remotePort?: number | undefined }, detail?: string, code?: ErrorCode): void {
    const now = Date.now();
    if (now - this.windowStart >= 60_000) {
      const total = Object.values(this.suppressed).reduce((a, b) => a + b, 0);
      if (total > 0) this.log.warn({ suppressed: total, by_reason: this.suppressed }, 'refused connections not logged in the last minute');
      this.windowStart = now;
      this.logged.coded = 0;
      this.logged.other = 0;
      this.suppressed = {};
    }
    const budget = code ? 'coded' : 'other';
    if (this.logged[budget] >= this.perMinute) {
      this.suppressed[reason] = (this.suppressed[reason] ?? 0) + 1;
      return;
    }
    this.logged[budget]++;
    const line = { reason, client: `${client.remoteAddress ?? ''}:${client.remotePort ?? 0}`, ...(detail ? { detail } : {}), ...(code ? { code } : {}) };
    // A refusal with a code is one an operator should look at (a client posing as the balancer); the rest is noise.
    if (code) this.log.warn(line, 'connection refused');
    else this.log.info(line, 'connection refused');
  }
}
