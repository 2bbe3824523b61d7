/**
 * Connection upgrades through HTTP apps: a WebSocket (or any `Upgrade` the app answers with 101) on an app's public
 * address is passed to the app and, once the app switched protocols, spliced both ways until either side ends.
 *
 * The request gets exactly the checks of an app request (webapps.ts appCaller and openApp): the user's
 * certificate or the Web UI's app session, the roles' app_labels, the user as it stands now; the upgraded
 * connection is tracked in auth.sessions for as long as it is open, so a lock or a removed user closes it at once,
 * and it counts its bytes in the same audited app session as the app's other requests.
 *
 * What may happen, in order, and what decides:
 *
 *   the request       its head was read by the web server (header_timeout, the head's cap); the bytes the client
 *                     sent after it wait unread (Node pauses an upgraded socket) until the splice: TCP back-pressure
 *   the app's answer  the request goes to the app with Connection: Upgrade and the client's Upgrade; Node's HTTP
 *                     client parses the answer's head (its cap: the one for every app answer). No head within
 *                     header_timeout: GW_ERR_APP_UPGRADE_TIMEOUT. An answer other than 101 (the app refused the
 *                     upgrade: 400, 401, 426...) is relayed as it is and the connection closed. A 101 to another
 *                     protocol than the one asked for: GW_ERR_APP_UPGRADE_UNASKED, the app's connection dropped
 *   the switch        the app's 101 head goes to the client (hop-by-hop headers other than Upgrade and
 *                     Connection dropped, the gateway's cookies never set), then the bytes of each side that came
 *                     with the heads, then src/stream/splice.ts both ways (pipe: back-pressure, half-close, a
 *                     break reset on the other side)
 *   the upgraded      no bytes either way for idle_timeout: closed (as an app request that moves no bytes); the
 *                     same for the body of a refusal
 *
 * Written here rather than with an HTTP proxy library: Node's own HTTP client already parses the app's answer
 * (with its caps) and hands over the socket on a 101; what is left is the checks above, which no library knows.
 * The relay of plain app requests (webapps.ts relay) refuses a 101 to a request that did not ask for one.
 */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { appSessionKey } from './webcredentials.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import type { HttpDeadlines } from '../net/http.js';
import { splice } from '../stream/splice.js';
import type { AgentSource } from './router.js';
import { findWebApp } from './resources.js';
import type { AuditedSession, SessionAudit } from './sessionaudit.js';
import { refuseUpgrade } from './webanswer.js';
import { appCaller, gatewayCookie, openApp, relayed, withoutGatewayCookies } from './webapps.js';

export interface AppUpgradeOptions {
  /** headerMs: the time the app has to answer the upgrade; idleMs: how long the upgraded connection may be silent. */
  deadlines: Pick<HttpDeadlines, 'headerMs' | 'idleMs'>;
  audit?: SessionAudit;
}

/** The protocols an Upgrade header names, lower-cased ("websocket", "h2c", "spdy/3.1"). */
function protocolsOf(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((p) => p.trim().toLowerCase())
    .filter(Boolean);
}

/**
 * Returns the web port's upgrade handler for HTTP apps: false when the request's Host is not an app's public
 * address (the Proxy's own upgrade routes then take it), else the upgrade is the app's, and refused or relayed.
 */
export function createWebAppUpgradeHandler(auth: ProxyAuth, agents: AgentSource, options: AppUpgradeOptions): (req: http.IncomingMessage, socket: Duplex, head: Buffer) => boolean {
  const log = logger('webapps');
  return (req, socket, head) => {
    const host = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
    const target = host ? findWebApp(agents.agents(), host) : undefined;
    if (!target) return false;
    socket.on('error', () => socket.destroy());
    void (async () => {
      const asked = protocolsOf(req.headers.upgrade);
      const key = appSessionKey(target.name, host);
      const track = (who: Parameters<ProxyAuth['sessions']['track']>[0], what: string) => {
        const untrack = auth.sessions.track(who, `${what} (upgraded)`, () => socket.destroy());
        socket.once('close', untrack);
        if (socket.destroyed) untrack();
      };
      const { identity, appSession } = await appCaller(auth, target.name, key, req, track, options.audit);
      const { stream, meter, client } = await openApp(auth, agents, target, identity, req, appSession, options.audit);
      if (socket.destroyed) return void stream.destroy();
      log.info({ user: identity.name, app: target.name, path: req.url, upgrade: asked.join(',') }, 'app upgrade request');
      withoutGatewayCookies(req);
      const headers: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(req.headers)) if (relayed(k) && v !== undefined) headers[k] = v;
      Object.assign(headers, { connection: 'Upgrade', upgrade: req.headers.upgrade, 'x-forwarded-for': client.address, 'x-forwarded-proto': 'https', 'x-forwarded-host': req.headers.host ?? host, 'x-gateway-user': identity.name });
      const upstream = http.request({ method: req.method, path: req.url ?? '/', headers, createConnection: () => stream as never });
      // A Web UI app session is ended after 10 idle minutes without requests: its upgraded connections keep it on.
      const touch = appSession && options.audit ? () => options.audit?.touchHttp(`app:${appSession}`) : undefined;
      await switched(upstream, socket, head, asked, options, meter, touch);
      log.info({ user: identity.name, app: target.name, upgrade: asked.join(',') }, 'app connection upgraded');
    })().catch((err: unknown) => {
      const e = toGatewayError(err);
      log.info({ app: target.name, code: e.code, err: e.message }, 'app upgrade refused');
      refuseUpgrade(socket, e);
    });
    return true;
  };
}

/**
 * Waits for the app's answer to the upgrade request upstream (within headerMs) and settles the client's socket:
 * resolved once the connection is spliced, or once a refusal of the app's was relayed; rejected (nothing sent to
 * the client yet) for a missing or unasked 101.
 */
function switched(upstream: http.ClientRequest, socket: Duplex, head: Buffer, asked: string[], options: AppUpgradeOptions, meter?: AuditedSession, touch?: () => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      upstream.destroy();
      reject(new GatewayError('GW_ERR_APP_UPGRADE_TIMEOUT', `the app did not answer the upgrade to ${asked.join(', ')} within ${options.deadlines.headerMs} ms`));
    }, Math.max(1, options.deadlines.headerMs));
    const settle = () => clearTimeout(timer);
    // The client gone while the app thinks: the app's connection goes too.
    const gone = () => upstream.destroy();
    socket.once('close', gone);
    upstream.on('error', (err) => {
      settle();
      reject(new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `the app's answer to the upgrade failed: ${err.message}`));
    });
    upstream.on('response', (answer) => {
      settle();
      socket.off('close', gone);
      relayRefusal(answer, socket);
      idleLimit(socket, answer, options.deadlines.idleMs);
      resolve();
    });
    upstream.on('upgrade', (answer: http.IncomingMessage, appSocket: Duplex, appHead: Buffer) => {
      settle();
      socket.off('close', gone);
      const to = protocolsOf(answer.headers.upgrade);
      if (to.length !== 1 || !asked.includes(to[0]!)) {
        appSocket.destroy();
        return reject(new GatewayError('GW_ERR_APP_UPGRADE_UNASKED', `the app switched to ${JSON.stringify(answer.headers.upgrade ?? '')} where ${asked.join(', ')} was asked for`));
      }
      socket.write(headOf(answer));
      if (appHead.length > 0) socket.write(appHead);
      if (head.length > 0) appSocket.write(head);
      meter?.count(head.length, appHead.length);
      if (meter) {
        socket.on('data', (chunk: Buffer) => meter.count(chunk.length, 0));
        appSocket.on('data', (chunk: Buffer) => meter.count(0, chunk.length));
      }
      idleLimit(socket, appSocket, options.deadlines.idleMs, touch);
      splice(socket, appSocket);
      resolve();
    });
    upstream.end();
  });
}

/** The app's 101 head as the client gets it: its headers but the hop-by-hop ones (Upgrade and Connection kept). */
function headOf(answer: http.IncomingMessage): string {
  const lines = [`HTTP/1.1 101 ${answer.statusMessage || 'Switching Protocols'}`];
  const raw = answer.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    if (lower === 'connection' || lower === 'upgrade') continue;
    if (!relayed(lower)) continue;
    if (lower === 'set-cookie' && gatewayCookie(raw[i + 1]!.slice(0, Math.max(0, raw[i + 1]!.indexOf('='))).trim())) continue;
    lines.push(`${name}: ${raw[i + 1]!}`);
  }
  lines.push('Connection: Upgrade', `Upgrade: ${answer.headers.upgrade ?? ''}`);
  return `${lines.join('\r\n')}\r\n\r\n`;
}

/** The app refused the upgrade (any answer but 101): its answer as it is, then the close. */
function relayRefusal(answer: http.IncomingMessage, socket: Duplex): void {
  const lines = [`HTTP/1.1 ${answer.statusCode ?? 502} ${answer.statusMessage ?? ''}`];
  const raw = answer.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const lower = raw[i]!.toLowerCase();
    if (!relayed(lower) || lower === 'content-length') continue;
    if (lower === 'set-cookie' && gatewayCookie(raw[i + 1]!.slice(0, Math.max(0, raw[i + 1]!.indexOf('='))).trim())) continue;
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
 * app's (or the refusal's body is cut). Bytes moving touch the audited app session.
 */
function idleLimit(socket: Duplex, appSide: { on(event: 'data', listener: () => void): unknown }, idleMs: number, touch?: () => void): void {
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
  appSide.on('data', moved);
  socket.once('close', () => clearTimeout(timer));
}
