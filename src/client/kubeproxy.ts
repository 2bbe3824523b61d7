/**
 * gwsh's two ways to Kubernetes (docs/kubernetes.md), and what they share: where the Proxy's kube route is and the
 * server name that reaches it (kubeRoute).
 *
 *   gwsh kube login CLUSTER   kubectl → the Proxy's kube route directly (TLS with the user's certificate; the
 *                             Proxy reads the HTTP and impersonates). src/cli/kubelogin.ts.
 *   gwsh proxy kube CLUSTER   kubectl → http://127.0.0.1:PORT/k8s/CLUSTER, a listener of gwsh on loopback, whose
 *                             every connection is one stream (src/client/e2e.ts E2EStreams, service kube): end to
 *                             end, TLS between gwsh and the agent, the agent impersonating from the grant
 *                             (src/agent/kubeapi.ts); or, under --e2e auto when no end-to-end stream is possible,
 *                             the classic route opened here (kubeClassicOpener): TLS to the kube route with the
 *                             user's certificate, kubectl's bytes inside it as they came.
 *
 * Decisions for `gwsh proxy kube`:
 *  - the listener speaks plain HTTP on 127.0.0.1, as `kubectl proxy` does and as `gwsh proxy db` carries plain TCP
 *    on loopback: kubectl talks HTTP/1.1 to an http:// server (exec, attach and port-forward included, by the
 *    WebSocket or SPDY upgrade), and needs no certificate, so none is made, written or trusted. Anyone who can
 *    connect to that loopback port acts as the user while gwsh runs, as with every gwsh proxy listener.
 *  - gwsh does not parse kubectl's HTTP: its bytes go as they are, on either route. So the server URL keeps the
 *    /k8s/<cluster> prefix the Proxy's kube route takes, and the agent takes it off an end-to-end stream the same
 *    way (src/wire/kubeimpersonate.ts kubePathOf); one kubeconfig works whichever route a connection takes.
 *  - each kubectl connection is one stream, decided on its own (kubectl keeps connections alive and opens one per
 *    upgrade), as `gwsh proxy db` decides per connection. A connection that gets none (a refused grant, --e2e
 *    require without an end-to-end stream) is answered as the Proxy's kube route answers a refusal: one HTTP
 *    answer with a Kubernetes Status naming the gateway's code (kubeRefusal), so kubectl prints the code rather
 *    than a reset; nothing of kubectl's was sent anywhere.
 */
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import { isIP } from 'node:net';
import type tls from 'node:tls';
import { parseAddr } from '../addr.js';
import { connectClusterTls } from '../dial/fallback.js';
import type { Dialer } from '../dial/dialer.js';
import { tlsVerifyError, UNTRUSTED_HINTS } from '../dial/tlsverify.js';
import { GatewayError, httpStatus } from '../errors.js';
import { KUBE_PATH_PREFIX, kubeStatus } from '../wire/kubeimpersonate.js';
import type { PingResponse } from '../wire/ping.js';
import { KUBE_LOCAL_SNI, KUBE_SNI_PREFIX } from '../wire/protocols.js';
import { proxyServerIdentity } from './api.js';
import type { Profile } from './profile.js';

/** Where the Proxy's kube route is (its address) and the server name that reaches it. */
export interface KubeRoute {
  address: string;
  serverName: string;
}

/**
 * The kube route of the Proxy a ping answer describes: the web address with TLS routing (or with no separate
 * public address), else the Kubernetes listener's public address. The server name is under the Proxy's public DNS
 * name, whose wildcard its certificate carries, else KUBE_LOCAL_SNI (a Proxy reached only by IP address): a user
 * who logged in by IP address (or by another name) to a Proxy with a public name gets that name.
 */
export function kubeRoute(profile: Profile, ping: PingResponse): KubeRoute {
  if (!ping.proxy.kube.enabled) {
    throw new GatewayError('GW_ERR_KUBE_CLUSTER_NOT_FOUND', `the Proxy ${profile.proxy} serves no Kubernetes access`, { hint: 'Ask an administrator to enable Kubernetes on the Proxy (TLS routing, or kube_listen_addr).' });
  }
  const address = ping.proxy.tls_routing_enabled || !ping.proxy.kube.public_addr ? profile.proxy : ping.proxy.kube.public_addr;
  const sniHost = publicDnsHost(ping.proxy.ssh.public_addr) ?? parseAddr(profile.proxy).host;
  return { address, serverName: isIP(sniHost) === 0 ? `${KUBE_SNI_PREFIX}${sniHost}` : KUBE_LOCAL_SNI };
}

/** The host of the Proxy's public web address when it is a DNS name (undefined for none, an IP, or garble). */
function publicDnsHost(publicAddr: string): string | undefined {
  if (!publicAddr) return undefined;
  try {
    const { host } = parseAddr(publicAddr);
    return isIP(host) === 0 && !host.startsWith('*') ? host : undefined;
  } catch {
    return undefined;
  }
}

/** The server URL path of a cluster on either route: /k8s/<cluster>. */
export function kubeServerPath(cluster: string): string {
  return `${KUBE_PATH_PREFIX}${encodeURIComponent(cluster)}`;
}

/**
 * The classic route for `gwsh proxy kube`'s connections: TLS to the kube route through the Dialer (HTTPS_PROXY, the
 * upgrade past an inspecting proxy), the route's server name, ALPN http/1.1 (the route's HTTP server), the user's
 * certificate, and the Proxy's certificate checked as every classic route checks it (role proxy). The stream is
 * then kubectl's HTTP as it came; the Proxy's refusals are HTTP answers kubectl prints.
 */
export function kubeClassicOpener(profile: Profile, dialer: Dialer, route: KubeRoute, secureContext?: tls.SecureContext): () => Promise<Duplex> {
  const credentials = secureContext ? { secureContext } : { ca: profile.hostCa, cert: profile.cert, key: profile.key };
  const peer = { server: 'proxy' as const, untrustedHint: UNTRUSTED_HINTS.clusterCa(route.address) };
  return () =>
    connectClusterTls(
      dialer,
      route.address,
      { ALPNProtocols: ['http/1.1'], ...credentials, host: parseAddr(route.address).host, servername: route.serverName, checkServerIdentity: proxyServerIdentity },
      { peer, clusterCa: profile.hostCa, webAddress: profile.proxy },
    ).catch((err: Error) => {
      throw tlsVerifyError(err, { address: route.address, ...peer }) ?? new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `the Proxy's Kubernetes route at ${route.address}: ${err.message}`);
    });
}

/** kubectl's connection that gets no stream: the refusal as one HTTP answer (a Kubernetes Status), then the close. */
export function kubeRefusal(local: net.Socket, e: GatewayError): void {
  const body = JSON.stringify(kubeStatus(e));
  local.on('error', () => local.destroy());
  // What kubectl sends meanwhile is read and dropped: the answer is whole before the close.
  local.resume();
  local.end(`HTTP/1.1 ${httpStatus(e.code)} Refused\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  local.once('end', () => local.destroy());
}
