/**
 * Proxy peering (docs/proxy.md, "Proxy peering"): a Proxy reaches an agent whose tunnel another Proxy holds by
 * asking that Proxy, on its peering listener (proxy_service.peer_listen_addr, 3021).
 *
 *   transport   a mutual-TLS connection per client stream, ALPN gateway-peer-tls (the default), pooled ahead and
 *               resumed; or, with GATEWAY_PEER_TRANSPORT=http2 on the asking Proxy, HTTP/2 (node:http2) over
 *               TLS 1.3, ALPN gateway-peer: one connection per pair of Proxies, one stream per client connection.
 *               The listener serves both. The default is chosen by measurement end to end (bench/peer.ts,
 *               bench/RESULTS.md "peer"): a connection per stream moves bytes for less CPU (every run) and
 *               faster (most runs), for 0.2-0.4 ms more per stream open.
 *   identity    mutual TLS with the cluster's host CA, checked on every connection (a resumed session too). The
 *               server accepts only a host certificate of this cluster with the system role "proxy" whose host
 *               ID is a live Proxy (cluster.ts), and drops every open connection of a peer that stops being one
 *               (locked or removed: the Auth Service takes its record out; stopped or dead); the client accepts
 *               only a server certificate naming the host ID of the Proxy it meant to reach, with the same role
 *               (a session is resumed only with the Proxy whose certificate was checked when it was made).
 *   a stream    gateway-peer-tls: the first line is the JSON {"hostId", "request"} (the DialRequest, the same JSON
 *               as the tunnel's: src/tunnel/protocol.ts); the answer one JSON line, {"ok":true} once the agent
 *               reached the resource, else {"ok":false,"error":{code,message,hint}}. Then raw bytes both ways:
 *               TCP and TLS are the back-pressure, the TLS end (close_notify, FIN) the half-close.
 *               gateway-peer: POST PEER_PATH with x-gateway-host and x-gateway-dial; :status 200, or an
 *               error status with x-gateway-error; HTTP/2 flow control, END_STREAM.
 *   a probe     a DialRequest with probe: true (gwctl probe, probe.ts): after the answer this Proxy writes one line of
 *               its own, {"hop":"peer-tunnel","ms"}, its tunnel dial's time, before the agent's report (protocol.ts).
 *   no loops    the server answers from this Proxy's own tunnels only, never over peering again.
 *   end to end  the listener also takes end-to-end streams (src/tunnel/e2e.ts) that a Proxy holding no tunnel of
 *               the agent relays here: raw TCP, no TLS of its own (the stream is TLS between client and agent
 *               already), starting with the stream line `GWE2E1 <grant>`. The first byte sorts them (accept: 0x16
 *               TLS, `G` the line, read whole within peer-request and its cap, anything else closed, the first
 *               byte within tls-handshake); the relay (e2erelay.ts
 *               `peered`) checks the grant itself and routes only to this Proxy's own tunnels. Such a connection
 *               is not authenticated as a Proxy: it opens nothing the one port would not (the grant and the
 *               user's key do), and it is relayed no further.
 *   deadlines   tls-handshake; gateway-peer-tls: peer-idle (idle_timeout) until the request's first byte (a
 *               pooled connection waits here), peer-request (header_timeout) until its line is whole;
 *               gateway-peer: peer-request until the first stream, then peer-idle whenever no stream is open. The dial answer
 *               within dialTimeoutMs on the client.
 *   caps        the listener's connection caps (gateway.limits), PEER_MAX_REQUEST_BYTES of request line,
 *               PEER_MAX_STREAMS concurrent HTTP/2 streams per connection, PEER_MAX_HEADER_BYTES of headers.
 *   tls client  keeps the latest TLS session ticket of each peer (a new connection resumes: no certificate
 *               exchange) and up to PEER_POOL_SIZE connections established ahead, each closed after
 *               PEER_POOL_IDLE_MS unused; a pooled connection the peer closed meanwhile is replaced once.
 *   departed    a peer that leaves the cluster's list (locked or removed: the Auth Service takes its record out;
 *               stopped or dead) loses every connection on both sides: the server drops its connections
 *               (dropDeparted), the client resets the streams it carries through it (PeerClient.dropDeparted).
 */
import http2 from 'node:http2';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls, { type TLSSocket } from 'node:tls';
import { formatHostPort, isIpLiteral, parseAddr, type HostPort } from '../addr.js';
import { peerIdentityOf } from '../auth/peeridentity.js';
import { identityFromCert, type Identity } from '../auth/pki.js';
import type { ClusterTrust } from '../auth/proxyauth.js';
import type { ProxyRecord } from '../auth/records.js';
import { GatewayError, httpStatus, isErrorCode, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { recordPeerServed, recordPeerStream, watchPeerClient } from '../metrics/peering.js';
import type { ConnectionLimits } from '../net/deadlines.js';
import { connectionOf } from '../net/deadlines.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { peerX509, tlsTerminator } from '../net/tls.js';
import { readLine } from '../stream/lines.js';
import { FramedStream } from '../stream/framed.js';
import { splice } from '../stream/splice.js';
import { LineSplitter } from '../stream/splitter.js';
import { databaseGrantOf, type DialRequest, type ProbeReport, type ServiceKind } from '../tunnel/protocol.js';
import { E2E_MAGIC } from '../wire/protocols.js';
import { parseE2ELine } from '../tunnel/e2e.js';
import type { ConnInfo } from '../mux/multiplexer.js';
import { startHop, traceContextOf, traceFields, withinHop } from '../trace.js';
import type { ClusterView } from './cluster.js';
import type { LocalTunnels, PeerDialer } from './router.js';

/** The first byte of a TLS connection (a handshake record): the peering listener's sniff. */
const TLS_HANDSHAKE_RECORD = 0x16;

/** HTTP/2, one connection per pair of Proxies (GATEWAY_PEER_TRANSPORT=http2). */
export const PEER_ALPN = 'gateway-peer';
/** A TLS connection per stream: the default transport. */
export const PEER_ALPN_TLS = 'gateway-peer-tls';
export const PEER_PATH = '/gateway.peer.v1/dial';
export type PeerTransport = 'tls' | 'http2';
/** The request line of a gateway-peer connection; a DialRequest is a few hundred bytes. */
export const PEER_MAX_REQUEST_BYTES = 8 * 1024;
/** The answer line (an error with its message and hint). */
const PEER_MAX_ANSWER_BYTES = 16 * 1024;
/** Connections a client keeps established ahead, per peer Proxy. */
export const PEER_POOL_SIZE = 2;
/** How long a pooled connection may wait unused (at most half the client's idle_timeout). */
export const PEER_POOL_IDLE_MS = 30_000;
/** Concurrent streams one HTTP/2 peer connection may carry (SETTINGS_MAX_CONCURRENT_STREAMS). */
export const PEER_MAX_STREAMS = 1024;
/** Header bytes of one HTTP/2 stream (SETTINGS_MAX_HEADER_LIST_SIZE). */
export const PEER_MAX_HEADER_BYTES = 8 * 1024;
/** Peer certificates whose identity a server keeps (a cluster has a few Proxies, each with one or two). */
const PEER_IDENTITY_CACHE = 256;
/** The system role a peering certificate must carry. */
export const PEER_ROLE = 'proxy';

const HOST_HEADER = 'x-gateway-host';
const DIAL_HEADER = 'x-gateway-dial';
const ERROR_HEADER = 'x-gateway-error';
const OK_LINE = '{"ok":true}\n';
/** The answer to a request that asked for frames (src/stream/framed.ts): a Proxy of an earlier version sends OK_LINE. */
const OK_FRAMED_LINE = '{"ok":true,"framed":true}\n';
const SERVICES: readonly ServiceKind[] = ['ssh', 'db', 'app', 'desktop', 'kube'];
/**
 * HTTP/2 flow control is the back-pressure of every HTTP/2 stream. A window of 1 MiB per stream (8 MiB per
 * connection) instead of the default 64 KiB keeps one fast stream from waiting for WINDOW_UPDATEs.
 */
export const PEER_STREAM_WINDOW = 1024 * 1024;
const PEER_SESSION_WINDOW = 8 * PEER_STREAM_WINDOW;
const SESSION_SETTINGS: http2.Settings = { maxConcurrentStreams: PEER_MAX_STREAMS, maxHeaderListSize: PEER_MAX_HEADER_BYTES, enablePush: false, initialWindowSize: PEER_STREAM_WINDOW };

/** The transport GATEWAY_PEER_TRANSPORT names: tls (a connection per stream, the default) or http2. */
export function peerTransportFromEnv(env: NodeJS.ProcessEnv = process.env): PeerTransport {
  return env.GATEWAY_PEER_TRANSPORT === 'http2' ? 'http2' : 'tls';
}

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
  /** The live Proxies; its 'proxies' event drops the connections of a peer that left (locked, removed, dead). */
  cluster: Pick<ClusterView, 'proxy' | 'selfId' | 'on' | 'off'>;
  tunnels: Pick<LocalTunnels, 'get' | 'dial'>;
  limits: ConnectionLimits;
}

/** The peering listener: other Proxies ask it for streams to agents whose tunnels this Proxy holds. */
export class PeerServer {
  private readonly log = logger('peer');
  private readonly terminate: ReturnType<typeof tlsTerminator>;
  private server: net.Server | undefined;
  /** Each open peer connection: its Connection (every layer down to the socket), and its HTTP/2 session if any. */
  private readonly open = new Map<TLSSocket, { conn: ReturnType<typeof connectionOf>; session?: http2.ServerHttp2Session; peer: string }>();
  private readonly onProxies = () => this.dropDeparted();
  /** Identities already read from peers' certificates (by SHA-256 fingerprint), for the host CA they were checked against. */
  private readonly identities = new Map<string, Identity>();
  private identitiesCa = '';
  private e2e: ((stream: Duplex, info: ConnInfo) => void) | undefined;

  constructor(private readonly options: PeerServerOptions) {
    this.terminate = tlsTerminator({
      credentials: { key: options.tls.key, cert: options.tls.cert, ca: [options.tls.ca] },
      name: 'peer',
      alpn: [PEER_ALPN, PEER_ALPN_TLS],
      handshakeMs: options.limits.settings.tlsHandshakeMs,
    });
  }

  /** Binds the listener; resolves with the bound address. */
  async listen(addr: HostPort, what = 'proxy_service.peer_listen_addr'): Promise<string> {
    const guard = this.options.limits.listener('peer', { sourceAtAccept: true });
    const server = guardedServer(guard, (socket) => this.accept(socket));
    const bound = await listenOn(server, addr, what);
    this.server = server;
    this.options.cluster.off('proxies', this.onProxies);
    this.options.cluster.on('proxies', this.onProxies);
    return bound;
  }

  /**
   * Drops every open connection of a peer that is no longer a live Proxy: a lock on it or its removal takes its
   * record out (src/auth/agents.ts forgetRevokedProxy), and so do its death and its graceful stop. The streams it
   * carries are reset; its new connections are refused (refusal).
   */
  private dropDeparted(): void {
    for (const [socket, { conn, session, peer }] of [...this.open]) {
      if (this.options.cluster.proxy(peer)) continue;
      this.log.warn({ peer }, 'peer dropped: no longer a live Proxy of this cluster');
      this.open.delete(socket);
      session?.destroy();
      conn.destroy();
    }
  }

  /** Stops listening and drops every peer connection (their clients see the streams reset). */
  async close(): Promise<void> {
    const closing = this.server ? closeServer(this.server) : Promise.resolve();
    this.options.cluster.off('proxies', this.onProxies);
    for (const { conn, session } of this.open.values()) {
      session?.destroy();
      conn.destroy();
    }
    this.open.clear();
    await closing;
    this.server = undefined;
  }

  /**
   * End-to-end streams a peer relays here raw (e2erelay.ts `peered`: checked as on the one port, routed only to
   * this Proxy's own tunnels). Until set, a connection that does not start TLS is closed.
   */
  serveE2E(handler: (stream: Duplex, info: ConnInfo) => void): void {
    this.e2e = handler;
  }

  /**
   * The first byte decides, within the TLS handshake's deadline (tls-handshake): a TLS record (0x16) peers as
   * always; `G` starts the stream line of an end-to-end stream (`GWE2E1 <grant>`), read whole here within
   * header_timeout (peer-request) and at most E2E_LINE_MAX_BYTES (parseE2ELine), then handed with everything after
   * it to the relay; any other byte, a line that is not one, or too long, or late: closed.
   */
  private accept(socket: net.Socket): void {
    const conn = connectionOf(socket);
    const { tlsHandshakeMs, headerMs } = this.options.limits.settings;
    conn.enter('tls-handshake', tlsHandshakeMs);
    let buf = Buffer.alloc(0);
    const client = () => `${socket.remoteAddress}:${socket.remotePort}`;
    const onData = (chunk: Buffer) => {
      if (buf.length === 0) {
        if (chunk[0] === TLS_HANDSHAKE_RECORD) {
          socket.off('data', onData);
          socket.pause();
          socket.unshift(chunk);
          return this.acceptTls(socket);
        }
        if (chunk[0] !== E2E_MAGIC.charCodeAt(0) || !this.e2e) {
          this.log.debug({ client: client(), first: chunk[0] }, 'peering connection is neither TLS nor an end-to-end stream; closed');
          return void socket.destroy();
        }
        conn.enter('peer-request', headerMs);
      }
      // At most the line's cap and one chunk: parseE2ELine says bad past the cap.
      buf = Buffer.concat([buf, chunk]);
      const parsed = parseE2ELine(buf);
      if (parsed.kind === 'need-more') return;
      socket.off('data', onData);
      if (parsed.kind === 'bad') {
        this.log.debug({ client: client(), why: parsed.why }, 'peering connection: not an end-to-end stream line; closed');
        return void socket.destroy();
      }
      conn.leave('peer-request');
      socket.pause();
      socket.unshift(buf);
      const info: ConnInfo = { remoteAddress: socket.remoteAddress ?? '', remotePort: socket.remotePort ?? 0, localAddress: socket.localAddress ?? '', localPort: socket.localPort ?? 0, route: 'gateway-e2e' };
      this.e2e!(socket, info);
      // The relay reads the line again from here (it listens for data: a paused socket would never give it).
      socket.resume();
    };
    socket.on('data', onData);
    socket.on('error', () => socket.destroy());
  }

  private acceptTls(socket: net.Socket): void {
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
        this.open.set(secure, { conn: connectionOf(secure), peer: this.identityOf(secure).name });
        secure.once('close', () => this.open.delete(secure));
        if (secure.alpnProtocol === PEER_ALPN_TLS) this.serveStream(secure, client);
        else this.serveH2(secure, client);
      },
      (err) => this.log.debug({ client, err: err.message }, 'TLS on the peering listener failed'),
    );
  }

  /** Why this TLS client may not peer, or undefined when it is a live Proxy of this cluster. */
  private refusal(socket: TLSSocket): string | undefined {
    if (socket.alpnProtocol !== PEER_ALPN && socket.alpnProtocol !== PEER_ALPN_TLS) return `ALPN ${JSON.stringify(socket.alpnProtocol || 'none')} is neither ${PEER_ALPN} nor ${PEER_ALPN_TLS}`;
    let id;
    try {
      id = this.identityOf(socket);
    } catch (err) {
      return (err as Error).message;
    }
    if (id.kind !== 'host') return `a ${id.kind} certificate cannot peer`;
    if (!id.roles.includes(PEER_ROLE)) return `host ${id.name} has no "${PEER_ROLE}" role (roles: ${id.roles.join(', ') || 'none'})`;
    if (!this.options.cluster.proxy(id.name)) return `host ${id.name} is not a live Proxy of this cluster`;
    return undefined;
  }

  /**
   * The peer's identity (peerIdentityOf). A connection per stream would read the same certificate again and
   * again; what follows from its bytes and the host CA is kept by fingerprint, while OpenSSL's verification of
   * this connection (socket.authorized) and the liveness of the Proxy (refusal) are checked every time.
   */
  private identityOf(socket: TLSSocket): Identity {
    const ca = this.options.trust.host.tls.certPem;
    if (ca !== this.identitiesCa || this.identities.size >= PEER_IDENTITY_CACHE) {
      this.identities.clear();
      this.identitiesCa = ca;
    }
    const fingerprint = socket.authorized ? peerX509(socket)?.fingerprint256 : undefined;
    const known = fingerprint ? this.identities.get(fingerprint) : undefined;
    if (known) return known;
    const id = peerIdentityOf(this.options.trust, socket);
    if (fingerprint) this.identities.set(fingerprint, id);
    return id;
  }

  /** gateway-peer-tls: one request line (idle, then request deadline, size cap), the answer line, then the bytes. */
  private serveStream(socket: TLSSocket, client: string): void {
    const conn = connectionOf(socket);
    const { headerMs, idleMs } = this.options.limits.settings;
    conn.enter('peer-idle', idleMs);
    const splitter = new LineSplitter(PEER_MAX_REQUEST_BYTES, 'peering request');
    const onData = (chunk: Buffer) => {
      if (conn.phase === 'peer-idle') conn.enter('peer-request', headerMs);
      let result;
      try {
        result = splitter.feed(chunk);
      } catch (err) {
        socket.off('data', onData);
        conn.leave('peer-request');
        this.served(socket, 'GW_ERR_PEER_PROTOCOL');
        return void answerLine(socket, new GatewayError('GW_ERR_PEER_PROTOCOL', `bad peering request: ${(err as Error).message}`));
      }
      if (result.kind !== 'line') return;
      socket.off('data', onData);
      socket.pause();
      conn.leave('peer-request');
      if (result.rest.length > 0) socket.unshift(result.rest);
      this.onRequest(socket, result.line.toString('utf8'), client).catch((err: unknown) => {
        const e = toGatewayError(err);
        this.served(socket, e.code);
        answerLine(socket, e);
      });
    };
    socket.on('data', onData);
  }

  private async onRequest(socket: TLSSocket, line: string, client: string): Promise<void> {
    const { hostId, request, framed } = parsePeerRequest(line);
    const started = performance.now();
    const channel = await this.dialLocal(hostId, request);
    if (socket.destroyed) {
      channel.destroy();
      return;
    }
    socket.write(framed ? OK_FRAMED_LINE : OK_LINE);
    socket.once('close', this.served(socket, 'ok'));
    const out = framed ? new FramedStream(socket) : socket;
    if (request.probe === true) out.write(peerTunnelLine(started));
    this.log.debug({ client, hostId, service: request.service, resource: request.resource }, 'peered stream opened');
    splice(out, channel);
  }

  /** Counts a stream served for the peer on socket (its host ID, checked at accept), by outcome; ok: open until the returned function. */
  private served(socket: TLSSocket, outcome: string): () => void {
    return recordPeerServed(this.open.get(socket)?.peer ?? '', outcome);
  }

  /** A channel to the agent through this Proxy's own tunnel: never forwarded again (the asking Proxy tries the next holder). */
  private async dialLocal(hostId: string, request: DialRequest): Promise<Duplex> {
    // This hop's span: a child of the asking Proxy's (its context is trusted: the caller is a live Proxy).
    const hop = startHop('proxy.peer', {
      kind: 'server',
      parent: traceContextOf(request),
      trusted: true,
      attributes: { 'gateway.agent.host_id': hostId, 'gateway.service': request.service, 'gateway.router.via': 'local', 'gateway.router.reason': 'asked by a peer: answered from this Proxy\'s own tunnels only' },
    });
    return withinHop(hop, async () => {
      if (!this.options.tunnels.get(hostId)) throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `Proxy ${this.options.cluster.selfId} holds no tunnel of agent ${hostId}`);
      return this.options.tunnels.dial(hostId, { ...request, ...traceFields(hop.context) });
    });
  }

  private serveH2(socket: TLSSocket, client: string): void {
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
    conn.enter('peer-request', headerMs, expire);
    this.open.set(socket, { conn, session, peer: this.open.get(socket)?.peer ?? '' });
    let open = 0;
    session.on('stream', (stream, headers) => {
      open++;
      conn.leave();
      stream.once('close', () => {
        if (--open === 0) conn.enter('peer-idle', idleMs, expire);
      });
      stream.on('error', () => undefined);
      // A session outlives the check made at its handshake: each stream checks again that the peer is a live Proxy.
      const refused = this.refusal(socket);
      if (refused) {
        this.log.warn({ client, why: refused }, 'peer refused');
        this.served(socket, 'GW_ERR_ACCESS_DENIED');
        answerH2Error(stream, new GatewayError('GW_ERR_ACCESS_DENIED', `peering refused: ${refused}`));
        session.close();
        return;
      }
      this.onH2Stream(socket, stream, headers, client).catch((err: unknown) => {
        const e = toGatewayError(err);
        this.served(socket, e.code);
        answerH2Error(stream, e);
      });
    });
    session.on('error', (err) => this.log.debug({ client, err: err.message }, 'peering session error'));
    session.once('close', () => socket.destroy());
  }

  private async onH2Stream(socket: TLSSocket, stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, client: string): Promise<void> {
    const { hostId, request } = parseStreamHeaders(headers);
    const started = performance.now();
    const channel = await this.dialLocal(hostId, request);
    if (stream.destroyed) {
      channel.destroy();
      return;
    }
    stream.respond({ ':status': 200 });
    stream.once('close', this.served(socket, 'ok'));
    if (request.probe === true) stream.write(peerTunnelLine(started));
    this.log.debug({ client, hostId, service: request.service, resource: request.resource }, 'peered stream opened (HTTP/2)');
    splice(stream, channel);
  }
}

/** A probe through this Proxy: its own hop's line (src/tunnel/protocol.ts ProbeReport) before the agent's. */
function peerTunnelLine(started: number): string {
  return `${JSON.stringify({ hop: 'peer-tunnel', ms: performance.now() - started } satisfies ProbeReport)}\n`;
}

const badRequest = (why: string) => new GatewayError('GW_ERR_PEER_PROTOCOL', `bad peering request: ${why}`);

/** The target and DialRequest of a gateway-peer-tls request line; a GW_ERR_PEER_PROTOCOL error when not well formed. */
export function parsePeerRequest(line: string): { hostId: string; request: DialRequest; framed: boolean } {
  let r: { hostId?: unknown; request?: unknown; framed?: unknown };
  try {
    r = JSON.parse(line) as typeof r;
  } catch {
    throw badRequest('the request line is not JSON');
  }
  if (typeof r !== 'object' || r === null) throw badRequest('the request line is not a JSON object');
  if (typeof r.hostId !== 'string' || r.hostId === '') throw badRequest('no hostId');
  return { hostId: r.hostId, request: dialRequestOf(r.request), framed: r.framed === true };
}

/** The target and DialRequest of an HTTP/2 peered stream; a GW_ERR_PEER_PROTOCOL error when not well formed. */
export function parseStreamHeaders(headers: http2.IncomingHttpHeaders): { hostId: string; request: DialRequest } {
  if (headers[':method'] !== 'POST' || headers[':path'] !== PEER_PATH) throw badRequest(`expected POST ${PEER_PATH}`);
  const hostId = headers[HOST_HEADER];
  const raw = headers[DIAL_HEADER];
  if (typeof hostId !== 'string' || hostId === '') throw badRequest(`no ${HOST_HEADER}`);
  if (typeof raw !== 'string') throw badRequest(`no ${DIAL_HEADER}`);
  let r: unknown;
  try {
    r = JSON.parse(raw);
  } catch {
    throw badRequest(`${DIAL_HEADER} is not JSON`);
  }
  return { hostId, request: dialRequestOf(r) };
}

function dialRequestOf(value: unknown): DialRequest {
  const r = value as Partial<DialRequest> | null;
  if (typeof r !== 'object' || r === null || !SERVICES.includes(r.service as ServiceKind)) throw badRequest('the dial request names no known service');
  for (const k of ['resource', 'client_src', 'client_dst'] as const) if (typeof r[k] !== 'string') throw badRequest(`the dial request has no ${k}`);
  if (r.user !== undefined && typeof r.user !== 'string') throw badRequest('user is not a string');
  const grant = r.db_access === undefined ? undefined : databaseGrantOf(r.db_access);
  if (r.db_access !== undefined && grant === undefined) throw badRequest('db_access is not a database grant');
  return {
    service: r.service!,
    resource: r.resource!,
    client_src: r.client_src!,
    client_dst: r.client_dst!,
    ...(r.user === undefined ? {} : { user: r.user }),
    ...(r.probe === true ? { probe: true } : {}),
    ...(grant === undefined ? {} : { db_access: grant }),
    ...traceFields(traceContextOf(r)),
  };
}

/** The error answer of a gateway-peer-tls connection; the connection ends after it. */
function answerLine(socket: TLSSocket, err: GatewayError): void {
  if (socket.destroyed || !socket.writable) return void socket.destroy();
  socket.end(`${JSON.stringify({ ok: false, error: err.toJSON() })}\n`);
}

function answerH2Error(stream: http2.ServerHttp2Stream, err: GatewayError): void {
  if (stream.destroyed) return;
  if (stream.headersSent) return void stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  stream.respond({ ':status': httpStatus(err.code), [ERROR_HEADER]: JSON.stringify(err.toJSON()) }, { endStream: true });
}

export interface PeerClientOptions {
  tls: PeerTls;
  clusterName: string;
  /** The process's Dialer: peering addresses obey HTTPS_PROXY / NO_PROXY like every other dial. */
  dialer: { dial(target: string): Promise<net.Socket> };
  tlsHandshakeMs: number;
  /** How long a Proxy may take to answer a stream (the agent's dial included). */
  dialTimeoutMs: number;
  /** idle_timeout: a pooled connection waits at most half of it; an HTTP/2 connection with no frame for it is closed. */
  idleMs: number;
  /** How this Proxy asks its peers; peerTransportFromEnv() when not given. */
  transport?: PeerTransport;
}

/** The client side: one HTTP/2 connection per peer, or a TLS connection per stream (pooled ahead, sessions resumed). */
export class PeerClient implements PeerDialer {
  readonly transport: PeerTransport;
  private readonly log = logger('peer');
  private readonly pools = new Map<string, PeerPool>();
  private readonly sessions = new Map<string, Promise<http2.ClientHttp2Session>>();
  /** The streams carried through each peer now, by its host ID: dropDeparted resets them. */
  private readonly carried = new Map<string, Set<Duplex>>();
  /** The streams carried per peer, at each scrape (gateway_peer_streams_open). */
  private readonly unwatchMetrics = watchPeerClient(() => [...this.carried].map(([id, set]): [string, number] => [id, set.size]));
  private closed = false;
  /** Made once: a context per connection would parse the key, certificate and CA again each time. */
  private readonly context: tls.SecureContext;

  constructor(private readonly options: PeerClientOptions) {
    this.transport = options.transport ?? peerTransportFromEnv();
    this.context = tls.createSecureContext({ key: options.tls.key, cert: options.tls.cert, ca: [options.tls.ca] });
  }

  async dial(proxy: ProxyRecord, hostId: string, request: DialRequest): Promise<Duplex> {
    if (this.closed) throw new GatewayError('GW_ERR_PEER_UNREACHABLE', 'this Proxy is shutting down');
    const stream = await (this.transport === 'http2' ? this.dialH2(proxy, hostId, request) : this.dialTls(proxy, hostId, request)).catch((err: unknown) => {
      recordPeerStream(proxy.id, toGatewayError(err).code);
      throw err;
    });
    recordPeerStream(proxy.id, 'ok');
    return this.carry(proxy.id, stream);
  }

  /**
   * Resets every stream carried through a peer that is no longer a live Proxy (live says which are), and drops
   * its pooled connections and HTTP/2 session: a locked or removed Proxy carries nothing more from here (the
   * Auth Service takes its record out), and neither does a dead one.
   */
  dropDeparted(live: (proxyId: string) => boolean): void {
    for (const id of new Set([...this.carried.keys(), ...this.pools.keys(), ...this.sessions.keys()])) {
      if (live(id)) continue;
      const streams = this.carried.get(id);
      if (streams?.size) this.log.warn({ proxy: id, streams: streams.size }, 'streams through a Proxy that left the cluster reset');
      for (const stream of streams ?? []) stream.destroy();
      this.carried.delete(id);
      this.pools.get(id)?.close();
      this.pools.delete(id);
      void this.sessions.get(id)?.then((session) => session.destroy(), () => undefined);
      this.sessions.delete(id);
    }
  }

  private carry(proxyId: string, stream: Duplex): Duplex {
    const streams = this.carried.get(proxyId) ?? new Set<Duplex>();
    this.carried.set(proxyId, streams);
    streams.add(stream);
    stream.once('close', () => {
      streams.delete(stream);
      if (streams.size === 0 && this.carried.get(proxyId) === streams) this.carried.delete(proxyId);
    });
    if (stream.destroyed) streams.delete(stream);
    return stream;
  }

  private async dialTls(proxy: ProxyRecord, hostId: string, request: DialRequest): Promise<Duplex> {
    const pool = this.pool(proxy);
    // Framed: the peer's end is said in the stream, so that a peer that dies (a FIN) is a break here, not an end.
    const line = `${JSON.stringify({ hostId, request, framed: true })}\n`;
    for (let attempt = 0; ; attempt++) {
      const { socket, pooled } = await pool.take();
      // Refilled once the peer answered: the new connection's handshake does not delay this stream's answer.
      const answer = await this.ask(socket, proxy, hostId, line).finally(() => pool.refill());
      // A pooled connection the peer closed while it waited (its idle deadline, a restart): once more on a new one.
      if (answer === 'closed' && pooled && attempt === 0) continue;
      if (answer === 'closed') throw new GatewayError('GW_ERR_PEER_UNREACHABLE', `the peering connection to Proxy ${proxy.id} closed before its answer`);
      return answer;
    }
  }

  /** Drops every peer connection (their streams are reset). */
  close(): void {
    this.closed = true;
    this.unwatchMetrics();
    for (const p of this.pools.values()) p.close();
    this.pools.clear();
    for (const s of this.sessions.values()) void s.then((session) => session.destroy(), () => undefined);
    this.sessions.clear();
  }

  /** Sends the request line and reads the answer: the connection once it is {"ok":true}; 'closed' when cut before any answer. */
  private async ask(socket: TLSSocket, proxy: ProxyRecord, hostId: string, line: string): Promise<Duplex | 'closed'> {
    socket.write(line);
    let answer: string;
    try {
      answer = await readLine(socket, { maxBytes: PEER_MAX_ANSWER_BYTES, timeoutMs: this.options.dialTimeoutMs, what: `answer of Proxy ${proxy.id}` });
    } catch (err) {
      const cut = socket.destroyed || socket.readableEnded;
      socket.destroy();
      if (cut) return 'closed';
      const e = toGatewayError(err);
      if (e.code === 'GW_ERR_TUNNEL_TIMEOUT') throw new GatewayError('GW_ERR_PEER_PROTOCOL', `Proxy ${proxy.id} did not answer for agent ${hostId} within ${this.options.dialTimeoutMs} ms`);
      throw new GatewayError('GW_ERR_PEER_PROTOCOL', `Proxy ${proxy.id}: ${e.message}`);
    }
    if (answer === OK_FRAMED_LINE.trimEnd()) return new FramedStream(socket);
    if (answer === OK_LINE.trimEnd()) return socket;
    socket.destroy();
    let parsed: { ok?: unknown; error?: unknown } = {};
    try {
      parsed = JSON.parse(answer) as typeof parsed;
    } catch {
      // reported below as a protocol error
    }
    throw remoteError(proxy, parsed?.error, 'an answer that is neither ok nor an error');
  }

  private pool(proxy: ProxyRecord): PeerPool {
    const known = this.pools.get(proxy.id);
    if (known && known.addr === proxy.peer_addr) return known;
    known?.close();
    const idleMs = Math.min(PEER_POOL_IDLE_MS, this.options.idleMs / 2);
    const pool = new PeerPool(proxy.peer_addr!, (session, onSession) => this.connect(proxy, PEER_ALPN_TLS, session, onSession), idleMs, (err) =>
      this.log.debug({ proxy: proxy.id, err: err.message }, 'cannot open a peering connection ahead'),
    );
    this.pools.set(proxy.id, pool);
    return pool;
  }

  /** A TLS connection to the peer, its certificate checked (or its session, from a checked one, resumed). */
  private async connect(proxy: ProxyRecord, alpn: string, session?: Buffer, onSession?: (s: Buffer) => void): Promise<TLSSocket> {
    const addr = proxy.peer_addr!;
    const unreachable = (why: string, cause?: unknown) => new GatewayError('GW_ERR_PEER_UNREACHABLE', `cannot peer with Proxy ${proxy.id} at ${addr}: ${why}`, { cause });
    const raw = await this.options.dialer.dial(addr).catch((err: unknown) => {
      throw unreachable(toGatewayError(err).message, err);
    });
    const host = parseAddr(addr).host;
    const socket = tls.connect({
      socket: raw,
      secureContext: this.context,
      ALPNProtocols: [alpn],
      ...(session ? { session } : {}),
      ...(isIpLiteral(host) ? {} : { servername: host }),
      // Node checks this on a full handshake only: a session is resumed only with the Proxy it was made with.
      checkServerIdentity: (_host, cert) => checkPeerCert(cert.raw, proxy.id, this.options.clusterName),
    });
    if (onSession) socket.on('session', onSession);
    socket.on('error', () => undefined);
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
      socket.once('close', () => {
        clearTimeout(timer);
        reject(unreachable('the connection closed during the TLS handshake'));
      });
    }).catch((err: unknown) => {
      socket.destroy();
      throw err;
    });
    if (socket.alpnProtocol !== alpn) {
      socket.destroy();
      throw unreachable(`the peer does not speak ${alpn} (an older version?)`);
    }
    return socket;
  }

  private async dialH2(proxy: ProxyRecord, hostId: string, request: DialRequest): Promise<Duplex> {
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
    const raw = headers[ERROR_HEADER];
    let parsed: unknown;
    try {
      if (typeof raw === 'string' && raw.length <= PEER_MAX_HEADER_BYTES) parsed = JSON.parse(raw);
    } catch {
      // reported below as a protocol error
    }
    throw remoteError(proxy, parsed, `status ${String(headers[':status'])} without an error`);
  }

  private async session(proxy: ProxyRecord): Promise<http2.ClientHttp2Session> {
    const known = this.sessions.get(proxy.id);
    // A session whose connection ended (the peer restarted, a cut) may not have emitted 'close' yet.
    const usable = await known?.then((s) => (s.destroyed || s.closed ? undefined : s), () => undefined);
    if (usable) return usable;
    if (known && this.sessions.get(proxy.id) === known) this.sessions.delete(proxy.id);
    const again = this.sessions.get(proxy.id);
    if (again) return again;
    const opening = this.connectH2(proxy).then((session) => {
      session.once('close', () => {
        if (this.sessions.get(proxy.id) === opening) this.sessions.delete(proxy.id);
      });
      return session;
    });
    opening.catch(() => this.sessions.get(proxy.id) === opening && this.sessions.delete(proxy.id));
    this.sessions.set(proxy.id, opening);
    return opening;
  }

  private async connectH2(proxy: ProxyRecord): Promise<http2.ClientHttp2Session> {
    const socket = await this.connect(proxy, PEER_ALPN);
    const host = parseAddr(proxy.peer_addr!).host;
    const session = http2.connect(`https://${formatHostPort(host, 443)}`, { createConnection: () => socket, settings: SESSION_SETTINGS, maxSessionMemory: 64 });
    session.on('error', (err) => this.log.debug({ proxy: proxy.id, err: err.message }, 'peering session error'));
    session.once('localSettings', () => session.setLocalWindowSize(PEER_SESSION_WINDOW));
    // The Dialer's sockets allow half-open connections: a peer that closes must end the session here.
    socket.once('end', () => session.destroy()).once('close', () => session.destroy());
    session.setTimeout(this.options.idleMs, () => {
      // No frame for idle_timeout: close once the streams still open (silent but alive) are done.
      this.sessions.delete(proxy.id);
      session.close();
    });
    this.log.debug({ proxy: proxy.id, addr: proxy.peer_addr }, 'peering connection open (HTTP/2)');
    return session;
  }
}

/**
 * The gateway-peer-tls connections to one peer address: the latest TLS session (resumed by every new connection)
 * and up to PEER_POOL_SIZE connections established ahead. Each stream refills the pool; a pooled connection
 * unused for idleMs, or that the peer closed or wrote to, is dropped and not replaced.
 */
class PeerPool {
  private readonly idle = new Map<TLSSocket, () => void>();
  private opening = 0;
  private session: Buffer | undefined;
  private closed = false;

  constructor(
    readonly addr: string | undefined,
    private readonly connect: (session: Buffer | undefined, onSession: (s: Buffer) => void) => Promise<TLSSocket>,
    private readonly idleMs: number,
    private readonly onRefillError: (err: Error) => void,
  ) {}

  async take(): Promise<{ socket: TLSSocket; pooled: boolean }> {
    for (const [socket, unpark] of this.idle) {
      unpark();
      if (socket.destroyed || socket.readableEnded) continue;
      return { socket, pooled: true };
    }
    return { socket: await this.open(), pooled: false };
  }

  close(): void {
    this.closed = true;
    for (const [socket, unpark] of this.idle) {
      unpark();
      socket.destroy();
    }
  }

  private open(): Promise<TLSSocket> {
    return this.connect(this.session, (s) => (this.session = s));
  }

  /** Opens connections ahead until PEER_POOL_SIZE are pooled or opening. */
  refill(): void {
    while (!this.closed && this.idle.size + this.opening < PEER_POOL_SIZE) {
      this.opening++;
      this.open().then(
        (socket) => {
          this.opening--;
          if (this.closed) socket.destroy();
          else this.park(socket);
        },
        (err: Error) => {
          this.opening--;
          this.onRefillError(err);
        },
      );
    }
  }

  /** Holds an established connection until take(); it reads meanwhile, so that the peer's end is seen at once. */
  private park(socket: TLSSocket): void {
    const drop = () => {
      unpark();
      socket.destroy();
    };
    const timer = setTimeout(drop, this.idleMs);
    timer.unref();
    const unpark = () => {
      this.idle.delete(socket);
      clearTimeout(timer);
      socket.off('data', drop).off('end', drop).off('close', drop);
      socket.pause();
    };
    // The peer sends nothing before the request: data here is a protocol error.
    socket.on('data', drop).once('end', drop).once('close', drop);
    socket.resume();
    this.idle.set(socket, unpark);
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

/** The error a peer answered ({code, message, hint}), as this Proxy reports it. */
function remoteError(proxy: ProxyRecord, raw: unknown, fallback: string): GatewayError {
  const parsed = (typeof raw === 'object' && raw !== null ? raw : {}) as { code?: unknown; message?: unknown; hint?: unknown };
  const code = isErrorCode(parsed.code) ? parsed.code : 'GW_ERR_PEER_PROTOCOL';
  const message = typeof parsed.message === 'string' ? parsed.message : fallback;
  return new GatewayError(code, `through Proxy ${proxy.id}: ${message}`, typeof parsed.hint === 'string' ? { hint: parsed.hint } : {});
}
