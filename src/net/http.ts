/**
 * Deadlines for an http.Server that is handed its connections (server.emit('connection', socket)) rather than
 * listening itself: the web server behind the multiplexer or our own TLS termination, the plain-HTTP redirect,
 * the Kubernetes route and the Auth API.
 *
 * Node checks headersTimeout and requestTimeout only for servers that listen(): the check starts from the
 * 'listening' event, so on a server fed with sockets a client that sends its headers slowly, or nothing at all
 * after the TLS handshake, held the connection forever. Here the same rules are driven by the server's own
 * events, through the connection's phases (src/net/deadlines.ts):
 *
 *   http-headers  from the hand-off (or the end of the previous answer on a kept-alive connection) to the
 *                 'request' event: the whole request head must arrive within header_timeout;
 *   http-request  from 'request' to the last byte of the body (req.complete), within request_timeout; a handler
 *                 still working on its answer when it passes is not interrupted;
 *   http-idle     Node's own socket timeout (server.timeout = idle_timeout, armed per socket for fed servers
 *                 too): a request or answer that moves no bytes; kept-alive connections between requests close
 *                 after Node's keepAliveTimeout (5 s).
 */
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { GatewayError } from '../errors.js';
import { connectionOf, type LimitSettings } from './deadlines.js';

export type HttpDeadlines = Pick<LimitSettings, 'headerMs' | 'requestMs' | 'idleMs'>;

/**
 * Sets the deadlines on server and returns the function that hands it a connection. upgrades: the server
 * serves upgrade requests ('upgrade' listeners): the connection then leaves HTTP and its phases.
 */
export function guardHttpServer(server: http.Server, settings: HttpDeadlines, options: { upgrades?: boolean } = {}): (socket: Duplex) => void {
  server.timeout = settings.idleMs;
  // Before the application's own listener, so that the phase is set whatever the handler does synchronously.
  server.prependListener('request', requestPhases(settings));
  if (options.upgrades) server.prependListener('upgrade', leaveOnUpgrade);

  return (socket) => {
    enterHttp1(socket, settings);
    server.emit('connection', socket);
  };
}

/** An upgrade request: the connection leaves HTTP and its phases (the upgraded protocol has its own). */
export function leaveOnUpgrade(req: http.IncomingMessage): void {
  connectionOf(req.socket).leave();
}

/** An HTTP/1.1 connection handed over: its first request head is due within header_timeout. */
export function enterHttp1(socket: Duplex, settings: HttpDeadlines): void {
  const conn = connectionOf(socket);
  conn.enter('http-headers', settings.headerMs);
  socket.on('timeout', () => conn.count('http-idle'));
}

/**
 * The 'request' listener that moves an HTTP/1.1 connection through its phases: http-request until the body is
 * complete, then, once every answer on the connection is done, http-headers for the next request.
 */
export function requestPhases(settings: HttpDeadlines): (req: http.IncomingMessage, res: http.ServerResponse) => void {
  const inFlight = new WeakMap<object, number>();
  return (req, res) => {
    const socket = req.socket;
    const conn = connectionOf(socket);
    inFlight.set(socket, (inFlight.get(socket) ?? 0) + 1);
    conn.enter('http-request', settings.requestMs, { unless: () => req.complete });
    let answered = false;
    const done = () => {
      if (answered) return;
      answered = true;
      const left = (inFlight.get(socket) ?? 1) - 1;
      inFlight.set(socket, left);
      // The next request on a kept-alive connection has the same time for its head as the first.
      if (left === 0) conn.enter('http-headers', settings.headerMs);
    };
    res.once('finish', done);
    res.once('close', done);
  };
}

/**
 * A request body of at most max bytes: refused (GW_ERR_API_TOO_LARGE) when its Content-Length says more, or as
 * soon as more arrives, before the rest is read.
 */
export async function readBoundedBody(req: http.IncomingMessage, max: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (declared > max) throw new GatewayError('GW_ERR_API_TOO_LARGE', `request body of ${declared} bytes is over this endpoint's ${max}`);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > max) throw new GatewayError('GW_ERR_API_TOO_LARGE', `request body over this endpoint's ${max} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

const HTML_ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/** Text as HTML (element content or a quoted attribute value): & < > " ' escaped. */
export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]!);
}
