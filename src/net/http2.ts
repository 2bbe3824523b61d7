/**
 * The web port's HTTP server: HTTP/2 and HTTP/1.1 on one TLS endpoint, with the deadlines and caps of
 * src/net/deadlines.ts (docs/security.md, "HTTP/2 on the web port").
 *
 * One node:http2 secure server with allowHTTP1 that never listens: it is handed our streams (an accepted socket,
 * or the multiplexer's with its ClientHello pushed back) with emit('connection'), so the TLS handshake is its own
 * (node:http2 needs the TLS socket a tls.Server makes) under our handshake deadline. ALPN: h2, then http/1.1; a
 * client that offers no ALPN speaks HTTP/1.1. Both reach the same request listener: on HTTP/2 through Node's
 * compatibility API (req.socket is a proxy of the TLS socket: getPeerCertificate, authorized and the addresses
 * work through it). Before the listener runs, an HTTP/2 request gets `host` from `:authority` when it has none,
 * and its req.socket sees the routed stream's metadata (the client address of a PROXY header).
 *
 * WebSocket upgrades stay on HTTP/1.1 (no RFC 8441 extended CONNECT: browsers then open an HTTP/1.1 connection
 * for a WebSocket): the server's 'upgrade' event, as http.Server's.
 *
 * Deadlines (counted on the listener of the connection, like every other phase):
 *   tls-handshake  the stream handed over → handshake done (tls_handshake_timeout)
 *   HTTP/1.1       as src/net/http.ts: http-headers, http-request, http-idle; keep-alive between requests 5 s
 *   HTTP/2         http-headers   no stream open (the session's start, or its last stream closed) → the next
 *                                 stream's HEADERS, within header_timeout; else GOAWAY and close
 *                  http-request   per stream: its HEADERS → the end of its request body (END_STREAM), within
 *                                 request_timeout; else that stream is reset (CANCEL), the session goes on
 *                  http-idle      per stream and per session: no frame for idle_timeout; the stream is reset,
 *                                 the session closed
 * Caps (HTTP2_CAPS): SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_MAX_HEADER_LIST_SIZE and header pairs, session
 * memory, SETTINGS entries, and what closes a session: streams the client cancels at a rapid rate (the "rapid
 * reset" attack: closed with GOAWAY ENHANCE_YOUR_CALM), a flood of frames that need an answer (PING and SETTINGS
 * per second; nghttp2's outbound queue), invalid frames and refused streams over Node's caps. Each such close is
 * counted on the listener (ListenerStats.closed).
 */
import type http from 'node:http';
import http2 from 'node:http2';
import type { Duplex } from 'node:stream';
import type { SecureContextOptions, TLSSocket } from 'node:tls';
import { wrapStream } from '../stream/meta.js';
import { Connection, connectionOf, type LimitSettings, type ProtocolCap } from './deadlines.js';
import { enterHttp1, leaveOnUpgrade, requestPhases } from './http.js';
import { innerStream, sessionIdContext } from './tls.js';

const { NGHTTP2_NO_ERROR, NGHTTP2_CANCEL, NGHTTP2_ENHANCE_YOUR_CALM, NGHTTP2_STREAM_STATE_HALF_CLOSED_REMOTE, NGHTTP2_STREAM_STATE_CLOSED } = http2.constants;
/** nghttp2's NGHTTP2_ERR_FLOODED: the peer made it queue too many answers (SETTINGS or PING acks, resets). */
const NGHTTP2_ERR_FLOODED = -904;

export interface Http2Caps {
  /** SETTINGS_MAX_CONCURRENT_STREAMS: more are refused (RST_STREAM REFUSED_STREAM). */
  maxConcurrentStreams: number;
  /** SETTINGS_MAX_HEADER_LIST_SIZE: the decoded header list of one request, in bytes (as HTTP/1.1's 16 KiB). */
  maxHeaderListBytes: number;
  /** Header fields in one request, pseudo-headers included. */
  maxHeaderPairs: number;
  /** Memory one session may hold in nghttp2 (headers, queued frames), MiB: over it new streams are refused. */
  maxSessionMemoryMiB: number;
  /** Streams of one session the client may cancel in one second (rapid reset); more close the session. */
  maxResetsPerSecond: number;
  /** PING and SETTINGS frames of one session in one second (each asks for an answer); more close the session. */
  maxControlFramesPerSecond: number;
  /** Invalid frames in one session before it is closed. */
  maxInvalidFrames: number;
  /** Streams refused for the memory cap in one session before it is closed (Node's maxSessionRejectedStreams). */
  maxRefusedStreams: number;
  /** Entries in one SETTINGS frame. */
  maxSettings: number;
}

export const HTTP2_CAPS: Readonly<Http2Caps> = Object.freeze({
  maxConcurrentStreams: 128,
  maxHeaderListBytes: 16 * 1024,
  maxHeaderPairs: 128,
  maxSessionMemoryMiB: 16,
  maxResetsPerSecond: 100,
  maxControlFramesPerSecond: 100,
  maxInvalidFrames: 100,
  maxRefusedStreams: 100,
  maxSettings: 32,
});

/** Node's keep-alive between HTTP/1.1 requests (what http.Server does by default). */
const HTTP1_KEEP_ALIVE_MS = 5_000;

export type WebRequestListener = (req: http.IncomingMessage, res: http.ServerResponse) => void;

export interface WebServerOptions {
  /** The port's certificate, key and the CAs a client certificate may come from (asked for, not required). */
  credentials: SecureContextOptions;
  /** Keeps TLS sessions of this endpoint apart from the others' (session ID context). */
  name: string;
  settings: Pick<LimitSettings, 'tlsHandshakeMs' | 'headerMs' | 'requestMs' | 'idleMs'>;
  caps?: Partial<Http2Caps>;
  /** Hears why a TLS handshake failed (the connection is closed). */
  onTlsError?: (err: Error) => void;
}

export interface WebServer {
  /** Node's server: 'upgrade' (HTTP/1.1 WebSocket upgrades) is the caller's. */
  readonly server: http2.Http2SecureServer;
  /** Hands a stream to the server: TLS first, then HTTP/2 or HTTP/1.1. */
  accept(stream: Duplex): void;
  /** Sessions open now (HTTP/2 connections). */
  sessions(): number;
  /** Closes every connection the server holds. */
  close(): void;
}

/** The streams we reset ourselves (a deadline): not counted as the client's resets. */
const ourResets = new WeakSet<http2.ServerHttp2Stream>();

/** What the web server knows of one HTTP/2 session: its connection, the stream under the TLS, its streams. */
class SessionState {
  private open = 0;
  private readonly resets = new PerSecond();
  private readonly controlFrames = new PerSecond();
  private ending = false;

  constructor(
    readonly session: http2.ServerHttp2Session,
    readonly conn: Connection,
    readonly raw: Duplex,
    private readonly settings: WebServerOptions['settings'],
    private readonly caps: Http2Caps,
  ) {
    this.idle();
  }

  /** No stream open: the next one's HEADERS are due within header_timeout, as a kept-alive HTTP/1.1 request. */
  private idle(): void {
    this.conn.enter('http-headers', this.settings.headerMs, this);
  }

  /** For Connection: http-headers passed. GOAWAY: a stream the client opened just now is still answered. */
  onExpire(): void {
    this.session.close();
  }

  opened(stream: http2.ServerHttp2Stream): void {
    if (this.open++ === 0) this.conn.leave('http-headers');
    watchStream(stream, this);
  }

  closed(stream: http2.ServerHttp2Stream): void {
    // Not when the session itself is going (the socket closed: Node cancels every stream still open).
    const going = this.ending || this.session.closed || this.session.destroyed;
    if (!going && stream.rstCode !== undefined && stream.rstCode !== NGHTTP2_NO_ERROR && !ourResets.has(stream)) this.reset();
    if (--this.open === 0 && !this.session.closed && !this.session.destroyed) this.idle();
  }

  /** A stream the client reset (RST_STREAM): over maxResetsPerSecond in one second closes the session. */
  private reset(): void {
    if (this.resets.over(this.caps.maxResetsPerSecond)) this.closeFor('h2-rapid-reset');
  }

  /**
   * A PING or SETTINGS frame: each makes the server answer (an ACK), and Node writes the answers out whether or
   * not the client reads them, so a flood of them would pile up in memory; nghttp2's own flood check only sees
   * answers it still holds. Over maxControlFramesPerSecond in one second closes the session.
   */
  controlFrame(): void {
    if (this.controlFrames.over(this.caps.maxControlFramesPerSecond)) this.closeFor('h2-flood');
  }

  /** Counts the cap on the listener and closes the session with GOAWAY ENHANCE_YOUR_CALM. */
  closeFor(cap: ProtocolCap): void {
    if (this.ending) return;
    this.ending = true;
    this.conn.closedFor(cap);
    if (!this.session.destroyed) this.session.destroy(new Error(`HTTP/2 cap reached: ${cap}`), NGHTTP2_ENHANCE_YOUR_CALM);
  }

  /** A session error (Node closes the session): counted when a cap caused it. */
  failed(err: Error & { code?: string; errno?: number }): void {
    if (this.ending) return;
    const cap = capOf(err);
    if (!cap) return;
    this.ending = true;
    this.conn.closedFor(cap);
  }

  /** No frame for idle_timeout (Node's session timer). */
  timedOut(): void {
    this.ending = true;
    this.conn.count('http-idle');
    this.session.destroy();
  }

  get streamSettings(): WebServerOptions['settings'] {
    return this.settings;
  }
}

/** Events in fixed one-second windows: O(1) memory, whatever the rate. */
class PerSecond {
  private start = 0;
  private count = 0;

  /** Counts one event; true when the window now holds more than max. */
  over(max: number): boolean {
    const now = performance.now();
    if (now - this.start >= 1000) {
      this.start = now;
      this.count = 0;
    }
    return ++this.count > max;
  }
}

/** Which cap an HTTP/2 session error stands for, if any (a reset socket is none: the client left). */
function capOf(err: Error & { code?: string; errno?: number }): ProtocolCap | undefined {
  if (err.code === 'ERR_HTTP2_TOO_MANY_INVALID_FRAMES') return 'h2-invalid-frames';
  if (err.code === 'ERR_HTTP2_ERROR' && err.errno === NGHTTP2_ERR_FLOODED) return 'h2-flood';
  if (err.code === 'ERR_HTTP2_ERROR' || err.code === 'ERR_HTTP2_SESSION_ERROR') return 'h2-protocol';
  return undefined;
}

/**
 * One stream's deadlines: http-request until the client ends its request (END_STREAM), http-idle while no frame
 * of it moves. Its own Connection (no listener, no linger) holds the first, on the shared deadline lists; the
 * count goes to the session's listener.
 */
class StreamDeadlines {
  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly state: SessionState,
  ) {}

  unless(): boolean {
    const s = this.stream.destroyed ? NGHTTP2_STREAM_STATE_CLOSED : this.stream.state.state;
    return s === NGHTTP2_STREAM_STATE_HALF_CLOSED_REMOTE || s === NGHTTP2_STREAM_STATE_CLOSED;
  }

  onExpire(): void {
    this.state.conn.count('http-request');
    resetStream(this.stream);
  }
}

function watchStream(stream: http2.ServerHttp2Stream, state: SessionState): void {
  const { requestMs, idleMs } = state.streamSettings;
  if (!stream.endAfterHeaders) new Connection(stream, undefined, 0).enter('http-request', requestMs, new StreamDeadlines(stream, state));
  if (idleMs > 0) {
    stream.setTimeout(idleMs);
    stream.once('timeout', onStreamTimeout);
  }
  stream.once('close', onStreamClose);
}

const streamStates = new WeakMap<http2.ServerHttp2Stream, SessionState>();

function onStreamTimeout(this: http2.ServerHttp2Stream): void {
  streamStates.get(this)?.conn.count('http-idle');
  resetStream(this);
}

function onStreamClose(this: http2.ServerHttp2Stream): void {
  streamStates.get(this)?.closed(this);
}

function resetStream(stream: http2.ServerHttp2Stream): void {
  ourResets.add(stream);
  if (!stream.destroyed) stream.close(NGHTTP2_CANCEL);
}

/** The HTTP/2 request as the listener expects it: `host` set from `:authority`, the routed stream's metadata. */
function prepareH2Request(req: http2.Http2ServerRequest, state: SessionState | undefined): void {
  if (req.headers.host === undefined && typeof req.headers[':authority'] === 'string') req.headers.host = req.headers[':authority'];
  if (state) wrapStream(req.socket, state.raw);
}

export function createWebServer(options: WebServerOptions, listener: WebRequestListener): WebServer {
  const caps: Http2Caps = { ...HTTP2_CAPS, ...options.caps };
  const { settings } = options;
  const server = http2.createSecureServer({
    ...options.credentials,
    sessionIdContext: sessionIdContext(options.name),
    requestCert: true,
    rejectUnauthorized: false,
    allowHTTP1: true,
    settings: { maxConcurrentStreams: caps.maxConcurrentStreams, maxHeaderListSize: caps.maxHeaderListBytes, enablePush: false, enableConnectProtocol: false },
    maxHeaderListPairs: caps.maxHeaderPairs,
    maxSessionMemory: caps.maxSessionMemoryMiB,
    maxSessionInvalidFrames: caps.maxInvalidFrames,
    maxSessionRejectedStreams: caps.maxRefusedStreams,
    maxSettings: caps.maxSettings,
  });
  // HTTP/1.1 connections: http.Server's idle and keep-alive rules (a server that never listens arms no others).
  server.setTimeout(settings.idleMs);
  (server as unknown as { keepAliveTimeout: number }).keepAliveTimeout = HTTP1_KEEP_ALIVE_MS;
  const sessions = new Map<http2.ServerHttp2Session, SessionState>();
  let handing: { conn: Connection; raw: Duplex; socket: TLSSocket } | undefined;

  // Before Node's own listener, which starts the session (or HTTP/1.1) at once.
  server.prependListener('secureConnection', (socket: TLSSocket) => {
    const raw = innerStream(socket);
    if (!raw) return void socket.destroy();
    const conn = connectionOf(raw);
    conn.leave('tls-handshake');
    conn.link(socket);
    wrapStream(socket, raw);
    socket.on('error', () => socket.destroy());
    if (socket.alpnProtocol === 'h2') handing = { conn, raw, socket };
    else enterHttp1(socket, settings);
  });
  server.on('session', (session: http2.ServerHttp2Session) => {
    const h = handing;
    handing = undefined;
    if (!h) return void session.destroy();
    const state = new SessionState(session, h.conn, h.raw, settings, caps);
    sessions.set(session, state);
    session.on('stream', (stream: http2.ServerHttp2Stream) => {
      streamStates.set(stream, state);
      state.opened(stream);
    });
    session.on('ping', () => state.controlFrame());
    session.on('remoteSettings', () => state.controlFrame());
    session.once('close', () => sessions.delete(session));
    // The listeners allow half-open connections, so the TLS socket does not end itself when the client ends its
    // side, and node:http2 waits for 'close': a client gone (curl exiting) would hold the session until a deadline.
    h.socket.once('end', () => session.close());
  });
  server.on('sessionError', (err: Error, session: http2.ServerHttp2Session) => sessions.get(session)?.failed(err));
  server.on('timeout', (target: http2.ServerHttp2Session | Duplex) => {
    const state = sessions.get(target as http2.ServerHttp2Session);
    if (state) return state.timedOut();
    (target as Duplex).destroy(); // an HTTP/1.1 socket: counted by enterHttp1
  });
  server.on('tlsClientError', (err: Error) => options.onTlsError?.(err));
  // An HTTP/1.1 request Node's parser refuses (headers over its 16 KiB, a malformed line): an answer, not a silent close.
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    const status = err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : '400 Bad Request';
    // The parser reports every chunk that follows too: the answer is written once, and its end is not cut short.
    if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
    else if (!socket.writableEnded) socket.destroy();
  });

  const http1 = requestPhases(settings);
  server.prependListener('request', (req: http2.Http2ServerRequest | http.IncomingMessage, res: http2.Http2ServerResponse | http.ServerResponse) => {
    if (req.httpVersionMajor >= 2) prepareH2Request(req as http2.Http2ServerRequest, sessions.get((req as http2.Http2ServerRequest).stream.session as http2.ServerHttp2Session));
    else http1(req as http.IncomingMessage, res as http.ServerResponse);
  });
  server.on('request', listener as unknown as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void);
  server.prependListener('upgrade', leaveOnUpgrade);

  return {
    server,
    accept(stream) {
      connectionOf(stream).enter('tls-handshake', settings.tlsHandshakeMs);
      server.emit('connection', stream);
    },
    sessions: () => sessions.size,
    close() {
      for (const session of sessions.keys()) session.destroy();
      server.close();
    },
  };
}
