/**
 * A Proxy's view of the cluster it belongs to: the other Proxies (each writes its own record with a TTL and
 * refreshes it every heartbeat interval; this one too) and where every agent has a tunnel (the presence records
 * the tunnel servers write, one per agent and Proxy, refreshed far less often: a presence counts while the record
 * of the Proxy that wrote it lives, presenceCounts). Kept in memory from one list and then the Backend's watch
 * (through ProxyAuth: in process, or over the Auth API), so that routing a client never waits for a lookup.
 *
 * Events: 'proxies' when the set of live Proxies or the tunnel strategy changed (the tunnel server then tells its
 * agents: discovery); 'agents' when an agent's presence changed anywhere.
 *
 * Ordering: the watch starts before the list; events that arrive while the list is in flight are kept and
 * applied after it, in order. Every event carries the whole state of its key, so the result is the state after
 * the last event, whatever the list saw. A gap (resync) lists again the same way.
 */
import { createHash } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { PresenceEvent, ProxyDirectory } from '../auth/proxyauth.js';
import { newestPerAgent, presenceCounts, type AgentPresence, type Presence, type ProxyRecord, type TunnelStrategy } from '../auth/records.js';
import type { UpgradeChannelConfig } from '../config/index.js';
import { logger } from '../log.js';

/** The proxyId of the presence an agent joined directly writes (direct.ts): live without any Proxy record. */
export const DIRECT_PROXY_ID = 'direct';

export interface ClusterViewOptions {
  directory: ProxyDirectory;
  /** This Proxy's record without the times: the view adds started_at and last_heartbeat. */
  self: Omit<ProxyRecord, 'started_at' | 'last_heartbeat' | 'channels' | 'channels_digest'>;
  channels: Readonly<Record<string, UpgradeChannelConfig>>;
  heartbeatMs: number;
  /** How long a record lives without a heartbeat. */
  ttlMs: number;
  clock?: () => number;
}

/** The canonical form of automatic_upgrades_channels that Proxies compare: name → "static <v>" or "forward <url>". */
export function channelSummary(channels: Readonly<Record<string, UpgradeChannelConfig>>): { channels: Record<string, string>; digest: string } {
  const names = Object.keys(channels).sort();
  const summary: Record<string, string> = {};
  for (const name of names) {
    const c = channels[name]!;
    summary[name] = c.static_version !== undefined ? `static ${c.static_version}` : `forward ${c.forward_url ?? ''}`;
  }
  return { channels: summary, digest: createHash('sha256').update(JSON.stringify(summary)).digest('hex') };
}

export class ClusterView extends EventEmitter {
  private readonly log = logger('cluster');
  private readonly proxyMap = new Map<string, ProxyRecord>();
  /** hostId → proxyId → presence. */
  private readonly presence = new Map<string, Map<string, Presence>>();
  private strategyNow: TunnelStrategy = { type: 'agent_mesh' };
  private readonly startedAt: string;
  private channels: { channels: Record<string, string>; digest: string };
  private timer: NodeJS.Timeout | undefined;
  private unwatch: (() => void) | undefined;
  private pending: PresenceEvent[] | undefined;
  private closed = false;
  private peerAddr: string | undefined;

  constructor(private readonly options: ClusterViewOptions) {
    super();
    this.startedAt = new Date(this.now()).toISOString();
    this.channels = channelSummary(options.channels);
  }

  get selfId(): string {
    return this.options.self.id;
  }

  private now(): number {
    return (this.options.clock ?? Date.now)();
  }

  /** Writes this Proxy's record, then lists and watches the others. */
  async start(): Promise<void> {
    await this.heartbeat();
    this.timer = setInterval(() => void this.heartbeat(), this.options.heartbeatMs);
    this.timer.unref();
    this.unwatch = this.options.directory.watchCluster({
      presence: (event) => (this.pending ? this.pending.push(event) : this.apply(event)),
      proxies: () => void this.refreshProxies(),
      resync: () => void this.resync(),
    });
    await this.resync();
  }

  /** This Proxy's record as it is written now. */
  selfRecord(): ProxyRecord {
    const now = new Date(this.now()).toISOString();
    const peer = this.peerAddr ?? this.options.self.peer_addr;
    return { ...this.options.self, ...(peer ? { peer_addr: peer } : {}), channels: this.channels.channels, channels_digest: this.channels.digest, started_at: this.startedAt, last_heartbeat: now };
  }

  /** SIGHUP: the version server's channels changed; the next heartbeat publishes them (this one now). */
  setChannels(channels: Readonly<Record<string, UpgradeChannelConfig>>): void {
    this.channels = channelSummary(channels);
    void this.heartbeat();
  }

  private async heartbeat(): Promise<void> {
    if (this.closed) return;
    try {
      await this.options.directory.heartbeatProxy(this.selfRecord(), this.options.ttlMs);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'cannot write this Proxy\'s record');
    }
  }

  private async resync(): Promise<void> {
    this.pending = [];
    try {
      const list = await this.options.directory.listPresence();
      this.presence.clear();
      this.version++;
      for (const p of list) this.put(p);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'cannot list where agents are');
    } finally {
      const pending = this.pending ?? [];
      this.pending = undefined;
      for (const event of pending) this.apply(event);
    }
    this.emit('agents');
    await this.refreshProxies();
  }

  private async refreshProxies(): Promise<void> {
    try {
      const [list, strategy] = await Promise.all([this.options.directory.listProxies(), this.options.directory.tunnelStrategy()]);
      const before = this.signature();
      this.proxyMap.clear();
      for (const p of list) this.proxyMap.set(p.id, p);
      if (!this.closed) this.proxyMap.set(this.selfId, this.proxyMap.get(this.selfId) ?? this.selfRecord());
      this.strategyNow = strategy;
      if (this.signature() !== before) {
        this.version++;
        this.emit('proxies');
      }
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'cannot list the Proxies');
    }
  }

  private signature(): string {
    return JSON.stringify([[...this.proxyMap.values()].map((p) => [p.id, p.public_addr, p.peer_addr, p.channels_digest]).sort(), this.strategyNow]);
  }

  /**
   * Changes when the set of agents or what they serve may have changed (a presence added, removed, or from a new
   * connection: the hello is the only place an agent's resources come from), or the live Proxies: not on the
   * heartbeats that only renew a presence. The Router keeps its list of agents between changes.
   */
  version = 0;

  private put(p: Presence): void {
    let byProxy = this.presence.get(p.hostId);
    if (!byProxy) this.presence.set(p.hostId, (byProxy = new Map()));
    if (byProxy.get(p.proxyId)?.connectedAt !== p.connectedAt) this.version++;
    byProxy.set(p.proxyId, p);
  }

  private apply(event: PresenceEvent): void {
    if (event.type === 'put') this.put(event.presence);
    else {
      const byProxy = this.presence.get(event.hostId);
      if (byProxy?.delete(event.proxyId)) this.version++;
      if (byProxy?.size === 0) this.presence.delete(event.hostId);
    }
    this.emit('agents');
  }

  /** The live Proxies, this one included, by ID. */
  proxies(): ProxyRecord[] {
    return [...this.proxyMap.values()].sort((a, b) => a.id.localeCompare(b.id));
  }

  proxy(id: string): ProxyRecord | undefined {
    return this.proxyMap.get(id);
  }

  strategy(): TunnelStrategy {
    return this.strategyNow;
  }

  /** Where other Proxies reach this one for peering: set once the peering listener is bound (the next heartbeat publishes it). */
  setPeerAddr(addr: string | undefined): void {
    this.peerAddr = addr;
    void this.heartbeat();
  }

  /** Whether a presence counts (presenceCounts: its Proxy is live and it is from that Proxy's current run; or direct). */
  private live(p: Presence): boolean {
    return presenceCounts(p, this.proxyMap.get(p.proxyId));
  }

  /** The Proxies that hold a tunnel of the agent right now (live ones only; "direct" is not a Proxy). */
  locations(hostId: string): string[] {
    return [...(this.presence.get(hostId)?.values() ?? [])].filter((p) => p.proxyId !== DIRECT_PROXY_ID && this.live(p)).map((p) => p.proxyId);
  }

  /** The agent's presence on one Proxy (or DIRECT_PROXY_ID), when live. */
  presenceOf(hostId: string, proxyId: string): Presence | undefined {
    const p = this.presence.get(hostId)?.get(proxyId);
    return p && this.live(p) ? p : undefined;
  }

  /** One presence per agent (its newest tunnel anywhere), with every live Proxy holding one. */
  agents(): AgentPresence[] {
    const live = [...this.presence.values()].flatMap((byProxy) => [...byProxy.values()]).filter((p) => this.live(p));
    return [...newestPerAgent(live).values()];
  }

  /** Stops the heartbeat and the watch and removes this Proxy's record (a graceful leave: agents drop their tunnel to it). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.unwatch?.();
    await this.options.directory.removeProxy(this.selfId).catch(() => undefined);
  }
}
