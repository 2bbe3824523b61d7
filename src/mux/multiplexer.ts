/**
 * One port, every protocol. Each accepted connection is sniffed (sniff.ts) within a deadline, then:
 *
 *   PROXY v1/v2 header ─► (only with proxy_protocol on, at most one) client address taken from it, sniff again
 *   TLS  ─► ClientHello parsed here (clienthello.ts), routed BEFORE the handshake by SNI / ALPN:
 *             SNI kube-gateway-proxy-alpn.*          → kube
 *             first client ALPN with a route          → that route (a "-ping" suffix maps to its base protocol)
 *             no ALPN, http/1.1, h2                   → web
 *             ALPNs but none served                   → TLS alert no_application_protocol, closed
 *           the route gets the socket with the hello bytes pushed back, and terminates TLS itself (its own
 *           certificate, client-certificate policy and ALPN) or passes the bytes through untouched
 *   SSH  ─► ssh route (raw SSH on the web port)
 *   HTTP ─► plain-http route (a redirect to HTTPS)
 *   else ─► closed, logged at a limited rate
 *
 * A client that sends nothing, or trickles bytes, is closed when the deadline passes (the connection's "detect"
 * phase, src/net/deadlines.ts); nothing is buffered beyond the largest ClientHello allowed. Once the client's
 * address is known (after a PROXY header, if any) the connection is counted against its source's cap.
 */
import type { Duplex } from 'node:stream';
import type net from 'node:net';
import { GatewayError, isGatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { connectionOf } from '../net/deadlines.js';
import { parseClientHello, DEFAULT_MAX_HELLO_BYTES } from './clienthello.js';
import { setClientAddress } from '../stream/meta.js';
import { parseProxyHeader } from './proxyproto.js';
import { sniffProtocol } from './sniff.js';

export const KUBE_SNI_PREFIX = 'kube-gateway-proxy-alpn.';
/** Protocols that accept a "-ping" suffix (keep-alive pings inside the stream). */
const PING_CAPABLE = new Set(['gateway-postgres', 'gateway-mysql', 'gateway-mongodb', 'gateway-redis', 'gateway-tcp']);
const WEB_ALPNS = new Set(['http/1.1', 'h2']);

/** The route an ALPN protocol names: "gateway-postgres" for "gateway-postgres-ping"; any other name unchanged. */
export function alpnBase(protocol: string): string {
  return protocol.endsWith('-ping') && PING_CAPABLE.has(protocol.slice(0, -5)) ? protocol.slice(0, -5) : protocol;
}

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
  /** The route name the ALPN maps to ("gateway-postgres" for "gateway-postgres-ping"). */
  route: string;
  serverName?: string;
  clientAlpn?: string[];
  /** Whether the proxy must send keep-alive pings inside the stream (a "-ping" ALPN). */
  ping?: boolean;
  /** Set when the stream came through /webapi/connectionupgrade. */
  upgraded?: boolean;
}

export type RouteHandler = (stream: Duplex, info: ConnInfo) => void;

export interface MultiplexerOptions {
  /** TLS routes by ALPN protocol name (gateway-reversetunnel, gateway-postgres, ...). */
  alpn: ReadonlyMap<string, RouteHandler>;
  /** TLS with no ALPN, http/1.1 or h2. */
  web: RouteHandler;
  /** TLS whose SNI starts with kube-gateway-proxy-alpn. */
  kube?: RouteHandler;
  /** Raw SSH on this port. */
  ssh?: RouteHandler;
  /** Plain HTTP on this port (a redirect to HTTPS). */
  http?: RouteHandler;
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

export class Multiplexer {
  private readonly log: Logger;
  private readonly maxHello: number;
  private readonly stats: MultiplexerStats = { accepted: 0, detecting: 0, routed: {}, refused: {} };
  private refusalWindowStart = 0;
  private refusalsLogged = 0;
  private refusalsSuppressed = 0;

  constructor(private readonly options: MultiplexerOptions) {
    this.log = options.log ?? logger('mux');
    this.maxHello = options.maxHelloBytes ?? DEFAULT_MAX_HELLO_BYTES;
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
   * `only` restricts TLS routing to one ALPN route (connection upgrades name theirs up front).
   */
  handleStream(stream: Duplex, source: Source, upgrade?: { route: string }): void {
    this.stats.accepted++;
    this.stats.detecting++;
    let buffered: Buffer = Buffer.alloc(0);
    let consumed = 0; // bytes of PROXY header already taken off the front
    let proxyHeaderSeen = false;
    let client = source;
    let done = false;
    const conn = connectionOf(stream);

    const finish = () => {
      if (done) return false;
      done = true;
      conn.leave('detect');
      stream.off('readable', onReadable);
      stream.off('end', onEnd);
      stream.off('error', onError);
      stream.off('close', onClose);
      this.stats.detecting--;
      return true;
    };
    const refuse = (reason: string, detail?: string, reply?: Buffer) => {
      if (!finish()) return;
      this.stats.refused[reason] = (this.stats.refused[reason] ?? 0) + 1;
      this.logRefusal(reason, client, detail);
      if (reply) stream.end(reply);
      stream.destroy();
    };
    const route = (name: string, handler: RouteHandler, info: Omit<ConnInfo, keyof Source | 'route'>) => {
      if (done) return;
      // The client's address is known now (a PROXY header names it): count it against its source's cap.
      if (!conn.attribute(client.remoteAddress)) return refuse('source-cap', `${client.remoteAddress} holds as many connections as it may`);
      if (!finish()) return;
      this.stats.routed[name] = (this.stats.routed[name] ?? 0) + 1;
      const rest = buffered.subarray(consumed);
      if (rest.length > 0) stream.unshift(rest);
      setClientAddress(stream, client.remoteAddress, client.remotePort);
      this.log.debug({ route: name, client: `${client.remoteAddress}:${client.remotePort}`, ...(info.alpn ? { alpn: info.alpn } : {}), ...(info.serverName ? { sni: info.serverName } : {}) }, 'connection routed');
      buffered = Buffer.alloc(0);
      try {
        handler(stream, { ...client, ...info, route: name, ...(upgrade ? { upgraded: true } : {}) });
      } catch (err) {
        this.log.error({ err, route: name }, 'route handler failed');
        stream.destroy();
      }
    };

    const decide = (): void => {
      for (;;) {
        const view = buffered.subarray(consumed);
        const sniffed = sniffProtocol(view);
        switch (sniffed.kind) {
          case 'need-more':
            return;
          case 'unknown':
            return refuse('unknown-protocol', JSON.stringify(view.subarray(0, 8).toString('latin1')));
          case 'proxy-v1':
          case 'proxy-v2': {
            if (!this.options.proxyProtocol) return refuse('proxy-protocol-off', 'a PROXY header arrived but proxy_protocol is off');
            if (proxyHeaderSeen) return refuse('proxy-protocol-twice', 'a second PROXY header on one connection');
            if (upgrade) return refuse('proxy-protocol-in-upgrade');
            let header;
            try {
              header = parseProxyHeader(view);
            } catch (err) {
              return refuse('bad-proxy-header', isGatewayError(err) ? err.message : String(err));
            }
            if (header.kind === 'need-more') return;
            proxyHeaderSeen = true;
            consumed += header.length;
            if (header.command === 'PROXY' && header.source && header.destination) {
              client = {
                remoteAddress: header.source.address,
                remotePort: header.source.port,
                localAddress: header.destination.address,
                localPort: header.destination.port,
              };
            }
            continue;
          }
          case 'ssh':
            if (upgrade || !this.options.ssh) return refuse('ssh-not-served');
            return route('ssh', this.options.ssh, {});
          case 'http':
            if (upgrade || !this.options.http) return refuse('http-not-served');
            return route('http', this.options.http, {});
          case 'tls':
            return this.routeTls(view, route, refuse, upgrade);
        }
      }
    };

    const onReadable = () => {
      let chunk: Buffer | null;
      while (!done && (chunk = stream.read() as Buffer | null) !== null) {
        buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
        if (buffered.length - consumed > this.maxHello + 5) {
          // Larger than any acceptable first message: the hello parser would say so too; stop buffering now.
          decide();
          if (!done) refuse('too-large', `${buffered.length} bytes without a decision`);
          return;
        }
        decide();
      }
    };
    const onEnd = () => refuse('closed-early');
    const onError = () => refuse('socket-error');
    const onClose = () => refuse('closed-early');
    conn.enter('detect', this.options.detectTimeoutMs, {
      onExpire: () => refuse('detect-timeout', `no decision within ${this.options.detectTimeoutMs} ms (${buffered.length} bytes)`),
    });
    stream.on('readable', onReadable);
    stream.once('end', onEnd);
    stream.once('error', onError);
    stream.once('close', onClose);
  }

  private routeTls(
    view: Buffer,
    route: (name: string, handler: RouteHandler, info: Omit<ConnInfo, 'remoteAddress' | 'remotePort' | 'localAddress' | 'localPort' | 'route'>) => void,
    refuse: (reason: string, detail?: string, reply?: Buffer) => void,
    upgrade: { route: string } | undefined,
  ): void {
    let hello;
    try {
      hello = parseClientHello(view, { maxBytes: this.maxHello });
    } catch (err) {
      const e = err as GatewayError;
      return refuse(e.code === 'GW_ERR_MUX_HELLO_TOO_LARGE' ? 'hello-too-large' : 'bad-hello', e.message);
    }
    if (hello.kind === 'need-more') return;
    const common = { clientAlpn: hello.alpn, ...(hello.serverName ? { serverName: hello.serverName } : {}) };
    if (!upgrade && hello.serverName?.startsWith(KUBE_SNI_PREFIX)) {
      if (!this.options.kube) return refuse('kube-not-served', hello.serverName, NO_APPLICATION_PROTOCOL_ALERT);
      return route('kube', this.options.kube, common);
    }
    for (const offered of hello.alpn) {
      const base = alpnBase(offered);
      if (upgrade && base !== upgrade.route) continue;
      const handler = this.options.alpn.get(base);
      if (handler) return route(base, handler, { ...common, alpn: offered, ping: base !== offered });
      if (!upgrade && WEB_ALPNS.has(offered)) return route('web', this.options.web, { ...common, alpn: offered });
    }
    if (hello.alpn.length === 0 && !upgrade) return route('web', this.options.web, common);
    return refuse('no-application-protocol', `offered ${JSON.stringify(hello.alpn)}`, NO_APPLICATION_PROTOCOL_ALERT);
  }

  private logRefusal(reason: string, client: Source, detail?: string): void {
    const now = Date.now();
    if (now - this.refusalWindowStart >= 60_000) {
      if (this.refusalsSuppressed > 0) this.log.warn({ suppressed: this.refusalsSuppressed }, 'refused connections not logged in the last minute');
      this.refusalWindowStart = now;
      this.refusalsLogged = 0;
      this.refusalsSuppressed = 0;
    }
    if (this.refusalsLogged >= (this.options.refusalLogsPerMinute ?? 60)) {
      this.refusalsSuppressed++;
      return;
    }
    this.refusalsLogged++;
    this.log.info({ reason, client: `${client.remoteAddress}:${client.remotePort}`, ...(detail ? { detail } : {}) }, 'connection refused');
  }
}
