/**
 * The Auth API of Proxies that run in their own process (src/client/remoteauth.ts is the other end): what a
 * ProxyAuth does, as calls, plus one long-lived event stream.
 *
 *   POST   /v1/proxy/resolve-caller   {identity}                    → {identity}
 *   POST   /v1/proxy/resolve-ssh-user {name, issued_at?}            → {identity}
 *   POST   /v1/proxy/roles            {names}                       → {roles}
 *   POST   /v1/proxy/revocation       {identity}                    → {error: {code, message, hint} | null}
 *   GET    /v1/proxy/nodes/:host_id                                  → {node | null}
 *   GET    /v1/proxy/nodes                                           → {nodes}
 *   PUT    /v1/proxy/presence         {presence, ttl_ms}            (presence.proxyId must be the caller; for a
 *                                     joined, unlocked agent, rebuilt from what its roles serve: memberchecks.ts)
 *   DELETE /v1/proxy/presence/:host_id[?connected_at=]               (the caller's presence record only)
 *   POST   /v1/proxy/agent-events     {host_id, event}              (an agent whose presence of the caller lives;
 *                                     kinds: audit.ts REPORTABLE_EVENTS.agent; recorded via the caller)
 *   POST   /v1/proxy/session-events   {event}                       (the caller's own report, a session it carried:
 *                                     REPORTABLE_EVENTS.proxy; at most PROXY_EVENTS_PER_MINUTE)
 *   POST   /v1/proxy/host-renewals    {host_id, public_key, proof}  → a renewed agent's certificates (joining.ts renewHost)
 *   GET    /v1/proxy/maintenance                                     → {config: cluster_maintenance_config | null}
 *   PUT    /v1/proxy/proxies/self     {record, ttl_ms}              (record.id must be the caller)
 *   DELETE /v1/proxy/proxies/self
 *   GET    /v1/proxy/proxies | /v1/proxy/presence | /v1/proxy/strategy
 *   POST   /v1/proxy/server-cert      {public_key, names}           → {cert} for the caller's host ID, roles [proxy]
 *   POST   /v1/proxy/web-sessions/resolve  {id, bearer?}          → {session: WebSessionView}
 *   POST   /v1/proxy/web-sessions/ssh-cert {id, bearer?, ssh_public_key} → {ssh_cert}
 *   POST   /v1/proxy/app-launches     {id, bearer?, app, state}     → {token}
 *   POST   /v1/proxy/app-launches/redeem {token, app, state}        → {session_id, expires_at}
 *   POST   /v1/proxy/app-sessions/resolve {session_id, app}         → {session: WebSessionView}
 *   GET    /v1/proxy/events           newline-delimited JSON: hello, keepalive, maintenance, presence, proxies,
 *                                     resync, revoke {scope}; at most MAX_STREAMS_PER_PROXY per caller; tracked in
 *                                     auth.sessions, so a lock on the Proxy or its removal closes it
 *
 * Only a Proxy of this cluster (a host certificate with the role proxy, as it stands now: its node record
 * exists and no lock targets it) or the local admin may call them: requireProxy.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { AddrError, parseAddr } from '../addr.js';
import { GatewayError } from '../errors.js';
import type { Identity, RenewProof } from './pki.js';
import { canonicalIdentity } from './pki/identity.js';
import { agentNode, checkHostId, checkPresenceProof, proxyPresence } from './memberchecks.js';
import type { NodeRecord, Presence, ProxyRecord } from './records.js';
import type { AuthService } from './service.js';

/** Event streams one Proxy may hold open at once (a restart overlaps the old stream briefly). */
export const MAX_STREAMS_PER_PROXY = 4;
/** How much an event stream may buffer for a Proxy that does not read before it is cut (the Proxy resyncs). */
const MAX_STREAM_BUFFER = 1024 * 1024;

/** What a handler returns when it has answered on the response itself (the event stream). */
export const STREAMED: unique symbol = Symbol('streamed');

export interface ProxyCall {
  /** The calling Proxy (or the local admin), as it stands now. */
  proxy: Identity;
  params: Record<string, string>;
  query: URLSearchParams;
  body(): Promise<Record<string, unknown>>;
  req: IncomingMessage;
  res: ServerResponse;
}

export interface ProxyRoute {
  method: string;
  path: string;
  maxBody: number;
  handle(call: ProxyCall): Promise<unknown>;
}

const SMALL = 16 * 1024;
const LARGE = 256 * 1024;

/** Refuses anyone but a Proxy of this cluster (host certificate with role proxy) or the local admin. */
export function requireProxy(caller: Identity): void {
  if (caller.kind === 'admin') return;
  if (caller.kind === 'host' && caller.roles.includes('proxy')) return;
  throw new GatewayError('GW_ERR_ACCESS_DENIED', `${caller.kind} ${caller.name} is not a Proxy of this cluster: /v1/proxy/ is for Proxies only`, {
    hint: "Only a Proxy joined with a token of type proxy ('gwctl tokens add --type proxy') calls these routes.",
  });
}

function bad(message: string): GatewayError {
  return new GatewayError('GW_ERR_API_BAD_REQUEST', message);
}

function object(v: unknown, what: string): Record<string, unknown> {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw bad(`"${what}" must be an object`);
  return v as Record<string, unknown>;
}

function text(v: unknown, what: string, max = 1024): string {
  if (typeof v !== 'string' || v.length > max) throw bad(`"${what}" must be a string of at most ${max} characters`);
  return v;
}

function positive(v: unknown, what: string): number {
  if (typeof v !== 'number' || !(v > 0) || v > 24 * 3600_000) throw bad(`"${what}" must be a positive number of milliseconds (at most a day)`);
  return v;
}

/** An identity a Proxy read from a certificate it verified, sent back for the checks of the Auth Service. */
export function identityFromBody(v: unknown): Identity {
  const identity = canonicalIdentity(v, (reason) => bad(`"identity": ${reason}`));
  const issuedAt = (v as Record<string, unknown>).issuedAt;
  if (issuedAt !== undefined && (typeof issuedAt !== 'number' || !Number.isFinite(issuedAt))) throw bad('"identity.issuedAt" must be a number');
  return typeof issuedAt === 'number' ? { ...identity, issuedAt } : identity;
}

/** A Proxy writes its own records only (the admin may write any). */
function own(call: ProxyCall, id: string, what: string): void {
  if (call.proxy.kind === 'admin' || call.proxy.name === id) return;
  throw new GatewayError('GW_ERR_ACCESS_DENIED', `Proxy ${call.proxy.name} may not write the ${what} of ${id}`, { hint: 'A Proxy writes only its own records.' });
}

/**
 * The presence a Proxy may write (memberchecks.ts): its own, for a joined agent that is not locked, rebuilt from
 * what the agent's join roles serve. GW_ERR_MEMBER_PRESENCE_REFUSED otherwise.
 */
async function presenceFrom(auth: AuthService, c: ProxyCall, v: unknown): Promise<Presence> {
  const p = object(v, 'presence');
  const proxyId = text(p.proxyId, 'presence.proxyId', 256);
  own(c, proxyId, 'presence');
  const hostId = checkHostId(p.hostId);
  const node = agentNode(hostId, await auth.getNode(hostId));
  const revoked = await auth.revocationOf({ kind: 'host', name: node.hostId, cluster: auth.clusterName, roles: node.roles });
  if (revoked) throw new GatewayError('GW_ERR_MEMBER_PRESENCE_REFUSED', `agent ${node.hostId} may not be online: ${revoked.message}`, { hint: revoked.hint });
  const now = Date.now();
  // From the first valid proof on, this agent's presence is taken only with one.
  if (checkPresenceProof(p, node, proxyId, auth.clusterName, now) && !node.signsPresence) await auth.markPresenceSigned(node.hostId);
  return proxyPresence(p, node, proxyId, now);
}

/**
 * The agent a Proxy relays an event of: a joined agent whose presence record of this very Proxy lives (the
 * Proxy claims its tunnel). The local admin relays for any joined agent.
 */
async function relayedAgent(auth: AuthService, c: ProxyCall, v: unknown): Promise<NodeRecord> {
  const hostId = checkHostId(v, 'GW_ERR_MEMBER_EVENT_REFUSED');
  const node = agentNode(hostId, await auth.getNode(hostId), 'GW_ERR_MEMBER_EVENT_REFUSED');
  if (c.proxy.kind === 'admin' || (await auth.presenceOf(hostId, c.proxy.name))) return node;
  throw new GatewayError('GW_ERR_MEMBER_EVENT_REFUSED', `Proxy ${c.proxy.name} holds no tunnel of agent ${hostId}: it may not report its events`, {
    hint: 'A Proxy relays the events of the agents whose tunnels it holds (its presence record of the agent must be live).',
  });
}

/**
 * An address a Proxy publishes about itself: other Proxies dial peer_addr, clients and the join checks read the
 * public ones. A name with a port, or (public_addr only: a Proxy without a public address publishes its nodename)
 * a bare name; anything else is refused here rather than failing later in every peer that reads the record.
 */
function addrText(v: unknown, what: string, port: 'required' | 'optional'): string {
  const value = text(v, what, 300);
  try {
    const parsed = parseAddr(value);
    if (port === 'required' && parsed.port === undefined) throw new AddrError(`"${value}" has no port`);
  } catch (err) {
    if (!(err instanceof AddrError)) throw err;
    throw new GatewayError('GW_ERR_API_BAD_REQUEST', `"${what}" is not a ${port === 'required' ? 'host:port' : 'host[:port]'} address: ${err.message}`, {
      hint: 'A Proxy publishes the addresses of its configuration (proxy_service.public_addr, peer_public_addr); this record was not written by a Gateway Proxy.',
    });
  }
  return value;
}

function proxyRecordFrom(v: unknown): ProxyRecord {
  const r = object(v, 'record');
  for (const key of ['id', 'nodename', 'version', 'channels_digest', 'started_at', 'last_heartbeat']) text(r[key], `record.${key}`);
  addrText(r.public_addr, 'record.public_addr', 'optional');
  if (r.peer_addr !== undefined) addrText(r.peer_addr, 'record.peer_addr', 'required');
  if (r.public_addrs !== undefined && (!Array.isArray(r.public_addrs) || r.public_addrs.length > 64)) throw bad('"record.public_addrs" must be a list of at most 64 addresses');
  if (Array.isArray(r.public_addrs)) r.public_addrs.forEach((a, i) => addrText(a, `record.public_addrs[${i}]`, 'required'));
  if (r.tunnel_host_key !== undefined && !/^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/=]+$/.test(text(r.tunnel_host_key, 'record.tunnel_host_key', 4096))) {
    throw bad('"record.tunnel_host_key" must be one OpenSSH public key line');
  }
  object(r.channels, 'record.channels');
  return r as unknown as ProxyRecord;
}

/** The calls of CallerChecks. */
function callerRoutes(auth: AuthService): ProxyRoute[] {
  return [
    { method: 'POST', path: '/v1/proxy/resolve-caller', maxBody: SMALL * 4, handle: async (c) => ({ identity: await auth.resolveCaller(identityFromBody((await c.body()).identity)) }) },
    {
      method: 'POST', path: '/v1/proxy/resolve-ssh-user', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        const issuedAt = b.issued_at;
        if (issuedAt !== undefined && typeof issuedAt !== 'number') throw bad('"issued_at" must be a number');
        return { identity: await auth.resolveSshUser(text(b.name, 'name', 256), issuedAt) };
      },
    },
    {
      method: 'POST', path: '/v1/proxy/roles', maxBody: SMALL * 4, handle: async (c) => {
        const names = (await c.body()).names;
        if (!Array.isArray(names) || names.length > 1024 || !names.every((n) => typeof n === 'string')) throw bad('"names" must be a list of strings');
        return { roles: await auth.rolesOf(names as string[]) };
      },
    },
    {
      method: 'POST', path: '/v1/proxy/revocation', maxBody: SMALL * 4, handle: async (c) => {
        const reason = await auth.revocationOf(identityFromBody((await c.body()).identity));
        return { error: reason ? reason.toJSON() : null };
      },
    },
  ];
}

/** The calls of AgentRecords and ProxyDirectory, and the Proxy's web certificate. */
function directoryRoutes(auth: AuthService): ProxyRoute[] {
  return [
    { method: 'GET', path: '/v1/proxy/nodes', maxBody: 0, handle: async () => ({ nodes: await auth.listNodes() }) },
    { method: 'GET', path: '/v1/proxy/nodes/:host_id', maxBody: 0, handle: async (c) => ({ node: (await auth.getNode(c.params.host_id!)) ?? null }) },
    {
      method: 'POST', path: '/v1/proxy/host-renewals', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        // The host ID is the one the calling Proxy authenticated on the agent's tunnel; what it gets back certifies
        // only the key that host joined with, so it is worth nothing without that host's private key.
        // Only with the host's own fresh proof (carried), so that a Proxy cannot spend the renewals of a host that did not ask.
        const proof = b.proof as RenewProof | undefined;
        return auth.renewHost({ hostId: text(b.host_id, 'host_id', 256), publicKeyPem: text(b.public_key, 'public_key', 8192), via: c.proxy.name, carried: { proof: proof && typeof proof === 'object' ? proof : undefined } });
      },
    },
    { method: 'GET', path: '/v1/proxy/maintenance', maxBody: 0, handle: async () => ({ config: (await auth.maintenanceConfig()) ?? null }) },
    {
      method: 'PUT', path: '/v1/proxy/proxies/self', maxBody: SMALL * 4, handle: async (c) => {
        const b = await c.body();
        const record = proxyRecordFrom(b.record);
        own(c, record.id, 'Proxy record');
        await auth.heartbeatProxy(record, positive(b.ttl_ms, 'ttl_ms'));
        return { ok: true };
      },
    },
    { method: 'DELETE', path: '/v1/proxy/proxies/self', maxBody: 0, handle: async (c) => { await auth.removeProxy(c.proxy.name); return { ok: true }; } },
    { method: 'GET', path: '/v1/proxy/proxies', maxBody: 0, handle: async () => ({ proxies: await auth.listProxies() }) },
    { method: 'GET', path: '/v1/proxy/presence', maxBody: 0, handle: async () => ({ presence: await auth.listPresence() }) },
    { method: 'GET', path: '/v1/proxy/strategy', maxBody: 0, handle: async () => ({ strategy: await auth.tunnelStrategy() }) },
    { method: 'GET', path: '/v1/proxy/auth-preference', maxBody: 0, handle: async () => ({ preference: await auth.authPreference() }) },
    {
      method: 'POST', path: '/v1/proxy/server-cert', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        const names = b.names;
        if (!Array.isArray(names) || names.length > 64 || !names.every((n) => typeof n === 'string' && n.length <= 253)) throw bad('"names" must be a list of at most 64 names');
        // The caller's own host ID, and the role proxy only: a Proxy never gets a certificate that says auth.
        return { cert: await auth.issueServerCert(text(b.public_key, 'public_key', 8192), names as string[], c.proxy.name, ['proxy']) };
      },
    },
  ];
}

/** What a Proxy writes about the agents it carries and the sessions it routes: each checked (memberchecks.ts, audit.ts). */
function memberRoutes(auth: AuthService): ProxyRoute[] {
  return [
    {
      method: 'PUT', path: '/v1/proxy/presence', maxBody: LARGE, handle: async (c) => {
        const b = await c.body();
        const presence = await presenceFrom(auth, c, b.presence);
        await auth.setPresence(presence, positive(b.ttl_ms, 'ttl_ms'));
        return { ok: true };
      },
    },
    {
      method: 'DELETE', path: '/v1/proxy/presence/:host_id', maxBody: 0, handle: async (c) => {
        const connectedAt = c.query.get('connected_at') ?? undefined;
        await auth.clearPresence(checkHostId(c.params.host_id), c.query.get('proxy_id') && c.proxy.kind === 'admin' ? c.query.get('proxy_id')! : c.proxy.name, connectedAt);
        return { ok: true };
      },
    },
    {
      method: 'POST', path: '/v1/proxy/agent-events', maxBody: SMALL * 4, handle: async (c) => {
        const b = await c.body();
        const node = await relayedAgent(auth, c, b.host_id);
        // The nodename is the one the agent joined with, whatever the body says; the relaying Proxy is the caller.
        await auth.recordAgentEvent(node.hostId, node.nodename, object(b.event, 'event'), c.proxy.name);
        return { ok: true };
      },
    },
    {
      method: 'POST', path: '/v1/proxy/session-events', maxBody: SMALL * 4, handle: async (c) => {
        await auth.recordProxyEvent(c.proxy.name, object((await c.body()).event, 'event'));
        return { ok: true };
      },
    },
  ];
}

/** One long-lived stream of everything a Proxy watches; every (re)connect means "anything may have changed". */
function eventRoute(auth: AuthService, keepAliveMs: number): ProxyRoute {
  const open = new Map<string, number>();
  return {
    method: 'GET', path: '/v1/proxy/events', maxBody: 0, handle: async ({ proxy, res, req }) => {
      const held = open.get(proxy.name) ?? 0;
      if (held >= MAX_STREAMS_PER_PROXY) {
        throw new GatewayError('GW_ERR_API_TOO_MANY_STREAMS', `Proxy ${proxy.name} already holds ${held} event streams`);
      }
      open.set(proxy.name, held + 1);
      res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
      const stops: Array<() => void> = [];
      const write = (event: Record<string, unknown>) => {
        if (res.destroyed || res.writableEnded) return;
        // A Proxy that does not read: cut it; it reconnects and lists everything again.
        if (res.writableLength > MAX_STREAM_BUFFER) res.destroy();
        else res.write(`${JSON.stringify(event)}\n`);
      };
      const timer = setInterval(() => write({ type: 'keepalive' }), keepAliveMs);
      const end = () => {
        clearInterval(timer);
        for (const stop of stops.splice(0)) stop();
        const left = (open.get(proxy.name) ?? 1) - 1;
        if (left <= 0) open.delete(proxy.name);
        else open.set(proxy.name, left);
      };
      let ended = false;
      const once = () => {
        if (ended) return;
        ended = true;
        end();
      };
      res.once('close', once);
      req.once('close', () => { if (res.destroyed) once(); });
      // Tracked like every stream opened for an identity: a lock on this Proxy or its removal closes it (callers.ts
      // watchRevocations); the check after tracking catches a lock that landed since the caller was resolved.
      stops.push(auth.sessions.track(proxy, 'Proxy event stream', () => res.destroy()));
      void auth.revocationOf(proxy).then((revoked) => revoked && res.destroy());
      stops.push(auth.watchMaintenance(() => write({ type: 'maintenance' })));
      stops.push(auth.watchCluster({
        presence: (event) => write({ type: 'presence', event }),
        proxies: () => write({ type: 'proxies' }),
        resync: () => write({ type: 'resync' }),
      }));
      stops.push(auth.watchRevocationScopes((why, scope) => write({ type: 'revoke', why, scope })));
      write({ type: 'hello', keepalive_ms: keepAliveMs });
      if (ended) for (const stop of stops.splice(0)) stop();
      return STREAMED;
    },
  };
}

/** The optional bearer of a web session call: a string when given. */
function optionalBearer(b: Record<string, unknown>): string | undefined {
  return b.bearer === undefined ? undefined : text(b.bearer, 'bearer', 512);
}

/** The calls of the web (websessions.ts): secrets travel in bodies only, never in paths or logs. */
function webRoutes(auth: AuthService): ProxyRoute[] {
  return [
    {
      method: 'POST', path: '/v1/proxy/web-sessions/resolve', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        return { session: await auth.resolveWebSession(text(b.id, 'id', 512), optionalBearer(b)) };
      },
    },
    {
      method: 'POST', path: '/v1/proxy/web-sessions/ssh-cert', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        return auth.webSessionSshCert(text(b.id, 'id', 512), optionalBearer(b), text(b.ssh_public_key, 'ssh_public_key', 8192));
      },
    },
    {
      method: 'POST', path: '/v1/proxy/app-launches', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        return auth.createAppLaunch(text(b.id, 'id', 512), optionalBearer(b), text(b.app, 'app', 256), text(b.state, 'state', 64));
      },
    },
    {
      method: 'POST', path: '/v1/proxy/app-launches/redeem', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        const r = await auth.redeemAppLaunch(text(b.token, 'token', 512), text(b.app, 'app', 256), text(b.state, 'state', 64));
        return { session_id: r.sessionId, expires_at: r.expiresAt };
      },
    },
    {
      method: 'POST', path: '/v1/proxy/app-sessions/resolve', maxBody: SMALL, handle: async (c) => {
        const b = await c.body();
        return { session: await auth.resolveAppSession(text(b.session_id, 'session_id', 512), text(b.app, 'app', 256)) };
      },
    },
  ];
}

export function proxyRoutes(auth: AuthService, options: { keepAliveMs: number }): ProxyRoute[] {
  return [...callerRoutes(auth), ...directoryRoutes(auth), ...memberRoutes(auth), eventRoute(auth, options.keepAliveMs), ...webRoutes(auth)];
}
