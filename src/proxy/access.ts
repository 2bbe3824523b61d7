/**
 * Client → resource through the Proxy: a TLS connection with a protocol's ALPN (gateway-postgres,
 * gateway-mysql, gateway-mongodb, gateway-redis, gateway-tcp) and the user's client certificate arrives from
 * the front door already terminated. Then:
 *
 *   1. the identity is the user certificate (signed by the user CA of this cluster), as it stands now: the user
 *      must still exist and not be locked, and only the roles it still has count (AuthService.resolveCaller);
 *      the connection is tracked in auth.sessions from here on, so a lock or a deletion closes it;
 *   2. the client sends one JSON line naming the resource: {"resource": "<name>"} (gwsh does this); with
 *      "check": true the Proxy answers whether the connection would be allowed and dials nothing;
 *   3. the resource is looked up among the connected agents, and the user's roles must allow its labels;
 *   4. the Proxy dials it through the agent's tunnel, answers one line ({"ok": true} or {"ok": false, "error":
 *      {code, message}}: never a hang), and then the bytes flow both ways with back-pressure and half-close.
 *
 * The database keeps authenticating its own users: the Proxy only decides who may reach it.
 */
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { peerIdentityOf } from '../auth/api.js';
import { canAccess, type AccessKind } from '../auth/rbac.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { GatewayError, isGatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import type { ConnInfo } from '../mux/multiplexer.js';
import { connectionOf } from '../net/deadlines.js';
import { readJsonLine, writeJsonLine } from '../stream/lines.js';
import { splice } from '../stream/splice.js';
import type { DialAnswer, ServiceKind } from '../tunnel/protocol.js';
import type { ConnectedAgent, TunnelServer } from './tunnel.js';

export interface RouteHeader {
  resource: string;
  /** gateway-proxy-ssh: the OS login the client will ask the node for. */
  login?: string;
  /** For gateway-tcp: which kind of resource (app or desktop); databases are implied by the protocol. */
  kind?: 'app' | 'desktop';
  /**
   * Only ask: every check runs (identity, resource connected, login, roles) and the answer says whether a real
   * connection would be allowed, but nothing is dialled. gwsh's local proxies ask this at start, so that a
   * server taking one client at a time never sees a connection that is opened and closed at once.
   */
  check?: boolean;
}

type Target = { agent: ConnectedAgent; service: ServiceKind; access: AccessKind; labels: Record<string, string> };

export function findTarget(agents: ConnectedAgent[], route: string, header: RouteHeader): Target | undefined {
  const protocol = route.startsWith('gateway-') ? route.slice('gateway-'.length) : route;
  // Most recently connected first: a reconnected agent wins over a stale entry.
  const sorted = [...agents].sort((a, b) => b.connectedAt.getTime() - a.connectedAt.getTime());
  for (const agent of sorted) {
    if (protocol === 'proxy-ssh') {
      // A node by name, host ID, or host ID qualified with the cluster name.
      const name = header.resource.replace(/:\d+$/, '');
      if (agent.services.includes('ssh') && (agent.nodename === name || agent.hostId === name || name.startsWith(`${agent.hostId}.`))) {
        return { agent, service: 'ssh', access: 'node', labels: agent.resources.node_labels ?? {} };
      }
    } else if (['postgres', 'mysql', 'mongodb', 'redis'].includes(protocol)) {
      const db = agent.resources.databases.find((d) => d.name === header.resource && d.protocol === protocol);
      if (db) return { agent, service: 'db', access: 'db', labels: db.labels };
    } else if (protocol === 'tcp') {
      if (header.kind !== 'desktop') {
        const app = agent.resources.apps.find((a) => a.name === header.resource);
        if (app) return { agent, service: 'app', access: 'app', labels: app.labels };
      }
      if (header.kind !== 'app') {
        const desktop = agent.resources.desktops.find((d) => d.name === header.resource);
        if (desktop) return { agent, service: 'desktop', access: 'windows_desktop', labels: desktop.labels };
      }
    }
  }
  return undefined;
}

/** headerTimeoutMs: how long the client may take to send its route header (gateway.limits.header_timeout). */
export function createAccessHandler(auth: ProxyAuth, tunnels: TunnelServer, headerTimeoutMs = 20_000): (stream: Duplex, info: ConnInfo) => void {
  const log = logger('access');
  return (stream, info) => {
    const socket = stream as TLSSocket;
    const client = `${info.remoteAddress}:${info.remotePort}`;
    const fail = (err: unknown) => {
      const e = toGatewayError(err);
      log.info({ route: info.route, client, code: e.code, err: e.message }, 'connection to a resource refused');
      const answer: DialAnswer = { ok: false, error: { code: e.code, message: e.message } };
      socket.end(`${JSON.stringify(answer)}\n`);
    };
    void (async () => {
      const certified = peerIdentityOf(auth, socket);
      if (certified.kind !== 'user') throw new GatewayError('GW_ERR_ACCESS_DENIED', 'only user certificates may reach resources');
      // Tracked before the checks: a lock that lands while they run still closes this connection.
      const untrack = auth.sessions.track(certified, `${info.route} ${client}`, (why) => {
        log.info({ user: certified.name, route: info.route, client, code: why.code }, 'connection closed: identity revoked');
        socket.destroy();
      });
      socket.once('close', untrack);
      if (socket.destroyed) untrack();
      const identity = await auth.resolveCaller(certified);
      const header = await readJsonLine<RouteHeader>(socket, { what: 'route header', timeoutMs: headerTimeoutMs, maxBytes: 4096 }).catch((err: unknown) => {
        // The line reader enforces this deadline itself (so that the client is told why): count it with the others.
        if (isGatewayError(err) && err.code === 'GW_ERR_TUNNEL_TIMEOUT') connectionOf(socket).count('route-header');
        throw err;
      });
      if (typeof header.resource !== 'string' || header.resource === '') throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the route header names no resource');
      const target = findTarget(tunnels.list(), info.route, header);
      if (!target) {
        throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `no connected agent serves ${describe(info.route)} "${header.resource}"`, {
          hint: "List what is reachable with 'gwsh ls', 'gwsh db ls' or 'gwsh apps ls'; the agent that serves it may be offline.",
        });
      }
      if (target.service === 'ssh') {
        const login = header.login ?? '';
        if (!login || !(identity.logins ?? []).includes(login)) {
          throw new GatewayError('GW_ERR_ACCESS_DENIED', `login "${login}" is not allowed for ${identity.name} (allowed: ${(identity.logins ?? []).join(', ') || 'none'})`, {
            hint: "Ask for a role whose logins include it, then sign in again; 'gwsh status' shows your logins.",
          });
        }
      }
      const roles = await auth.rolesOf(identity.roles);
      if (!canAccess(roles, target.access, target.labels)) {
        throw new GatewayError('GW_ERR_ACCESS_DENIED', `your roles (${identity.roles.join(', ') || 'none'}) do not allow ${describe(info.route)} "${header.resource}" (labels ${JSON.stringify(target.labels)})`, {
          hint: `Ask for a role whose ${LABEL_FIELD[target.access]} match these labels, then sign in again.`,
        });
      }
      if (header.check === true) {
        socket.end(`${JSON.stringify({ ok: true } satisfies DialAnswer)}\n`);
        log.debug({ user: identity.name, route: info.route, resource: header.resource, client }, 'access check answered');
        return;
      }
      const channel = await tunnels.dial(target.agent.hostId, {
        service: target.service,
        resource: target.service === 'ssh' ? `${header.login}@${target.agent.nodename}` : header.resource,
        client_src: client,
        client_dst: `${info.localAddress}:${info.localPort}`,
        user: identity.name,
      });
      writeJsonLine(socket, { ok: true } satisfies DialAnswer);
      log.info({ user: identity.name, route: info.route, resource: header.resource, agent: target.agent.nodename, client }, 'connection to a resource opened');
      splice(socket, channel);
    })().catch(fail);
  };
}

const LABEL_FIELD: Record<AccessKind, string> = {
  node: 'node_labels',
  db: 'db_labels',
  app: 'app_labels',
  kube_cluster: 'kubernetes_labels',
  windows_desktop: 'windows_desktop_labels',
};

function describe(route: string): string {
  if (route === 'gateway-proxy-ssh') return 'node';
  return route === 'gateway-tcp' ? 'app or desktop' : `${route.replace('gateway-', '')} database`;
}
