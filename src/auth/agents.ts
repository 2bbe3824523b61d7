/**
 * What the cluster knows about its agents: their node records (written at join, joining.ts), their presence
 * (written by the Proxies' tunnel registries, expiring unless refreshed), the inventory a user may reach through
 * them, and the cluster_maintenance_config their upgraders read.
 */
import { watchAcrossGaps, type Backend } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { CallerCheck } from './callers.js';
import type { Identity } from './pki.js';
import { canAccess, type AccessKind } from './rbac.js';
import { KEYS, newestPerAgent, presenceCounts, readJson, type AgentPresence, type NodeRecord, type Presence, type ProxyRecord, type TunnelStrategy } from './records.js';
import type { ClusterWatchHandlers } from './proxyauth.js';
import type { Resource } from './resources/index.js';

export interface InventoryItem {
  name: string;
  labels: Record<string, string>;
  agent: string;
  host_id: string;
  connected_since: string;
  protocol?: string;
  public_addr?: string;
  /** Nodes: the SSH host certificate, for gwsh known-hosts. */
  host_cert?: string;
}

/** The kinds `GET /v1/inventory/:kind` lists, and the access kind each is checked against. */
const INVENTORY_KINDS: ReadonlyMap<string, AccessKind> = new Map([
  ['node', 'node'],
  ['nodes', 'node'],
  ['db', 'db'],
  ['app', 'app'],
  ['apps', 'app'],
  ['desktop', 'windows_desktop'],
  ['desktops', 'windows_desktop'],
  ['kube', 'kube_cluster'],
]);

export class AgentDirectory {
  constructor(
    private readonly backend: Backend,
    private readonly clusterName: string,
    private readonly callers: CallerCheck,
  ) {}

  async setPresence(presence: Presence, ttlMs: number): Promise<void> {
    // The agent's proof is checked on the way in (memberchecks.ts), never kept.
    const { proof: _proof, ...stored } = presence;
    await this.backend.put(KEYS.presence(presence.hostId, presence.proxyId), JSON.stringify(stored), { ttlMs });
  }

  /**
   * Removes the presence record of an agent on one Proxy; with connectedAt, only the record of that tunnel (a
   * reconnect to the same Proxy wrote a newer one meanwhile, which stays).
   */
  async clearPresence(hostId: string, proxyId: string, connectedAt?: string): Promise<void> {
    const item = await this.backend.get(KEYS.presence(hostId, proxyId));
    if (!item) return;
    if (connectedAt !== undefined && (JSON.parse(item.value) as Presence).connectedAt !== connectedAt) return;
    try {
      await this.backend.atomicWrite([{ key: item.key, revision: item.revision }], [{ type: 'delete', key: item.key }]);
    } catch (err) {
      if (!isGatewayError(err, 'GW_ERR_BACKEND_CONFLICT')) throw err;
    }
  }

  /** The presence record of an agent on one Proxy, while it lives. */
  async presenceOf(hostId: string, proxyId: string): Promise<Presence | undefined> {
    return readJson<Presence>(this.backend, KEYS.presence(hostId, proxyId));
  }

  /** Every presence record: one per agent and Proxy that holds a tunnel of it. */
  async listPresence(): Promise<Presence[]> {
    return (await this.backend.range('/presence/')).map((i) => JSON.parse(i.value) as Presence);
  }

  /** One presence per agent (the newest tunnel), with every Proxy that holds one: the presences that count (presenceCounts). */
  async agentsOnline(): Promise<Map<string, AgentPresence>> {
    const [presence, proxies] = await Promise.all([this.listPresence(), this.listProxies()]);
    const byId = new Map(proxies.map((p) => [p.id, p]));
    return newestPerAgent(presence.filter((p) => presenceCounts(p, byId.get(p.proxyId))));
  }

  // --- the cluster's Proxies (ProxyRecord: written by each Proxy, expiring unless refreshed) ---------------------

  async heartbeatProxy(record: ProxyRecord, ttlMs: number): Promise<void> {
    await this.backend.put(KEYS.proxy(record.id), JSON.stringify(record), { ttlMs });
  }

  async removeProxy(id: string): Promise<void> {
    await this.backend.delete(KEYS.proxy(id));
  }

  /**
   * Removes the record of a Proxy that a lock names or that was removed (callers.ts decides), so that no Proxy
   * peers with it any more and no presence it wrote counts (presenceCounts): the cluster forgets it within a watch
   * round trip instead of at the record's TTL. Its heartbeats are refused meanwhile (the caller check of
   * /v1/proxy/). Returns whether a record was removed.
   */
  async forgetRevokedProxy(id: string): Promise<boolean> {
    if (!(await this.backend.get(KEYS.proxy(id)))) return false;
    const node = await this.callers.getNode(id);
    const reason = await this.callers.revocationOf({ kind: 'host', name: id, cluster: this.clusterName, roles: node?.roles ?? ['proxy'] });
    if (!reason) return false;
    await this.backend.delete(KEYS.proxy(id));
    return true;
  }

  async listProxies(): Promise<ProxyRecord[]> {
    return (await this.backend.range('/proxies/')).map((i) => JSON.parse(i.value) as ProxyRecord);
  }

  /** Every Proxy as `gwctl get proxies` shows it (unchecked: callers authorize first). */
  async proxyResources(): Promise<Resource[]> {
    return (await this.listProxies()).map((p) => ({
      kind: 'proxy',
      version: 'v2',
      metadata: { name: p.id },
      spec: { hostname: p.nodename, version: p.version, public_addr: p.public_addr, ...(p.peer_addr ? { peer_addr: p.peer_addr } : {}), channels_digest: p.channels_digest, started_at: p.started_at, last_heartbeat: p.last_heartbeat },
    }) as unknown as Resource);
  }

  async setTunnelStrategy(strategy: TunnelStrategy): Promise<void> {
    await this.backend.put(KEYS.networking, JSON.stringify({ tunnel_strategy: strategy }));
  }

  /** auth_service.tunnel_strategy as the Auth Service last wrote it; agent_mesh before any did. */
  async tunnelStrategy(): Promise<TunnelStrategy> {
    return (await readJson<{ tunnel_strategy: TunnelStrategy }>(this.backend, KEYS.networking))?.tunnel_strategy ?? { type: 'agent_mesh' };
  }

  /**
   * Changes of the Proxies and of the agents' presence, for a Proxy's view of the cluster (src/proxy/cluster.ts).
   * After a gap in the change log, onResync: the caller lists again.
   */
  watchCluster(handlers: ClusterWatchHandlers): () => void {
    const presence = watchAcrossGaps(this.backend, '/presence/', (event) => {
      if (event.type === 'put') handlers.presence({ type: 'put', presence: JSON.parse(event.item.value) as Presence });
      else {
        const [hostId = '', proxyId = ''] = event.key.slice('/presence/'.length).split('/');
        handlers.presence({ type: 'delete', hostId, proxyId });
      }
    }, () => handlers.resync());
    const proxies = watchAcrossGaps(this.backend, '/proxies/', () => handlers.proxies(), () => handlers.resync());
    const networking = watchAcrossGaps(this.backend, KEYS.networking, () => handlers.proxies(), () => handlers.resync());
    return () => {
      presence();
      proxies();
      networking();
    };
  }

  /** Every node record with its presence, as `gwctl get nodes` shows them (unchecked: callers authorize first). */
  async nodeResources(): Promise<Resource[]> {
    const online = await this.agentsOnline();
    return (await this.backend.range('/nodes/')).map((i) => {
      const n = JSON.parse(i.value) as NodeRecord;
      const p = online.get(n.hostId);
      return {
        kind: 'node',
        version: 'v2',
        metadata: { name: n.hostId, ...(p?.resources.node_labels ? { labels: p.resources.node_labels } : {}) },
        spec: {
          hostname: n.nodename,
          roles: n.roles,
          public_addrs: n.publicAddrs,
          joined_at: n.joinedAt,
          status: p ? 'online' : 'offline',
          ...(p ? { connected_since: p.connectedAt, last_heartbeat: p.lastHeartbeat, proxy: p.proxyId, proxies: p.proxies, services: p.services } : {}),
          // What a managed rollout reads (docs/upgrades.md): the version from the hello, the group, the agent's health.
          ...(p?.version ? { version: p.version } : {}),
          ...(p?.upgradeGroup ? { upgrade_group: p.upgradeGroup } : {}),
          ...(p?.health ? { health: p.health } : {}),
        },
      } as unknown as Resource;
    });
  }

  /**
   * What the caller may reach right now, from the agents' presence: nodes, databases, apps, desktops or kube
   * clusters, each with its labels, agent and since when it is connected. Filtered by the caller's roles.
   */
  async inventory(caller: Identity, kind: string): Promise<InventoryItem[]> {
    // A Map, not an object literal: "constructor" or "__proto__" must not name an inventory kind.
    const accessKind = INVENTORY_KINDS.get(kind);
    if (!accessKind) throw new GatewayError('GW_ERR_RESOURCE_KIND', `unknown inventory kind "${kind}"`, { hint: 'Kinds: node, db, app, desktop, kube.' });
    if (caller.kind !== 'admin' && caller.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'host identities have no inventory');
    if (caller.cluster !== this.clusterName && caller.kind !== 'admin') throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}"`);
    const roles = caller.kind === 'admin' ? undefined : await this.callers.rolesOf((await this.callers.resolveCaller(caller)).roles);
    const allowed = (labels: Record<string, string>) => roles === undefined || canAccess(roles, accessKind, labels);
    const items: InventoryItem[] = [];
    for (const p of (await this.agentsOnline()).values()) {
      const base = { agent: p.nodename, host_id: p.hostId, connected_since: p.connectedAt };
      if (accessKind === 'node' && p.services.includes('ssh')) {
        const labels = p.resources.node_labels ?? {};
        if (allowed(labels)) items.push({ ...base, name: p.nodename, labels, ...(p.resources.node_host_cert ? { host_cert: p.resources.node_host_cert } : {}) });
      } else if (accessKind === 'db') {
        for (const d of p.resources.databases) if (allowed(d.labels)) items.push({ ...base, name: d.name, protocol: d.protocol, labels: d.labels });
      } else if (accessKind === 'app') {
        for (const a of p.resources.apps) if (allowed(a.labels)) items.push({ ...base, name: a.name, protocol: a.kind, labels: a.labels, ...(a.public_addr ? { public_addr: a.public_addr } : {}) });
      } else if (accessKind === 'windows_desktop') {
        for (const d of p.resources.desktops) if (allowed(d.labels)) items.push({ ...base, name: d.name, labels: d.labels });
      } else if (accessKind === 'kube_cluster') {
        for (const k of p.resources.kube_clusters) if (allowed(k.labels)) items.push({ ...base, name: k.name, labels: k.labels });
      }
    }
    return items.sort((a, b) => a.name.localeCompare(b.name));
  }

  /**
   * The cluster_maintenance_config for agents (their upgraders need the windows): readable by any host
   * identity of this cluster, and by callers with read on the resource.
   */
  async maintenanceForAgent(caller: Identity): Promise<Resource | undefined> {
    if (caller.kind === 'host') {
      if (caller.cluster !== this.clusterName) throw new GatewayError('GW_ERR_ACCESS_DENIED', `identity from cluster "${caller.cluster}"`);
      await this.callers.resolveCaller(caller);
    } else {
      await this.callers.authorize(caller, 'cluster_maintenance_config', 'read');
    }
    return readJson<Resource>(this.backend, KEYS.maintenance);
  }

  /** Calls onChange after every write or removal of cluster_maintenance_config. Returns the unsubscribe function. */
  watchMaintenance(onChange: () => void): () => void {
    // After a gap in the backend's change log a change may have been missed: agents re-read it either way.
    return watchAcrossGaps(this.backend, KEYS.maintenance, () => onChange(), () => onChange());
  }
}

