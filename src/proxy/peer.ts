/**
 * Proxy peering (docs/proxy.md, "Proxy peering"): a Proxy reaches an agent whose tunnel another Proxy holds by
 * asking that Proxy, on its peering listener (proxy_service.peer_listen_addr, 3021).
 *
 *   transport   HTTP/2 (node:http2) over TLS 1.3 with ALPN gateway-peer: one connection per pair of Proxies,
 *               one stream per client connection. Chosen by measurement against the ssh2 channel protocol the
 *               tunnels use (bench/peer-transport.ts, bench/RESULTS.md "peer-transport").
 *   identity    mutual TLS with the cluster's host CA. The server accepts only a host certificate of this cluster
 *               with the system role "proxy" whose host ID is a live Proxy (cluster.ts); the client accepts only
 *               a server certificate naming the host ID of the Proxy it meant to reach, with the same role.
 *   a stream    POST PEER_PATH with headers x-gateway-host (the agent's host ID) and x-gateway-dial (the
 *               DialRequest, the same JSON as the tunnel's: src/tunnel/protocol.ts). Answer: :status 200 once the
 *               agent reached the resource, else an error status with x-gateway-error ({code, message, hint}).
 *               Then the stream carries the connection's bytes both ways (HTTP/2 flow control is the
 *               back-pressure; END_STREAM is the half-close).
 *   no loops    the server answers from this Proxy's own tunnels only, never over peering again.
 *   deadlines   tls-handshake, then peer-first-stream (header_timeout) until the first stream, then peer-idle
 *               (idle_timeout) whenever no stream is open; the dial answer within dialTimeoutMs on the client.
 *   caps        the listener's connection caps (gateway.limits), PEER_MAX_STREAMS concurrent streams per
 *               connection, PEER_MAX_HEADER_BYTES of headers per stream.
 */
import http2 from 'node:http2';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls, { type TLSSocket } from 'node:tls';
import { formatHostPort, isIpLiteral, parseAddr, type HostPort } from '../addr.js';
import { peerIdentityOf } from '../auth/api.js';
import { identityFromCert } from '../auth/pki.js';
import type { ClusterTrust } from '../auth/proxyauth.js';
import type { ProxyRecord } from '../auth/records.js';
import { ERROR_CODES, GatewayError, toGatewayError, type ErrorCode } from '../errors.js';
import { logger } from '../log.js';
import type { ConnectionLimits } from '../net/deadlines.js';
import { connectionOf } from '../net/deadlines.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { tlsTerminator } from '../net/tls.js';
import { splice } from '../stream/splice.js';
import type { DialRequest, ServiceKind } from '../tunnel/protocol.js';
import type { ClusterView } from './cluster.js';
import type { LocalTunnels, PeerDialer } from './router.js';

export const PEER_ALPN = 'gateway-peer';
export const PEER_PATH = '/gateway.peer.v1/dial';
/** Concurrent streams one peer connection may carry (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). */
export const PEER_MAX_STREAMS = 1024;
/** Header bytes of one stream (SETTINGS_MAX_HEADER_LIST_SIZE); a DialRequest is a few hundred. */
export const PEER_MAX_HEADER_BYTES = 8 * 1024;
/** The system role a peering certificate must carry. */
export const PEER_ROLE = 'proxy';

const HOST_HEADER = 'x-gateway-host';
const DIAL_HEADER = 'x-gateway-dial';
const ERROR_HEADER = 'x-gateway-error';
const SERVICES: readonly ServiceKind[] = ['ssh', 'db', 'app', 'desktop', 'kube'];
/**
 * HTTP/2 flow control is the back-pressure of every stream. A window of 1 MiB per stream (8 MiB per connection)
 * instead of the default 64 KiB keeps one fast stream from waiting for WINDOW_UPDATEs (bench/RESULTS.md "peer").
 */
export const PEER_STREAM_WINDOW = 1024 * 1024;
const PEER_SESSION_WINDOW = 8 * PEER_STREAM_WINDOW;
const SESSION_SETTINGS: http2.Settings = { maxConcurrentStreams: PEER_MAX_STREAMS, maxHeaderListSize: PEER_MAX_HEADER_BYTES, enablePush: false, initialWindowSize: PEER_STREAM_WINDOW };

/** This Proxy's peering certificate (host kind, role proxy, name = its host ID) and the host CA. */
export interface PeerTls {
  key: string;
  cert: string;
  /** The cluster's host CA: the only issuer of peering certificates. */
  ca: string;
}

export interface PeerServerOptions {
  trust: ClusterTrust;
  tls: PeerTls;
  cluster: Pick<ClusterView, 'proxy' | 'selfId'>;
  tunnels: Pick<LocalTunnels, 'get' | 'dial'>;
  limits: ConnectionLimits;
}

/** The peering listener: other Proxies ask it for streams to agents whose tunnels this Proxy holds. */
export class PeerServer {
  private readonly log = logger('peer');
  private readonly terminate: ReturnType<typeof tlsTerminator>;
  private server: net.Server | undefined;
  /** Each open peer connection: its session and its Connection (every layer down to the socket). */
  private readonly sessions = new Map<http2.ServerHttp2Session, ReturnType<typeof connectionOf>>();

  constructor(private readonly options: PeerServerOptions) {
    this.terminate = tlsTerminator({
      credentials: { key: options.tls.key, cert: options.tls.cert, ca: [options.tls.ca] },
      name: 'peer',
      alpn: [PEER_ALPN],
      handshakeMs: options.limits.settings.tlsHandshakeMs,
    });
  }

  /** Binds the listener; resolves with the bound address. */
  async listen(addr: HostPort, what = 'proxy_service.peer_listen_addr'): Promise<string> {
    const guard = this.options.limits.listener('peer', { sourceAtAccept: true });
    const server = guardedServer(guard, (socket) => this.accept(socket));
    const bound = await listenOn(server, addr, what);
    this.server = server;
    return bound;
  }

  /** Stops listening and drops every peer connection (their clients see the streams reset). */
  async close(): Promise<void> {
    const closing = this.server ? closeServer(this.server) : Promise.resolve();
    for (const [session, conn] of this.sessions) {
      session.destroy();
      conn.destroy();
    }
    this.sessions.clear();
    await closing;
    this.server = undefined;
  }

  private accept(socket: net.Socket): void {
    const client = `${socket.remoteAddress}:${socket.remotePort}`;
    this.terminate(
      socket,
      (secure) => {
        const why = this.refusal(secure);
        if (why) {
          this.log.warn({ client, why }, 'peer refused');
          secure.destroy();
          return;
        }
        this.serve(secure, client);
      },
      (err) => this.log.debug({ client, err: err.message }, 'TLS on the peering listener failed'),
    );
  }

  /** Why this TLS client may not peer, or undefined when it is a live Proxy of this cluster. */
  private refusal(socket: TLSSocket): string | undefined {
    if (socket.alpnProtocol !== PEER_ALPN) return `ALPN ${JSON.stringify(socket.alpnProtocol || 'none')} is not ${PEER_ALPN}`;
    let id;
    try {
      id = peerIdentityOf(this.options.trust, socket);
    } catch (err) {
      return (err as Error).message;
    }
    if (id.kind !== 'host') return `a ${id.kind} certificate cannot peer`;
    if (!id.roles.includes(PEER_ROLE)) return `host ${id.name} has no "${PEER_ROLE}" role (roles: ${id.roles.join(', ') || 'none'})`;
    if (!this.options.cluster.proxy(id.name)) return `host ${id.name} is not a live Proxy of this cluster`;
    return undefined;
  }

  private serve(socket: TLSSocket, client: string): void {
    const conn = connectionOf(socket);
    const { headerMs, idleMs } = this.options.limits.settings;
    const session = http2.performServerHandshake(socket, { settings: SESSION_SETTINGS, maxSessionMemory: 64 });
    session.once('localSettings', () => session.setLocalWindowSize(PEER_SESSION_WINDOW));
    // The session holds the socket: a deadline ends the session first, then every layer of the connection.
    const expire = {
      onExpire: () => {
        session.destroy();
        conn.destroy();
      },
    };
    conn.enter('peer-first-stream', headerMs, expire);
    this.sessions.set(session, conn);
    let open = 0;
    session.on('stream', (stream, headers) => {
      open++;
      conn.leave();
      stream.once('close', () => {
        if (--open === 0) conn.enter('peer-idle', idleMs, expire);
      });
      stream.on('error', () => undefined);
      this.onStream(stream, headers, client).catch((err: unknown) => answerError(stream, toGatewayError(err)));
    });
    session.on('error', (err) => this.log.debug({ client, err: err.message }, 'peering session error'));
    session.once('close', () => {
      this.sessions.delete(session);
      socket.destroy();
    });
  }

  private async onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, client: string): Promise<void> {
    const { hostId, request } = parseStreamHeaders(headers);
    if (!this.options.tunnels.get(hostId)) {
      // Never forwarded again: the asking Proxy tries the next holder itself.
      throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `Proxy ${this.options.cluster.selfId} holds no tunnel of agent ${hostId}`);
    }
    const channel = await this.options.tunnels.dial(hostId, request);
    if (stream.destroyed) {
      channel.destroy();
      return;
    }
    stream.respond({ ':status': 200 });
    this.log.debug({ client, hostId, service: request.service, resource: request.resource }, 'peered stream opened');
    splice(stream, channel);
  }
}

/** The target and DialRequest of a peered stream; a GW_ERR_PEER_PROTOCOL error when they are not well formed. */
export function parseStreamHeaders(headers: http2.IncomingHttpHeaders): { hostId: string; request: DialRequest } {
  const bad = (why: string) => new GatewayError('GW_ERR_PEER_PROTOCOL', `bad peering stream: ${why}`);
  if (headers[':method'] !== 'POST' || headers[':path'] !== PEER_PATH) throw bad(`expected POST ${PEER_PATH}`);
  const hostId = headers[HOST_HEADER];
  const raw = headers[DIAL_HEADER];
  if (typeof hostId !== 'string' || hostId === '') throw bad(`no ${HOST_HEADER}`);
  if (typeof raw !== 'string') throw bad(`no ${DIAL_HEADER}`);
  let r: Partial<DialRequest>;
  try {
    r = JSON.parse(raw) as Partial<DialRequest>;
  } catch {
    throw bad(`${DIAL_HEADER} is not JSON`);
  }
  if (typeof r !== 'object' || r === null || !SERVICES.includes(r.service as ServiceKind)) throw bad('the dial request names no known service');
  for (const k of ['resource', 'client_src', 'client_dst'] as const) if (typeof r[k] !== 'string') throw bad(`the dial request has no ${k}`);
  if (r.user !== undefined && typeof r.user !== 'string') throw bad('user is not a string');
  return { hostId, request: { service: r.service!, resource: r.resource!, client_src: r.client_src!, client_dst: r.client_dst!, ...(r.user === undefined ? {} : { user: r.user }) } };
}

function answerError(stream: http2.ServerHttp2Stream, err: GatewayError): void {
  if (stream.destroyed) return;
  const status = err.code === 'GW_ERR_TUNNEL_NOT_FOUND' ? 404 : err.code === 'GW_ERR_PEER_PROTOCOL' ? 400 : 502;
  if (stream.headersSent) return void stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  stream.respond({ ':status': status, [ERROR_HEADER]: JSON.stringify(err.toJSON()) }, { endStream: true });
}

export interface PeerClientOptions {
  tls: PeerTls;
  clusterName: string;
  /** The process's Dialer: peering addresses obey HTTPS_PROXY / NO_PROXY like every other dial. */
  dialer: { dial(target: string): Promise<net.Socket> };
  tlsHandshakeMs: number;
  /** How long a Proxy may take to answer a stream (the agent's dial included). */
  dialTimeoutMs: number;
  /** A connection to a peer with no stream for this long is closed (idle_timeout). */
  idleMs: number;
}

/** The client side: one HTTP/2 connection per peer Proxy, every client stream multiplexed on it. */
export class PeerClient implements PeerDialer {
  private readonly log = logger('peer');
  private readonly sessions = new Map<string, Promise<http2.ClientHttp2Session>>();
  private closed = false;

  constructor(private readonly options: PeerClientOptions) {}

  async dial(proxy: ProxyRecord, hostId: string, request: DialRequest): Promise<Duplex> {
    const session = await this.session(proxy);
    const stream = session.request({ ':method': 'POST', ':path': PEER_PATH, [HOST_HEADER]: hostId, [DIAL_HEADER]: JSON.stringify(request) });
    stream.on('error', () => undefined);
    const headers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
      const timer = setTimeout(() => {
        stream.close(http2.constants.NGHTTP2_CANCEL);
        reject(new GatewayError('GW_ERR_PEER_PROTOCOL', `Proxy ${proxy.id} did not answer for agent ${hostId} within ${this.options.dialTimeoutMs} ms`));
      }, this.options.dialTimeoutMs);
      stream.once('response', (h) => {
        clearTimeout(timer);
        resolve(h);
      });
      stream.once('close', () => {
        clearTimeout(timer);
        reject(new GatewayError('GW_ERR_PEER_UNREACHABLE', `the peering stream to Proxy ${proxy.id} closed before its answer (code ${stream.rstCode ?? 'none'})`));
      });
    });
    if (Number(headers[':status']) === 200) return stream;
    stream.destroy();
    throw remoteError(proxy, headers);
  }

  /** Drops every peer connection (their streams are reset). */
  close(): void {
    this.closed = true;
    for (const s of this.sessions.values()) void s.then((session) => session.destroy(), () => undefined);
    this.sessions.clear();
  }

  private session(proxy: ProxyRecord): Promise<http2.ClientHttp2Session> {
    const known = this.sessions.get(proxy.id);
    if (known) return known;
    if (this.closed) return Promise.reject(new GatewayError('GW_ERR_PEER_UNREACHABLE', 'this Proxy is shutting down'));
    const opening = this.connect(proxy).then((session) => {
      session.once('close', () => {
        if (this.sessions.get(proxy.id) === opening) this.sessions.delete(proxy.id);
      });
      return session;
    });
    opening.catch(() => this.sessions.get(proxy.id) === opening && this.sessions.delete(proxy.id));
    this.sessions.set(proxy.id, opening);
    return opening;
  }

  private async connect(proxy: ProxyRecord): Promise<http2.ClientHttp2Session> {
    const addr = proxy.peer_addr!;
    const unreachable = (why: string, cause?: unknown) => new GatewayError('GW_ERR_PEER_UNREACHABLE', `cannot peer with Proxy ${proxy.id} at ${addr}: ${why}`, { cause });
    const raw = await this.options.dialer.dial(addr).catch((err: unknown) => {
      throw unreachable(toGatewayError(err).message, err);
    });
    const host = parseAddr(addr).host;
    const socket = tls.connect({
      socket: raw,
      key: this.options.tls.key,
      cert: this.options.tls.cert,
      ca: [this.options.tls.ca],
      ALPNProtocols: [PEER_ALPN],
      ...(isIpLiteral(host) ? {} : { servername: host }),
      checkServerIdentity: (_host, cert) => checkPeerCert(cert.raw, proxy.id, this.options.clusterName),
    });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(unreachable(`no TLS handshake within ${this.options.tlsHandshakeMs} ms`)), this.options.tlsHandshakeMs);
      socket.once('secureConnect', () => {
        clearTimeout(timer);
        resolve();
      });
      socket.once('error', (err) => {
        clearTimeout(timer);
        reject(unreachable(err.message, err));
      });
    }).catch((err: unknown) => {
      socket.destroy();
      throw err;
    });
    const session = http2.connect(`https://${formatHostPort(host, 443)}`, { createConnection: () => socket, settings: SESSION_SETTINGS, maxSessionMemory: 64 });
    session.on('error', (err) => this.log.debug({ proxy: proxy.id, err: err.message }, 'peering session error'));
    session.once('localSettings', () => session.setLocalWindowSize(PEER_SESSION_WINDOW));
    // The Dialer's sockets allow half-open connections: a peer that closes must end the session here.
    for (const layer of [raw, socket]) layer.once('end', () => session.destroy()).once('close', () => session.destroy());
    session.setTimeout(this.options.idleMs, () => {
      // No frame for idle_timeout: close once the streams still open (silent but alive) are done.
      this.sessions.delete(proxy.id);
      session.close();
    });
    this.log.debug({ proxy: proxy.id, addr }, 'peering connection open');
    return session;
  }
}

/** The server certificate must name the Proxy meant, with the proxy role, in this cluster (the CA was checked). */
function checkPeerCert(raw: Buffer, proxyId: string, clusterName: string): Error | undefined {
  try {
    const id = identityFromCert(raw);
    if (id.kind !== 'host' || id.cluster !== clusterName) return new Error(`the certificate is a ${id.kind} certificate of cluster "${id.cluster}"`);
    if (id.name !== proxyId) return new Error(`the certificate names host ${id.name}, not Proxy ${proxyId}`);
    if (!id.roles.includes(PEER_ROLE)) return new Error(`host ${id.name} has no "${PEER_ROLE}" role`);
    return undefined;
  } catch (err) {
    return err as Error;
  }
}

/** The error a peer answered, as this Proxy reports it. */
function remoteError(proxy: ProxyRecord, headers: http2.IncomingHttpHeaders): GatewayError {
  const raw = headers[ERROR_HEADER];
  let parsed: { code?: string; message?: string; hint?: string } = {};
  try {
    if (typeof raw === 'string' && raw.length <= PEER_MAX_HEADER_BYTES) parsed = JSON.parse(raw) as typeof parsed;
  } catch {
    // reported below as a protocol error
  }
  const code = typeof parsed.code === 'string' && parsed.code in ERROR_CODES ? (parsed.code as ErrorCode) : 'GW_ERR_PEER_PROTOCOL';
  const message = typeof parsed.message === 'string' ? parsed.message : `status ${String(headers[':status'])} without an error`;
  return new GatewayError(code, `through Proxy ${proxy.id}: ${message}`, typeof parsed.hint === 'string' ? { hint: parsed.hint } : {});
}
