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
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { clientAddress } from '../stream/meta.js';
import type { ConnInfo } from '../mux/multiplexer.js';
import { guardHttpServer, type HttpDeadlines } from '../net/http.js';
import type { AgentSource } from './router.js';
import { statusFor } from '../auth/api.js';
import { KUBE_SNI_PREFIX } from './protocols.js';
import { findTarget, findWebApp } from './resources.js';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'http2-settings']);

/** Whether a header is relayed: not hop-by-hop, and not an HTTP/2 pseudo-header (:method, :path, ...). */
const relayed = (name: string): boolean => !HOP_BY_HOP.has(name) && !name.startsWith(':');

function sendError(res: http.ServerResponse, err: unknown): void {
  const e = toGatewayError(err);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = JSON.stringify({ error: e.toJSON() });
  res.writeHead(e.code === 'GW_ERR_TUNNEL_DIAL_FAILED' || e.code === 'GW_ERR_TUNNEL_DOWN' ? 502 : statusFor(e.code), {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

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
  upstream.on('error', (err) => sendError(res, new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `the upstream answer failed: ${err.message}`)));
  req.pipe(upstream);
}

/** Returns a web-port request handler for HTTP apps, or false from handle() when the Host is not an app's. */
export function createWebAppHandler(auth: ProxyAuth, agents: AgentSource) {
  const log = logger('webapps');
  return (req: http.IncomingMessage, res: http.ServerResponse): boolean => {
    const host = (req.headers.host ?? '').toLowerCase().replace(/:\d+$/, '');
    if (!host) return false;
    const target = findWebApp(agents.agents(), host);
    if (!target) return false;
    void (async () => {
      let certified: Identity;
      try {
        certified = peerIdentityOf(auth, req.socket as TLSSocket);
      } catch {
        throw new GatewayError('GW_ERR_AUTH_UNAUTHENTICATED', `app "${target.name}" needs your gateway certificate`, {
          hint: `Sign in with 'gwsh login', then present ~/.gwsh/cert.pem and key.pem, or use 'gwsh proxy app ${target.name}'.`,
        });
      }
      trackRequest(auth, certified, `app ${target.name}`, req, res);
      const identity = await auth.resolveCaller(certified);
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
      relay(req, res, stream, req.url ?? '/', { 'x-forwarded-for': client.address, 'x-forwarded-proto': 'https', 'x-forwarded-host': req.headers.host ?? host, 'x-gateway-user': identity.name });
    })().catch((err: unknown) => sendError(res, err));
    return true;
  };
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
    })().catch((err: unknown) => sendError(res, err));
  });
  // No idle deadline here: a watch (kubectl get -w) may stay silent for many minutes. Only authenticated users
  // get answers long enough to back up; TCP keep-alive finds peers that vanished.
  const accept = guardHttpServer(server, { ...deadlines, idleMs: 0 });
  return (stream) => accept(stream);
}
