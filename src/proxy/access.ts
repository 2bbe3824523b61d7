/**
 * Client → resource through the Proxy: a TLS connection on one of the table's resource routes (protocols.ts:
 * gateway-postgres, gateway-mysql, gateway-mongodb, gateway-redis, gateway-tcp, gateway-proxy-ssh) with the
 * user's client certificate arrives from the front door already terminated. Then:
 *
 *   1. the identity is the user certificate (signed by the user CA of this cluster), as it stands now: the user
 *      must still exist and not be locked, and only the roles it still has count (AuthService.resolveCaller);
 *      the connection is tracked in auth.sessions from here on, so a lock or a deletion closes it;
 *   2. the client sends one JSON line naming the resource: {"resource": "<name>"} (gwsh does this); with
 *      "check": true the Proxy answers whether the connection would be allowed and dials nothing;
 *   3. the resource is looked up among the agents this Proxy reaches (router.ts, resources.ts: the newest agent first, among the kinds
 *      of resource the route reaches), a node only with a login the identity allows, and the user's roles must
 *      allow the resource's labels;
 *   4. the Proxy dials it through the agent's tunnel (its own, or another Proxy's over peering: router.ts), answers one line ({"ok": true} or {"ok": false, "error":
 *      {code, message}}: never a hang), and then the bytes flow both ways with back-pressure and half-close; a
 *      client that asked for `framed` gets them in frames that say a clean end (src/stream/framed.ts), so that a
 *      Proxy killed mid-transfer is a break at the client, not an end.
 *   5. from the dial on, the session is audited (sessionaudit.ts): db.session.*, app.session.* (TCP apps) and
 *      desktop.session.* with the bytes of both directions (the client's payload, without the frames), the end
 *      recorded however the connection ends; a Postgres or MySQL client's startup gives the session's db_user and
 *      db_name (dbstartup.ts). SSH sessions are the agent's to audit (it sees them; the Proxy does not).
 *
 * The database keeps authenticating its own users. For a database the dial request also carries which database
 * users and names the user's roles allow now (db_access, from resolveCaller); the agent checks the client's
 * startup against it (src/agent/dbgate.ts), since only the agent sees the protocol.
 */
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { peerIdentityOf } from '../auth/peeridentity.js';
import type { Identity } from '../auth/pki.js';
import { canAccess, LABEL_FIELDS, type AccessKind } from '../auth/rbac.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { GatewayError, isGatewayError, toGatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { clientOf, routeReason, type ConnInfo } from '../mux/multiplexer.js';
import { connectionOf } from '../net/deadlines.js';
import { readJsonLine, writeJsonLine } from '../stream/lines.js';
import { FramedStream } from '../stream/framed.js';
import { splice } from '../stream/splice.js';
import { startHop, traceContextOf, traceFields, type HopSpan } from '../trace.js';
import type { DatabaseGrant, DialAnswer } from '../tunnel/protocol.js';
import type { AgentSource } from './router.js';
import { startupPeek, type StartupPeek } from './dbstartup.js';
import { protocolNamed } from './protocols.js';
import { findTarget, type Target } from './resources.js';
import type { AuditedSession, SessionAudit, SessionKind } from './sessionaudit.js';

export interface RouteHeader {
  resource: string;
  /** gateway-proxy-ssh: the OS login the client will ask the node for. */
  login?: string;
  /** For gateway-tcp: which kind of resource (app or desktop); databases are implied by the protocol. */
  kind?: 'app' | 'desktop';
  /**
   * Only ask: every check runs (identity, resource connected, login, roles) and the answer says whether a real
   * connection would be allowed, but nothing is dialled. gwsh's local proxies ask this at start, so that a
   * server taking one client at a time never sees a connection that is opened and closed at once.
   */
  check?: boolean;
  /**
   * The client asks for the connection's bytes in frames whose end is said in the stream (src/stream/framed.ts):
   * the answer then says `framed`, and an end that is not that frame is a break (reset), never a clean end.
   */
  framed?: boolean;
  /** W3C trace context of the client's span (src/trace.ts): validated, and its sampled flag not trusted. */
  traceparent?: string;
  tracestate?: string;
}

/** The route header is one JSON line of at most this many bytes. */
export const ROUTE_HEADER_MAX_BYTES = 4096;

interface AccessContext {
  auth: ProxyAuth;
  agents: AgentSource;
  headerTimeoutMs: number;
  log: Logger;
  audit: SessionAudit | undefined;
}

/**
 * headerTimeoutMs: how long the client may take to send its route header (gateway.limits.header_timeout); audit:
 * where the sessions are recorded (the Proxy's one SessionAudit).
 */
export function createAccessHandler(auth: ProxyAuth, agents: AgentSource, headerTimeoutMs = 20_000, audit?: SessionAudit): (stream: Duplex, info: ConnInfo) => void {
  const ctx: AccessContext = { auth, agents, headerTimeoutMs, log: logger('access'), audit };
  return (stream, info) => {
    const socket = stream as TLSSocket;
    const hop = { span: undefined as HopSpan | undefined };
    connect(ctx, socket, info, hop)
      .catch((err: unknown) => {
        hop.span?.fail(toGatewayError(err).code);
        refuse(ctx, socket, info, err);
      })
      .finally(() => hop.span?.end());
  };
}

/** Steps 1 to 4 at the top of this file; a failure is thrown, and answered by refuse(). */
async function connect(ctx: AccessContext, socket: TLSSocket, info: ConnInfo, hop: { span: HopSpan | undefined }): Promise<void> {
  const client = clientOf(info);
  const certified = peerIdentityOf(ctx.auth, socket);
  if (certified.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'only user certificates may reach resources');
  trackSession(ctx, socket, certified, info);
  const identity = await ctx.auth.resolveCaller(certified);
  const header = await readRouteHeader(socket, ctx.headerTimeoutMs);
  // This hop's span, from the route header on (the client's context is not trusted: src/trace.ts).
  hop.span = startHop('proxy.access', { kind: 'server', parent: traceContextOf(header), attributes: { 'gateway.route': info.route, 'gateway.route.reason': routeReason(info) } });
  const target = await authorizeRoute(ctx.auth, ctx.agents, identity, info.route, header, hop.span);
  if (header.check === true) {
    socket.end(`${JSON.stringify({ ok: true } satisfies DialAnswer)}\n`);
    ctx.log.debug({ user: identity.name, route: info.route, resource: header.resource, client }, 'access check answered');
    return;
  }
  const channel = await ctx.agents.dial(target.agent.hostId, {
    service: target.service,
    resource: target.service === 'ssh' ? `${header.login}@${target.agent.nodename}` : header.resource,
    client_src: client,
    client_dst: `${info.localAddress}:${info.localPort}`,
    user: identity.name,
    ...(target.service === 'db' ? { db_access: dbAccessOf(identity) } : {}),
    ...traceFields(hop.span.context),
  });
  const framed = header.framed === true;
  writeJsonLine(socket, (framed ? { ok: true, framed: true } : { ok: true }) satisfies DialAnswer);
  ctx.log.info({ user: identity.name, route: info.route, resource: header.resource, agent: target.agent.nodename, client }, 'connection to a resource opened');
  const stream = framed ? new FramedStream(socket) : socket;
  auditSession(ctx, { client: stream, socket }, channel, { user: identity.name, target, route: info.route, client });
  splice(stream, channel);
}

/**
 * Step 3's checks, the one place that decides whether a resolved identity may take a route to a resource: the
 * target among the agents, the login for a node, the roles against its labels. A refusal is thrown (the classic
 * route answers it; the grant session, e2egrants.ts, answers it with the same code).
 */
export async function authorizeRoute(auth: ProxyAuth, agents: AgentSource, identity: Identity, route: string, wanted: Pick<RouteHeader, 'resource' | 'login' | 'kind'>, span?: HopSpan): Promise<Target> {
  const target = findTarget(agents.agents(), route, wanted);
  if (!target) {
    throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no connected agent serves ${describe(route)} "${wanted.resource}"`, {
      hint: "List what is reachable with 'gwsh ls', 'gwsh db ls' or 'gwsh apps ls'; the agent that serves it may be offline.",
    });
  }
  if (target.service === 'ssh') checkLogin(identity, wanted.login);
  // On the span before the roles are checked: a refusal's span names what was refused.
  span?.set({ 'gateway.service': target.service, 'gateway.resource': target.name, 'gateway.agent.host_id': target.agent.hostId });
  await checkRoles(auth, identity, target, route, wanted.resource);
  return target;
}

/** The database users and names a resolved identity's roles allow now (DialRequest.db_access). */
export function dbAccessOf(identity: Identity): DatabaseGrant {
  return identity.db ?? NO_DATABASE_GRANT;
}

/** What a user without a resolved grant may use of a database: nothing (the agent refuses every user and name). */
const NO_DATABASE_GRANT: DatabaseGrant = { users: { allow: [], deny: [] }, names: { allow: [], deny: [] } };

/** The audit kind of a target's sessions; SSH (node) sessions are the agent's. */
const AUDIT_KIND: Partial<Record<AccessKind, SessionKind>> = { db: 'db', app: 'app', windows_desktop: 'desktop' };

/** Step 5: the session's start now, its bytes as they pass, its end when both sides have closed. */
function auditSession(ctx: AccessContext, streams: { client: Duplex; socket: Duplex }, channel: Duplex, s: { user: string; target: Target; route: string; client: string }): void {
  const kind = AUDIT_KIND[s.target.access];
  if (!ctx.audit || !kind) return;
  const protocol = protocolNamed(s.route)?.database;
  const fields = { user: s.user, resource: s.target.name, node: s.target.agent.nodename, client: s.client, ...(protocol ? { protocol } : {}) };
  const peek = startupPeek(protocol);
  const session = ctx.audit.start(kind, fields, { defer: peek !== undefined });
  // The client's own bytes (inside the frames when framed); a revocation is noted on the TLS socket it closes.
  if (peek) learnDbStartup(streams.client, session, peek);
  ctx.audit.spliced(session, streams.client, channel, () => revoked.get(streams.socket));
}

/** The database user and name the client asks for (its startup), for the session's records. */
function learnDbStartup(socket: Duplex, session: AuditedSession, peek: StartupPeek): void {
  const onData = (chunk: Buffer) => {
    const answer = peek.feed(chunk);
    if (!answer.done) return;
    socket.off('data', onData);
    session.learn({ ...(answer.user ? { db_user: answer.user } : {}), ...(answer.database ? { db_name: answer.database } : {}) }); // {} when not known: the start is written all the same
  };
  socket.on('data', onData);
}

/** Why a connection was closed by a revocation (a lock, a removal): its audited end says so. */
const revoked = new WeakMap<Duplex, string>();

/** Tracked before the checks: a lock that lands while they run still closes this connection. */
function trackSession(ctx: AccessContext, socket: TLSSocket, certified: Identity, info: ConnInfo): void {
  const client = clientOf(info);
  const untrack = ctx.auth.sessions.track(certified, `${info.route} ${client}`, (why) => {
    ctx.log.info({ user: certified.name, route: info.route, client, code: why.code }, 'connection closed: identity revoked');
    revoked.set(socket, `identity revoked: ${why.code}`);
    socket.destroy();
  });
  socket.once('close', untrack);
  if (socket.destroyed) untrack();
}

/** The client's route header: one JSON object on one line, within the deadline, naming a resource. */
async function readRouteHeader(socket: Duplex, timeoutMs: number): Promise<RouteHeader> {
  const header = await readJsonLine<RouteHeader>(socket, { what: 'route header', timeoutMs, maxBytes: ROUTE_HEADER_MAX_BYTES }).catch((err: unknown) => {
    // The line reader enforces this deadline itself (so that the client is told why): count it with the others.
    if (isGatewayError(err) && err.code === 'GW_ERR_TUNNEL_TIMEOUT') connectionOf(socket).count('route-header');
    throw err;
  });
  if (typeof header.resource !== 'string' || header.resource === '') throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the route header names no resource');
  return header;
}

/** A node is reached as one of the OS logins the user's identity allows. */
function checkLogin(identity: Identity, requested: string | undefined): void {
  const login = requested ?? '';
  if (!login || !(identity.logins ?? []).includes(login)) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `login "${login}" is not allowed for ${identity.name} (allowed: ${(identity.logins ?? []).join(', ') || 'none'})`, {
      hint: "Ask for a role whose logins include it, then sign in again; 'gwsh status' shows your logins.",
    });
  }
}

/** The user's roles must allow the resource's labels (and none deny them). */
async function checkRoles(auth: ProxyAuth, identity: Identity, target: Target, route: string, resource: string): Promise<void> {
  const roles = await auth.rolesOf(identity.roles);
  if (!canAccess(roles, target.access, target.labels)) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles (${identity.roles.join(', ') || 'none'}) do not allow ${describe(route)} "${resource}" (labels ${JSON.stringify(target.labels)})`, {
      hint: `Ask for a role whose ${LABEL_FIELDS[target.access]} match these labels, then sign in again.`,
    });
  }
}

/** A refusal is one answer line, then the end of the stream: never a hang. */
function refuse(ctx: AccessContext, socket: TLSSocket, info: ConnInfo, err: unknown): void {
  const e = toGatewayError(err);
  ctx.log.info({ route: info.route, client: clientOf(info), code: e.code, err: e.message }, 'connection to a resource refused');
  const answer: DialAnswer = { ok: false, error: { code: e.code, message: e.message } };
  socket.end(`${JSON.stringify(answer)}\n`);
}

const NOUN: Record<AccessKind, string> = { node: 'node', db: 'database', app: 'app', windows_desktop: 'desktop', kube_cluster: 'Kubernetes cluster' };

/** What a route's resources are called in messages: "node", "postgres database", "app or desktop". */
function describe(route: string): string {
  const row = protocolNamed(route);
  if (!row || row.access.length === 0) return route;
  return row.access.map((kind) => (kind === 'db' && row.database ? `${row.database} ${NOUN.db}` : NOUN[kind])).join(' or ');
}
