/**
 * What /webapi/ping and /webapi/find tell clients and agents about the Proxy's addresses (the answers' shapes are
 * src/wire/ping.ts, which the clients read too). Pure: derived from the configuration and the bound listeners only.
 *
 * - The web public address is the first proxy_service.public_addr, else <nodename>:<web port>.
 * - With TLS routing (multiplex), every public address is the web public address and every listen address is
 *   the web listen address: clients reach every protocol through 443.
 * - With separate listeners, each protocol has its own port: its *_public_addr when set (the first one), else
 *   the web public host with that protocol's listen port.
 */
import { formatHostPort, type HostPort } from '../addr.js';
import type { GatewayConfig } from '../config/index.js';
import type { AuthPreference } from '../auth/sso/index.js';
import { VERSION } from '../version.js';
import type { PingProxy, PingResponse } from '../wire/ping.js';
import { WIRE_PROTOCOLS, type DatabasePingAddrs, type ListenAddrKey } from '../wire/protocols.js';

/** Clients older than this are told to upgrade (one major version back, as is usual). */
export const MIN_CLIENT_VERSION = '16.0.0';

const hp = (a: HostPort) => formatHostPort(a.host, a.port);

/**
 * bound: the addresses the listeners actually bound (useful with port 0), by listener name ("web", "redis");
 * listen addresses fall back to the configuration's.
 */
export function pingProxy(config: GatewayConfig, bound: Readonly<Record<string, string>> = {}): PingProxy {
  const p = config.proxy_service;
  const multiplex = config.auth_service.proxy_listener_mode === 'multiplex';
  const webListen = bound.web ?? hp(p.web_listen_addr);
  const webPort = Number(/:(\d+)$/.exec(webListen)?.[1] ?? p.web_listen_addr.port);
  const webPublic = p.public_addr[0] ? hp(p.public_addr[0]) : formatHostPort(config.gateway.nodename, webPort);
  const webHost = p.public_addr[0]?.host ?? config.gateway.nodename;
  const publicFor = (list: readonly HostPort[], listen: HostPort | string | undefined): string => {
    if (multiplex) return webPublic;
    if (list[0]) return hp(list[0]);
    const port = typeof listen === 'string' ? Number(/:(\d+)$/.exec(listen)?.[1]) : listen?.port;
    return port === undefined ? '' : formatHostPort(webHost, port);
  };
  const listenFor = (key: string, addr: HostPort | undefined): string =>
    multiplex ? webListen : (bound[key] ?? (addr ? hp(addr) : ''));
  const kubeEnabled = multiplex || p.kube_listen_addr !== undefined;
  // Multiplex with tunnel_public_addr set: the tunnel listener runs beside the one port (src/proxy/frontdoor.ts).
  const tunnelBeside = multiplex && p.tunnel_public_addr.length > 0;
  return {
    kube: {
      enabled: kubeEnabled,
      public_addr: kubeEnabled ? publicFor(p.kube_public_addr, bound.kube ?? p.kube_listen_addr) : '',
      listen_addr: kubeEnabled ? listenFor('kube', p.kube_listen_addr) : '',
    },
    ssh: {
      listen_addr: listenFor('ssh', p.listen_addr),
      tunnel_listen_addr: tunnelBeside ? (bound.tunnel ?? hp(p.tunnel_listen_addr)) : listenFor('tunnel', p.tunnel_listen_addr),
      web_listen_addr: webListen,
      public_addr: webPublic,
      ssh_public_addr: publicFor(p.ssh_public_addr, bound.ssh ?? p.listen_addr),
      ssh_tunnel_public_addr: tunnelBeside ? hp(p.tunnel_public_addr[0]!) : publicFor(p.tunnel_public_addr, bound.tunnel ?? p.tunnel_listen_addr),
    },
    db: databaseAddrs(p, (l, pub) => ({ listen: listenFor(l.name, p[l.key]), public: publicFor(pub, bound[l.name] ?? p[l.key]) })),
    tls_routing_enabled: multiplex,
  };
}

/** The `db` section: each database row's ping fields (src/wire/protocols.ts), from its listener's addresses. */
function databaseAddrs(
  p: GatewayConfig['proxy_service'],
  addrsOf: (listener: { name: string; key: ListenAddrKey }, publicAddrs: readonly HostPort[]) => { listen: string; public: string },
): DatabasePingAddrs {
  const db: Partial<Record<keyof DatabasePingAddrs, string>> = {};
  for (const row of WIRE_PROTOCOLS) {
    if (!('pingDb' in row)) continue;
    const a = addrsOf(row.listener, p[row.publicAddr.key]);
    db[row.pingDb.public] = a.public;
    if ('listen' in row.pingDb) db[row.pingDb.listen] = a.listen;
  }
  return db as DatabasePingAddrs;
}

export function pingResponse(config: GatewayConfig, clusterName: string, bound: Parameters<typeof pingProxy>[1] = {}, preference: AuthPreference = { type: 'local' }): PingResponse {
  return {
    cluster_name: clusterName,
    server_version: VERSION,
    min_client_version: MIN_CLIENT_VERSION,
    auth: { type: preference.type, second_factor: 'off', local: { name: '' }, ...(preference.connector ? { connector: preference.connector } : {}) },
    proxy: pingProxy(config, bound),
  };
}

/** How long the Proxy reuses the Auth Service's answer on how users sign in. */
export const AUTH_PREFERENCE_CACHE_MS = 10_000;

/**
 * The authentication preference, asked of the Auth Service at most every AUTH_PREFERENCE_CACHE_MS; while it cannot
 * be asked, the last answer (or local) is reported: ping must answer even when the Auth Service does not.
 */
export function cachedAuthPreference(ask: () => Promise<AuthPreference>, clock: () => number = Date.now): () => Promise<AuthPreference> {
  let last: AuthPreference = { type: 'local' };
  let at = -Infinity;
  let pending: Promise<AuthPreference> | undefined;
  return () => {
    if (clock() - at < AUTH_PREFERENCE_CACHE_MS) return Promise.resolve(last);
    pending ??= ask()
      .then((p) => (last = p), () => last)
      .finally(() => {
        at = clock();
        pending = undefined;
      });
    return pending;
  };
}
