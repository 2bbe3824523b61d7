/**
 * `gateway start`: runs the roles the configuration (or --roles) enables, in one process, by composing the role
 * starters of src/roles/:
 *
 *   auth    roles/auth.ts    Backend, AuthService, its API (mTLS), the local admin identity
 *   proxy   roles/proxy.ts   the front door, tunnel server, SSH jump host, version server; its ProxyAuth is the
 *                            in-process AuthService, or, without the auth role here, a RemoteProxyAuth
 *                            (roles/auth.ts connectRemoteAuth: mutual TLS to the Auth API, joined with a proxy token)
 *   agents  roles/agent.ts   a host identity, the reverse tunnel and what it forwards to, the schedule export
 *
 * The roles share one Dialer, one set of connection limits and one shutdown order (roles/lifecycle.ts: agents,
 * then the Proxy, then the Auth API, then the Backend). The environment comes from the caller (roles/environment.ts).
 *
 * A role's starter, and all it imports, is loaded only when the role runs: an agent's start does not load the Auth
 * Service, its Backend or the Proxy (start-up time).
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { AuthService } from './auth/service.js';
import { writePublicFile } from './fsutil.js';
import type { HostIdentity } from './agent/identity.js';
import { formatHostPort } from './addr.js';
import type { GatewayConfig, ServiceName } from './config/index.js';
import { enabledServices } from './config/index.js';
import { Dialer } from './dial/dialer.js';
import { GatewayError } from './errors.js';
import { ConnectionLimits, limitSettings } from './net/deadlines.js';
import { enableMetrics } from './metrics/define.js';
import { startDiagServer } from './net/diag.js';
import { HEALTH_TIMEOUT_MS, HealthMonitor } from './net/health.js';
import { checkDiagAddr, readinessChecks, reachTcp } from './roles/health.js';
import { startTracing, stopTracing, tracingSettings } from './trace.js';
import type { AgentRole, JoinFlags } from './roles/agent.js';
import type { DaemonEnvironment } from './roles/environment.js';
import { Lifecycle } from './roles/lifecycle.js';
import { agentJoinRoles } from './roles/names.js';
import type { TunnelServer } from './proxy/tunnel.js';
import type { ClusterView } from './proxy/cluster.js';
import type { RemoteProxyAuth } from './client/remoteauth.js';

export interface StartFlags extends JoinFlags {
  /** --roles: node, db, app, kube, desktop, auth, proxy (overrides the services the configuration enables). */
  roles?: string[];
}

export interface Daemon {
  services: ServiceName[];
  tunnelAgent?: AgentRole['tunnelAgent'];
  tunnels?: TunnelServer;
  /** The cluster's Proxies and where agents are, as this Proxy sees them. */
  cluster?: ClusterView;
  /** Bound addresses, by listener name (auth, web). */
  addresses: Record<string, string>;
  /** Deadlines, caps and counters of the Auth API's and the Proxy's listeners (when either runs here). */
  limits?: ConnectionLimits;
  auth?: AuthService;
  /** A Proxy without the Auth Service in its process: its client of the Auth API. */
  remoteAuth?: RemoteProxyAuth;
  /** An agent's host identity, or a Proxy's that joined with a proxy token. */
  hostIdentity?: HostIdentity;
  /**
   * SIGHUP (src/reload.ts): applies what can change without a restart, the version server's channels and the
   * sources PROXY headers are believed from (`parts`: which of them; both when not given). Throws, changing
   * nothing, when the channels are invalid. Listeners, tunnels and sessions are not touched.
   */
  reload(config: GatewayConfig, parts?: { channels: boolean; trustedSources: boolean }): void;
  /**
   * A hand-over (src/handover.ts): lets go of the diag listener (gateway.diag_addr) so that the successor binds
   * it; undo() binds it again when the successor failed.
   */
  releaseDiag(): Promise<{ undo(): Promise<void> }>;
  stop(): Promise<void>;
}

const ROLE_TO_SERVICE: Record<string, ServiceName> = {
  auth: 'auth_service',
  proxy: 'proxy_service',
  node: 'ssh_service',
  ssh: 'ssh_service',
  db: 'db_service',
  app: 'app_service',
  kube: 'kube_service',
  desktop: 'windows_desktop_service',
};

export function servicesFor(config: GatewayConfig, roles: string[] | undefined): ServiceName[] {
  if (!roles || roles.length === 0) return enabledServices(config);
  const out = new Set<ServiceName>();
  for (const role of roles) {
    const service = ROLE_TO_SERVICE[role.trim().toLowerCase()];
    if (!service) {
      throw new GatewayError('GW_ERR_USAGE', `--roles: "${role}" is not a role`, { hint: `Roles: ${Object.keys(ROLE_TO_SERVICE).join(', ')}.` });
    }
    out.add(service);
  }
  return [...out];
}

/**
 * Where clients and agents reach this Proxy (what `gwctl tokens add` prints as --proxy and the start banner names):
 * its first public address, else this node and the web port (the bound one, when the configured port is 0).
 */
export function proxyAddressForClients(config: GatewayConfig, webPort: number = config.proxy_service.web_listen_addr.port): string {
  const first = config.proxy_service.public_addr[0];
  return first ? formatHostPort(first.host, first.port) : formatHostPort(config.gateway.nodename, webPort);
}

export async function startDaemon(config: GatewayConfig, flags: StartFlags, environment: DaemonEnvironment): Promise<Daemon> {
  const services = servicesFor(config, flags.roles);
  checkDiagAddr(config, services);
  const runs = (service: ServiceName) => services.includes(service);
  const lifecycle = new Lifecycle();
  // Metrics are recorded only where they can be read (docs/operations.md): before any role binds its recorders.
  if (config.gateway.diag_addr) enableMetrics();
  const proxyCa = config.gateway.proxy_ca_file;
  const dialer = new Dialer({ env: environment.env, ...(proxyCa ? { inspectionRoots: [{ path: proxyCa, from: 'gateway.proxy_ca_file' }] } : {}) });
  const addresses: Record<string, string> = {};
  let diag: Awaited<ReturnType<typeof startDiagServer>> | undefined;
  let reopenDiag: (() => Promise<void>) | undefined;
  try {
    await startDaemonTracing(config, services, environment.env, lifecycle);
    const remoteProxy = runs('proxy_service') && !runs('auth_service');
    const agents = agentJoinRoles(services).length > 0;
    if (remoteProxy && agents) {
      throw new GatewayError('GW_ERR_CONFIG_VALUE', 'a Proxy without the auth service in its process runs no agent service next to it in this version', {
        hint: 'Run the agent services in their own process (its own data directory), joined through this Proxy.',
      });
    }
    // The starters of the roles that run, loading side by side from here on.
    const authRole = runs('auth_service') || remoteProxy ? loading(import('./roles/auth.js')) : undefined;
    const proxyRole = runs('proxy_service') ? loading(import('./roles/proxy.js')) : undefined;
    const agentRole = agents ? loading(import('./roles/agent.js')) : undefined;
    // The limits of every listener of this process: the Auth API's and the Proxy's.
    const limits = runs('auth_service') || runs('proxy_service') ? startLimits(config, lifecycle) : undefined;
    const auth = limits && runs('auth_service')
      ? await (await authRole!).startAuthRole({ config, limits, lifecycle, dialer, ...(runs('proxy_service') ? { proxyPublicAddr: proxyAddressForClients(config) } : {}) })
      : undefined;
    if (auth) addresses.auth = auth.address;
    const remote = remoteProxy
      ? await (await authRole!).connectRemoteAuth({ config, dialer, lifecycle, ...(flags.authServer ? { authServers: flags.authServer } : {}), ...(flags.token ? { token: flags.token } : {}), ...(flags.caPin ? { caPin: flags.caPin } : {}) })
      : undefined;
    const proxyAuth = auth ? { auth: auth.auth, api: auth.api, proxyId: localProxyId(config.gateway.data_dir) } : remote ? { auth: remote.auth, api: remote.api, proxyId: remote.identity.hostId } : undefined;
    const proxy = limits && proxyAuth && runs('proxy_service')
      ? await (await proxyRole!).startProxyRole({ config, ...proxyAuth, limits, dialer, lifecycle })
      : undefined;
    Object.assign(addresses, proxy?.addresses);
    const agent = agentRole
      ? await (await agentRole).startAgentRole({ config, services, join: flags, ...(auth ? { localAuth: auth.auth } : {}), ...(addresses.web ? { localProxy: addresses.web } : {}), ...(limits ? { limits } : {}), dialer, environment, lifecycle })
      : undefined;
    if (agent?.sshAddress) addresses.ssh = agent.sshAddress;
    // Last, so that /healthz answers only once everything above started; /readyz reads the checks' last round.
    if (config.gateway.diag_addr) {
      const monitor = new HealthMonitor(
        readinessChecks({
          timeoutMs: HEALTH_TIMEOUT_MS,
          ...(auth ? { backend: auth.backend, localAuth: true } : {}),
          ...(remote ? { remoteAuth: remote.auth } : {}),
          ...(proxy ? { listeners: () => proxy.listening() } : {}),
          ...(agent?.tunnelAgent ? { tunnel: agent.tunnelAgent } : {}),
          ...(agent ? agent.health : {}),
          ...(agent?.sshAddress ? { sshListener: { check: (ms: number) => reachTcp(agent.sshAddress!, ms) } } : {}),
        }),
      );
      lifecycle.onStop('backend', () => monitor.stop());
      void monitor.start();
      const at = config.gateway.diag_addr;
      diag = await startDiagServer(at, () => monitor.report());
      lifecycle.onStop('backend', () => diag?.close());
      addresses.diag = diag.address;
      reopenDiag = async () => {
        diag = await startDiagServer(at, () => monitor.report());
      };
    }
    return {
      services,
      addresses,
      ...(limits ? { limits } : {}),
      ...(auth ? { auth: auth.auth } : {}),
      ...(agent ? { hostIdentity: agent.hostIdentity } : remote ? { hostIdentity: remote.identity } : {}),
      ...(remote ? { remoteAuth: remote.auth } : {}),
      ...(agent?.tunnelAgent ? { tunnelAgent: agent.tunnelAgent } : {}),
      ...(proxy ? { tunnels: proxy.tunnels, cluster: proxy.cluster } : {}),
      reload: (next, parts = { channels: true, trustedSources: true }) => {
        // Channels first: it is the step that can refuse the new values.
        if (parts.channels) proxy?.setChannels(next.proxy_service.automatic_upgrades_channels);
        if (parts.trustedSources) proxy?.setProxyProtocolTrusted(next.proxy_service.proxy_protocol_trusted_sources);
      },
      releaseDiag: async () => {
        const open = diag;
        diag = undefined;
        await open?.close();
        return { undo: async () => (open ? reopenDiag?.() : undefined) };
      },
      stop: () => lifecycle.stop(),
    };
  } catch (err) {
    await lifecycle.stop();
    throw err;
  }
}

/**
 * Traces (src/trace.ts), before any role starts so that their first connections are traced; off (nothing loaded)
 * unless gateway.tracing or the OTEL_ variables name an endpoint. The last export is flushed at the very end.
 */
async function startDaemonTracing(config: GatewayConfig, services: readonly ServiceName[], env: Record<string, string | undefined>, lifecycle: Lifecycle): Promise<void> {
  const settings = tracingSettings(config.gateway.tracing, env, 'gateway');
  if (!settings) return;
  await startTracing({ ...settings, resource: { 'gateway.nodename': config.gateway.nodename, 'gateway.roles': services.map((s) => s.replace(/_service$/, '')).join(',') } });
  lifecycle.onStop('backend', () => stopTracing());
}

/** A module being loaded: awaited later, or not at all when an earlier step fails (which must not be an unhandled rejection). */
function loading<T>(module: Promise<T>): Promise<T> {
  module.catch(() => undefined);
  return module;
}

/** The host ID of a Proxy that runs next to its Auth Service: made once, kept in <data_dir>/proxy_id. */
function localProxyId(dataDir: string): string {
  const file = join(dataDir, 'proxy_id');
  try {
    const id = readFileSync(file, 'utf8').trim();
    if (/^[0-9a-f-]{36}$/.test(id)) return id;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
  const id = randomUUID();
  writePublicFile(file, `${id}\n`);
  return id;
}

function startLimits(config: GatewayConfig, lifecycle: Lifecycle): ConnectionLimits {
  const limits = new ConnectionLimits(limitSettings(config));
  limits.startSummary();
  lifecycle.onStop('backend', () => limits.close());
  return limits;
}
