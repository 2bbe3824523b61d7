/**
 * Every protocol the Proxy serves, in one table. The multiplexer's routes, the TLS routes and listeners of the
 * front door, the services the daemon plugs in, connection upgrades and the access checks are all read from it;
 * none of them keeps a list of its own.
 *
 * A row says:
 *   name      the route's name: ConnInfo.route, the multiplexer's counters, what a connection upgrade names
 *   kind      what serves it behind the front door (RouteKind below)
 *   on        how the one port tells it apart: ALPN names, a server-name prefix, or the first bytes
 *   ping      whether "<alpn>-ping" selects it too (the client asks for keep-alive pings inside the stream)
 *   access    the RBAC kinds of the resources reached through it, in the order a name is looked up among them
 *             (rbac.ts says which label field of a role selects each kind)
 *   database  for a database route: the protocol the database must speak
 *   listener  proxy_listener_mode separate: the listener that serves it and what that listener expects
 *
 * Proxy peering is not a row: it has its own listener (peer_listen_addr, 3021) in both listener modes and is
 * never reached through the one port (src/proxy/peer.ts).
 *
 * Rows are in the order the separate listeners bind. Which row the one port picks does not depend on the order:
 * two rows may not claim the same ALPN name or server-name prefix (src/mux/routes.ts refuses such a table).
 */
import type { AccessKind } from '../auth/rbac.js';
import type { GatewayConfig } from '../config/index.js';
import type { AlpnProtocol, RouteMatch } from '../mux/routes.js';
import type { DatabaseInfo } from '../tunnel/protocol.js';

/** What serves a protocol behind the front door. */
export type RouteKind =
  /** The web server: API, ping, find, version server, connection upgrade, HTTP apps. TLS ends here. */
  | 'web'
  /** Plain HTTP on the one port: a redirect to https://. */
  | 'redirect'
  /** TLS ends here; then the Kubernetes proxy (webapps.ts). */
  | 'kube'
  /** The reverse-tunnel SSH server (over TLS on the one port, raw on its separate listener). */
  | 'tunnel'
  /** TLS ends here; then a route header and a resource through its agent's tunnel (access.ts). */
  | 'resource'
  /** Raw SSH: the SSH jump host (sshjump.ts). */
  | 'ssh';

/** The kinds served by a service the daemon plugs in (the front door serves web and redirect itself). */
export type ServiceKindOfRoute = Exclude<RouteKind, 'web' | 'redirect'>;

type ListenAddrKey = {
  [K in keyof GatewayConfig['proxy_service']]: K extends `${string}listen_addr` ? K : never;
}[keyof GatewayConfig['proxy_service']];

export interface SeparateListener {
  /** Its name in the front door's addresses ("postgres"). */
  name: string;
  /** Its address in proxy_service. */
  key: ListenAddrKey;
  /** tls: TLS for this row (no ALPN needed); raw: the row's service gets the bytes; mux: the multiplexer. */
  accepts: 'tls' | 'raw' | 'mux';
}

export interface Protocol {
  name: string;
  kind: RouteKind;
  on: { alpn: readonly string[]; noAlpn?: true } | { serverNamePrefix: string } | { sniffed: 'ssh' | 'http' };
  ping: boolean;
  access: readonly AccessKind[];
  database?: DatabaseInfo['protocol'];
  listener?: SeparateListener;
}

export const PING_SUFFIX = '-ping';
/** Kubernetes is routed by server name: kubectl's server is https://kube-gateway-proxy-alpn.<proxy host>/... */
export const KUBE_SNI_PREFIX = 'kube-gateway-proxy-alpn.';

/** A database route: its ALPN takes "-ping", its resources are databases speaking `protocol`. */
function database(protocol: DatabaseInfo['protocol'], listener: 'mysql' | 'postgres' | 'mongo' | 'redis'): Protocol {
  const name = `gateway-${protocol}`;
  return { name, kind: 'resource', on: { alpn: [name] }, ping: true, access: ['db'], database: protocol, listener: { name: listener, key: `${listener}_listen_addr`, accepts: 'tls' } };
}

/** Wire identifiers: fixed names that load balancers, clients and tests rely on. */
export const PROTOCOLS: readonly Protocol[] = Object.freeze([
  // HTTP apps under their public address are the web route's resources.
  { name: 'web', kind: 'web', on: { alpn: ['http/1.1', 'h2'], noAlpn: true }, ping: false, access: ['app'], listener: { name: 'web', key: 'web_listen_addr', accepts: 'tls' } },
  { name: 'ssh', kind: 'ssh', on: { sniffed: 'ssh' }, ping: false, access: ['node'], listener: { name: 'ssh', key: 'listen_addr', accepts: 'raw' } },
  // Reverse tunnels: v2 (frames over mutual TLS) and v1 (SSH over TLS, agents of earlier versions); an agent offers
  // both, v2 first, and the client's order decides. The separate listener (3024) is raw SSH, v1.
  { name: 'gateway-reversetunnel', kind: 'tunnel', on: { alpn: ['gateway-reversetunnel-v2', 'gateway-reversetunnel'] }, ping: false, access: [], listener: { name: 'tunnel', key: 'tunnel_listen_addr', accepts: 'raw' } },
  database('mysql', 'mysql'),
  database('postgres', 'postgres'),
  database('mongodb', 'mongo'),
  database('redis', 'redis'),
  { name: 'kube', kind: 'kube', on: { serverNamePrefix: KUBE_SNI_PREFIX }, ping: false, access: ['kube_cluster'], listener: { name: 'kube', key: 'kube_listen_addr', accepts: 'tls' } },
  { name: 'gateway-proxy-ssh', kind: 'resource', on: { alpn: ['gateway-proxy-ssh'] }, ping: false, access: ['node'] },
  // On one agent an app wins over a desktop of the same name, unless the route header asks for a desktop.
  { name: 'gateway-tcp', kind: 'resource', on: { alpn: ['gateway-tcp'] }, ping: true, access: ['app', 'windows_desktop'] },
  { name: 'http', kind: 'redirect', on: { sniffed: 'http' }, ping: false, access: [] },
]);

/** The row of a route name. */
export function protocolNamed(name: string, table: readonly Protocol[] = PROTOCOLS): Protocol | undefined {
  return table.find((p) => p.name === name);
}

/** The ALPN names a row takes, "-ping" variants included. */
export function alpnNames(p: Protocol): AlpnProtocol[] {
  if (!('alpn' in p.on)) return [];
  return p.on.alpn.flatMap((protocol) => (p.ping ? [{ protocol }, { protocol: `${protocol}${PING_SUFFIX}`, ping: true }] : [{ protocol }]));
}

/** What the multiplexer matches for a row. */
export function muxMatchOf(p: Protocol): RouteMatch {
  if ('sniffed' in p.on) return { sniffed: p.on.sniffed };
  if ('serverNamePrefix' in p.on) return { serverNamePrefix: p.on.serverNamePrefix };
  return { alpn: alpnNames(p), ...(p.on.noAlpn ? { noAlpn: true } : {}) };
}

/**
 * The row a connection upgrade may carry for a WebSocket subprotocol: any ALPN name of any row but the web's own
 * (the upgrade request already is a web request).
 */
export function upgradeRouteFor(protocol: string, table: readonly Protocol[] = PROTOCOLS): Protocol | undefined {
  return table.find((p) => p.kind !== 'web' && alpnNames(p).some((a) => a.protocol === protocol));
}
