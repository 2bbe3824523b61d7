/**
 * Every protocol the Proxy serves, in one table. The multiplexer's routes, the TLS routes and listeners of the
 * front door, the services the daemon plugs in, connection upgrades and the access checks are all read from it;
 * none of them keeps a list of its own.
 *
 * The rows are the wire's (src/wire/protocols.ts: name, how the one port tells it apart, -ping, database protocol,
 * separate listener, public address, ping field), each extended here with what only the Proxy needs to know:
 *   kind      what serves it behind the front door (RouteKind below)
 *   access    the RBAC kinds of the resources reached through it, in the order a name is looked up among them
 *             (rbac.ts says which label field of a role selects each kind)
 * A database row needs nothing here: every database route is a resource route reaching databases. Any other
 * row's facts are in FACTS, keyed by the row's name, so a wire row without them does not compile.
 *
 * Proxy peering is not a row: it has its own listener (peer_listen_addr, 3021) in both listener modes and is
 * never reached through the one port (src/proxy/peer.ts).
 *
 * Rows are in the order the separate listeners bind. Which row the one port picks does not depend on the order:
 * two rows may not claim the same ALPN name or server-name prefix (src/mux/routes.ts refuses such a table).
 */
import type { AccessKind } from '../auth/rbac.js';
import type { AlpnProtocol, RouteMatch } from '../mux/routes.js';
import {
  PING_SUFFIX,
  WIRE_PROTOCOLS,
  type DatabaseProtocol,
  type DatabaseRouteName,
  type ListenAddrKey,
  type OptionalListenAddrKey,
  type WireName,
  type WireProtocol,
} from '../wire/protocols.js';

export { KUBE_SNI_PREFIX, PING_SUFFIX } from '../wire/protocols.js';

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
  | 'ssh'
  /** TLS ends here; then grant requests for end-to-end streams (e2egrants.ts). */
  | 'grant'
  /** TLS passed through unopened to an agent's data connection (e2erelay.ts); and those data connections. */
  | 'e2e'
  | 'data';

/** The kinds served by a service the daemon plugs in (the front door serves web and redirect itself). */
export type ServiceKindOfRoute = Exclude<RouteKind, 'web' | 'redirect'>;

export interface SeparateListener {
  /** Its name in the front door's addresses ("postgres"). */
  name: string;
  /** Its address in proxy_service. */
  key: ListenAddrKey | OptionalListenAddrKey;
  /** tls: TLS for this row (no ALPN needed); raw: the row's service gets the bytes; mux: the multiplexer. */
  accepts: 'tls' | 'raw' | 'mux';
}

export interface Protocol extends Omit<WireProtocol, 'database' | 'listener'> {
  kind: RouteKind;
  access: readonly AccessKind[];
  database?: DatabaseProtocol;
  listener?: SeparateListener;
}

interface ProxyFacts {
  kind: RouteKind;
  access: readonly AccessKind[];
}

/** What the Proxy knows of each row that is not a database route. */
const FACTS: Record<Exclude<WireName, DatabaseRouteName>, ProxyFacts> = {
  // HTTP apps under their public address are the web route's resources.
  web: { kind: 'web', access: ['app'] },
  ssh: { kind: 'ssh', access: ['node'] },
  'gateway-reversetunnel': { kind: 'tunnel', access: [] },
  kube: { kind: 'kube', access: ['kube_cluster'] },
  'gateway-proxy-ssh': { kind: 'resource', access: ['node'] },
  // On one agent an app wins over a desktop of the same name, unless the route header asks for a desktop.
  'gateway-tcp': { kind: 'resource', access: ['app', 'windows_desktop'] },
  http: { kind: 'redirect', access: [] },
  // A grant names a resource of any kind a resource route reaches; the route the client names says which.
  'gateway-grant': { kind: 'grant', access: [] },
  'gateway-e2e': { kind: 'e2e', access: [] },
  'gateway-data': { kind: 'data', access: [] },
};

/** A database route: its resources are databases speaking the row's protocol. */
const DATABASE: ProxyFacts = { kind: 'resource', access: ['db'] };

/** The wire's rows with the Proxy's facts. */
export const PROTOCOLS: readonly Protocol[] = Object.freeze(WIRE_PROTOCOLS.map((row): Protocol => ({ ...row, ...('database' in row ? DATABASE : FACTS[row.name]) })));

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
