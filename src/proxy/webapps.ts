/**
 * HTTP through the tunnel, for the two resources that speak it:
 *
 *  - HTTP apps on the web port, under their public address: a request whose Host is an app's public_addr is
 *    authenticated with the user's client certificate, checked against the app's labels, and forwarded to the
 *    app through its agent's tunnel.
 *  - Kubernetes, routed by SNI (kube-gateway-proxy-alpn.*): kubectl's server URL carries the cluster as a path
 *    prefix, https://kube-gateway-proxy-alpn.<proxy host>:443/k8s/<cluster>; the Proxy authenticates the user by
 *    certificate, checks kubernetes_labels, and forwards the request through the agent (which holds the TLS
 *    connection to the API server and its credential) with Impersonate-User / Impersonate-Group set to what the
 *    roles' kubernetes_users / kubernetes_groups allow (src/wire/kubeimpersonate.ts, which the agent applies too
 *    to an end-to-end kube stream: a client's own Impersonate-* headers, kubectl --as / --as-group, only pick
 *    among those); roles that allow none are refused before the agent is dialled (authorizeKube, which an
 *    end-to-end kube grant is decided by too). Impersonate-* headers are then removed and only the Proxy's are sent.
 *
 * Both are audited per session, not per request (sessionaudit.ts httpRequest): a connection with a client
 * certificate is one session per resource it reaches (app.session.* or kube.session.*, start at its first request,
 * end when it closes); a Web UI app session is one session (its start is the launch's app.session.start, its end
 * the Proxy's). The bytes are the requests' and the answers' bodies.
 *
 * Both check the user as it stands now (AuthService.resolveCaller: still exists, not locked, the roles it still
 * has) on every request, and track the request in auth.sessions while it runs, so that a lock or a deletion
 * closes a long one (a watch, a stream) at once.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { peerIdentityOf } from '../auth/peeridentity.js';
import { canAccess } from '../auth/rbac.js';
import { impersonate, KUBE_PATH_PREFIX, kubePathOf, requireKubeAccess, type KubeAccess } from '../wire/kubeimpersonate.js';
import type { Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { APP_LAUNCH_NONCE_COOKIE, APP_SESSION_COOKIE, appSessionRef, cookieValue, isLaunchNonce, launchUnbound, WEB_SESSION_COOKIE } from '../auth/websessions.js';
import { GatewayError, httpStatus, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { clientAddress } from '../stream/meta.js';
import { startHop, type TraceContext, traceContextOf, traceFields, withinHop } from '../trace.js';
import { resetStream } from '../stream/reset.js';
import type { ConnInfo } from '../mux/multiplexer.js';
import { escapeHtml, guardHttpServer, type HttpDeadlines } from '../net/http.js';
import { protocolsOf, relayed, relayUpgrade } from '../net/upgrade.js';
import type { AgentSource } from './router.js';
import { KUBE_SNI_PREFIX } from './protocols.js';
import { findTarget, findWebApp, type Target } from './resources.js';
import type { AuditedSession, Connection, SessionAudit } from './sessionaudit.js';
import { abortResponse, refuseUpgrade, sendKubeError, sendWebError } from './webanswer.js';
import { appSessionKey } from './webcredentials.js';


/**
 * Sends req (with path and extra headers) over an already-open stream to the resource, and relays the answer;
 * a Set-Cookie whose name dropCookie refuses is not relayed.
 */
function relay(req: http.IncomingMessage, res: http.ServerResponse, stream: Duplex, path: string, headers: http.OutgoingHttpHeaders, dropCookie?: (name: string) => boolean, meter?: AuditedSession): void {
  const forwarded: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(req.headers)) if (relayed(k) && v !== undefined) forwarded[k] = v;
  const upstream = http.request({ method: req.method, path, headers: { ...forwarded, ...headers, connection: 'close' }, createConnection: () => stream as never });
  upstream.on('response', (answer) => {
    const out: http.OutgoingHttpHeaders = {};
    for (const [k, v] of Object.entries(answer.headers)) if (relayed(k) && v !== undefined) out[k] = v;
    const cookies = answer.headers['set-cookie'];
    if (dropCookie && cookies) out['set-cookie'] = cookies.filter((c) => !dropCookie(c.slice(0, Math.max(0, c.indexOf('='))).trim()));
    res.writeHead(answer.statusCode ?? 502, out);
    if (meter) answer.on('data', (chunk: Buffer) => meter.count(0, chunk.length));
    answer.pipe(res);
    // An answer cut before its end (the agent, the tunnel or the app gone) cuts the client's response: no last
    // chunk, no missing content-length bytes made up, no clean end of an HTTP/2 stream.
    answer.once('close', () => {
      if (!answer.complete) abortResponse(res);
    });
  });
  // A 101 to a request that asked for no upgrade (this relay never does): the app's connection is not taken over.
  upstream.on('upgrade', (_answer, socket: Duplex) => {
    socket.destroy();
    sendWebError(res, new GatewayError('GW_ERR_APP_UPGRADE_UNASKED', 'the app switched protocols (101) on a request that asked for no upgrade'));
  });
  upstream.on('error', (err) => sendWebError(res, new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `the upstream answer failed: ${err.message}`)));
  if (meter) req.on('data', (chunk: Buffer) => meter.count(chunk.length, 0));
  // The client gone before the answer's end (or its upload cut): the app's stream is reset, not ended.
  res.once('close', () => {
    if (!res.writableFinished || !req.complete) resetStream(stream);
  });
  req.pipe(upstream);
}

/** The path on an app's host where an app launch starts (a nonce cookie) and ends (the token for the app's cookie). */
export const APP_AUTH_PATH = '/x-gateway-auth';
/** The Web UI's page that turns a launch nonce into a token (web/src/pages/launch.tsx). */
export const WEB_LAUNCH_PAGE = '/web/launch';
/** How long a launch nonce cookie lives: the Web UI's round trip, with a sign-in on the way. */
export const LAUNCH_NONCE_MAX_AGE_S = 300;

export interface WebAppOptions {
  /**
   * The Proxy's public web addresses (host:port), from configuration: where a launch sends the browser for its
   * token. Never an address from the request: the nonce travels there.
   */
  webAddrs: () => readonly string[];
  /** Where app sessions are recorded (the Proxy's one SessionAudit). */
  audit?: SessionAudit;
}

/**
 * Returns a web-port request handler for HTTP apps, or false from handle() when the Host is not an app's. The
 * caller is the user's client certificate, or else the app session of the Web UI (the cookie __Host-gw_app, bound
 * to this app and to the web session it was launched from: ProxyAuth.resolveAppSession), checked on every request.
 */
export function createWebAppHandler(auth: ProxyAuth, agents: AgentSource, options: WebAppOptions) {
  const log = logger('webapps');
  return (req: http.IncomingMessage, res: http.ServerResponse): boolean => {
    const host = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
    if (!host) return false;
    const target = findWebApp(agents.agents(), host);
    if (!target) return false;
    if (misdirected(req, host, res)) return true;
    // Launches and app sessions are bound to this app's name and host (web.ts appSessionKey).
    const key = appSessionKey(target.name, host);
    if ((req.url ?? '/').split('?')[0] === APP_AUTH_PATH) {
      appLaunch(auth, options, key, target.name, host, req, res).catch((err: unknown) => {
        const e = toGatewayError(err);
        log.info({ app: target.name, code: e.code, err: e.message }, 'app launch refused');
        sendLaunchError(res, e);
      });
      return true;
    }
    void (async () => {
      const { identity, appSession } = await appCaller(auth, target.name, key, req, (who, what) => trackRequest(auth, who, what, req, res), options.audit);
      const { stream, meter, client, trace } = await openApp(auth, agents, target, identity, req, appSession, options.audit);
      log.info({ user: identity.name, app: target.name, method: req.method, path: req.url }, 'app request');
      withoutGatewayCookies(req);
      // Nor does the app set them on its host: a nonce of the app's choosing would let its launch links bind.
      relay(req, res, stream, req.url ?? '/', { 'x-forwarded-for': client.address, 'x-forwarded-proto': 'https', 'x-forwarded-host': req.headers.host ?? host, 'x-gateway-user': identity.name, ...appTraceHeaders(req, trace) }, gatewayCookie, meter);
    })().catch((err: unknown) => sendWebError(res, err));
    return true;
  };
}

/**
 * An HTTP/2 request for an app on a connection that was opened for another name (a browser pools its HTTP/2
 * connections across names that share an address and a certificate, as the Proxy's and its apps' do): answered
 * 421 Misdirected Request (RFC 9110 15.5.20), so that the browser opens a connection of the app's own. Without it
 * the browser never made a TLS handshake with the app's name, never decided about a client certificate there, and
 * Chromium then cancels the app's WebSockets (on their own HTTP/1.1 connection, the Proxy asks for a client
 * certificate, and a WebSocket may not ask the user).
 */
function misdirected(req: http.IncomingMessage, host: string, res: http.ServerResponse): boolean {
  if (req.httpVersionMajor < 2) return false;
  const sni = (req.socket as TLSSocket).servername;
  if (typeof sni !== 'string' || sni.toLowerCase() === host) return false;
  req.resume();
  res.writeHead(421, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
  res.end(`this connection was opened for ${sni}: open one for ${host}\n`);
  return true;
}

/**
 * The checks of every app request once its caller is known (a user whose roles allow the app), then a stream to
 * the app through its agent, and the audited session the request counts in (the app session's, else the
 * connection's).
 */
export async function openApp(auth: ProxyAuth, agents: AgentSource, target: Target, identity: Identity, req: http.IncomingMessage, appSession?: string, audit?: SessionAudit): Promise<{ stream: Duplex; meter?: AuditedSession; client: { address: string; port: number }; trace?: TraceContext }> {
  if (identity.kind !== 'user' || !canAccess(await auth.rolesOf(identity.roles), target.access, target.labels)) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles do not allow app "${target.name}"`);
  }
  const client = clientAddress(req.socket);
  // This hop's span: the request's traceparent header gives the trace, not its sampled flag (src/trace.ts).
  const hop = startHop('proxy.app', {
    kind: 'server',
    parent: traceContextOf({ traceparent: req.headers.traceparent, tracestate: req.headers.tracestate }),
    attributes: { 'gateway.route': 'web', 'gateway.route.reason': 'HTTP request to an app\'s public address', 'gateway.service': target.service, 'gateway.resource': target.name, 'gateway.agent.host_id': target.agent.hostId },
  });
  const stream = await withinHop(hop, () =>
    agents.dial(target.agent.hostId, {
      service: target.service,
      resource: target.name,
      client_src: `${client.address}:${client.port}`,
      client_dst: `${req.socket.localAddress}:${req.socket.localPort}`,
      user: identity.name,
      ...traceFields(hop.context),
    }),
  );
  const fields = { user: identity.name, resource: target.name, node: target.agent.nodename, client: `${client.address}:${client.port}`, ...(appSession ? { app_session: appSession } : {}) };
  const meter = appSession ? audit?.httpRequest('app', `app:${appSession}`, fields, { startRecorded: true }) : audit?.httpRequest('app', `app:${target.name}`, fields, { connection: connectionOf(req) });
  return { stream, client, ...(meter ? { meter } : {}), ...(hop.context ? { trace: hop.context } : {}) };
}

/**
 * The trace headers the app gets: the Proxy's span's context (the app's own span is then its child), or, tracing
 * off, the client's valid one passed on; a malformed or oversized one the client sent is replaced or removed.
 */
function appTraceHeaders(req: http.IncomingMessage, trace: TraceContext | undefined): http.OutgoingHttpHeaders {
  if (!trace && req.headers.traceparent === undefined && req.headers.tracestate === undefined) return {};
  delete req.headers.traceparent;
  delete req.headers.tracestate;
  return traceFields(trace);
}

/**
 * The caller of an app request, as it stands now and tracked (track) while the request runs: certificate, else app
 * cookie (then appSession: the app session's reference in the audit log). An app session refused ends its audited
 * session. appupgrade.ts asks the same for an upgrade request, tracking the upgraded connection instead.
 */
export async function appCaller(auth: ProxyAuth, app: string, key: string, req: http.IncomingMessage, track: (identity: Identity, what: string) => void, audit?: SessionAudit): Promise<{ identity: Identity; appSession?: string }> {
  let certified: Identity | undefined;
  try {
    certified = peerIdentityOf(auth, req.socket as TLSSocket);
  } catch {
    certified = undefined;
  }
  if (certified) {
    track(certified, `app ${app}`);
    return { identity: await auth.resolveCaller(certified) };
  }
  const sessionId = cookieValue(req.headers.cookie, APP_SESSION_COOKIE);
  if (!sessionId) {
    throw new GatewayError('GW_ERR_AUTH_UNAUTHENTICATED', `app "${app}" needs your gateway certificate or a session of the Web UI`, {
      hint: `Open the app from the Web UI's resources page, or sign in with 'gwsh login' and use 'gwsh proxy app ${app}'.`,
    });
  }
  const appSession = appSessionRef(sessionId);
  const view = await auth.resolveAppSession(sessionId, key).catch((err: unknown) => {
    // Ended for good (expired, signed out, locked, removed); an Auth Service that does not answer ends nothing.
    const code = toGatewayError(err).code;
    if (code.startsWith('GW_ERR_WEB_SESSION') || code === 'GW_ERR_ACCESS_LOCKED' || code === 'GW_ERR_AUTH_IDENTITY_REVOKED') audit?.endHttp(`app:${appSession}`, { error: code });
    throw err;
  });
  track(view.identity, `app ${app} (web)`);
  return { identity: view.identity, appSession };
}

/** Whether a cookie name is one of the gateway's own (the app session, the web session, a launch nonce). */
export function gatewayCookie(name: string): boolean {
  return name === APP_SESSION_COOKIE || name === WEB_SESSION_COOKIE || name.startsWith(APP_LAUNCH_NONCE_COOKIE);
}

/** The gateway's own cookies never reach the app (the app session would let the app act as the user here). */
export function withoutGatewayCookies(req: http.IncomingMessage): void {
  const cookie = req.headers.cookie;
  if (!cookie) return;
  const kept = cookie.split(';').filter((c) => !gatewayCookie(c.slice(0, Math.max(0, c.indexOf('='))).trim()));
  if (kept.length === 0) delete req.headers.cookie;
  else req.headers.cookie = kept.join(';').trim();
}

/** Headers of every answer of the launch path: never cached, framed, sniffed, nor followed by a Referer. */
const LAUNCH_HEADERS = {
  'cache-control': 'no-store',
  'referrer-policy': 'no-referrer',
  'content-security-policy': "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
  'x-frame-options': 'DENY',
  'x-content-type-options': 'nosniff',
};

/**
 * The nonce cookie's name on the host of key (the app's name and host): one per app host, so that a nonce set on
 * another app's host never counts here even if it were sent here.
 */
export function nonceCookieName(key: string): string {
  return `${APP_LAUNCH_NONCE_COOKIE}_${createHash('sha256').update(key).digest('hex').slice(0, 16)}`;
}

const nonceCookie = (key: string, value: string, maxAgeS: number) => `${nonceCookieName(key)}=${value}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=${maxAgeS}`;

/**
 * GET /x-gateway-auth on the app's host. Without a token it starts a launch: a new nonce in a cookie of this host
 * and a redirect to the Web UI's launch page, which asks for a token bound to the nonce with the user's own web
 * session. With ?token=&state= it ends one: the token is redeemed only when state is this browser's nonce cookie
 * and the token was bound to it; the nonce is cleared and the app session's cookie set.
 */
async function appLaunch(auth: ProxyAuth, options: WebAppOptions, key: string, app: string, host: string, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  req.resume();
  if (req.method !== 'GET') throw new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method} is not allowed on ${APP_AUTH_PATH}`, { hint: "Open the app from the Web UI's resources page." });
  const query = new URLSearchParams((req.url ?? '').split('?')[1] ?? '');
  const token = query.get('token');
  if (token === null) return startLaunch(options, key, app, host, req, query, res);
  if (!/^[A-Za-z0-9_-]{1,256}$/.test(token)) throw new GatewayError('GW_ERR_API_BAD_REQUEST', 'the launch URL carries no valid token', { hint: "Open the app again from the Web UI's resources page." });
  const state = query.get('state');
  if (!isLaunchNonce(state)) throw launchUnbound('the launch URL carries no state (the nonce of this browser)');
  if (!sameNonce(cookieValue(req.headers.cookie, nonceCookieName(key)), state)) throw launchUnbound("the URL's state is not the launch nonce this browser holds for this host (none, or another)");
  const { sessionId, expiresAt } = await auth.redeemAppLaunch(token, key, state);
  const ends = typeof expiresAt === 'number' ? expiresAt : Date.parse(expiresAt);
  const maxAge = Math.max(0, Math.floor((ends - Date.now()) / 1000));
  // A same-site navigation to the app's root, so that the Strict cookie is sent.
  const body = `<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=/"><title>Opening ${escapeHtml(app)}</title></head><body></body></html>\n`;
  res.writeHead(200, {
    ...LAUNCH_HEADERS,
    'content-type': 'text/html; charset=utf-8',
    'set-cookie': [nonceCookie(key, '', 0), `${APP_SESSION_COOKIE}=${sessionId}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=${maxAge}`],
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** The start of a launch: a nonce cookie on this host, and the Web UI's launch page on a configured address. */
function startLaunch(options: WebAppOptions, key: string, app: string, host: string, req: http.IncomingMessage, query: URLSearchParams, res: http.ServerResponse): void {
  const web = launchPageAddr(options.webAddrs(), query.get('web'));
  const nonce = randomBytes(32).toString('base64url');
  // The app's host as the browser reached it (its port: the web port's, as the Open button built it).
  const port = /:(\d+)$/.exec(String(req.headers.host ?? ''))?.[1];
  const next = new URLSearchParams({ app, addr: port && port !== '443' ? `${host}:${port}` : host, state: nonce });
  res.writeHead(302, {
    ...LAUNCH_HEADERS,
    location: `https://${web}${WEB_LAUNCH_PAGE}?${next.toString()}`,
    'set-cookie': nonceCookie(key, nonce, LAUNCH_NONCE_MAX_AGE_S),
    'content-length': 0,
  });
  res.end();
}

/**
 * Which configured web address the launch page is on: the one the Open button named when it is configured (the
 * page's own origin, where its session is), else the first. An address the configuration does not list never is.
 */
export function launchPageAddr(configured: readonly string[], asked: string | null): string {
  const first = configured[0];
  if (first === undefined) throw new GatewayError('GW_ERR_INTERNAL', 'the Proxy has no public web address to send an app launch to', { hint: 'Set proxy_service.public_addr.' });
  const norm = (a: string) => a.toLowerCase().replace(/:443$/, '');
  const wanted = asked === null ? undefined : configured.find((c) => norm(c) === norm(asked));
  return norm(wanted ?? first);
}

/** Whether the cookie's nonce is state, in constant time. */
function sameNonce(cookie: string | undefined, state: string): boolean {
  if (cookie === undefined) return false;
  const a = Buffer.from(cookie);
  const b = Buffer.from(state);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** A refused launch: a plain page (the browser navigated here) naming the code and what to do. */
function sendLaunchError(res: http.ServerResponse, e: GatewayError): void {
  if (res.headersSent) return abortResponse(res);
  const hint = e.hint ? `<p>${escapeHtml(e.hint)}</p>` : '';
  const body = `<!doctype html><html><head><meta charset="utf-8"><title>App launch refused</title></head><body><h1>App launch refused</h1><p><code data-code="${escapeHtml(e.code)}">${escapeHtml(e.code)}</code>: ${escapeHtml(e.message)}</p>${hint}</body></html>\n`;
  res.writeHead(httpStatus(e.code), { ...LAUNCH_HEADERS, 'content-type': 'text/html; charset=utf-8', 'x-gateway-error': e.code, 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

/** The connection a request came on, for its audited session: the socket, or over HTTP/2 the session of its stream. */
export function connectionOf(req: http.IncomingMessage): Connection {
  const session = (req as unknown as { stream?: { session?: Connection } }).stream?.session;
  return session ?? req.socket;
}

/** Tracks a request in auth.sessions until its answer is done; a revocation drops the client's connection. */
function trackRequest(auth: ProxyAuth, identity: Identity, what: string, req: http.IncomingMessage, res: http.ServerResponse): void {
  const untrack = auth.sessions.track(identity, what, () => req.socket.destroy());
  res.once('close', untrack);
  if (res.writableFinished || req.socket.destroyed) untrack();
}

export { KUBE_PATH_PREFIX } from '../wire/kubeimpersonate.js';
/** The protocol table's row for Kubernetes: which clusters its requests may reach. */
const KUBE_ROUTE = 'kube';

/** What a Kubernetes request reaches once checked: the agent's stream, the path on the API server, who it acts as. */
interface KubeOpened {
  stream: Duplex;
  path: string;
  headers: http.OutgoingHttpHeaders;
  user: string;
  cluster: string;
  meter?: AuditedSession;
}

/**
 * Whether a user may reach a Kubernetes cluster at all, and as whom: the agent that serves it, the roles'
 * kubernetes_labels, and the Kubernetes users and groups the roles allow (none: refused). The one decision of the
 * kube route, for each of its requests (openKube) and for an end-to-end kube stream's grant (e2egrants.ts).
 */
export async function authorizeKube(auth: ProxyAuth, agents: AgentSource, identity: Identity, cluster: string): Promise<{ target: Target; access: KubeAccess }> {
  const target = findTarget(agents.agents(), KUBE_ROUTE, { resource: cluster });
  if (!target) throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no connected agent serves the Kubernetes cluster "${cluster}"`);
  if (!canAccess(await auth.rolesOf(identity.roles), target.access, target.labels)) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles do not allow the Kubernetes cluster "${cluster}"`);
  }
  return { target, access: requireKubeAccess(identity.kube, identity.name) };
}

/**
 * The checks of every Kubernetes request, a plain one or an upgrade (kubectl exec, attach, port-forward): one path
 * for both. track: how the caller is tracked in auth.sessions (until the answer is done, or for as long as the
 * upgraded connection is open). The client's Impersonate-* headers are removed from req; headers are the Proxy's.
 */
async function openKube(auth: ProxyAuth, agents: AgentSource, req: http.IncomingMessage, track: (identity: Identity) => void, audit?: SessionAudit): Promise<KubeOpened> {
  const certified = peerIdentityOf(auth, req.socket as TLSSocket);
  if (certified.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'only user certificates may reach Kubernetes clusters');
  track(certified);
  const identity = await auth.resolveCaller(certified);
  const parsed = kubePathOf(req.url ?? '/');
  if (!parsed) {
    throw new GatewayError('GW_ERR_API_NOT_FOUND', `Kubernetes requests go to ${KUBE_PATH_PREFIX}<cluster>/...`, {
      hint: `Set the kubeconfig server to https://${KUBE_SNI_PREFIX}<proxy host>:<port>${KUBE_PATH_PREFIX}<cluster> ('gwsh kube login <cluster>' writes it).`,
    });
  }
  const { cluster, path } = parsed;
  const { target: kube, access } = await authorizeKube(auth, agents, identity, cluster);
  // Who the API server acts as: from the roles, refused before anything is dialled (kubectl --as asks); the
  // client's Impersonate-* headers are removed from req (src/wire/kubeimpersonate.ts, the agent's rule too).
  const as = impersonate(req, access, identity.name);
  const client = clientAddress(req.socket);
  // This hop's span, as an app request's (openApp): a traceparent header gives the trace, not its sampled flag.
  const hop = startHop('proxy.kube', {
    kind: 'server',
    parent: traceContextOf({ traceparent: req.headers.traceparent, tracestate: req.headers.tracestate }),
    attributes: { 'gateway.route': 'kube', 'gateway.route.reason': `TLS SNI ${KUBE_SNI_PREFIX}*, path ${KUBE_PATH_PREFIX}${cluster.slice(0, 256)}`, 'gateway.service': kube.service, 'gateway.resource': cluster.slice(0, 256), 'gateway.agent.host_id': kube.agent.hostId },
  });
  const stream = await withinHop(hop, () =>
    agents.dial(kube.agent.hostId, {
      service: kube.service,
      resource: cluster,
      client_src: `${client.address}:${client.port}`,
      client_dst: `${req.socket.localAddress}:${req.socket.localPort}`,
      user: identity.name,
      ...traceFields(hop.context),
    }),
  );
  const fields = { user: identity.name, resource: cluster, node: kube.agent.nodename, client: `${client.address}:${client.port}` };
  const meter = audit?.httpRequest('kube', `kube:${cluster}`, fields, { connection: connectionOf(req) });
  // The API server's request carries this span as its parent (or, tracing off, the client's valid context).
  const headers = { ...as.headers, ...appTraceHeaders(req, hop.context) };
  return { stream, path, headers, user: identity.name, cluster, ...(meter ? { meter } : {}) };
}

/**
 * The kube route's service: an HTTP server over the user's TLS stream, with the HTTP deadlines of gateway.limits.
 * An upgrade (kubectl exec, attach, port-forward: WebSocket or SPDY/3.1) gets the checks of a plain request
 * (openKube), then src/net/upgrade.ts relays it: the API server's 101 to the client and both ways spliced, with
 * the idle deadline (a plain request has none: a watch may be silent for minutes); the upgraded connection is
 * tracked (a lock or an expiry closes it) and is the connection's audited kube session, ended when it closes.
 */
export function createKubeHandler(auth: ProxyAuth, agents: AgentSource, deadlines: HttpDeadlines, audit?: SessionAudit): (stream: Duplex, info: ConnInfo) => void {
  const log = logger('kube');
  const server = http.createServer((req, res) => {
    void (async () => {
      const k = await openKube(auth, agents, req, (who) => trackRequest(auth, who, 'kube', req, res), audit);
      log.info({ user: k.user, cluster: k.cluster, method: req.method, path: k.path }, 'kubernetes request');
      relay(req, res, k.stream, k.path, k.headers, undefined, k.meter);
    })().catch((err: unknown) => sendKubeError(res, err));
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => kubeUpgrade(auth, agents, deadlines, req, socket, head, audit));
  // No idle deadline here: a watch (kubectl get -w) may stay silent for many minutes. Only authenticated users
  // get answers long enough to back up; TCP keep-alive finds peers that vanished. Upgraded connections have one.
  const accept = guardHttpServer(server, { ...deadlines, idleMs: 0 }, { upgrades: true });
  return (stream) => accept(stream);
}

/** One upgrade request on the kube route: checked as a plain request, then relayed (src/net/upgrade.ts). */
function kubeUpgrade(auth: ProxyAuth, agents: AgentSource, deadlines: HttpDeadlines, req: http.IncomingMessage, socket: Duplex, head: Buffer, audit?: SessionAudit): void {
  const log = logger('kube');
  socket.on('error', () => socket.destroy());
  const asked = protocolsOf(req.headers.upgrade);
  void (async () => {
    const track = (who: Identity) => {
      const untrack = auth.sessions.track(who, 'kube (upgraded)', () => socket.destroy());
      socket.once('close', untrack);
      if (socket.destroyed) untrack();
    };
    const k = await openKube(auth, agents, req, track, audit);
    if (socket.destroyed) return void k.stream.destroy();
    log.info({ user: k.user, cluster: k.cluster, method: req.method, path: k.path.split('?')[0], upgrade: asked.join(',') }, 'kubernetes upgrade request');
    // What the session was for (the path only: a query may carry a command's arguments).
    k.meter?.learn({ upgrade: asked.join(','), upgrade_path: k.path.split('?')[0]! });
    const headers: http.OutgoingHttpHeaders = {};
    for (const [name, v] of Object.entries(req.headers)) if (relayed(name) && v !== undefined) headers[name] = v;
    Object.assign(headers, k.headers, { connection: 'Upgrade', upgrade: req.headers.upgrade });
    const upstream = http.request({ method: req.method, path: k.path, headers, createConnection: () => k.stream as never });
    await relayUpgrade(upstream, socket, head, asked, {
      headerMs: deadlines.headerMs,
      idleMs: deadlines.idleMs,
      peer: 'the API server',
      codes: { timeout: 'GW_ERR_KUBE_UPGRADE_TIMEOUT', unasked: 'GW_ERR_KUBE_UPGRADE_UNASKED' },
      ...(k.meter ? { meter: k.meter } : {}),
    });
    log.info({ user: k.user, cluster: k.cluster, upgrade: asked.join(',') }, 'kubernetes connection upgraded');
  })().catch((err: unknown) => {
    const e = toGatewayError(err);
    log.info({ code: e.code, err: e.message, upgrade: asked.join(',') }, 'kubernetes upgrade refused');
    refuseUpgrade(socket, e, true);
  });
}
