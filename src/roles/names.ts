/**
 * The names the servers of this process are reached by, which their certificates must carry, the local address
 * of a listener, and the join roles of the agent services.
 */
import { isIP } from 'node:net';
import type { MemberName } from '../auth/reserved.js';
import type { JoinRole } from '../wire/certs.js';
import { KUBE_LOCAL_SNI } from '../wire/protocols.js';
import type { GatewayConfig, ServiceName } from '../config/index.js';

const WILDCARD_HOSTS = ['', '0.0.0.0', '::'];

/**
 * The Auth API's names: this node, loopback, the Auth Service's public addresses, and its listen address when it
 * is a specific one (it is what <data_dir>/admin/auth-addr gives gwctl).
 */
export function authServerNames(config: GatewayConfig): string[] {
  const authHost = config.auth_service.listen_addr.host;
  return [
    config.gateway.nodename,
    'localhost',
    '127.0.0.1',
    '::1',
    ...config.auth_service.public_addr.map((a) => a.host),
    ...(WILDCARD_HOSTS.includes(authHost) ? [] : [authHost]),
  ];
}

/**
 * The web port's names: those of the Auth API (the same router answers on both), every public address of the
 * Proxy and, for a DNS name, its wildcard (HTTP apps under <app>.<proxy host> and
 * kube-gateway-proxy-alpn.<proxy host>), for a public address that is an IP the Kubernetes route's name that
 * needs none (KUBE_LOCAL_SNI: gwsh kube login gives it to kubectl as tls-server-name), and the web listen address
 * when it is a specific one.
 */
export function webServerNames(config: GatewayConfig): string[] {
  const webHost = config.proxy_service.web_listen_addr.host;
  const publicHosts = config.proxy_service.public_addr.map((a) => a.host);
  return [
    ...authServerNames(config),
    ...publicHosts,
    ...publicHosts.filter((h) => isIP(h) === 0).map((h) => `*.${h}`),
    ...(publicHosts.some((h) => isIP(h) !== 0) ? [KUBE_LOCAL_SNI] : []),
    ...(WILDCARD_HOSTS.includes(webHost) ? [] : [webHost]),
  ];
}

/**
 * The names of this process's cluster members from its configuration, which the Auth Service keeps agents' joins
 * from taking (src/auth/reserved.ts): the Auth Service's node name and public addresses, and with a Proxy in this
 * process (proxyHere) its public addresses (and every name under a public DNS name) and peering address. Loopback
 * names are dropped there.
 */
export function configuredMemberNames(config: GatewayConfig, proxyHere: boolean): MemberName[] {
  const names: MemberName[] = [
    { name: config.gateway.nodename, owner: `the node name of this ${proxyHere ? 'Auth Service and Proxy' : 'Auth Service'}` },
    ...config.auth_service.public_addr.map((a) => ({ name: a.host, owner: 'a public address of the Auth Service (auth_service.public_addr)' })),
  ];
  if (!proxyHere) return names;
  return [
    ...names,
    ...config.proxy_service.public_addr.map((a) => ({ name: a.host, owner: 'a public address of the Proxy (proxy_service.public_addr)', under: true })),
    ...config.proxy_service.peer_public_addr.map((a) => ({ name: a.host, owner: 'the peering address of the Proxy (proxy_service.peer_public_addr)' })),
  ];
}

/** Where a client on this machine reaches a listener bound to addr (0.0.0.0 → 127.0.0.1). */
export function localAddress(bound: string): string {
  return bound.replace(/^0\.0\.0\.0:/, '127.0.0.1:').replace(/^\[::\]:/, '[::1]:');
}

const SERVICE_TO_JOIN_ROLE: Partial<Record<ServiceName, JoinRole>> = {
  ssh_service: 'node',
  db_service: 'db',
  app_service: 'app',
  kube_service: 'kube',
  windows_desktop_service: 'desktop',
};

/** The join roles of the agent services among services: none means no agent runs. */
export function agentJoinRoles(services: readonly ServiceName[]): JoinRole[] {
  return services.map((s) => SERVICE_TO_JOIN_ROLE[s]).filter((r): r is JoinRole => r !== undefined);
}
