/**
 * `gwsh kube login CLUSTER`: a kubeconfig context for a Kubernetes cluster the user's roles reach, so that the
 * real kubectl goes through the Proxy with the gwsh profile's certificate (upstream's `tsh kube login`). The
 * cluster is checked against the user's inventory first (an unknown or forbidden one is refused before the file
 * is touched); where the Proxy serves Kubernetes comes from its ping answer; what is written and why is
 * src/client/kubeconfig.ts.
 */
import { join } from 'node:path';
import type { Command } from 'commander';
import { parseAddr } from '../addr.js';
import { ApiClient } from '../client/api.js';
import { kubeconfigPath, writeKubeconfig } from '../client/kubeconfig.js';
import type { Profile } from '../client/profile.js';
import { fetchPing } from '../client/resources.js';
import { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { isIP } from 'node:net';
import { KUBE_LOCAL_SNI, KUBE_SNI_PREFIX } from '../wire/protocols.js';
import { formatOf, formatOption, render, type FormatOptions } from './output.js';

/** The path prefix of the Proxy's Kubernetes route (src/proxy/webapps.ts KUBE_PATH_PREFIX). */
const KUBE_PATH_PREFIX = '/k8s/';

export function addKubeLogin(kube: Command, requireProfile: () => Profile): void {
  formatOption(
    kube
      .command('login')
      .description('write a kubeconfig context for a Kubernetes cluster you may reach, and make it the current one (kubectl then goes through the Proxy)')
      .argument('<cluster>', "the Kubernetes cluster's name (gwsh kube ls lists them)")
      .option('--kubeconfig <file>', 'the kubeconfig to merge into (default: the first file of $KUBECONFIG, else ~/.kube/config)'),
  ).action(async (cluster: string, opts: { kubeconfig?: string } & FormatOptions) => {
    const format = formatOf(opts);
    const profile = requireProfile();
    const dialer = new Dialer();
    const api = new ApiClient({ address: profile.proxy, dialer, ca: profile.hostCa, cert: profile.cert, key: profile.key });
    const { items } = await api.call<{ items: Array<{ name: string }> }>('GET', '/v1/inventory/kube');
    if (!items.some((i) => i.name === cluster)) {
      const known = items.map((i) => i.name).join(', ');
      throw new GatewayError('GW_ERR_KUBE_CLUSTER_NOT_FOUND', `no Kubernetes cluster "${cluster}" is reachable with your roles${known ? ` (you may reach: ${known})` : ''}`);
    }
    const ping = await fetchPing(profile, dialer);
    if (!ping.proxy.kube.enabled) throw new GatewayError('GW_ERR_KUBE_CLUSTER_NOT_FOUND', `the Proxy ${profile.proxy} serves no Kubernetes access`, { hint: 'Ask an administrator to enable Kubernetes on the Proxy (TLS routing, or kube_listen_addr).' });
    const address = ping.proxy.tls_routing_enabled || !ping.proxy.kube.public_addr ? profile.proxy : ping.proxy.kube.public_addr;
    const webHost = parseAddr(profile.proxy).host;
    // The SNI names the Proxy's certificate, which carries its public DNS name's wildcard: a user who logged in by
    // IP address (or by another name) to a Proxy with a public name gets that name, not the one they dialled.
    const publicHost = publicDnsHost(ping.proxy.ssh.public_addr);
    const sniHost = publicHost ?? webHost;
    const name = `${profile.cluster}-${cluster}`;
    const file = kubeconfigPath(opts.kubeconfig);
    const entry = {
      name,
      server: `https://${address}${KUBE_PATH_PREFIX}${encodeURIComponent(cluster)}`,
      tlsServerName: isIP(sniHost) === 0 ? `${KUBE_SNI_PREFIX}${sniHost}` : KUBE_LOCAL_SNI,
      caFile: join(profile.dir, 'host-ca.pem'),
      certFile: join(profile.dir, 'cert.pem'),
      keyFile: join(profile.dir, 'key.pem'),
    };
    const written = writeKubeconfig(file, entry);
    const result = { context: name, kubeconfig: written, server: entry.server, tls_server_name: entry.tlsServerName };
    process.stdout.write(render(format, result, () => `Logged into Kubernetes cluster "${cluster}": context ${name} in ${written} (now the current context).\nTry: kubectl version\n`));
  });
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
