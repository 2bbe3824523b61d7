/**
 * What the Auth Service keeps in the Backend: the keys and the stored shapes that its modules share. Each record
 * has one module that writes it (authorities.ts, users.ts, joining.ts, lockadmin.ts, agents.ts, audit.ts,
 * manifests.ts for what only manifests write); the others may read it through these keys.
 */
import { randomBytes } from 'node:crypto';
import type { Backend, Item } from '../backend/index.js';
import type { AgentResources, E2ECapability } from '../tunnel/protocol.js';
import { JOIN_ROLES, type JoinRole } from '../wire/certs.js';
import type { AgentHealth } from '../wire/autoupdate.js';
import type { UserResource } from './resources/index.js';

/** The roles a join may ask for: the wire's list (src/wire/certs.ts), which agents and gwctl read too. */
export { JOIN_ROLES, type JoinRole };

/** Names of users and nodes: 1-128 letters, digits, ".", "_", "@" or "-", starting with a letter or digit. */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$/;

export const KEYS = {
  clusterName: '/cluster/name',
  authority: (type: 'host' | 'user') => `/authorities/${type}`,
  user: (name: string) => `/users/${name}`,
  role: (name: string) => `/roles/${name}`,
  token: (id: string) => `/tokens/${id}`,
  connector: (kind: string, name: string) => `/connectors/${kind}/${name}`,
  maintenance: '/cluster_maintenance_config',
  /** The managed rollout (src/auth/rollout/): its two resources, and the state the controller computed (one key). */
  autoupdateConfig: '/autoupdate/config',
  autoupdateVersion: '/autoupdate/version',
  autoupdateRollout: '/autoupdate/rollout',
  node: (hostId: string) => `/nodes/${hostId}`,
  /** One record per agent and Proxy: an agent keeps a tunnel to several Proxies (agent_mesh, proxy_peering). */
  presence: (hostId: string, proxyId: string) => `/presence/${hostId}/${proxyId}`,
  /** A Proxy's own record, kept alive by its heartbeats (src/proxy/cluster.ts). */
  proxy: (id: string) => `/proxies/${id}`,
  /** auth_service.tunnel_strategy, written by the Auth Service at start, read by every Proxy. */
  networking: '/cluster/networking',
  /**
   * An audit event: time-ordered, then 64 random bits. Events of one millisecond are many under a flood of
   * sessions, and `put` overwrites: with 32 bits, two of 12 000 events in one millisecond shared a key about once
   * in 60 runs (test/auth/audit.test.ts) and one record silently replaced the other.
   */
  event: (time: number) => `/events/${String(time).padStart(15, '0')}-${randomBytes(8).toString('hex')}`,
};

export interface StoredUser {
  resource: UserResource;
  passwordHash?: string;
  createdAt: string;
}

export interface StoredToken {
  id: string;
  roles: JoinRole[];
  expiresAt: number;
  /** 0 = unlimited until expiry. */
  uses: number;
  used: number;
  createdAt: string;
  createdBy: string;
  labels?: Record<string, string>;
}

export interface NodeRecord {
  hostId: string;
  nodename: string;
  roles: JoinRole[];
  publicAddrs: string[];
  joinedAt: string;
  source?: string;
  /** The SSH public key its host certificate certifies: what it must authenticate its reverse tunnel with. */
  sshPublicKey?: string;
  /** When it last renewed its certificates (joining.ts renewHost); absent until the first renewal. */
  renewedAt?: string;
  /**
   * Set the first time a Proxy carried this agent's valid presence proof (joining.ts markPresenceSigned): from then
   * on a presence from a Proxy in its own process needs one (an agent of an earlier version never gets it).
   */
  signsPresence?: boolean;
}

/** An agent connected to a proxy right now (written by the proxy's tunnel registry, expires unless refreshed). */
export interface Presence {
  hostId: string;
  nodename: string;
  proxyId: string;
  services: string[];
  resources: AgentResources;
  connectedAt: string;
  lastHeartbeat: string;
  /**
   * Only for an agent that joined the Auth Service directly (proxyId DIRECT_PRESENCE): where the Proxy dials its
   * listeners (host:port), written by the agent's own heartbeat (src/auth/agentapi.ts).
   */
  direct?: DirectAddrs;
  /** The agent's software version and upgrade channel, from its tunnel hello (absent for agents of earlier versions). */
  version?: string;
  channel?: string;
  /** The agent's rollout group from its hello (absent: none). */
  upgradeGroup?: string;
  /** The agent's last health message through this Proxy (absent: none yet, or an agent of an earlier version). */
  health?: AgentHealth;
  /**
   * From a Proxy: the agent's signature of this presence through it (src/auth/pki/proof.ts), checked by a remote
   * Auth Service (memberchecks.ts) and not stored from there.
   */
  proof?: { time: string; signature: string };
  /**
   * The end-to-end capability of the agent's v2 tunnel to this Proxy (its hello's, as e2eCapabilityOf keeps it),
   * written only by a Proxy that takes end-to-end streams for that tunnel on its peering listener as well (raw, the
   * `GWE2E1` line first): another Proxy grants end-to-end streams for an agent it reaches over peering only when
   * the record says so. Absent: a v1 tunnel, an agent or a Proxy of an earlier version: the classic route.
   */
  e2e?: E2ECapability;
}

/** The proxyId of the presence record a direct-join agent writes itself: it has no tunnel to any Proxy. */
export const DIRECT_PRESENCE = 'direct';

/** The listeners of a direct-join agent, as host:port the Proxy dials. */
export interface DirectAddrs {
  ssh?: string;
  kube?: string;
  desktop?: string;
}

/**
 * A Proxy of the cluster as the others and the agents see it: written by the Proxy itself every heartbeat
 * interval with a TTL of a few intervals, so a Proxy that dies drops out of every list on its own.
 */
export interface ProxyRecord {
  /** Its host ID: the same in the agents' tunnel handshake (welcome), presence records and peering. */
  id: string;
  nodename: string;
  version: string;
  /** Where clients and agents reach it: its web public address (often the load balancer's). */
  public_addr: string;
  /**
   * Every proxy_service.public_addr (public_addr is the first): the Auth Service refuses agents' joins that name
   * any of them (src/auth/reserved.ts). Absent from Proxies of earlier versions.
   */
  public_addrs?: string[];
  /** Where other Proxies reach it for peering (proxy_service.peer_public_addr, else its host and peer port). */
  peer_addr?: string;
  /** The SSH host key of its reverse-tunnel server (OpenSSH line): /webapi/find lists every live Proxy's. */
  tunnel_host_key?: string;
  /** sha256 of its automatic_upgrades_channels (canonical JSON), and the channels themselves, for drift checks. */
  channels_digest: string;
  channels: Record<string, string>;
  started_at: string;
  last_heartbeat: string;
}

/**
 * Whether a presence record counts: an agent joined directly (DIRECT_PRESENCE) while its record lives; a tunnel's
 * while the Proxy that wrote it is live (its record, `proxy`) and the tunnel is from this run of that Proxy (not
 * older than its started_at: a Proxy that restarted under the same ID does not revive the records of its previous
 * run). Proxies refresh presence far less often than their own record (src/proxy/tunnel.ts), so the Proxy's record
 * is what tells a dead Proxy's tunnels apart.
 */
export function presenceCounts(p: Presence, proxy: ProxyRecord | undefined): boolean {
  if (p.proxyId === DIRECT_PRESENCE) return true;
  return proxy !== undefined && p.connectedAt >= proxy.started_at;
}

/** An agent's newest presence, with every Proxy that holds a tunnel of it. */
export type AgentPresence = Presence & { proxies: string[] };

/**
 * One entry per agent: its newest presence (the first one seen wins a tie) and the sorted IDs of every Proxy
 * (or "direct") of the presences given. What `gwctl get nodes`, the inventory and each Proxy's view of the cluster
 * show of an agent.
 */
export function newestPerAgent(presences: Iterable<Presence>): Map<string, AgentPresence> {
  const out = new Map<string, AgentPresence>();
  for (const p of presences) {
    const seen = out.get(p.hostId);
    const proxies = [...(seen?.proxies ?? []), p.proxyId].sort();
    out.set(p.hostId, { ...(!seen || p.connectedAt > seen.connectedAt ? p : seen), proxies });
  }
  return out;
}

/** How agents keep their tunnels (auth_service.tunnel_strategy). */
export type TunnelStrategy = { type: 'agent_mesh' } | { type: 'proxy_peering'; agent_connection_count: number };

export function parseJson<T>(item: Item | undefined): T | undefined {
  return item === undefined ? undefined : (JSON.parse(item.value) as T);
}

export async function readJson<T>(backend: Backend, key: string): Promise<T | undefined> {
  return parseJson<T>(await backend.get(key));
}

