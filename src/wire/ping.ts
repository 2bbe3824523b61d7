/**
 * What a Proxy answers on GET /webapi/ping (clients: gwsh, the upgraders) and GET /webapi/find (agents): the
 * shapes both ends read and write. The Proxy builds them in src/proxy/ping.ts and src/proxy/frontdoor.ts; gwsh
 * reads them in src/client/resources.ts, an agent in src/agent/tunnel.ts, the upgraders in
 * src/upgrade/client.ts. Types and paths only: how the addresses are chosen is the Proxy's (proxy/ping.ts).
 *
 * A field is added, never renamed or removed: older clients and agents read these answers.
 */

import type { DatabasePingAddrs } from './protocols.js';

export const PING_PATH = '/webapi/ping';
export const FIND_PATH = '/webapi/find';

/**
 * Connection upgrade on the web address: GET with Upgrade: websocket, and as the WebSocket subprotocol either an
 * ALPN name of the protocol table (the stream goes to that route only: L7 load balancers that end TLS) or
 * UPGRADE_TRANSPORT (the stream is routed as a new connection on the one port, by its own ClientHello: the
 * transport through TLS-inspecting proxies, src/dial/upgrade.ts). Inside it the client runs its usual TLS.
 */
export const UPGRADE_PATH = '/webapi/connectionupgrade';
export const UPGRADE_TRANSPORT = 'gateway-alpn';
/** The largest WebSocket message either end takes on an upgraded stream: a TLS record is at most 16 KiB, a write a few. */
export const UPGRADE_MAX_PAYLOAD = 1024 * 1024;

/** Every address a client or an agent may need, per protocol: the web port's own under TLS routing. */
export interface PingProxy {
  kube: { enabled: boolean; public_addr: string; listen_addr: string };
  ssh: { listen_addr: string; tunnel_listen_addr: string; web_listen_addr: string; public_addr: string; ssh_public_addr: string; ssh_tunnel_public_addr: string };
  /** Each database protocol's address fields, as its row in src/wire/protocols.ts names them (proxy/ping.ts pingDb). */
  db: DatabasePingAddrs;
  tls_routing_enabled: boolean;
}

/** The kinds of sign-in a Proxy may announce (the Auth Service's preference: src/auth/sso/index.ts). */
export type PingAuthType = 'local' | 'oidc' | 'saml' | 'github';

/** How users sign in: local, or the connector auth_service.authentication names (docs/sso.md). */
export interface PingAuth {
  type: PingAuthType;
  second_factor: 'off';
  local: { name: string };
  connector?: { kind: Exclude<PingAuthType, 'local'>; name: string; display: string };
}

/** GET /webapi/ping. */
export interface PingResponse {
  cluster_name: string;
  server_version: string;
  min_client_version: string;
  auth: PingAuth;
  proxy: PingProxy;
}

/** GET /webapi/find: ping's addresses for an agent, and the live Proxies' reverse-tunnel host keys. */
export interface FindResponse {
  proxy: PingProxy;
  server_version: string;
  cluster_name: string;
  /** Every live Proxy's reverse-tunnel SSH host key (OpenSSH line): raw SSH accepts only these. */
  tunnel_host_keys?: string[];
  /** Which Proxy holds which tunnel host key (raw SSH: the Proxy ID the agent records). */
  tunnel_proxies?: Array<{ proxy_id: string; host_key: string }>;
  /** The live Proxies of the cluster. */
  proxies?: Array<{ id: string; nodename: string; public_addr: string; version: string }>;
}

/** What the Proxy's role adds to the find answer besides ping's part. */
export type FindExtras = Omit<FindResponse, 'proxy' | 'server_version' | 'cluster_name'>;
