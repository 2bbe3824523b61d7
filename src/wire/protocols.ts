/**
 * Every protocol of the cluster's wire, declared once: what both ends agree on (the Proxy that serves it, gwsh and
 * agents that reach it) and what the configuration names for it. The Proxy's own facts about a row (what serves
 * it behind the front door, the RBAC kinds it reaches) extend these rows in src/proxy/protocols.ts; nothing else
 * keeps a list of protocols, listen addresses or public addresses of its own.
 *
 * A row says:
 *   name       the route's name: ConnInfo.route, the multiplexer's counters, what a connection upgrade names
 *   on         how the Proxy's one port tells it apart: ALPN names (what a client offers), a server-name prefix,
 *              or the first bytes
 *   ping       whether "<alpn>-ping" selects it too (the client asks for keep-alive pings inside the stream)
 *   database   for a database route: the protocol the database speaks (its resources are databases of it; the
 *              agent's service that carries them is "db", as for every database)
 *   listener   proxy_listener_mode separate: its own listener. key and port are the configuration's
 *              (proxy_service.<key>, default 0.0.0.0:<port>; off: no listener unless set), doc its line in the
 *              configuration's table, label its line in the start banner, accepts what the listener expects
 *   publicAddr proxy_service.<key>: where clients reach that listener (default port: the listener's); what names
 *              it in the configuration's table. The web row has none: its public address is proxy_service.public_addr
 *   pingDb     a database row's fields in /webapi/ping's `db` section ("<listener>_public_addr", and for MySQL the
 *              listen address too, as the seed's ping has it); the client routes the row's ALPN to that address
 *
 * Adding a database protocol is one row of databaseRow() below; everything above is derived from it (the
 * configuration's keys and their types, the Proxy's listener, ping, the client's address, the banner's label).
 *
 * Proxy peering is not a row: it is never reached through the one port (src/proxy/peer.ts).
 * Rows are in the order the separate listeners bind (web first).
 */

/** How the one port tells a row apart. */
export type WireMatch = { readonly alpn: readonly string[]; readonly noAlpn?: true } | { readonly serverNamePrefix: string } | { readonly sniffed: 'ssh' | 'http' | 'gwdata' | 'gwe2e' };

export interface WireListener {
  /** Its name in the front door's addresses ("postgres"); the start banner shows it as proxy_<name>. */
  readonly name: string;
  /** Its address in proxy_service. */
  readonly key: string;
  /** The default port (and the default port of its public address). */
  readonly port: number;
  /** No listener unless the key is set. */
  readonly off?: true;
  readonly doc: string;
  readonly label: string;
  /** tls: TLS for this row (no ALPN needed); raw: the row's service gets the bytes. */
  readonly accepts: 'tls' | 'raw';
}

export interface WireProtocol {
  readonly name: string;
  readonly on: WireMatch;
  readonly ping: boolean;
  readonly database?: string;
  readonly listener?: WireListener;
  readonly publicAddr?: { readonly key: string; readonly what: string };
  readonly pingDb?: { readonly public: string; readonly listen?: string };
}

/** The reverse tunnel's ALPN names: v1 (SSH over TLS) and v2 (frames over mutual TLS), src/tunnel/protocol.ts. */
export const TUNNEL_ALPN_V1 = 'gateway-reversetunnel';
export const TUNNEL_ALPN_V2 = 'gateway-reversetunnel-v2';

/**
 * End-to-end streams (src/tunnel/e2e.ts): the ALPN of a client's TLS with the agent (the agent's to check: the Proxy
 * passes it through unopened); the grant session a client asks the Proxy for grants on; the first bytes of an
 * agent's data connection; the first bytes of a client's end-to-end stream (its grant line, ahead of its TLS: any
 * Proxy of the cluster routes it by the grant it carries).
 */
export const E2E_ALPN = 'gateway-e2e-v1';
export const GRANT_ALPN = 'gateway-grant-v1';
export const DATA_MAGIC = 'GWDATA1 ';
export const E2E_MAGIC = 'GWE2E1 ';

export const PING_SUFFIX = '-ping';
/** Kubernetes is routed by server name: kubectl's server is https://kube-gateway-proxy-alpn.<proxy host>/... */
export const KUBE_SNI_PREFIX = 'kube-gateway-proxy-alpn.';
/**
 * The kube route's server name for a Proxy reached by IP address (no name to put under the prefix): every
 * certificate the cluster issues the Proxy's web port carries it, as upstream's carries *.teleport.cluster.local.
 * It never has to resolve: gwsh kube login writes it as kubectl's tls-server-name, the server being the address.
 */
export const KUBE_LOCAL_SNI = `${KUBE_SNI_PREFIX}gateway.cluster.local`;

/**
 * A database route: ALPN gateway-<protocol> (with -ping), a TLS listener of its own in separate mode, its public
 * address and its ping field. `short` names the keys (mongo_listen_addr for mongodb, as the seed names them).
 */
function databaseRow<const P extends string, const S extends string, const L extends boolean = false>(protocol: P, short: S, port: number, label: string, pingListen?: L) {
  type PingDb = L extends true ? { readonly public: `${S}_public_addr`; readonly listen: `${S}_listen_addr` } : { readonly public: `${S}_public_addr` };
  return {
    name: databaseRoute(protocol),
    on: { alpn: [databaseRoute(protocol)] },
    ping: true,
    database: protocol,
    listener: { name: short, key: `${short}_listen_addr`, port, doc: `${label} clients (separate mode).`, label, accepts: 'tls' },
    publicAddr: { key: `${short}_public_addr`, what: `the ${label} proxy` },
    pingDb: (pingListen ? { public: `${short}_public_addr`, listen: `${short}_listen_addr` } : { public: `${short}_public_addr` }) as PingDb,
  } as const satisfies WireProtocol;
}

/** Wire identifiers: fixed names that load balancers, clients and tests rely on. */
export const WIRE_PROTOCOLS = Object.freeze([
  {
    name: 'web',
    on: { alpn: ['http/1.1', 'h2'], noAlpn: true },
    ping: false,
    listener: { name: 'web', key: 'web_listen_addr', port: 443, doc: 'Web UI and HTTPS API; in multiplex mode every protocol.', label: 'web and API', accepts: 'tls' },
  },
  {
    name: 'ssh',
    on: { sniffed: 'ssh' },
    ping: false,
    listener: { name: 'ssh', key: 'listen_addr', port: 3023, doc: 'SSH port clients connect to (separate mode).', label: 'SSH', accepts: 'raw' },
    publicAddr: { key: 'ssh_public_addr', what: 'the SSH proxy' },
  },
  // Reverse tunnels: v2 (frames over mutual TLS) and v1 (SSH over TLS, agents of earlier versions); an agent offers
  // both, v2 first, and the client's order decides. The separate listener (3024) is raw SSH, v1.
  {
    name: 'gateway-reversetunnel',
    on: { alpn: [TUNNEL_ALPN_V2, TUNNEL_ALPN_V1] },
    ping: false,
    listener: { name: 'tunnel', key: 'tunnel_listen_addr', port: 3024, doc: 'Reverse tunnels from agents (separate mode).', label: 'reverse tunnels', accepts: 'raw' },
    publicAddr: { key: 'tunnel_public_addr', what: 'the reverse-tunnel port' },
  },
  databaseRow('mysql', 'mysql', 3036, 'MySQL', true),
  databaseRow('postgres', 'postgres', 5432, 'PostgreSQL'),
  databaseRow('mongodb', 'mongo', 27017, 'MongoDB'),
  databaseRow('redis', 'redis', 6379, 'Redis'),
  {
    name: 'kube',
    on: { serverNamePrefix: KUBE_SNI_PREFIX },
    ping: false,
    listener: { name: 'kube', key: 'kube_listen_addr', port: 3026, off: true, doc: 'Kubernetes clients (separate mode); no listener unless set.', label: 'Kubernetes', accepts: 'tls' },
    publicAddr: { key: 'kube_public_addr', what: 'the Kubernetes proxy' },
  },
  { name: 'gateway-proxy-ssh', on: { alpn: ['gateway-proxy-ssh'] }, ping: false },
  { name: 'gateway-tcp', on: { alpn: ['gateway-tcp'] }, ping: true },
  // End-to-end streams: the client's grant session (terminated here), its stream to the agent (its grant line, then
  // its TLS with the agent, passed through unopened) and the agent's data connections (not TLS: their first
  // bytes), src/tunnel/e2e.ts.
  { name: 'gateway-grant', on: { alpn: [GRANT_ALPN] }, ping: false },
  { name: 'gateway-e2e', on: { sniffed: 'gwe2e' }, ping: false },
  { name: 'gateway-data', on: { sniffed: 'gwdata' }, ping: false },
  { name: 'http', on: { sniffed: 'http' }, ping: false },
] as const satisfies readonly WireProtocol[]);

type Row = (typeof WIRE_PROTOCOLS)[number];
type ListenerRow = Extract<Row, { listener: object }>;

/** A route's name ("gateway-redis"). */
export type WireName = Row['name'];
/** The protocols databases speak (config db_service.databases[].protocol, the tunnel's DatabaseInfo). */
export type DatabaseProtocol = Extract<Row, { database: string }>['database'];
/** The route of a database protocol. */
export type DatabaseRouteName = Extract<Row, { database: string }>['name'];
/** proxy_service keys of the separate listeners: always bound ones, and those bound only when set. */
export type ListenAddrKey = Exclude<ListenerRow, { listener: { off: true } }>['listener']['key'];
export type OptionalListenAddrKey = Extract<ListenerRow, { listener: { off: true } }>['listener']['key'];
/** proxy_service keys of the protocols' public addresses. */
export type PublicAddrKey = Extract<Row, { publicAddr: object }>['publicAddr']['key'];
/** The fields of /webapi/ping's `db` section, each an address ("host:port"). */
export type DatabasePingAddrs = { [K in PingDbField<Row>]: string };
type PingDbField<R> = R extends { pingDb: infer P } ? P[keyof P] & string : never;

/** The rows as the wide type (for code that walks them). */
export const WIRE_ROWS: readonly WireProtocol[] = WIRE_PROTOCOLS;

/** Every database protocol, in the table's order. */
export const DATABASE_PROTOCOLS: readonly DatabaseProtocol[] = WIRE_PROTOCOLS.flatMap((row) => ('database' in row ? [row.database] : []));

/**
 * The route (ALPN) a client asks for to reach a database of this protocol. gwsh names it for any protocol the
 * inventory lists, so that a Proxy newer than gwsh can serve a protocol gwsh does not know yet.
 */
export function databaseRoute<const P extends string>(protocol: P): `gateway-${P}` {
  return `gateway-${protocol}`;
}

/** The row whose ALPN names include `alpn` (a "-ping" variant counts when the row takes pings). */
export function wireRowOfAlpn(alpn: string, table: readonly WireProtocol[] = WIRE_ROWS): WireProtocol | undefined {
  return table.find((row) => 'alpn' in row.on && row.on.alpn.some((a) => a === alpn || (row.ping && `${a}${PING_SUFFIX}` === alpn)));
}

/** The separate listeners' rows, in the order they bind. */
export function listenerRows(table: readonly WireProtocol[] = WIRE_ROWS): Array<WireProtocol & { listener: WireListener }> {
  return table.filter((row): row is WireProtocol & { listener: WireListener } => row.listener !== undefined);
}
