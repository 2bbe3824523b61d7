/**
 * Finding a resource among the agents this Proxy can reach (router.ts: its own tunnels, those of the other live
 * Proxies, agents joined directly), for every service of the Proxy (access.ts, webapps.ts, sshjump.ts). One rule
 * for every lookup: the agents are asked most recently connected first, so that an agent
 * that reconnected wins over a stale entry of itself, and the first that serves the resource is the one.
 *
 * What a route reaches is the protocol table's (protocols.ts): its access kinds, in order, and for databases the
 * protocol the database must speak.
 */
import type { AccessKind } from '../auth/rbac.js';
import type { AgentResources, ServiceKind } from '../tunnel/protocol.js';
import { PROTOCOLS, protocolNamed, type Protocol } from './protocols.js';

/** An agent as a lookup sees it, wherever its tunnel is (a ReachableAgent of this Proxy is one). */
export interface ReachableAgent {
  hostId: string;
  nodename: string;
  services: readonly ServiceKind[];
  resources: AgentResources;
  connectedAt: Date;
}

/** A resource found on an agent, with what the access check and the dial need. */
export interface Target {
  agent: ReachableAgent;
  /** The resource's name (a node's is its node name). */
  name: string;
  /** The agent service that carries connections to it. */
  service: ServiceKind;
  access: AccessKind;
  labels: Record<string, string>;
}

/** What a client asks for: a name and, for gateway-tcp, whether it means an app or a desktop. */
export interface Wanted {
  resource: string;
  kind?: 'app' | 'desktop';
}

/** The agent service that carries each kind of resource. */
const SERVICE_OF: Record<AccessKind, ServiceKind> = { node: 'ssh', db: 'db', app: 'app', windows_desktop: 'desktop', kube_cluster: 'kube' };

/**
 * The first answer `pick` gives, asking the agents most recently connected first (of agents connected at the same
 * time, the one listed first). One pass, no sort: an agent no newer than the best answer so far is not asked.
 */
export function findNewest<T>(agents: readonly ReachableAgent[], pick: (agent: ReachableAgent) => T | undefined): T | undefined {
  let best: T | undefined;
  let bestAt = -Infinity;
  for (const agent of agents) {
    const at = agent.connectedAt.getTime();
    if (best !== undefined && at <= bestAt) continue;
    const found = pick(agent);
    if (found !== undefined) {
      best = found;
      bestAt = at;
    }
  }
  return best;
}

/**
 * The resource named `wanted.resource` among the kinds route `route` reaches; on one agent, kinds are tried in
 * the table's order. `wanted.kind` "app" rules out desktops and "desktop" rules out apps; any other value rules
 * out nothing.
 */
export function findTarget(agents: readonly ReachableAgent[], route: string, wanted: Wanted, table: readonly Protocol[] = PROTOCOLS): Target | undefined {
  const row = protocolNamed(route, table);
  if (!row) return undefined;
  const ruledOut: AccessKind | undefined = wanted.kind === 'app' ? 'windows_desktop' : wanted.kind === 'desktop' ? 'app' : undefined;
  const kinds = row.access.filter((k) => k !== ruledOut);
  return findNewest(agents, (agent) => {
    for (const kind of kinds) {
      const found = resourceOn(agent, kind, wanted.resource, row);
      if (found) return found;
    }
    return undefined;
  });
}

/** An HTTP app (not a TCP one) whose public address is `host`. */
export function findWebApp(agents: readonly ReachableAgent[], host: string): Target | undefined {
  return findNewest(agents, (agent) => {
    const app = agent.resources.apps.find((a) => a.public_addr === host && a.kind !== 'tcp');
    return app ? target(agent, 'app', app.name, app.labels) : undefined;
  });
}

/** A resource of one kind on one agent, by name. */
function resourceOn(agent: ReachableAgent, kind: AccessKind, name: string, row: Protocol): Target | undefined {
  const { resources } = agent;
  const byName = <R extends { name: string }>(list: readonly R[]) => list.find((r) => r.name === name);
  switch (kind) {
    case 'node': {
      // A node by name, host ID, or host ID qualified with the cluster name; a ":port" suffix is ignored.
      const host = name.replace(/:\d+$/, '');
      const isIt = agent.nodename === host || agent.hostId === host || host.startsWith(`${agent.hostId}.`);
      return agent.services.includes('ssh') && isIt ? target(agent, kind, agent.nodename, resources.node_labels ?? {}) : undefined;
    }
    case 'db': {
      const db = resources.databases.find((d) => d.name === name && d.protocol === row.database);
      return db ? target(agent, kind, db.name, db.labels) : undefined;
    }
    case 'app':
      return found(agent, kind, byName(resources.apps));
    case 'windows_desktop':
      return found(agent, kind, byName(resources.desktops));
    case 'kube_cluster':
      return found(agent, kind, byName(resources.kube_clusters));
  }
}

/** A resource of one kind by name, whatever route reaches it (a database of any protocol): what `gwctl probe` names. */
export function findByKind(agents: readonly ReachableAgent[], kind: AccessKind, name: string): Target | undefined {
  return findNewest(agents, (agent) => (kind === 'db' ? found(agent, kind, agent.resources.databases.find((d) => d.name === name)) : resourceOn(agent, kind, name, PROTOCOLS[0]!)));
}

function found(agent: ReachableAgent, kind: AccessKind, resource: { name: string; labels: Record<string, string> } | undefined): Target | undefined {
  return resource ? target(agent, kind, resource.name, resource.labels) : undefined;
}

function target(agent: ReachableAgent, access: AccessKind, name: string, labels: Record<string, string>): Target {
  return { agent, name, service: SERVICE_OF[access], access, labels };
}
