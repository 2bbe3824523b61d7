/**
 * The one relay of an HTTP/1.1 connection upgrade (a WebSocket, SPDY/3.1, any `Upgrade` a server answers with 101)
 * between a client's socket whose upgrade request was already read, and the request sent on to the server behind
 * (an HTTP app, a Kubernetes API server). Used by the Proxy for HTTP apps (src/proxy/appupgrade.ts) and for
 * Kubernetes (src/proxy/webapps.ts, the kube route), and by the agent's Kubernetes credential front
 * (src/agent/kubeapi.ts): one relay with one set of rules, whoever checked the request before.
 *
 * What may happen, in order, and what decides:
 *
 *   the request       its head was read by the caller's HTTP server (its header deadline, the head's cap); the
 *                     bytes the client sent after it wait unread (Node pauses an upgraded socket) until the splice:
 *                     TCP back-pressure
 *   the answer        Node's HTTP client parses the server's answer head (its cap). No head within headerMs: the
 *                     caller's timeout code. An answer other than 101 (a refusal: 400, 401, 403, 426..., or a 200
 *                     that merely announces an Upgrade: Node's parser treats only a 101 as switching) is relayed as
 *                     it is and the connection closed. A 101 that names no protocol, or another than the one asked
 *                     for: the caller's unasked code, the server's connection dropped; so is a 101 without any
 *                     Upgrade header (Node's client hands that one over as a plain answer: never relayed as one).
 *   the switch        the 101 head goes to the client (hop-by-hop headers other than Upgrade and Connection
 *                     dropped), then the bytes of each side that came with the heads, then src/stream/splice.ts
 *                     both ways (pipe: back-pressure, half-close, a break reset on the other side)
 *   the upgraded      no bytes either way for idleMs: closed; the same for the body of a refusal
 *
 * Written here rather than with an HTTP proxy library (http-proxy-3 and its kind relay the upgrade but know none
 * of the deadlines, the protocol check or the byte counts the callers need): Node's own HTTP client already parses
 * the answer (with its caps) and hands over the socket on a 101; what is left is the rules above.
 */
import type http from 'node:http';
import type { Duplex } from 'node:stream';
import { GatewayError, type ErrorCode } from '../errors.js';
import { splice } from '../stream/splice.js';

/** Headers that are the connection's own (RFC 9110 7.6.1), never relayed as they are. */
export const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'http2-settings']);

/** Whether a header is relayed: not hop-by-hop, and not an HTTP/2 pseudo-header (:method, :path, ...). */
export const relayed = (name: string): boolean => !HOP_BY_HOP.has(name) && !name.startsWith(':');

/** The protocols an Upgrade header names, lower-cased ("websocket", "h2c", "spdy/3.1"). */
export function protocolsOf(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((p) => p.trim().toLowerCase())
    .filter(Boolean);
}

export interface UpgradeRelayOptions {
  /** How long the server has for its answer's head; how long the upgraded connection may move no bytes (0: no limit). */
  headerMs: number;
  idleMs: number;
  /** Who answers, for messages: "the app", "the API server". */
  peer: string;
  /** The codes of the two refusals of this relay's own: no answer in time, a 101 to what was not asked. */
  codes: { timeout: ErrorCode; unasked: ErrorCode };
  /** Counts the bytes: from the client, from the server. */
  meter?: { count(fromClient: number, fromServer: number): void };
  /** Bytes moved on the upgraded connection (an app session kept alive by it). */
  touch?: () => void;
  /** A Set-Cookie of the server's that the client must not get, by the cookie's name. */
  dropCookie?: (name: string) => boolean;
  /** The answer's head, before it is relayed (the agent's credential front re-reads a token after a 401). */
  onAnswer?: (answer: http.IncomingMessage) => void;
}

/**
 * Sends nothing itself: upstream is the request to the server (not yet ended), socket the client's. Resolves once
 * the connection is spliced, or once a refusal of the server's was relayed; rejects (nothing sent to the client
 * yet) for no answer within headerMs, a failed connection, or a 101 to what was not asked. The caller answers a
 * rejection on the socket (src/proxy/webanswer.ts refuseUpgrade).
 */
export function relayUpgrade(upstream: http.ClientRequest, socket: Duplex, head: Buffer, asked: readonly string[], options: UpgradeRelayOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      upstream.destroy();
      reject(new GatewayError(options.codes.timeout, `${options.peer} did not answer the upgrade to ${asked.join(', ')} within ${options.headerMs} ms`));
    }, Math.max(1, options.headerMs));
    const settle = () => clearTimeout(timer);
    // The client gone while the server thinks: the server's connection goes too.
    const gone = () => upstream.destroy();
    socket.once('close', gone);
    upstream.on('error', (err) => {
      settle();
      // A refusal of the connection's own (an untrusted certificate, a credential) keeps its code.
      reject(err instanceof GatewayError ? err : new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `${options.peer}'s answer to the upgrade failed: ${err.message}`));
    });
    upstream.on('response', (answer) => {
      settle();
      socket.off('close', gone);
      options.onAnswer?.(answer);
      // A 101 without an Upgrade header (Node hands it over as a final answer): a switch to nothing named.
      if (answer.statusCode === 101) {
        answer.destroy();
        return reject(new GatewayError(options.codes.unasked, `${options.peer} switched protocols (101) without naming one where ${asked.join(', ')} was asked for`));
      }
      relayRefusal(answer, socket, options.dropCookie);
      idleLimit(socket, answer, options.idleMs);
      resolve();
    });
    upstream.on('upgrade', (answer: http.IncomingMessage, serverSocket: Duplex, serverHead: Buffer) => {
      settle();
      socket.off('close', gone);
      options.onAnswer?.(answer);
      const to = protocolsOf(answer.headers.upgrade);
      if (to.length !== 1 || !asked.includes(to[0]!)) {
        serverSocket.destroy();
        return reject(new GatewayError(options.codes.unasked, `${options.peer} switched to ${JSON.stringify(answer.headers.upgrade ?? '')} where ${asked.join(', ')} was asked for`));
      }
      socket.write(headOf(answer, options.dropCookie));
      if (serverHead.length > 0) socket.write(serverHead);
      if (head.length > 0) serverSocket.write(head);
      const meter = options.meter;
      meter?.count(head.length, serverHead.length);
      if (meter) {
        socket.on('data', (chunk: Buffer) => meter.count(chunk.length, 0));
        serverSocket.on('data', (chunk: Buffer) => meter.count(0, chunk.length));
      }
      idleLimit(socket, serverSocket, options.idleMs, options.touch);
      splice(socket, serverSocket);
      resolve();
    });
    upstream.end();
  });
}

const cookieName = (setCookie: string) => setCookie.slice(0, Math.max(0, setCookie.indexOf('='))).trim();

/** The 101 head as the client gets it: the server's headers but the hop-by-hop ones (Upgrade and Connection kept). */
function headOf(answer: http.IncomingMessage, dropCookie?: (name: string) => boolean): string {
  const lines = [`HTTP/1.1 101 ${answer.statusMessage || 'Switching Protocols'}`];
  const raw = answer.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if (!relayed(lower)) continue;
    if (lower === 'set-cookie' && dropCookie?.(cookieName(raw[i + 1]!))) continue;
    lines.push(`${name}: ${raw[i + 1]!}`);
  }
  lines.push('Connection: Upgrade', `Upgrade: ${answer.headers.upgrade ?? ''}`);
  return `${lines.join('\r\n')}\r\n\r\n`;
}

/** The server refused the upgrade (any answer but 101): its answer as it is, then the close. */
function relayRefusal(answer: http.IncomingMessage, socket: Duplex, dropCookie?: (name: string) => boolean): void {
  const lines = [`HTTP/1.1 ${answer.statusCode ?? 502} ${answer.statusMessage ?? ''}`];
  const raw = answer.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (!relayed(lower) || lower === 'content-length') continue;
    if (lower === 'set-cookie' && dropCookie?.(cookieName(raw[i + 1]!))) continue;
    lines.push(`${raw[i]!}: ${raw[i + 1]!}`);
  }
  // The body as Node decoded it, delimited by the close.
  lines.push('Connection: close');
  socket.write(`${lines.join('\r\n')}\r\n\r\n`);
  answer.pipe(socket);
  answer.once('close', () => {
    if (!answer.complete) socket.destroy();
  });
}

/**
 * No bytes either way for idleMs (0: no limit): the client's connection is closed, and the splice resets the
 * server's (or the refusal's body is cut). Bytes moving call touch.
 */
function idleLimit(socket: Duplex, serverSide: { on(event: 'data', listener: () => void): unknown }, idleMs: number, touch?: () => void): void {
  let timer: NodeJS.Timeout | undefined = idleMs > 0 ? setTimeout(expire, idleMs) : undefined;
  function expire(): void {
    socket.destroy();
  }
  const moved = () => {
    touch?.();
    if (timer === undefined) return;
    clearTimeout(timer);
    timer = setTimeout(expire, idleMs);
  };
  socket.on('data', moved);
  serverSide.on('data', moved);
  socket.once('close', () => clearTimeout(timer));
}
