/**
 * What a Proxy in its own process may write about others, checked by the Auth Service (docs/security.md, "Each
 * member acts only for itself"). The Auth Service cannot see a Proxy's tunnels, so it checks what it can know:
 *
 *   presence   under the calling Proxy's own ID only (proxyapi.ts); for a host ID that is a host ID (NAME_PATTERN:
 *              no "/", so never a path such as a/b/../c), of an agent that joined (its node record) as an agent
 *              (not a Proxy only) and is not locked; its nodename is the one it joined with; its services and
 *              resources only of the kinds its join roles serve, each well formed and bounded (anything else is
 *              dropped); connected_at and last_heartbeat times that the tunnel can have (not ahead of this
 *              clock, not before the agent joined).
 *   events     an agent's event relayed by a Proxy only while that Proxy's own presence record of the agent is
 *              live (it claims the tunnel); the kinds are audit.ts's REPORTABLE_EVENTS.
 *   proof      the agent's signature of this presence through this Proxy, over what its hello announced
 *              (checkPresenceProof): once an agent has signed one, its presence is taken only with a valid one, so
 *              a Proxy cannot claim its tunnel nor change its labels. An agent of an earlier version signs nothing:
 *              for it, a compromised Proxy can still claim a tunnel with resources of the kinds it serves; such a
 *              record counts only while that Proxy is live and unlocked (presenceCounts; a lock takes its record
 *              out: agents.ts forgetRevokedProxy). Pure: the caller reads the node record and the clock.
 */
import { GatewayError } from '../errors.js';
import { presenceProofRefusal } from './pki/proof.js';
import { e2eCapabilityOf } from '../tunnel/e2e.js';
import type { AgentResources, ServiceKind } from '../tunnel/protocol.js';
import { DATABASE_PROTOCOLS } from '../wire/protocols.js';
import { checkAgentHealth, UPGRADE_GROUP_PATTERN } from '../wire/autoupdate.js';
import { NAME_PATTERN, type JoinRole, type NodeRecord, type Presence } from './records.js';

/** How far a presence's times may be ahead of the Auth Service's clock, or before the agent joined. */
export const PRESENCE_SKEW_MS = 60_000;
/** Labels per resource, and the length of a name, a label key or value. */
const MAX_LABELS = 64;
const MAX_TEXT = 256;
/** Resources of one kind in one presence. */
const MAX_RESOURCES = 1024;

/** Which service kind, and which resources, each join role serves. */
const ROLE_SERVICE: Partial<Record<JoinRole, ServiceKind>> = { node: 'ssh', db: 'db', app: 'app', kube: 'kube', desktop: 'desktop' };
const DB_PROTOCOLS: ReadonlySet<string> = new Set(DATABASE_PROTOCOLS);
const APP_KINDS: ReadonlySet<string> = new Set(['http', 'https', 'tcp']);

function refused(message: string, hint?: string): GatewayError {
  return new GatewayError('GW_ERR_MEMBER_PRESENCE_REFUSED', message, hint ? { hint } : {});
}

/** A host ID as the Auth Service stores them, or GW_ERR_MEMBER_PRESENCE_REFUSED (code given) naming what it got. */
export function checkHostId(v: unknown, code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' | 'GW_ERR_MEMBER_EVENT_REFUSED' = 'GW_ERR_MEMBER_PRESENCE_REFUSED'): string {
  if (typeof v === 'string' && NAME_PATTERN.test(v)) return v;
  const shown = typeof v === 'string' ? JSON.stringify(v.slice(0, 64)) : typeof v;
  throw new GatewayError(code, `${shown} is not a host ID`, { hint: "A host ID is the one an agent got at join ('gwctl get nodes'): letters, digits, '.', '_', '@' or '-'." });
}

/** The agent a Proxy reports about: joined, and as an agent (a host that joined as a Proxy only serves nothing). */
export function agentNode(hostId: string, node: NodeRecord | undefined, code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' | 'GW_ERR_MEMBER_EVENT_REFUSED' = 'GW_ERR_MEMBER_PRESENCE_REFUSED'): NodeRecord {
  if (!node) throw new GatewayError(code, `no agent joined this cluster with host ID ${hostId}`, { hint: "A Proxy reports only agents whose tunnels it holds; 'gwctl get nodes' lists the members." });
  if (!node.roles.some((r) => ROLE_SERVICE[r] !== undefined)) {
    throw new GatewayError(code, `host ${hostId} joined as ${node.roles.join(', ') || 'nothing'}, not as an agent`, { hint: 'Only agents (node, db, app, kube, desktop) keep tunnels.' });
  }
  return node;
}

function isoTime(v: unknown, what: string, node: NodeRecord, now: number): string {
  if (typeof v !== 'string' || v.length > 40 || !Number.isFinite(Date.parse(v))) throw refused(`"presence.${what}" must be an RFC 3339 time`);
  const t = Date.parse(v);
  const joined = Date.parse(node.joinedAt);
  const clock = "Check the Proxy's clock (NTP): it must agree with the Auth Service's within a minute.";
  if (t > now + PRESENCE_SKEW_MS) throw refused(`agent ${node.hostId}: ${what} ${v} is more than a minute after this Auth Service's time`, clock);
  if (Number.isFinite(joined) && t < joined - PRESENCE_SKEW_MS) throw refused(`agent ${node.hostId}: ${what} ${v} is before the agent joined (${node.joinedAt})`, clock);
  return v;
}

const text = (v: unknown, max = MAX_TEXT): v is string => typeof v === 'string' && v.length > 0 && v.length <= max;

/** Labels: at most MAX_LABELS string pairs, or undefined when not well formed. */
function labelsOf(v: unknown): Record<string, string> | undefined {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return undefined;
  const entries = Object.entries(v as Record<string, unknown>);
  if (entries.length > MAX_LABELS || !entries.every(([k, val]) => text(k) && typeof val === 'string' && val.length <= MAX_TEXT)) return undefined;
  return Object.fromEntries(entries) as Record<string, string>;
}

/** The well-formed items of a list, each rebuilt from its known fields only; nothing when the role does not serve it. */
function items<T>(v: unknown, served: boolean, build: (item: Record<string, unknown>, labels: Record<string, string>) => T | undefined): T[] {
  if (!served || !Array.isArray(v)) return [];
  const out: T[] = [];
  for (const raw of v.slice(0, MAX_RESOURCES)) {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) continue;
    const item = raw as Record<string, unknown>;
    const labels = labelsOf(item.labels ?? {});
    const built = labels && text(item.name) ? build(item, labels) : undefined;
    if (built) out.push(built);
  }
  return out;
}

/** The resources of the kinds the agent's join roles serve, each well formed; anything else dropped. */
export function servedResources(value: unknown, node: NodeRecord): AgentResources {
  const r = (value !== null && typeof value === 'object' && !Array.isArray(value) ? value : {}) as Partial<Record<keyof AgentResources, unknown>>;
  const has = (role: JoinRole) => node.roles.includes(role);
  const named = (i: Record<string, unknown>, labels: Record<string, string>) => ({ name: i.name as string, labels });
  const nodeLabels = has('node') ? labelsOf(r.node_labels) : undefined;
  return {
    databases: items(r.databases, has('db'), (i, labels) => (typeof i.protocol === 'string' && DB_PROTOCOLS.has(i.protocol) ? { name: i.name as string, protocol: i.protocol as AgentResources['databases'][number]['protocol'], labels } : undefined)),
    apps: items(r.apps, has('app'), (i, labels) => {
      if (typeof i.kind !== 'string' || !APP_KINDS.has(i.kind)) return undefined;
      if (i.public_addr !== undefined && !text(i.public_addr, 253)) return undefined;
      return { name: i.name as string, kind: i.kind as AgentResources['apps'][number]['kind'], labels, ...(i.public_addr === undefined ? {} : { public_addr: i.public_addr as string }) };
    }),
    desktops: items(r.desktops, has('desktop'), named),
    kube_clusters: items(r.kube_clusters, has('kube'), named),
    ...(nodeLabels ? { node_labels: nodeLabels } : {}),
    ...(has('node') && text(r.node_host_cert, 16 * 1024) ? { node_host_cert: r.node_host_cert } : {}),
  };
}

/**
 * The agent's proof of this presence through proxyId (src/auth/pki/proof.ts), over the services and resources as
 * the Proxy sent them: true when it holds, false when there is none and the agent never signed (an agent of an
 * earlier version, or one with no recorded key); GW_ERR_MEMBER_PRESENCE_REFUSED when it does not hold, or is
 * missing for an agent that signs (node.signsPresence): then the Proxy holds no tunnel of it, or lies about it.
 */
export function checkPresenceProof(value: Record<string, unknown>, node: NodeRecord, proxyId: string, cluster: string, now: number): boolean {
  const hint = 'A Proxy writes the presence of an agent only with the proof the agent sends over its tunnel to that Proxy; check the clocks of the agent and the Auth Service (date -u).';
  if (value.proof === undefined || !node.sshPublicKey) {
    if (node.signsPresence) throw refused(`agent ${node.hostId} signs its presence, and Proxy ${proxyId} sent no proof of it: it holds no tunnel of that agent`, hint);
    return false;
  }
  const why = presenceProofRefusal(value.proof, node.hostId, cluster, { proxyId, services: value.services, resources: value.resources }, node.sshPublicKey, now);
  if (why) throw refused(`presence of agent ${node.hostId} through Proxy ${proxyId}: ${why}`, hint);
  return true;
}

/**
 * The hello's software fields, kept only when they are short printable strings; the rollout group and the agent's
 * health only when they pass the same checks as on the Proxy (src/wire/autoupdate.ts). Neither is in the agent's
 * signed proof (docs/tunnels.md): a Proxy that lies about them can only delay its agents' own rollout.
 */
function software(p: Record<string, unknown>, now: number): Pick<Presence, 'version' | 'channel' | 'upgradeGroup' | 'health'> {
  const ok = (v: unknown): v is string => typeof v === 'string' && v.length > 0 && v.length <= 128 && /^[\x21-\x7e]+$/.test(v);
  const health = p.health === undefined ? undefined : checkAgentHealth(p.health, now);
  return {
    ...(ok(p.version) ? { version: p.version } : {}),
    ...(ok(p.channel) ? { channel: p.channel } : {}),
    ...(typeof p.upgradeGroup === 'string' && UPGRADE_GROUP_PATTERN.test(p.upgradeGroup) ? { upgradeGroup: p.upgradeGroup } : {}),
    ...(health?.ok ? { health: health.health } : {}),
  };
}

/**
 * The presence record a Proxy may write for the agent `node` (already read for the checked host ID), rebuilt from
 * what it sent: its own proxyId, the joined nodename, only the services and resources the agent's roles serve,
 * times the tunnel can have. No `direct` listener: only a direct-join agent writes that, itself (agentapi.ts).
 */
export function proxyPresence(value: Record<string, unknown>, node: NodeRecord, proxyId: string, now: number): Presence {
  const served = new Set(node.roles.map((r) => ROLE_SERVICE[r]).filter((s) => s !== undefined));
  const services = Array.isArray(value.services) ? [...new Set(value.services.slice(0, 16))].filter((s): s is ServiceKind => served.has(s as ServiceKind)) : [];
  return {
    hostId: node.hostId,
    nodename: node.nodename,
    proxyId,
    services,
    resources: servedResources(value.resources, node),
    connectedAt: isoTime(value.connectedAt, 'connectedAt', node, now),
    lastHeartbeat: isoTime(value.lastHeartbeat, 'lastHeartbeat', node, now),
    ...software(value, now),
    // A Proxy that lies about it can only send streams that the agent then refuses (it checks every grant itself).
    ...e2eOf(value.e2e),
  };
}

function e2eOf(v: unknown): Pick<Presence, 'e2e'> {
  const capability = e2eCapabilityOf(v);
  return capability ? { e2e: capability } : {};
}
