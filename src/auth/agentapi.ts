/**
 * The Auth API routes an agent calls about itself, with its host certificate:
 *
 *   PUT    /v1/agent/presence   {services, resources, direct: {ssh?, kube?, desktop?}, connected_at, ttl_ms}
 *   DELETE /v1/agent/presence   {connected_at}
 *   POST   /v1/agent/events     {event}   an SSH session event for the audit log (a tunnel carries these to a Proxy)
 *
 * An agent that joined the Auth Service directly (self-hosted) has no reverse tunnel, so no Proxy writes its
 * presence: it writes its own, keyed /presence/<hostId>/direct (DIRECT_PRESENCE), with the addresses where the
 * Proxy dials its listeners. Same TTL rule as tunnel presence: a few heartbeat intervals, refreshed by every
 * heartbeat, so a dead agent drops out on its own; removed on a graceful stop (only the record of that run).
 * docs/tunnels.md (Direct-join agents).
 */
import { formatHostPort, parseAddr } from '../addr.js';
import { GatewayError } from '../errors.js';
import type { Identity } from './pki.js';
import { DIRECT_PRESENCE, type DirectAddrs, type JoinRole, type NodeRecord, type Presence } from './records.js';
import type { AgentResources, ServiceKind } from '../tunnel/protocol.js';

/** What these routes need of the Auth Service. */
export interface AgentApiService {
  getNode(hostId: string): Promise<NodeRecord | undefined>;
  setPresence(presence: Presence, ttlMs: number): Promise<void>;
  clearPresence(hostId: string, proxyId: string, connectedAt?: string): Promise<void>;
  recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>): Promise<void>;
}

/** The part of a request a route handler reads (api.ts's context). */
export interface AgentRouteContext {
  caller: () => Promise<Identity>;
  body: () => Promise<Record<string, unknown>>;
  /** The client's address as the API saw it. */
  source: string;
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

/** Which service kind each join role may advertise. */
const ROLE_SERVICE: Partial<Record<JoinRole, ServiceKind>> = { node: 'ssh', db: 'db', app: 'app', kube: 'kube', desktop: 'desktop' };
/** Which join role may advertise each direct listener. */
const LISTENER_ROLE: Record<keyof DirectAddrs, JoinRole> = { ssh: 'node', kube: 'kube', desktop: 'desktop' };

function bad(message: string): GatewayError {
  return new GatewayError('GW_ERR_API_BAD_REQUEST', message, { hint: 'Check that the agent and the Auth Service run the same version.' });
}

/** The caller must be an agent (a host identity) that is still a member; returns its node record. */
async function agentOf(auth: AgentApiService, ctx: AgentRouteContext): Promise<NodeRecord> {
  const caller = await ctx.caller();
  if (caller.kind !== 'host') {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `only agents (host certificates) write their presence; this is a ${caller.kind} identity`, {
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

/**
 * The listener addresses, each host:port; a wildcard host (0.0.0.0, ::) is replaced with the address the
 * request came from, which is how the Auth Service saw the agent (Proxies usually share its network).
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
    const host = wildcard ? source : parsed.host;
    out[kind] = formatHostPort(host, parsed.port);
  }
  return out;
}

function servicesOf(value: unknown, node: NodeRecord): ServiceKind[] {
  if (!Array.isArray(value) || value.length > 16 || !value.every((s) => typeof s === 'string')) throw bad('"services" must be a list of service kinds');
  const allowed = new Set(node.roles.map((r) => ROLE_SERVICE[r]).filter((s) => s !== undefined));
  return [...new Set(value as string[])].filter((s): s is ServiceKind => allowed.has(s as ServiceKind));
}

function resourcesOf(value: unknown): AgentResources {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw bad('"resources" must be an object');
  const r = value as Partial<Record<keyof AgentResources, unknown>>;
  const list = <T>(v: unknown): T[] => (Array.isArray(v) ? (v as T[]) : []);
  return {
    databases: list(r.databases),
    apps: list(r.apps),
    desktops: list(r.desktops),
    kube_clusters: list(r.kube_clusters),
    ...(r.node_labels && typeof r.node_labels === 'object' && !Array.isArray(r.node_labels) ? { node_labels: r.node_labels as Record<string, string> } : {}),
    ...(typeof r.node_host_cert === 'string' ? { node_host_cert: r.node_host_cert } : {}),
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
          resources: resourcesOf(b.resources),
          connectedAt: isoTime(b, 'connected_at'),
          lastHeartbeat: new Date().toISOString(),
          direct: directAddrs(b.direct, node, ctx.source),
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
  ];
}
