/**
 * Server-side TLS on a stream we hold (an accepted socket, a routed socket with its ClientHello pushed back, a
 * stream inside a connection upgrade), with the handshake deadline of its connection (src/net/deadlines.ts).
 * Every TLS endpoint of the gateway goes through here: every TLS route of the one port, the separate protocol
 * ports and the Auth API; peering and the web port (src/net/http2.ts) through a tls.Server that never listens,
 * paired with their streams by innerStream().
 */
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import { createHash, X509Certificate } from 'node:crypto';
import tls, { type TLSSocket } from 'node:tls';
import { tlsSocketParent, tlsVerifyResult } from '../internals.js';
import { wrapStream } from '../stream/meta.js';
import { connectionOf } from './deadlines.js';

export interface TlsTermination {
  secureContext: tls.SecureContext;
  /** The ALPN protocols this endpoint selects from (none: no ALPN). */
  alpn: string[];
  handshakeMs: number;
}

/**
 * A secure context for terminateTls. tls.Server gives its context a session ID context; a context made by hand
 * has none, and with client certificates requested OpenSSL then refuses every resumed session (a session ID or
 * ticket from an earlier connection, as undici, curl and browsers send) with an internal_error alert. `name`
 * keeps the sessions of different endpoints apart.
 */
export function serverSecureContext(options: tls.SecureContextOptions, name: string): tls.SecureContext {
  return tls.createSecureContext({ ...options, sessionIdContext: sessionIdContext(name) });
}

/** The TLS session ID context of endpoint `name` (above: why every server context needs one). */
export function sessionIdContext(name: string): string {
  return createHash('sha256').update(`gateway:${name}`).digest('hex').slice(0, 32);
}

/**
 * Starts TLS as the server on stream, asking for (not requiring) a client certificate. onSecure gets the TLS
 * socket once the handshake is done, with .authorized set as tls.Server would set it; a handshake that fails
 * or passes its deadline closes the connection, and onError (if given) hears why.
 */
export function terminateTls(stream: Duplex, options: TlsTermination, onSecure: (socket: TLSSocket) => void, onError?: (err: Error) => void): TLSSocket {
  const conn = connectionOf(stream);
  const socket = new tls.TLSSocket(stream as net.Socket, {
    isServer: true,
    secureContext: options.secureContext,
    requestCert: true,
    rejectUnauthorized: false,
    ALPNProtocols: options.alpn,
  });
  conn.link(socket);
  wrapStream(socket, stream); // the TLS socket sees the routed stream's metadata (its client address)
  conn.enter('tls-handshake', options.handshakeMs);
  socket.once('secure', () => {
    conn.leave('tls-handshake');
    recordClientVerification(socket);
    onSecure(socket);
  });
  socket.on('error', (err) => {
    onError?.(err);
    socket.destroy();
  });
  return socket;
}

/** authorizationError when Node's verdict on the client certificate cannot be read (src/internals.ts). */
export const VERDICT_UNAVAILABLE = 'the TLS verdict on the client certificate cannot be read (src/internals.ts)';

/**
 * A TLSSocket made by hand is not checked the way tls.Server checks its own (onServerSocketSecure): record
 * the client certificate's verification here so that handlers can rely on .authorized and .authorizationError.
 * Node offers no public call for it; the TLS handle's verifyError() is what tls.Server itself reads, through
 * src/internals.ts. Without it the client is not verified (fail closed). Exported for its test.
 */
export function recordClientVerification(socket: TLSSocket): void {
  const verdict = tlsVerifyResult(socket);
  if (!verdict) socket.authorizationError = VERDICT_UNAVAILABLE as never;
  else if (verdict.error) socket.authorizationError = (verdict.error.code ?? verdict.error.message) as never;
  else if (socket.getPeerCertificate()?.raw) socket.authorized = true;
}

/**
 * Server-side TLS through a tls.Server that never listens, for endpoints whose protocol library needs the socket
 * tls.Server makes (node:http2 stalls on a hand-made server TLSSocket: Proxy peering, src/proxy/peer.ts). Same
 * deadline as terminateTls; the client certificate is requested, not required, and .authorized is tls.Server's.
 */
export function tlsTerminator(
  options: Omit<TlsTermination, 'secureContext'> & { credentials: tls.SecureContextOptions; name: string },
): (stream: net.Socket, onSecure: (socket: TLSSocket) => void, onError?: (err: Error) => void) => void {
  const server = tls.createServer({ ...options.credentials, sessionIdContext: sessionIdContext(options.name), requestCert: true, rejectUnauthorized: false, ALPNProtocols: options.alpn });
  const pending = new WeakMap<net.Socket, { onSecure: (socket: TLSSocket) => void; onError?: (err: Error) => void }>();
  server.on('secureConnection', (socket: TLSSocket) => {
    const raw = innerStream(socket) as net.Socket | undefined;
    const handlers = raw ? pending.get(raw) : undefined;
    if (!raw || !handlers) return void socket.destroy();
    connectionOf(raw).leave('tls-handshake');
    connectionOf(raw).link(socket);
    socket.on('error', () => socket.destroy());
    handlers.onSecure(socket);
  });
  server.on('tlsClientError', (err: Error, socket: TLSSocket) => {
    const raw = innerStream(socket) as net.Socket | undefined;
    if (raw) pending.get(raw)?.onError?.(err);
    socket.destroy();
  });
  return (stream, onSecure, onError) => {
    pending.set(stream, { onSecure, ...(onError ? { onError } : {}) });
    connectionOf(stream).enter('tls-handshake', options.handshakeMs);
    server.emit('connection', stream);
  };
}

/**
 * The stream a TLS socket made by a tls.Server runs on: the one handed to the server with emit('connection').
 * Node offers no public way to pair the two (src/internals.ts reads it, and says what happens without it); the
 * servers that are fed our streams (tlsTerminator, the web port's HTTP/2 server in src/net/http2.ts) need the
 * pair for the deadlines, and refuse a connection they cannot pair.
 */
export function innerStream(socket: TLSSocket): Duplex | undefined {
  return tlsSocketParent(socket);
}

/**
 * The peer's certificate as an X509Certificate: what every caller uses instead of socket.getPeerX509Certificate().
 * On Node 20 (seen on 20.20) a client socket's first getPeerX509Certificate() takes the certificate away: the next
 * call, and getPeerCertificate(), answer nothing, so code that looks at it twice (a check, then a log or a second
 * check) sees no certificate. getPeerCertificate() leaves it where it is (test/net/peercert.test.ts).
 */
export function peerX509(socket: TLSSocket): X509Certificate | undefined {
  const raw = socket.getPeerCertificate()?.raw;
  return raw && raw.length > 0 ? new X509Certificate(raw) : undefined;
}
