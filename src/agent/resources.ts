/**
 * What an agent serves (from its configuration) and how it reaches each resource when the Proxy forwards a
 * connection: databases, TCP apps and desktops by direct TCP on the agent's own network (these are local
 * resources: a corporate HTTPS_PROXY is for reaching the Proxy, not the database next door); HTTP(S) apps
 * likewise; Kubernetes API servers through the Dialer, so HTTPS_PROXY / NO_PROXY apply: direct when NO_PROXY
 * exempts the API server's address or kube.<cluster_name>.local (the rule is select.ts's, docs/dialing.md);
 * with the cluster's credential (service-account token, kubeconfig) added by kubeapi.ts.
 */
import { readFileSync } from 'node:fs';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { formatHostPort, type HostPort } from '../addr.js';
import type { GatewayConfig, ServiceName } from '../config/index.js';
import type { Dialer } from '../dial/dialer.js';
import { decisionAttributes, kubeApiAlias, kubeApiTarget } from '../dial/select.js';
import { tlsVerifyError } from '../dial/tlsverify.js';
import { GatewayError } from '../errors.js';
import { connectTls } from '../stream/tls.js';
import { tracingEnabled, type HopSpan } from '../trace.js';
import type { AgentResources, AppInfo, DialRequest, ServiceKind } from '../tunnel/protocol.js';
import { kubeFront } from './kubeapi.js';
import { kubeCredentials, type KubeCredentials, type KubeTls } from './kubecreds.js';
import type { ResourceDialer } from './tunnel.js';

const SERVICE_KINDS: Partial<Record<ServiceName, ServiceKind>> = {
  ssh_service: 'ssh',
  db_service: 'db',
  app_service: 'app',
  windows_desktop_service: 'desktop',
  kube_service: 'kube',
};

export function agentServices(services: readonly ServiceName[]): ServiceKind[] {
  return services.map((s) => SERVICE_KINDS[s]).filter((k): k is ServiceKind => k !== undefined);
}

function appKind(uri: string): AppInfo['kind'] {
  return uri.startsWith('https://') ? 'https' : uri.startsWith('http://') ? 'http' : 'tcp';
}

export function agentResources(config: GatewayConfig, services: readonly ServiceName[]): AgentResources {
  const on = (s: ServiceName) => services.includes(s);
  return {
    databases: on('db_service') ? config.db_service.databases.map((d) => ({ name: d.name, protocol: d.protocol, labels: { ...d.labels } })) : [],
    apps: on('app_service')
      ? config.app_service.apps.map((a) => ({ name: a.name, kind: appKind(a.uri), labels: { ...a.labels }, ...(a.public_addr ? { public_addr: a.public_addr } : {}) }))
      : [],
    desktops: on('windows_desktop_service') ? config.windows_desktop_service.desktops.map((d) => ({ name: d.name, labels: { ...d.labels } })) : [],
    kube_clusters: on('kube_service') ? config.kube_service.clusters.map((k) => ({ name: k.name, labels: { ...k.labels } })) : [],
    ...(on('ssh_service') ? { node_labels: { ...config.ssh_service.labels } } : {}),
  };
}

/** host:port of an app URI (http://, https:// or tcp://). */
export function appAddress(uri: string): HostPort {
  const u = new URL(uri);
  const port = u.port ? Number(u.port) : u.protocol === 'https:' ? 443 : 80;
  return { host: u.hostname.replace(/^\[|\]$/g, ''), port };
}

/** A direct TCP connection with a deadline; half-close passes through. */
export function connectTcp(to: HostPort, timeoutMs: number, what: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: to.host, port: to.port, allowHalfOpen: true, noDelay: true, keepAlive: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `${what} at ${formatHostPort(to.host, to.port)}: no connection within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `${what} at ${formatHostPort(to.host, to.port)}: ${err.code ?? err.message}`));
    });
  });
}

export function resourceConnector(config: GatewayConfig, services: readonly ServiceName[], dialer: Dialer, clusterName: string, timeoutMs = 10_000): ResourceDialer {
  const on = (s: ServiceName) => services.includes(s);
  // One per cluster for the agent's life: each keeps its token and the stat it was read at.
  const kubeCreds = new Map<string, KubeCredentials>();
  return async (request: DialRequest, hop?: Pick<HopSpan, 'set'>): Promise<Duplex> => {
    const notServed = () => new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `this agent serves no ${request.service} "${request.resource}"`);
    switch (request.service) {
      case 'db': {
        const db = on('db_service') ? config.db_service.databases.find((d) => d.name === request.resource) : undefined;
        if (!db) throw notServed();
        return connectTcp(db.uri, timeoutMs, `database "${db.name}"`);
      }
      case 'app': {
        const app = on('app_service') ? config.app_service.apps.find((a) => a.name === request.resource) : undefined;
        if (!app) throw notServed();
        return connectTcp(appAddress(app.uri), timeoutMs, `app "${app.name}"`);
      }
      case 'desktop': {
        const desktop = on('windows_desktop_service') ? config.windows_desktop_service.desktops.find((d) => d.name === request.resource) : undefined;
        if (!desktop) throw notServed();
        return connectTcp(desktop.addr, timeoutMs, `desktop "${desktop.name}"`);
      }
      case 'kube': {
        const cluster = on('kube_service') ? config.kube_service.clusters.find((k) => k.name === request.resource) : undefined;
        if (!cluster) throw notServed();
        // Direct when NO_PROXY exempts the API server's address or kube.<cluster_name>.local (select.ts, rule 5).
        const target = kubeApiTarget(cluster.api_server);
        const address = formatHostPort(target.host, target.port);
        if (hop && tracingEnabled()) hop.set(decisionAttributes(dialer.plan(target, kubeApiAlias(clusterName))));
        const connect = async (tls: KubeTls): Promise<Duplex> => {
          const raw = await dialer.dial(target, { alias: kubeApiAlias(clusterName) });
          return connectTls(raw, { host: target.host, ...tls }).catch((err: Error) => {
            throw (
              tlsVerifyError(err, { address, server: 'kube-api', name: cluster.name }) ??
              new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `Kubernetes API server of "${cluster.name}" at ${address}: ${err.message}`)
            );
          });
        };
        // No credential (the classic route): the stream is the API server's TLS connection itself. With one, or on
        // an end-to-end stream (kube_access: the agent impersonates, so it must read the HTTP), the agent serves
        // the stream as HTTP and adds the credential and impersonation to each request (kubeapi.ts).
        const e2e = request.kube_access ? { cluster: cluster.name, user: request.user ?? '', access: request.kube_access } : undefined;
        if (cluster.credentials === 'none' && !e2e) return connect(cluster.ca_file ? { ca: readFileSync(cluster.ca_file, 'utf8') } : {});
        let creds = kubeCreds.get(cluster.name);
        if (!creds) kubeCreds.set(cluster.name, (creds = kubeCredentials(cluster)));
        return kubeFront(creds, connect, e2e ? { e2e } : {});
      }
      default:
        throw notServed();
    }
  };
}

/**
 * Whether a resource answers, without touching its data: a TCP connection to its address (a Kubernetes API
 * server's through the Dialer, as its real dials go), closed as soon as it is made. What /readyz's resource checks
 * (src/roles/health.ts) and a probe's last hop (`gwctl probe`, src/agent/tunnel.ts) ask. Resolves with the
 * connect time in milliseconds; rejects with GW_ERR_TUNNEL_NOT_FOUND for a resource this agent does not serve,
 * GW_ERR_TUNNEL_DIAL_FAILED when it does not answer within timeoutMs.
 */
export type ResourceReach = (service: ServiceKind, name: string, timeoutMs: number) => Promise<number>;

export function resourceReach(config: GatewayConfig, services: readonly ServiceName[], dialer: Dialer, clusterName: string): ResourceReach {
  const on = (s: ServiceName) => services.includes(s);
  const addressOf = (service: ServiceKind, name: string): { to: HostPort; what: string; viaDialer?: boolean } | undefined => {
    switch (service) {
      case 'db': {
        const db = on('db_service') ? config.db_service.databases.find((d) => d.name === name) : undefined;
        return db && { to: db.uri, what: `database "${db.name}"` };
      }
      case 'app': {
        const app = on('app_service') ? config.app_service.apps.find((a) => a.name === name) : undefined;
        return app && { to: appAddress(app.uri), what: `app "${app.name}"` };
      }
      case 'desktop': {
        const desktop = on('windows_desktop_service') ? config.windows_desktop_service.desktops.find((d) => d.name === name) : undefined;
        return desktop && { to: desktop.addr, what: `desktop "${desktop.name}"` };
      }
      case 'kube': {
        const cluster = on('kube_service') ? config.kube_service.clusters.find((k) => k.name === name) : undefined;
        return cluster && { to: kubeApiTarget(cluster.api_server), what: `Kubernetes API server of "${cluster.name}"`, viaDialer: true };
      }
      default:
        return undefined;
    }
  };
  return async (service, name, timeoutMs) => {
    const found = addressOf(service, name);
    if (!found) throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `this agent serves no ${service} "${name}"`);
    const started = performance.now();
    const socket = found.viaDialer ? await dialWithin(dialer, found.to, clusterName, timeoutMs, found.what) : await connectTcp(found.to, timeoutMs, found.what);
    socket.destroy();
    return performance.now() - started;
  };
}

/** The Dialer's connection to `to` within timeoutMs (aborted after it), for a reachability check. */
async function dialWithin(dialer: Dialer, to: HostPort, clusterName: string, timeoutMs: number, what: string): Promise<net.Socket> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    return await dialer.dial(to, { alias: kubeApiAlias(clusterName), signal: abort.signal });
  } catch (err) {
    const why = abort.signal.aborted ? `no connection within ${timeoutMs} ms` : (err as Error).message;
    throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `${what} at ${formatHostPort(to.host, to.port)}: ${why}`);
  } finally {
    clearTimeout(timer);
  }
}
