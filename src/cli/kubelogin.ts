/**
 * `gwsh kube login CLUSTER`: a kubeconfig context for a Kubernetes cluster the user's roles reach, so that the
 * real kubectl goes through the Proxy with the gwsh profile's certificate (upstream's `tsh kube login`). The
 * cluster is checked against the user's inventory first (an unknown or forbidden one is refused before the file
 * is touched); where the Proxy serves Kubernetes comes from its ping answer (src/client/kubeproxy.ts kubeRoute);
 * what is written and why is src/client/kubeconfig.ts. The Proxy sees kubectl's requests on this path: its output
 * names `gwsh proxy kube`, the end-to-end one.
 */
import { join } from 'node:path';
import type { Command } from 'commander';
import { ApiClient } from '../client/api.js';
import { kubeconfigPath, writeKubeconfig } from '../client/kubeconfig.js';
import { kubeRoute, kubeServerPath } from '../client/kubeproxy.js';
import type { Profile } from '../client/profile.js';
import { fetchPing } from '../client/resources.js';
import { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { formatOf, formatOption, render, type FormatOptions } from './output.js';

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
    await checkKubeCluster(new ApiClient({ address: profile.proxy, dialer, ca: profile.hostCa, cert: profile.cert, key: profile.key }), cluster);
    const route = kubeRoute(profile, await fetchPing(profile, dialer));
    const name = `${profile.cluster}-${cluster}`;
    const file = kubeconfigPath(opts.kubeconfig);
    const entry = {
      name,
      server: `https://${route.address}${kubeServerPath(cluster)}`,
      tls: { tlsServerName: route.serverName, caFile: join(profile.dir, 'host-ca.pem'), certFile: join(profile.dir, 'cert.pem'), keyFile: join(profile.dir, 'key.pem') },
    };
    const written = writeKubeconfig(file, entry);
    const result = { context: name, kubeconfig: written, server: entry.server, tls_server_name: route.serverName };
    process.stdout.write(
      render(format, result, () =>
        `Logged into Kubernetes cluster "${cluster}": context ${name} in ${written} (now the current context).\nTry: kubectl version\n` +
        `kubectl then goes through the Proxy, which sees its requests; for end-to-end encryption with the agent, run 'gwsh proxy kube ${cluster}' instead.\n`,
      ),
    );
  });
}

/** The cluster is in the user's inventory (reachable with their roles), else GW_ERR_KUBE_CLUSTER_NOT_FOUND. */
export async function checkKubeCluster(api: ApiClient, cluster: string): Promise<void> {
  const { items } = await api.call<{ items: Array<{ name: string }> }>('GET', '/v1/inventory/kube');
  if (!items.some((i) => i.name === cluster)) {
    const known = items.map((i) => i.name).join(', ');
    throw new GatewayError('GW_ERR_KUBE_CLUSTER_NOT_FOUND', `no Kubernetes cluster "${cluster}" is reachable with your roles${known ? ` (you may reach: ${known})` : ''}`);
  }
}

/**
 * What `gwsh proxy kube` prints once listening (src/client/kubeproxy.ts says why plain HTTP on loopback): the
 * server URL, and the kubeconfig context written with --kubeconfig (the merge rules of kube login), else how to
 * point kubectl there without one.
 */
export function kubeProxyStarted(profile: Profile, cluster: string, port: number, kubeconfig: string | undefined): string {
  const server = `http://127.0.0.1:${port}${kubeServerPath(cluster)}`;
  if (kubeconfig === undefined) return `Server: ${server}\nTry: kubectl --server ${server} get pods\n`;
  const name = `${profile.cluster}-${cluster}-proxy`;
  const written = writeKubeconfig(kubeconfigPath(kubeconfig), { name, server });
  return `Server: ${server}\nContext ${name} in ${written} (now the current context). Try: kubectl --kubeconfig ${written} get pods\n`;
}
