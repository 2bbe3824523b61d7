/**
 * Reverse-tunnel metrics, on both ends. The Proxy: the agents connected now, by tunnel protocol (v1: SSH, v2:
 * frames over TLS), and the agents it dropped for missing their heartbeats. An agent: its tunnels up now, by rung
 * of the transport ladder (src/agent/ladder.ts: alpn, tunnel-port, upgrade), its reconnects, and the times the
 * Proxy missed its heartbeats. Labels are the protocol and rung enums; never a host ID or an address.
 */
import { counter, gauge } from './define.js';

export const TUNNEL_PROTOCOLS = ['v1', 'v2'] as const;
/** The rungs of the transport ladder, and none before the first one was chosen. */
export const RUNGS = ['alpn', 'tunnel-port', 'upgrade', 'none'] as const;

const AREA = 'tunnels';
/** The tunnel servers of this process: each tells its agents' protocols at a scrape. */
const servers = new Set<() => Iterable<1 | 2>>();
const agents = gauge({
  name: 'gateway_tunnel_agents_connected',
  help: 'Agents holding a reverse tunnel to this Proxy now, by tunnel protocol.',
  area: AREA,
  labels: { protocol: TUNNEL_PROTOCOLS },
  collect: () => {
    agents.metric.reset();
    if (servers.size === 0) return; // no Proxy in this process: no series
    const n = { v1: 0, v2: 0 };
    for (const read of servers) for (const p of read()) n[p === 1 ? 'v1' : 'v2']++;
    agents.set({ protocol: 'v1' }, n.v1);
    agents.set({ protocol: 'v2' }, n.v2);
  },
});
const proxyMissed = counter({
  name: 'gateway_tunnel_heartbeats_missed_total',
  help: 'Tunnels dropped because the other end missed its heartbeats (side proxy: this Proxy dropped an agent; side agent: this agent dropped its Proxy).',
  area: AREA,
  labels: { side: ['proxy', 'agent'], transport: [...TUNNEL_PROTOCOLS, ...RUNGS] },
});
const up = gauge({ name: 'gateway_agent_tunnels_up', help: "This agent's reverse tunnels welcomed by a Proxy now, by rung of the transport ladder.", area: AREA, labels: { transport: RUNGS } });
const reconnects = counter({ name: 'gateway_agent_tunnel_reconnects_total', help: "This agent's tunnel retries after a tunnel went down or an attempt failed, by the rung last used.", area: AREA, labels: { transport: RUNGS } });

/** A tunnel server: read gives the protocol of each agent it holds now (at a scrape). Returns the unregister. */
export function watchTunnelServer(read: () => Iterable<1 | 2>): () => void {
  servers.add(read);
  return () => servers.delete(read);
}

export function recordProxyMissedHeartbeats(protocol: 1 | 2): void {
  proxyMissed.inc({ side: 'proxy', transport: `v${protocol}` });
}

export function recordAgentMissedHeartbeats(rung: string | undefined): void {
  proxyMissed.inc({ side: 'agent', transport: rung ?? 'none' });
}

/** An agent's tunnel was welcomed on rung; call the result when it goes down. */
export function recordAgentTunnelUp(rung: string | undefined): () => void {
  const child = up.with({ transport: rung ?? 'none' });
  child.inc();
  let done = false;
  return () => {
    if (done) return;
    done = true;
    child.dec();
  };
}

export function recordAgentReconnect(rung: string | undefined): void {
  reconnects.inc({ transport: rung ?? 'none' });
}
