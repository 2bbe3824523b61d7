/**
 * Grant sessions for end-to-end streams, at the Proxy (the contract: src/tunnel/e2e.ts; the prose: docs/tunnels.md,
 * "End-to-end streams: the Proxy"). The route gateway-grant arrives from the front door with TLS terminated and the
 * user's client certificate checked, as the resource routes do (access.ts). Then:
 *
 *   1. the certificate must be a user's of this cluster (peerIdentityOf); the session is tracked in auth.sessions
 *      from here on, so a lock or a deletion closes it;
 *   2. GrantRequest lines, read incrementally (LineSplitter: at most GRANT_LINE_MAX_BYTES each; a longer line ends
 *      the session), at most GRANT_SESSION_INFLIGHT_MAX in flight (the socket is paused beyond), the session closed
 *      after GRANT_SESSION_IDLE_MS without a request;
 *   3. each request is authorized exactly as the classic route would authorize it (access.ts authorizeRoute; for
 *      the kube route webapps.ts authorizeKube, whose Kubernetes users and groups the grant carries as kube_access
 *      for the agent to impersonate from), with the identity resolved again for each (a role taken away since
 *      the last request counts), and refused with the same code;
 *   4. an allowed request gets a grant only when the agent's tunnel is on this Proxy, is v2 and offered the e2e
 *      capability (its data connections are registered: e2edata.ts), or, with no tunnel here, when a live peer
 *      holds one whose presence offers the capability (router.ts e2ePeers: the stream is relayed to that peer raw
 *      over its peering listener, e2erelay.ts); otherwise the answer is `classic` with the reason (an agent or a
 *      Proxy of an earlier version, a v1 tunnel, peering off, an agent that joined directly);
 *   5. the grant is signed with this Proxy's own TLS key (the key of the certificate its tunnels see, so that the
 *      agent checks it with the tunnel's peer certificate), bound to the user's certificate key (spkiHash), the
 *      roles that authorized, the resource and the agent, good for GRANT_TTL_MS, and carries this Proxy's
 *      certificate (x5c) and the request's span. Nothing of it is kept here: the stream may land on any Proxy of
 *      the cluster (behind a load balancer), which checks the grant by itself (e2eissuer.ts) and takes it once
 *      (e2erelay.ts); the agent takes it once across all Proxies.
 */
import { randomBytes, type KeyObject } from 'node:crypto';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { peerIdentityOf } from '../auth/peeridentity.js';
import type { Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { peerX509 } from '../net/tls.js';
import { recordGrant } from '../metrics/e2e.js';
import { clientOf, type ConnInfo } from '../mux/multiplexer.js';
import { writeJsonLine } from '../stream/lines.js';
import { LineSplitter } from '../stream/splitter.js';
import { startHop, traceContextOf, traceFields, type HopSpan } from '../trace.js';
import {
  e2eServerName,
  GRANT_LINE_MAX_BYTES,
  GRANT_SESSION_IDLE_MS,
  GRANT_SESSION_INFLIGHT_MAX,
  GRANT_TTL_MS,
  signGrant,
  spkiHash,
  type E2EGrant,
  type GrantAnswer,
  type GrantRequest,
} from '../tunnel/e2e.js';
import { authorizeRoute, dbAccessOf } from './access.js';
import { protocolNamed } from './protocols.js';
import type { Target } from './resources.js';
import { authorizeKube } from './webapps.js';
import type { KubeAccess } from '../wire/kubeimpersonate.js';
import type { E2ECapability, ServiceKind } from '../tunnel/protocol.js';
import type { AgentSource, Router } from './router.js';

/** What the grant route needs of the Proxy. */
export interface GrantContext {
  auth: ProxyAuth;
  agents: AgentSource;
  /** This Proxy's own tunnels (tunnel.ts TunnelServer): whether the agent's is here, and its protocol. */
  tunnels: { get(hostId: string): { link: { readonly protocol: 1 | 2 }; e2e?: E2ECapability } | undefined };
  /** The peers that hold a tunnel of an agent with none here (router.ts Router); without it, such an agent is classic. */
  peering?: Pick<Router, 'e2ePeers'>;
  /** The tunnels that take end-to-end streams (e2edata.ts DataConnections). */
  data: { tunnelOf(hostId: string): unknown };
  /**
   * This Proxy's TLS private key, its certificate (DER, base64url: the grant's x5c) and host ID; none when the one
   * port serves the operator's certificate (proxy_service.https_keypairs), which names no host an agent could check
   * a grant against.
   */
  signer?: { key: KeyObject; x5c: string; iss: string };
  idleMs?: number;
  now?: () => number;
}

/** The route gateway-grant's service: one grant session per connection. */
export function createGrantHandler(ctx: GrantContext): (stream: Duplex, info: ConnInfo) => void {
  const log = logger('e2e-grants');
  return (stream, info) => {
    const socket = stream as TLSSocket;
    const client = clientOf(info);
    let certified: Identity;
    let key: string;
    try {
      certified = peerIdentityOf(ctx.auth, socket);
      if (certified.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'only user certificates may ask for grants');
      key = spkiHash(peerX509(socket)!);
    } catch (err) {
      const e = toGatewayError(err);
      log.info({ client, code: e.code, err: e.message }, 'grant session refused');
      return void socket.end(`${JSON.stringify({ id: 0, ok: false, error: { code: e.code, message: e.message, ...(e.hint ? { hint: e.hint } : {}) } } satisfies GrantAnswer)}\n`);
    }
    const untrack = ctx.auth.sessions.track(certified, `gateway-grant ${client}`, (why) => {
      log.info({ user: certified.name, client, code: why.code }, 'grant session closed: identity revoked');
      socket.destroy();
    });
    socket.once('close', untrack);
    if (socket.destroyed) untrack();
    serveSession(ctx, socket, { certified, key, client, log });
  };
}

interface Session {
  certified: Identity;
  key: string;
  client: string;
  log: Logger;
}

/** Step 2: the request lines, bounded, a few at a time, until the client ends or idles out. */
function serveSession(ctx: GrantContext, socket: TLSSocket, s: Session): void {
  const splitter = new LineSplitter(GRANT_LINE_MAX_BYTES, 'grant request');
  const idleMs = ctx.idleMs ?? GRANT_SESSION_IDLE_MS;
  let inflight = 0;
  let rest: Buffer | undefined;
  /** The client ended its side: the Proxy ends its own once every answer is written. */
  let ended = false;
  let idle = setTimeout(() => socket.destroy(), idleMs);
  socket.once('close', () => clearTimeout(idle));
  const answer = (a: GrantAnswer) => {
    if (!socket.destroyed && socket.writable) writeJsonLine(socket, a);
  };
  const pump = (): void => {
    try {
      while (rest && inflight < GRANT_SESSION_INFLIGHT_MAX) {
        const r = splitter.feed(rest);
        if (r.kind === 'need-more') rest = undefined;
        else {
          rest = r.rest.length > 0 ? r.rest : undefined;
          clearTimeout(idle);
          idle = setTimeout(() => socket.destroy(), idleMs);
          inflight++;
          void answerLine(ctx, s, r.line).then(answer).finally(() => {
            inflight--;
            pump();
          });
        }
      }
    } catch (err) {
      // A line over the cap: answered once, then the session ends (nothing more of it is read).
      const e = toGatewayError(err);
      answer({ id: 0, ok: false, error: { code: e.code, message: e.message } });
      rest = undefined;
      socket.off('data', onData);
      // Closed once the answer is out, whether or not the client closes its side.
      return void socket.destroySoon();
    }
    if (rest) socket.pause();
    else if (ended && inflight === 0) socket.end();
    else if (socket.isPaused()) socket.resume();
  };
  const onData = (chunk: Buffer) => {
    rest = rest ? Buffer.concat([rest, chunk]) : chunk;
    pump();
  };
  socket.on('data', onData);
  socket.on('end', () => {
    ended = true;
    pump();
  });
  socket.on('error', () => socket.destroy());
}

/** Steps 3 to 5 for one request line: the answer, never a throw. */
async function answerLine(ctx: GrantContext, s: Session, line: Buffer): Promise<GrantAnswer> {
  let id = 0;
  let span: HopSpan | undefined;
  try {
    const request = parseRequest(line);
    id = request.id;
    // This hop's span, from the request on (the client's context is not trusted: src/trace.ts).
    span = startHop('proxy.e2e.grant', { kind: 'server', parent: traceContextOf(request), attributes: { 'gateway.route': request.route } });
    const answer = await grantFor(ctx, s, request, span);
    recordGrant(answer.ok ? 'ok' : 'classic' in answer ? 'classic' : 'refused');
    span.set({ 'gateway.e2e.outcome': answer.ok ? 'ok' : 'classic' });
    return answer;
  } catch (err) {
    const e = toGatewayError(err);
    span?.fail(e.code);
    if (id === 0 && Number.isSafeInteger(e.details.id)) id = e.details.id as number;
    recordGrant('refused');
    s.log.info({ user: s.certified.name, client: s.client, code: e.code, err: e.message }, 'grant refused');
    return { id, ok: false, error: { code: e.code, message: e.message, ...(e.hint ? { hint: e.hint } : {}) } };
  } finally {
    span?.end();
  }
}

function parseRequest(line: Buffer): GrantRequest {
  let v: unknown;
  try {
    v = JSON.parse(line.toString('utf8'));
  } catch {
    throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the grant request is not JSON');
  }
  const r = v as Partial<GrantRequest> | null;
  if (typeof r !== 'object' || r === null || !Number.isSafeInteger(r.id)) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the grant request has no numeric id');
  if (typeof r.resource !== 'string' || r.resource === '') throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the grant request names no resource', { details: { id: r.id } });
  if (typeof r.route !== 'string' || !['resource', 'kube'].includes(protocolNamed(r.route)?.kind ?? '')) {
    throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `the grant request's route ${JSON.stringify(r.route)} is not a resource route (a database's, gateway-tcp, gateway-proxy-ssh or kube)`, { details: { id: r.id } });
  }
  return r as GrantRequest;
}

/**
 * Why an agent whose hello offers end-to-end streams still gets no grant for this service, or undefined: a kube grant
 * needs an agent that impersonates from it (the capability's `kube`); the agents of the version before took kube
 * grants and served them with their own credential, kubectl's own Impersonate-* headers passing through.
 */
export function e2eServiceGap(service: ServiceKind, capability: E2ECapability | undefined, nodename: string): string | undefined {
  if (service === 'kube' && capability?.kube !== true) return `agent "${nodename}" does not take end-to-end Kubernetes streams (an earlier version: it would not impersonate from the grant)`;
  return undefined;
}

/**
 * Step 3: the route's own authorization, reused (one file decides each): access.ts authorizeRoute for the resource
 * routes, webapps.ts authorizeKube for the kube route (with the Kubernetes users and groups the grant carries).
 */
async function authorizeGrant(ctx: GrantContext, identity: Identity, request: GrantRequest, span: HopSpan): Promise<{ target: Target; kube?: KubeAccess }> {
  if (protocolNamed(request.route)?.kind === 'kube') {
    const { target, access } = await authorizeKube(ctx.auth, ctx.agents, identity, request.resource);
    span.set({ 'gateway.service': target.service, 'gateway.resource': target.name, 'gateway.agent.host_id': target.agent.hostId });
    return { target, kube: { users: [...access.users], groups: [...access.groups] } };
  }
  const target = await authorizeRoute(ctx.auth, ctx.agents, identity, request.route, {
    resource: request.resource,
    ...(typeof request.login === 'string' ? { login: request.login } : {}),
    ...(request.kind === 'app' || request.kind === 'desktop' ? { kind: request.kind } : {}),
  }, span);
  return { target };
}

type LocalTunnel = NonNullable<ReturnType<GrantContext['tunnels']['get']>>;

/** The end-to-end capability of the agent's tunnel here, or why it takes none. */
function localCapability(ctx: GrantContext, local: LocalTunnel, hostId: string, nodename: string): E2ECapability | undefined | string {
  if (local.link.protocol !== 2) return `agent "${nodename}" holds a v1 (SSH) tunnel here: end-to-end streams need a v2 tunnel`;
  if (!ctx.data.tunnelOf(hostId)) return `agent "${nodename}" does not offer end-to-end streams (an earlier version, or turned off)`;
  return local.e2e;
}

/**
 * An agent with no tunnel here: the capability its tunnel to a peer offers, by the presence that peer wrote
 * (router.ts e2ePeers; the stream is relayed to that peer raw, e2erelay.ts), or why none does.
 */
export function peeredCapability(ctx: Pick<GrantContext, 'peering'>, hostId: string, nodename: string): E2ECapability | string {
  const via = ctx.peering?.e2ePeers(hostId);
  if (!via) return `agent "${nodename}" holds no tunnel to this Proxy, and this Proxy does not peer: end-to-end streams go through a Proxy that holds the tunnel`;
  const first = via.peers[0];
  if (!first) return `agent "${nodename}" holds no tunnel to this Proxy, and no peer offers end-to-end streams to it: ${via.reason}`;
  // An agent of the version before checks grants only with its own tunnels' certificates: it would refuse this one.
  if (first.capability.peered !== true) return `agent "${nodename}" holds no tunnel to this Proxy and takes no grant of a Proxy it holds no tunnel to (an earlier version)`;
  return first.capability;
}

async function grantFor(ctx: GrantContext, s: Session, request: GrantRequest, span: HopSpan): Promise<GrantAnswer> {
  const { id } = request;
  const identity = await ctx.auth.resolveCaller(s.certified);
  const { target, kube } = await authorizeGrant(ctx, identity, request, span);
  const hostId = target.agent.hostId;
  const local = ctx.tunnels.get(hostId);
  const classic = (reason: string): GrantAnswer => ({ id, ok: false, classic: true, reason });
  const capability = local ? localCapability(ctx, local, hostId, target.agent.nodename) : peeredCapability(ctx, hostId, target.agent.nodename);
  if (typeof capability === 'string') return classic(capability);
  const unserved = e2eServiceGap(target.service, capability, target.agent.nodename);
  if (unserved) return classic(unserved);
  if (!ctx.signer) return classic("this Proxy serves the operator's web certificate (proxy_service.https_keypairs), which names no host: an agent could not check its grants");
  const signer = ctx.signer;
  const now = (ctx.now ?? Date.now)();
  const grant: E2EGrant = {
    v: 1,
    id: randomBytes(16).toString('hex'),
    iss: signer.iss,
    sub: identity.name,
    key: s.key,
    roles: [...identity.roles],
    service: target.service,
    resource: target.service === 'ssh' ? `${request.login}@${target.agent.nodename}` : request.resource,
    agent: hostId,
    ...(target.service === 'db' ? { db_access: dbAccessOf(identity) } : {}),
    ...(kube ? { kube_access: kube } : {}),
    iat: now,
    exp: now + GRANT_TTL_MS,
    x5c: signer.x5c,
    ...traceFields(span.context),
  };
  const token = signGrant(grant, signer.key);
  s.log.debug({ user: identity.name, client: s.client, route: request.route, resource: request.resource, agent: target.agent.nodename }, 'grant issued');
  return { id, ok: true, grant: token, agent: hostId, server_name: e2eServerName(grant.id), expires: grant.exp };
}
