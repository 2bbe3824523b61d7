/**
 * The browser's credentials on a request to the Proxy's web routes (web.ts) and its terminal (terminal.ts): the
 * web session's cookie and the bearer of that same session, and the Origin check of a state-changing request (and
 * of every WebSocket), and what an app's launch token and session are bound to. Both route files import it (and
 * webapps.ts); neither imports the other for it.
 */
import type http from 'node:http';
import { cookieValue, originRefusal, sessionInvalid, sessionMissing, WEB_SESSION_COOKIE } from '../auth/websessions.js';

/** Refuses a request whose Origin is present and is not the page's own (GW_ERR_WEB_CSRF), as api.ts does. */
export function checkOrigin(req: http.IncomingMessage): void {
  const host = req.headers.host ?? req.headers[':authority'];
  const refusal = originRefusal(req.headers.origin, typeof host === 'string' && host.length > 0 && host.length <= 1024 ? host : undefined, req.method);
  if (refusal) throw refusal;
}

/** The session's credentials on a request: cookie id and bearer (header, or a WebSocket subprotocol). */
export interface WebCredentials {
  id: string;
  bearer: string;
}

export function credentialsOf(req: http.IncomingMessage, bearer: string | undefined): WebCredentials {
  const id = cookieValue(req.headers.cookie, WEB_SESSION_COOKIE);
  if (!id) throw sessionMissing();
  if (!bearer) throw sessionInvalid('the cookie came without the bearer token of its session (the page sends it with every request)');
  return { id, bearer };
}

/**
 * What launch tokens and app sessions are bound to: the app's name and its public address. The name alone would let
 * an agent that advertises an app of the same name under a host of its own (a rogue agent) receive a launch token
 * or an app cookie that opens the other agent's app as the user.
 */
export function appSessionKey(name: string, publicAddr: string): string {
  return `${name}@${publicAddr}`;
}
