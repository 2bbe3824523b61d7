/**
 * The Auth API routes an agent calls about itself, with its host certificate:
 *
 *   PUT    /v1/agent/presence   {services, resources, direct: {ssh?, kube?, desktop?}, connected_at, ttl_ms}
 *   DELETE /v1/agent/presence   {connected_at}
 *   POST   /v1/agent/events     {event}   one of its own session events for the audit log (audit.ts REPORTABLE_EVENTS.agent; a tunnel carries these to a Proxy)
 *   POST   /v1/agent/renew      {public_key}   → fresh host certificates for the key it joined with (joining.ts
 *                                renewHost; a tunnel agent asks over its tunnel's control channel instead)
 *
 * An agent that joined the Auth Service directly (self-hosted) has no reverse tunnel, so no Proxy writes its
 * presence: it writes its own, keyed /presence/<hostId>/direct (DIRECT_PRESENCE), with the addresses where the
 * Proxy dials its listeners. Same TTL rule as tunnel presence: a few heartbeat intervals, refreshed by every
 * heartbeat, so a dead agent drops out on its own; removed on a graceful stop (only the record of that run).
 *
 * The Proxy dials what a presence names, so what an agent may write is narrow: listener hosts only from its own
 * socket address or its join's public addresses, never loopback, link-local, unspecified or multicast; only the
 * resource kinds its roles serve; a connected_at that its clock can honestly have; and only on the Auth
 * Service's own listener (never forwarded by a Proxy's web port). docs/tunnels.md (Direct-join agents).
 */
import type { IncomingHttpHeaders } from 'node:http';
import { isIP } from 'node:net';
import { formatHostPort, isLoopbackHost, normalizeHost, parseAddr } from '../addr.js';
import { GatewayError } from '../errors.js';
import type { CertBundle } from './authorities.js';
import type { RenewRequest } from './joining.js';
import type { Identity } from './pki.js';
import { DIRECT_PRESENCE, type DirectAddrs, type JoinRole, type NodeRecord, type Presence } from './records.js';
import { clientAddress } from '../stream/meta.js';
import type { AgentResources, ServiceKind } from '../tunnel/protocol.js';

/** What these routes need of the Auth Service. */
export interface AgentApiService {
  getNode(hostId: string): Promise<NodeRecord | undefined>;
  setPresence(presence: Presence, ttlMs: number): Promise<void>;
  clearPresence(hostId: string, proxyId: string, connectedAt?: string): Promise<void>;
  recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>): Promise<void>;
  renewHost(request: RenewRequest): Promise<CertBundle & { hostId: string }>;
}

/** The part of a request a route handler reads (api.ts's context). */
export interface AgentRouteContext {
  caller: () => Promise<Identity>;
  body: () => Promise<Record<string, unknown>>;
  /** The client's address as the API saw it (a Proxy's forwarded one is refused here: see notForwarded). */
  source: string;
  /** The request itself: its headers (FORWARDED: src/wire/forwarded.ts) and its socket. */
  req: { headers: IncomingHttpHeaders; socket: { remoteAddress?: string | undefined; remotePort?: number | undefined } };
}

export interface AgentRoute {
  method: string;
  path: string;
  maxBody: number;
  handler: (ctx: AgentRouteContext) => Promise<unknown>;
}

/** Presence TTL bounds: what a heartbeat may ask for (tunnel presence: interval × (count_max + 1)). */
export const DIRECT_TTL_MS = { min: 1_000, max: 60 * 60_000 } as const;
/** A presence body holds the resources list: larger than other small bodies, still bounded. */
const PRESENCE_BODY = 256 * 1024;

/**
 * Which service kind each join role may advertise. A direct-join agent serves no databases or apps (they open no
 * listener), so db and app are not here.
 */
const ROLE_SERVICE: Partial<Record<JoinRole, ServiceKind>> = { node: 'ssh', kube: 'kube', desktop: 'desktop' };
/** How far connected_at may be from the Auth Service's clock (in the future, or before the join). */
export const CONNECTED_AT_SKEW_MS = 60_000;
/** Which join role may advertise each direct listener. */
const LISTENER_ROLE: Record<keyof DirectAddrs, JoinRole> = { ssh: 'node', kube: 'kube', desktop: 'desktop' };

function bad(message: string): GatewayError {
  return new GatewayError('GW_ERR_API_BAD_REQUEST', message, { hint: 'Check that the agent and the Auth Service run the same version.' });
}

/**
 * Refuses a request a Proxy forwarded from its web port (the FORWARDED headers of api.ts, all named
 * x-gateway-forwarded*): an agent's own calls come on the Auth Service's listener, so that the socket's address
 * is the agent's, whatever forwardedIdentity would accept.
 */
function notForwarded(ctx: AgentRouteContext): void {
  const header = Object.keys(ctx.req.headers).find((h) => h.toLowerCase().startsWith('x-gateway-forwarded'));
  if (header === undefined) return;
  throw new GatewayError('GW_ERR_DIRECT_FORWARDED', `/v1/agent/ calls are taken only on the Auth Service's own listener, not forwarded by a Proxy (header ${header})`, {
    hint: 'Point the agent at the Auth Service itself (--auth-server host:3025); an agent that joined through a Proxy uses its reverse tunnel and writes no presence itself.',
  });
}

/** The caller must be an agent (a host identity) that is still a member, on its own socket; returns its node record. */
async function agentOf(auth: AgentApiService, ctx: AgentRouteContext): Promise<NodeRecord> {
  notForwarded(ctx);
  const caller = await ctx.caller();
  if (caller.kind !== 'host') {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `only agents (host certificates) call /v1/agent/; this is a ${caller.kind} identity`, {
      hint: 'This route is for the agent itself, with the host identity in its data directory.',
    });
  }
  const node = await auth.getNode(caller.name);
  if (!node) throw new GatewayError('GW_ERR_AUTH_IDENTITY_REVOKED', `agent ${caller.name} is no longer a member of this cluster`, { hint: "Join it again with a new token from 'gwctl tokens add'." });
  return node;
}

function isoTime(b: Record<string, unknown>, key: string): string {
  const v = b[key];
  if (typeof v !== 'string' || v.length > 40 || Number.isNaN(Date.parse(v))) throw bad(`"${key}" must be an RFC 3339 time`);
  return v;
}

/** connected_at: at most a minute ahead of this clock, and not more than a minute before the agent joined. */
export function connectedAtOf(b: Record<string, unknown>, node: NodeRecord, now = Date.now()): string {
  const v = isoTime(b, 'connected_at');
  const t = Date.parse(v);
  const joined = Date.parse(node.joinedAt);
  const clock = (why: string) =>
    new GatewayError('GW_ERR_DIRECT_CLOCK', `agent ${node.hostId}: connected_at ${v} is ${why}`, { hint: "Check the agent's clock (NTP): it must agree with the Auth Service's within a minute." });
  if (t > now + CONNECTED_AT_SKEW_MS) throw clock(`more than a minute after this Auth Service's time (${new Date(now).toISOString()})`);
  if (Number.isFinite(joined) && t < joined - CONNECTED_AT_SKEW_MS) throw clock(`more than a minute before the agent joined (${node.joinedAt})`);
  return v;
}

/** "::ffff:192.0.2.1" as 192.0.2.1; other hosts normalised. */
function plainHost(host: string): string {
  const h = normalizeHost(host);
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  return mapped ? mapped[1]! : h;
}

/**
 * Why a Proxy must never dial this host whoever named it, or undefined: loopback (the Proxy's own services),
 * link-local (169.254/16 with cloud metadata, fe80::/10), unspecified and multicast or broadcast. Only literal
 * addresses and localhost names are recognised here; the Proxy checks the address it connected to as well.
 */
export function refusedDialHost(host: string): string | undefined {
  const h = plainHost(host);
  if (isLoopbackHost(h)) return 'a loopback address (the Proxy itself)';
  const family = isIP(h);
  if (family === 4) {
    const [a, b] = h.split('.').map(Number) as [number, number];
    if (a === 0) return 'an unspecified address (0.0.0.0/8)';
    if (a === 169 && b === 254) return 'a link-local address (169.254.0.0/16, where cloud metadata services answer)';
    if (a >= 224) return 'a multicast or reserved address (224.0.0.0/3)';
  } else if (family === 6) {
    const zone = h.indexOf('%');
    const bare = zone >= 0 ? h.slice(0, zone) : h;
    if (/^[0:]+$/.test(bare)) return 'the unspecified address (::)';
    const first = bare.startsWith('::') ? 0 : parseInt(bare.split(':')[0]!, 16);
    if ((first & 0xffc0) === 0xfe80) return 'a link-local address (fe80::/10)';
    if ((first & 0xff00) === 0xff00) return 'a multicast address (ff00::/8)';
  }
  return undefined;
}

/** The host of one of the node record's public addresses ("host" or "host:port"), or undefined. */
function publicHost(addr: string): string | undefined {
  try {
    return plainHost(parseAddr(addr).host);
  } catch {
    return undefined;
  }
}

function addrRefused(node: NodeRecord, kind: keyof DirectAddrs, addr: string, why: string): GatewayError {
  return new GatewayError('GW_ERR_DIRECT_ADDR_REFUSED', `agent ${node.hostId} may not advertise ${addr} for its ${kind} listener: ${why}`, {
    hint: "Set the service's listen_addr to a wildcard (0.0.0.0:port) or to the address the agent reaches the Auth Service from, or its public_addr to one given at join (--public-addr); a Proxy never dials loopback or link-local addresses.",
    details: { hostId: node.hostId, listener: kind, addr },
  });
}

/**
 * The listener addresses, each host:port. A host is accepted only if it is a wildcard (0.0.0.0, ::, empty:
 * replaced with the request's socket address, which is how the Auth Service saw the agent; Proxies usually
 * share its network), that socket address itself, or the host of one of the public addresses the agent gave
 * when it joined; and never one refusedDialHost names, whatever its origin.
 */
export function directAddrs(value: unknown, node: NodeRecord, source: string): DirectAddrs {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw bad('"direct" must be an object with ssh, kube or desktop addresses');
  const out: DirectAddrs = {};
  for (const [key, addr] of Object.entries(value as Record<string, unknown>)) {
    if (!Object.hasOwn(LISTENER_ROLE, key)) throw bad(`"direct.${key}" is not ssh, kube or desktop`);
    const kind = key as keyof DirectAddrs;
    if (!node.roles.includes(LISTENER_ROLE[kind])) throw new GatewayError('GW_ERR_ACCESS_DENIED', `agent ${node.hostId} did not join as ${LISTENER_ROLE[kind]}: it may not advertise a ${kind} listener`);
    if (typeof addr !== 'string' || addr.length > 300) throw bad(`"direct.${kind}" must be host:port`);
    let parsed;
    try {
      parsed = parseAddr(addr, { allowEmptyHost: true });
    } catch {
      throw bad(`"direct.${kind}" must be host:port`);
    }
    if (!parsed.port) throw bad(`"direct.${kind}" must be host:port`);
    const wildcard = parsed.host === '0.0.0.0' || parsed.host === '::' || parsed.host === '';
    const own = plainHost(source);
    const host = wildcard ? own : plainHost(parsed.host);
    const formatted = formatHostPort(host, parsed.port);
    const why = refusedDialHost(host);
    if (why !== undefined) throw addrRefused(node, kind, formatted, `it is ${why}${wildcard ? ', where the heartbeat came from' : ''}`);
    if (host !== own && !node.publicAddrs.some((a) => publicHost(a) === host)) {
      throw addrRefused(node, kind, formatted, `${host} is neither the address this heartbeat came from (${own}) nor a public address the agent joined with (${node.publicAddrs.join(', ') || 'none'})`);
    }
    out[kind] = formatted;
  }
  return out;
}

function servicesOf(value: unknown, node: NodeRecord): ServiceKind[] {
  if (!Array.isArray(value) || value.length > 16 || !value.every((s) => typeof s === 'string')) throw bad('"services" must be a list of service kinds');
  const allowed = new Set(node.roles.map((r) => ROLE_SERVICE[r]).filter((s) => s !== undefined));
  return [...new Set(value as string[])].filter((s): s is ServiceKind => allowed.has(s as ServiceKind));
}

/**
 * The resources, only of the kinds the agent's roles serve through a listener: the node's labels and host
 * certificate for node (ssh), Kubernetes clusters for kube, desktops for desktop; never databases or apps (a
 * direct-join agent opens no listener for them). Anything else is dropped, so an agent cannot stand in for
 * resources it does not serve.
 */
export function resourcesOf(value: unknown, node: NodeRecord): AgentResources {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw bad('"resources" must be an object');
  const r = value as Partial<Record<keyof AgentResources, unknown>>;
  const has = (role: JoinRole) => node.roles.includes(role);
  const list = <T>(v: unknown, role: JoinRole): T[] => (has(role) && Array.isArray(v) ? (v as T[]) : []);
  const labels = r.node_labels && typeof r.node_labels === 'object' && !Array.isArray(r.node_labels) ? (r.node_labels as Record<string, string>) : undefined;
  return {
    databases: [],
    apps: [],
    desktops: list(r.desktops, 'desktop'),
    kube_clusters: list(r.kube_clusters, 'kube'),
    ...(has('node') && labels ? { node_labels: labels } : {}),
    ...(has('node') && typeof r.node_host_cert === 'string' ? { node_host_cert: r.node_host_cert } : {}),
  };
}

/** The routes; api.ts registers them. */
export function agentRoutes(auth: AgentApiService): AgentRoute[] {
  return [
    {
      method: 'PUT',
      path: '/v1/agent/presence',
      maxBody: PRESENCE_BODY,
      handler: async (ctx) => {
        const node = await agentOf(auth, ctx);
        const b = await ctx.body();
        const ttl = b.ttl_ms;
        if (typeof ttl !== 'number' || !Number.isFinite(ttl)) throw bad('"ttl_ms" must be a number');
        const ttlMs = Math.min(DIRECT_TTL_MS.max, Math.max(DIRECT_TTL_MS.min, ttl));
        const presence: Presence = {
          hostId: node.hostId,
          nodename: node.nodename,
          proxyId: DIRECT_PRESENCE,
          services: servicesOf(b.services, node),
          resources: resourcesOf(b.resources, node),
          connectedAt: connectedAtOf(b, node),
          lastHeartbeat: new Date().toISOString(),
          // The socket's address, never a forwarded one (agentOf refused those already).
          direct: directAddrs(b.direct, node, clientAddress(ctx.req.socket).address),
        };
        await auth.setPresence(presence, ttlMs);
        return { presence: { proxyId: presence.proxyId, direct: presence.direct, ttl_ms: ttlMs } };
      },
    },
    {
      method: 'DELETE',
      path: '/v1/agent/presence',
      maxBody: 4096,
      handler: async (ctx) => {
        const node = await agentOf(auth, ctx);
        const b = await ctx.body();
        await auth.clearPresence(node.hostId, DIRECT_PRESENCE, b.connected_at === undefined ? undefined : isoTime(b, 'connected_at'));
        return { removed: true };
      },
    },
    {
      method: 'POST',
      path: '/v1/agent/events',
      maxBody: 64 * 1024,
      handler: async (ctx) => {
        const node = await agentOf(auth, ctx);
        const event = (await ctx.body()).event;
        if (event === null || typeof event !== 'object' || Array.isArray(event)) throw bad('"event" must be an object');
        await auth.recordAgentEvent(node.hostId, node.nodename, event as Record<string, unknown>);
        return { recorded: true };
      },
    },
    {
      method: 'POST',
      path: '/v1/agent/renew',
      maxBody: 16 * 1024,
      handler: async (ctx) => {
        const node = await agentOf(auth, ctx);
        const key = (await ctx.body()).public_key;
        if (typeof key !== 'string' || key.length > 8192) throw bad('"public_key" must be a PEM public key');
        return auth.renewHost({ hostId: node.hostId, publicKeyPem: key, via: 'direct' });
      },
    },
  ];
}
