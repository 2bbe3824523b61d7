/**
 * How this Proxy reaches an agent: the one place that decides (docs/proxy.md, "Reaching an agent").
 *
 * Which agents there are: the ones with a tunnel to this Proxy, and those the cluster view (cluster.ts) says
 * another live Proxy holds, or that joined directly (a presence whose proxyId is "direct"); a local tunnel
 * stands for its agent when both exist. Lookups ask them newest first (resources.ts).
 *
 * How to reach one, tried in this order, each a Decision with a reason a log line (or a command) prints:
 *   local    this Proxy holds a tunnel of the agent: a channel in it
 *   peer     another live Proxy holds one and publishes a peering address: a stream over Proxy peering
 *            (peer.ts), to each such Proxy in turn until one answers
 *   direct   the agent joined directly and publishes its own addresses: the direct dialer (direct.ts)
 *   none     GW_ERR_TUNNEL_NOT_FOUND naming the agent, with every reason above
 * A peer that is asked never routes further: it answers from its own tunnels only (peer.ts), so no loop.
 * End-to-end streams (e2ePeers) take the peer steps only, and only a peer whose presence offers them.
 */
import type { Duplex } from 'node:stream';
import type { Presence, ProxyRecord } from '../auth/records.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { startHop, traceContextOf, traceFields, tracingEnabled, type Attributes } from '../trace.js';
import type { AgentResources, DialRequest, E2ECapability, ServiceKind } from '../tunnel/protocol.js';
import { DIRECT_PROXY_ID, type ClusterView } from './cluster.js';
import type { ReachableAgent } from './resources.js';
import type { ConnectedAgent } from './tunnel.js';

export type Decision =
  | { via: 'local'; reason: string }
  | { via: 'peer'; proxyId: string; peerAddr: string; reason: string }
  | { via: 'direct'; presence: Presence; reason: string }
  | { via: 'none'; reason: string };

/** A peer Proxy that holds an agent's tunnel offering end-to-end streams (Router.e2ePeers). */
export interface E2EPeer {
  proxyId: string;
  peerAddr: string;
  capability: E2ECapability;
}

/** What the router needs of the tunnel server. */
export interface LocalTunnels {
  list(): ConnectedAgent[];
  /** Changes whenever list() would (TunnelServer's); without it the Router builds its list on every call. */
  readonly version?: number;
  get(hostId: string): ConnectedAgent | undefined;
  dial(hostId: string, request: DialRequest): Promise<Duplex>;
}

/** The client side of Proxy peering (peer.ts PeerClient). */
export interface PeerDialer {
  dial(proxy: ProxyRecord, hostId: string, request: DialRequest): Promise<Duplex>;
}

export interface RouterOptions {
  tunnels: LocalTunnels;
  /** The cluster's Proxies and agents; without it, only local tunnels. */
  cluster?: Pick<ClusterView, 'agents' | 'locations' | 'proxy' | 'selfId' | 'presenceOf'> & { readonly version?: number };
  peers?: PeerDialer;
  /** Agents joined directly (direct.ts). */
  direct?: (presence: Presence, request: DialRequest) => Promise<Duplex>;
  /** The Dialer's decision for an address, as span attributes (src/dial/select.ts decisionAttributes). */
  dialPlan?: (address: string) => Attributes;
}

/** What resources.ts looks resources up in. */
export interface AgentSource {
  agents(): ReachableAgent[];
  dial(hostId: string, request: DialRequest): Promise<Duplex>;
}

export class Router implements AgentSource {
  private readonly log = logger('router');

  /** agents() as last built, and the versions of the tunnels and the cluster view it was built from. */
  private cached: { tunnels: number; cluster: number; agents: ReachableAgent[] } | undefined;

  constructor(private readonly options: RouterOptions) {}

  /**
   * Every agent this Proxy can reach: local tunnels, then those only the cluster knows of. Built again only when
   * either source changed: every HTTP request on the web port and every client connection looks resources up in
   * it, and building it is O(agents) (10 000 agents made it half of a busy Proxy's CPU). Callers must not change it.
   */
  agents(): ReachableAgent[] {
    const tunnels = this.options.tunnels.version;
    const cluster = this.options.cluster ? this.options.cluster.version : 0;
    if (tunnels === undefined || cluster === undefined) return this.build();
    const hit = this.cached;
    if (hit && hit.tunnels === tunnels && hit.cluster === cluster) return hit.agents;
    const agents = this.build();
    this.cached = { tunnels, cluster, agents };
    return agents;
  }

  private build(): ReachableAgent[] {
    const local = this.options.tunnels.list();
    const out: ReachableAgent[] = [...local];
    const seen = new Set(local.map((a) => a.hostId));
    for (const p of this.options.cluster?.agents() ?? []) {
      if (seen.has(p.hostId)) continue;
      out.push(fromPresence(p));
    }
    return out;
  }

  /** The ways to reach an agent, in the order dial() tries them; the last says why nothing else is left. */
  plan(hostId: string): Decision[] {
    const { tunnels, cluster, peers, direct } = this.options;
    const steps: Decision[] = [];
    const skipped: string[] = [];
    if (tunnels.get(hostId)) steps.push({ via: 'local', reason: 'this Proxy holds a tunnel of the agent' });
    else skipped.push('no tunnel to this Proxy');
    for (const proxyId of cluster?.locations(hostId) ?? []) {
      if (proxyId === cluster?.selfId) continue;
      const record = cluster?.proxy(proxyId);
      if (!record?.peer_addr) skipped.push(`Proxy ${proxyId} holds a tunnel but publishes no peering address`);
      else if (!peers) skipped.push(`Proxy ${proxyId} holds a tunnel but peering is off on this Proxy`);
      else steps.push({ via: 'peer', proxyId, peerAddr: record.peer_addr, reason: `Proxy ${proxyId} holds a tunnel (peering at ${record.peer_addr})` });
    }
    const joined = cluster?.presenceOf(hostId, DIRECT_PROXY_ID);
    if (joined && direct) steps.push({ via: 'direct', presence: joined, reason: 'the agent joined directly and publishes its addresses' });
    else if (joined) skipped.push('the agent joined directly but this Proxy has no direct dialer');
    if (!cluster?.locations(hostId).some((id) => id !== cluster.selfId) && !joined) skipped.push('no other live Proxy holds a tunnel of it');
    steps.push({ via: 'none', reason: skipped.join('; ') || 'every way was tried' });
    return steps;
  }

  /**
   * End-to-end streams to an agent whose tunnel this Proxy does not hold: the live peers (in plan() order) that
   * hold a tunnel of it offering end-to-end streams, by the presence each wrote (its `e2e` capability: written only
   * by a Proxy whose peering listener takes them raw, peer.ts), with their peering address; else why none.
   */
  e2ePeers(hostId: string): { peers: E2EPeer[]; reason: string } {
    const peers: E2EPeer[] = [];
    const skipped: string[] = [];
    for (const step of this.plan(hostId)) {
      if (step.via === 'local') skipped.push('this Proxy holds a tunnel of it');
      else if (step.via === 'direct') skipped.push('it joined directly (no tunnel)');
      else if (step.via === 'peer') {
        const capability = this.options.cluster?.presenceOf(hostId, step.proxyId)?.e2e;
        if (capability) peers.push({ proxyId: step.proxyId, peerAddr: step.peerAddr, capability });
        else skipped.push(`its tunnel to Proxy ${step.proxyId} offers no end-to-end streams (a v1 tunnel, or an agent or Proxy of an earlier version)`);
      } else if (peers.length === 0) skipped.push(step.reason);
    }
    return { peers, reason: peers.length > 0 ? `Proxy ${peers.map((p) => p.proxyId).join(', ')} holds its tunnel (peering)` : skipped.join('; ') };
  }

  /** A stream to the resource the request names, through the agent, by the first way of plan() that works. */
  async dial(hostId: string, request: DialRequest): Promise<Duplex> {
    const failures: string[] = [];
    let last: GatewayError | undefined;
    for (const step of this.plan(hostId)) {
      if (step.via === 'none') {
        if (last) throw failures.length > 1 ? new GatewayError(last.code, `${last.message} (also tried: ${failures.slice(0, -1).join('; ')})`, { hint: last.hint }) : last;
        throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `agent ${this.name(hostId)} is not reachable from this Proxy: ${step.reason}`, {
          hint: "The agent may be offline, or its Proxy unreachable; 'gwctl get proxies' lists the live Proxies.",
        });
      }
      // One span per way tried, with the decision and its reason: the next hop (the peer or the agent) is its child.
      const hop = startHop('proxy.route', { kind: 'client', parent: traceContextOf(request), trusted: true, ...(tracingEnabled() ? { attributes: this.decisionAttributes(step, hostId) } : {}) });
      try {
        const stream = await this.attempt(step, hostId, { ...request, ...traceFields(hop.context) });
        this.log.debug({ hostId, via: step.via, reason: step.reason, resource: request.resource }, 'agent reached');
        hop.end();
        return stream;
      } catch (err) {
        last = toGatewayError(err);
        hop.fail(last.code);
        hop.end();
        failures.push(`${step.via}${step.via === 'peer' ? ` ${step.proxyId}` : ''}: ${last.message}`);
        this.log.info({ hostId, via: step.via, reason: step.reason, code: last.code, err: last.message }, 'cannot reach the agent this way; trying the next');
        // The agent answered and the resource failed: another way to the same agent would answer the same.
        if (last.code === 'GW_ERR_TUNNEL_DIAL_FAILED') throw last;
      }
    }
    throw new GatewayError('GW_ERR_INTERNAL', 'the route plan has no last step');
  }

  private decisionAttributes(step: Exclude<Decision, { via: 'none' }>, hostId: string): Attributes {
    const peer = step.via === 'peer' ? { 'gateway.router.peer_id': step.proxyId, ...this.options.dialPlan?.(step.peerAddr) } : {};
    return { 'gateway.router.via': step.via, 'gateway.router.reason': step.reason, 'gateway.agent.host_id': hostId, ...peer };
  }

  private attempt(step: Exclude<Decision, { via: 'none' }>, hostId: string, request: DialRequest): Promise<Duplex> {
    switch (step.via) {
      case 'local':
        return this.options.tunnels.dial(hostId, request);
      case 'peer':
        return this.options.peers!.dial(this.options.cluster!.proxy(step.proxyId)!, hostId, request);
      case 'direct':
        return this.options.direct!(step.presence, request);
    }
  }

  private name(hostId: string): string {
    const known = this.agents().find((a) => a.hostId === hostId);
    return known ? `"${known.nodename}" (${hostId})` : hostId;
  }
}

function fromPresence(p: Presence): ReachableAgent {
  return {
    hostId: p.hostId,
    nodename: p.nodename,
    services: p.services.filter((s): s is ServiceKind => ['ssh', 'db', 'app', 'desktop', 'kube'].includes(s)),
    resources: p.resources as AgentResources,
    connectedAt: new Date(p.connectedAt),
  };
}
