/**
 * One port, every protocol. Each accepted connection is sniffed (sniff.ts) within a deadline, then:
 *
 *   PROXY v1/v2 header ─► (only with proxy_protocol on, at most one) client address taken from it, sniff again
 *   TLS  ─► ClientHello parsed here (clienthello.ts), routed BEFORE the handshake by SNI / ALPN to one of the
 *           routes the caller gave (routes.ts decides which); a hello no route takes gets the TLS alert
 *           no_application_protocol and is closed. The route gets the socket with the hello bytes pushed back,
 *           and terminates TLS itself (its own certificate, client-certificate policy and ALPN) or passes the
 *           bytes through untouched
 *   SSH  ─► the route that takes sniffed ssh
 *   HTTP ─► the route that takes sniffed http
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
import { GatewayError, isGatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { connectionOf, type Connection } from '../net/deadlines.js';
import { parseClientHello, DEFAULT_MAX_HELLO_BYTES } from './clienthello.js';
import { setClientAddress } from '../stream/meta.js';
import { parseProxyHeader } from './proxyproto.js';
import { RouteTable, type Route } from './routes.js';
import { sniffProtocol } from './sniff.js';

/** TLS 1.2-framed fatal alert 120 (no_application_protocol), valid before any handshake message from us. */
export const NO_APPLICATION_PROTOCOL_ALERT = Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x78]);

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

export type RouteHandler = (stream: Duplex, info: ConnInfo) => void;
export type MuxRoute = Route<RouteHandler>;

export interface MultiplexerOptions {
  /** Every route this port serves, with what each matches (see routes.ts for how one is chosen). */
  routes: readonly MuxRoute[];
  proxyProtocol: boolean;
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
  readonly proxyProtocol: boolean;
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
      proxyProtocol: options.proxyProtocol,
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

  /** For net.Server 'connection'. */
  handleSocket = (socket: net.Socket): void => {
    socket.setNoDelay(true);
    this.handleStream(socket, {
      remoteAddress: socket.remoteAddress ?? '',
      remotePort: socket.remotePort ?? 0,
      localAddress: socket.localAddress ?? '',
      localPort: socket.localPort ?? 0,
    });
  };

  /**
   * Sniffs and routes any duplex stream (a socket, or a stream that arrived through a connection upgrade).
   * `upgrade` restricts routing to the one route the connection upgrade named.
   */
  handleStream(stream: Duplex, source: Source, upgrade?: { route: string }): void {
    new Detection(this.context, stream, source, upgrade).start();
  }
}

/**
 * One connection from its first byte to its route (or its refusal). Every byte read is kept until the decision,
 * then pushed back onto the stream for the route.
 */
class Detection {
  private buffered: Buffer = Buffer.alloc(0);
  /** Bytes of PROXY header already taken off the front. */
  private consumed = 0;
  private proxyHeaderSeen = false;
  private client: Source;
  private done = false;
  private readonly conn: Connection;

  constructor(
    private readonly mux: MuxContext,
    private readonly stream: Duplex,
    source: Source,
    private readonly upgrade: { route: string } | undefined,
  ) {
    this.client = source;
    this.conn = connectionOf(stream);
  }

  start(): void {
    this.mux.stats.accepted++;
    this.mux.stats.detecting++;
    const ms = this.mux.detectTimeoutMs;
    this.conn.enter('detect', ms, {
      onExpire: () => this.refuse('detect-timeout', `no decision within ${ms} ms (${this.buffered.length} bytes)`),
    });
    this.stream.on('readable', this.onReadable);
    this.stream.once('end', this.onEnd);
    this.stream.once('error', this.onError);
    this.stream.once('close', this.onClose);
  }

  private readonly onReadable = (): void => {
    let chunk: Buffer | null;
    while (!this.done && (chunk = this.stream.read() as Buffer | null) !== null) {
      this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
      if (this.buffered.length - this.consumed > this.mux.maxHello + 5) {
        // Larger than any acceptable first message: the hello parser would say so too; stop buffering now.
        this.decide();
        if (!this.done) this.refuse('too-large', `${this.buffered.length} bytes without a decision`);
        return;
      }
      this.decide();
    }
  };
  private readonly onEnd = (): void => this.refuse('closed-early');
  private readonly onError = (): void => this.refuse('socket-error');
  private readonly onClose = (): void => this.refuse('closed-early');

  /** Looks at what has arrived (after any PROXY header) and routes, refuses, or waits for more. */
  private decide(): void {
    for (;;) {
      const view = this.buffered.subarray(this.consumed);
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
        case 'http': {
          const route = this.mux.routes.forSniffed(sniffed.kind, this.upgrade?.route);
          if (!route) return this.refuse(`${sniffed.kind}-not-served`);
          return this.route(route, {});
        }
        case 'tls':
          return this.routeTls(view);
      }
    }
  }

  /** Takes a PROXY header off the front; false when the connection was refused or the header is incomplete. */
  private takeProxyHeader(view: Buffer): boolean {
    const unwanted = !this.mux.proxyProtocol
      ? ['proxy-protocol-off', 'a PROXY header arrived but proxy_protocol is off']
      : this.proxyHeaderSeen
        ? ['proxy-protocol-twice', 'a second PROXY header on one connection']
        : this.upgrade
          ? ['proxy-protocol-in-upgrade']
          : undefined;
    if (unwanted) {
      this.refuse(unwanted[0]!, unwanted[1]);
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
    this.proxyHeaderSeen = true;
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
    this.route(choice.route, {
      clientAlpn: hello.alpn,
      ...(hello.serverName ? { serverName: hello.serverName } : {}),
      ...(choice.alpn === undefined ? {} : { alpn: choice.alpn, ping: choice.ping === true }),
    });
  }

  private route(route: MuxRoute, details: RouteDetails): void {
    if (this.done) return;
    const { client, stream } = this;
    // The client's address is known now (a PROXY header names it): count it against its source's cap.
    if (!this.conn.attribute(client.remoteAddress)) return this.refuse('source-cap', `${client.remoteAddress} holds as many connections as it may`);
    if (!this.finish()) return;
    const { name } = route;
    this.mux.stats.routed[name] = (this.mux.stats.routed[name] ?? 0) + 1;
    const rest = this.buffered.subarray(this.consumed);
    if (rest.length > 0) stream.unshift(rest);
    setClientAddress(stream, client.remoteAddress, client.remotePort);
    this.mux.log.debug({ route: name, client: `${client.remoteAddress}:${client.remotePort}`, ...(details.alpn ? { alpn: details.alpn } : {}), ...(details.serverName ? { sni: details.serverName } : {}) }, 'connection routed');
    this.buffered = Buffer.alloc(0);
    try {
      route.handler(stream, { ...client, ...details, route: name, ...(this.upgrade ? { upgraded: true } : {}) });
    } catch (err) {
      this.mux.log.error({ err, route: name }, 'route handler failed');
      stream.destroy();
    }
  }

  private refuse(reason: string, detail?: string, reply?: Buffer): void {
    if (!this.finish()) return;
    this.mux.stats.refused[reason] = (this.mux.stats.refused[reason] ?? 0) + 1;
    this.mux.refusals.note(reason, this.client, detail);
    if (reply) this.stream.end(reply);
    this.stream.destroy();
  }

  /** Ends detection once: false when it had already ended. */
  private finish(): boolean {
    if (this.done) return false;
    this.done = true;
    this.conn.leave('detect');
    this.stream.off('readable', this.onReadable);
    this.stream.off('end', this.onEnd);
    this.stream.off('error', this.onError);
    this.stream.off('close', this.onClose);
    this.mux.stats.detecting--;
    return true;
  }
}

/** Refused connections are logged at most `perMinute` a minute; the rest are counted and summed up once a minute. */
class RefusalLog {
  private windowStart = 0;
  private logged = 0;
  private suppressed = 0;

  constructor(
    private readonly log: Logger,
    private readonly perMinute: number,
  ) {}

  note(reason: string, client: Source, detail?: string): void {
    const now = Date.now();
    if (now - this.windowStart >= 60_000) {
      if (this.suppressed > 0) this.log.warn({ suppressed: this.suppressed }, 'refused connections not logged in the last minute');
      this.windowStart = now;
      this.logged = 0;
      this.suppressed = 0;
    }
    if (this.logged >= this.perMinute) {
      this.suppressed++;
      return;
    }
    this.logged++;
    this.log.info({ reason, client: `${client.remoteAddress}:${client.remotePort}`, ...(detail ? { detail } : {}) }, 'connection refused');
  }
}
