/**
 * HTTP through the tunnel, for the two resources that speak it:
 *
 *  - HTTP apps on the web port, under their public address: a request whose Host is an app's public_addr is
 *    authenticated with the user's client certificate, checked against the app's labels, and forwarded to the
 *    app through its agent's tunnel.
 *  - Kubernetes, routed by SNI (kube-gateway-proxy-alpn.*): kubectl's server URL carries the cluster as a path
 *    prefix, https://kube-gateway-proxy-alpn.<proxy host>:443/k8s/<cluster>; the Proxy authenticates the user by
 *    certificate, checks kubernetes_labels, and forwards the request through the agent (which holds the TLS
 *    connection to the API server) with Impersonate-User / Impersonate-Group set to the user and roles. Headers
 *    a client sends to impersonate someone itself are removed first.
 *
 * Both check the user as it stands now (AuthService.resolveCaller: still exists, not locked, the roles it still
 * has) on every request, and track the request in auth.sessions while it runs, so that a lock or a deletion
 * closes a long one (a watch, a stream) at once.
 */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { peerIdentityOf } from '../auth/api.js';
import { canAccess } from '../auth/rbac.js';
import type { Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';
import { clientAddress } from '../stream/meta.js';
import type { ConnInfo } from '../mux/multiplexer.js';
import { escapeHtml, guardHttpServer, type HttpDeadlines } from '../net/http.js';
import type { AgentSource } from './router.js';
import { KUBE_SNI_PREFIX } from './protocols.js';
import { findTarget, findWebApp } from './resources.js';
import { APP_COOKIE, appSessionKey, cookieValue, SESSION_COOKIE, sendWebError } from './web.js';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'http2-settings']);

/** Whether a header is relayed: not hop-by-hop, and not an HTTP/2 pseudo-header (:method, :path, ...). */
const relayed = (name: string): boolean => !HOP_BY_HOP.has(name) && !name.startsWith(':');

/** Sends req (with path and extra headers) over an already-open stream to the resource, and relays the answer. */
function relay(req: http.IncomingMessage, res: http.ServerResponse, stream: Duplex, path: string, headers: http.OutgoingHttpHeaders): void {
  const forwarded: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(req.headers)) if (relayed(k) && v !== undefined) forwarded[k] = v;
  const upstream = http.request({ method: req.method, path, headers: { ...forwarded, ...headers, connection: 'close' }, createConnection: () => stream as never });
  upstream.on('response', (answer) => {
    const out: http.OutgoingHttpHeaders = {};
    for (const [k, v] of Object.entries(answer.headers)) if (relayed(k) && v !== undefined) out[k] = v;
    res.writeHead(answer.statusCode ?? 502, out);
    answer.pipe(res);
  });
  upstream.on('error', (err) => sendWebError(res, new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `the upstream answer failed: ${err.message}`)));
  req.pipe(upstream);
}

/** The path on an app's host where a launch token from the Web UI is redeemed for the app's cookie. */
export const APP_AUTH_PATH = '/x-gateway-auth';

/**
 * Returns a web-port request handler for HTTP apps, or false from handle() when the Host is not an app's. The
 * caller is the user's client certificate, or else the app session of the Web UI (the cookie __Host-gw_app, bound
 * to this app and to the web session it was launched from: ProxyAuth.resolveAppSession), checked on every request.
 */
export function createWebAppHandler(auth: ProxyAuth, agents: AgentSource) {
  const log = logger('webapps');
  return (req: http.IncomingMessage, res: http.ServerResponse): boolean => {
    const host = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
    if (!host) return false;
    const target = findWebApp(agents.agents(), host);
    if (!target) return false;
    // Launches and app sessions are bound to this app's name and host (web.ts appSessionKey).
    const key = appSessionKey(target.name, host);
    if ((req.url ?? '/').split('?')[0] === APP_AUTH_PATH) {
      redeemLaunch(auth, key, target.name, req, res).catch((err: unknown) => sendWebError(res, err));
      return true;
    }
    void (async () => {
      const identity = await appCaller(auth, target.name, key, req, res);
      if (identity.kind !== 'user' || !canAccess(await auth.rolesOf(identity.roles), target.access, target.labels)) {
        throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles do not allow app "${target.name}"`);
      }
      const client = clientAddress(req.socket);
      const stream = await agents.dial(target.agent.hostId, {
        service: target.service,
        resource: target.name,
        client_src: `${client.address}:${client.port}`,
        client_dst: `${req.socket.localAddress}:${req.socket.localPort}`,
        user: identity.name,
      });
      log.info({ user: identity.name, app: target.name, method: req.method, path: req.url }, 'app request');
      withoutGatewayCookies(req);
      relay(req, res, stream, req.url ?? '/', { 'x-forwarded-for': client.address, 'x-forwarded-proto': 'https', 'x-forwarded-host': req.headers.host ?? host, 'x-gateway-user': identity.name });
    })().catch((err: unknown) => sendWebError(res, err));
    return true;
  };
}

/** The caller of an app request, as it stands now and tracked while the request runs: certificate, else app cookie. */
async function appCaller(auth: ProxyAuth, app: string, key: string, req: http.IncomingMessage, res: http.ServerResponse): Promise<Identity> {
  let certified: Identity | undefined;
  try {
    certified = peerIdentityOf(auth, req.socket as TLSSocket);
  } catch {
    certified = undefined;
  }
  if (certified) {
    trackRequest(auth, certified, `app ${app}`, req, res);
    return auth.resolveCaller(certified);
  }
  const sessionId = cookieValue(req.headers.cookie, APP_COOKIE);
  if (!sessionId) {
    throw new GatewayError('GW_ERR_AUTH_UNAUTHENTICATED', `app "${app}" needs your gateway certificate or a session of the Web UI`, {
      hint: `Open the app from the Web UI's resources page, or sign in with 'gwsh login' and use 'gwsh proxy app ${app}'.`,
    });
  }
  const view = await auth.resolveAppSession(sessionId, key);
  trackRequest(auth, view.identity, `app ${app} (web)`, req, res);
  return view.identity;
}

/** The gateway's own cookies never reach the app (the app session would let the app act as the user here). */
function withoutGatewayCookies(req: http.IncomingMessage): void {
  const cookie = req.headers.cookie;
  if (!cookie) return;
  const kept = cookie.split(';').filter((c) => {
    const name = c.slice(0, Math.max(0, c.indexOf('='))).trim();
    return name !== APP_COOKIE && name !== SESSION_COOKIE;
  });
  if (kept.length === 0) delete req.headers.cookie;
  else req.headers.cookie = kept.join(';').trim();
}

/** A same-site path to go to after the launch: "/..." but never "//host" or a backslash trick; "/" otherwise. */
export function launchPath(raw: string | null): string {
  if (!raw || raw.length > 2048 || !raw.startsWith('/') || raw.startsWith('//') || /[\\\x00-\x1f\x7f]/.test(raw)) return '/';
  return raw;
}

/**
 * GET /x-gateway-auth?token=&path= on the app's host: the one-use launch token (bound to this app) becomes the app
 * session's cookie, and a tiny page moves on to the path with a same-site navigation (so the Strict cookie is sent).
 */
async function redeemLaunch(auth: ProxyAuth, key: string, app: string, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  req.resume();
  if (req.method !== 'GET') throw new GatewayError('GW_ERR_API_BAD_REQUEST', `${req.method} is not allowed on ${APP_AUTH_PATH}`, { hint: 'Open the launch URL the Web UI gives.' });
  const query = new URLSearchParams((req.url ?? '').split('?')[1] ?? '');
  const token = query.get('token') ?? '';
  if (!/^[A-Za-z0-9_-]{1,256}$/.test(token)) throw new GatewayError('GW_ERR_API_BAD_REQUEST', 'the launch URL carries no valid token', { hint: "Open the app again from the Web UI's resources page." });
  const { sessionId, expiresAt } = await auth.redeemAppLaunch(token, key);
  const ends = typeof expiresAt === 'number' ? expiresAt : Date.parse(expiresAt);
  const maxAge = Math.max(0, Math.floor((ends - Date.now()) / 1000));
  const path = escapeHtml(launchPath(query.get('path')));
  const body = `<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=${path}"><title>Opening ${escapeHtml(app)}</title></head><body></body></html>\n`;
  res.writeHead(200, {
    'content-type': 'text/html; charset=utf-8',
    'cache-control': 'no-store',
    'referrer-policy': 'no-referrer',
    'content-security-policy': "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    'x-frame-options': 'DENY',
    'x-content-type-options': 'nosniff',
    'set-cookie': `${APP_COOKIE}=${sessionId}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=${maxAge}`,
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** Tracks a request in auth.sessions until its answer is done; a revocation drops the client's connection. */
function trackRequest(auth: ProxyAuth, identity: Identity, what: string, req: http.IncomingMessage, res: http.ServerResponse): void {
  const untrack = auth.sessions.track(identity, what, () => req.socket.destroy());
  res.once('close', untrack);
  if (res.writableFinished || req.socket.destroyed) untrack();
}

export const KUBE_PATH_PREFIX = '/k8s/';
/** The protocol table's row for Kubernetes: which clusters its requests may reach. */
const KUBE_ROUTE = 'kube';

/** The kube route's service: an HTTP server over the user's TLS stream, with the HTTP deadlines of gateway.limits. */
export function createKubeHandler(auth: ProxyAuth, agents: AgentSource, deadlines: HttpDeadlines): (stream: Duplex, info: ConnInfo) => void {
  const log = logger('kube');
  const server = http.createServer((req, res) => {
    void (async () => {
      const certified = peerIdentityOf(auth, req.socket as TLSSocket);
      if (certified.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'only user certificates may reach Kubernetes clusters');
      trackRequest(auth, certified, 'kube', req, res);
      const identity = await auth.resolveCaller(certified);
      const url = req.url ?? '/';
      if (!url.startsWith(KUBE_PATH_PREFIX)) {
        throw new GatewayError('GW_ERR_API_NOT_FOUND', `Kubernetes requests go to ${KUBE_PATH_PREFIX}<cluster>/...`, {
          hint: `Set the kubeconfig server to https://${KUBE_SNI_PREFIX}<proxy host>:<port>${KUBE_PATH_PREFIX}<cluster>.`,
        });
      }
      const rest = url.slice(KUBE_PATH_PREFIX.length);
      const slash = rest.indexOf('/');
      const cluster = decodeURIComponent(slash < 0 ? rest : rest.slice(0, slash));
      const path = slash < 0 ? '/' : rest.slice(slash);
      const kube = findTarget(agents.agents(), KUBE_ROUTE, { resource: cluster });
      if (!kube) throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no connected agent serves the Kubernetes cluster "${cluster}"`);
      if (!canAccess(await auth.rolesOf(identity.roles), kube.access, kube.labels)) {
        throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles do not allow the Kubernetes cluster "${cluster}"`);
      }
      for (const h of Object.keys(req.headers)) if (h.startsWith('impersonate-')) delete req.headers[h];
      const client = clientAddress(req.socket);
      const stream = await agents.dial(kube.agent.hostId, {
        service: kube.service,
        resource: cluster,
        client_src: `${client.address}:${client.port}`,
        client_dst: `${req.socket.localAddress}:${req.socket.localPort}`,
        user: identity.name,
      });
      log.info({ user: identity.name, cluster, method: req.method, path }, 'kubernetes request');
      relay(req, res, stream, path, { 'impersonate-user': identity.name, 'impersonate-group': identity.roles });
    })().catch((err: unknown) => sendWebError(res, err));
  });
  // No idle deadline here: a watch (kubectl get -w) may stay silent for many minutes. Only authenticated users
  // get answers long enough to back up; TCP keep-alive finds peers that vanished.
  const accept = guardHttpServer(server, { ...deadlines, idleMs: 0 });
  return (stream) => accept(stream);
}
