/**
 * The agent role (ssh_service, db_service, app_service, kube_service, windows_desktop_service): a host identity,
 * then the reverse tunnel out to the Proxy through the Dialer, the services it forwards to (the SSH Service, the
 * resources of the configuration), and the export of the maintenance schedule for the upgrader.
 *
 * The identity is the stored one; or, on the first start, one joined with a token (through a Proxy or an Auth
 * Service anywhere), or one issued by an Auth Service in this same process (localAuth), whose tunnel then goes
 * to the Proxy of this process (localProxy), if one runs here.
 *
 * The host certificates renew themselves well before they run out (src/agent/renewal.ts): asked over the tunnel
 * once it is up, of the Auth API for a direct-join agent, of the Auth Service in this process for a local one.
 *
 * What only some agents run is loaded when they run it (start-up time): the SSH Service, the listeners of a
 * direct-join agent, the schedule export for the upgrader. The tunnel is dialed before any optional work.
 */
import { openUpgradeStream, operatorRoots } from '../dial/upgrade.js';
import type { Duplex } from 'node:stream';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { formatHostPort } from '../addr.js';
import { generateKeyPair } from '../auth/pki.js';
import type { CertBundle, JoinRole } from '../wire/certs.js';
import type { ClusterMaintenanceConfig } from '../auth/resources/types.js';
import { identityClient, joinCluster, loadHostIdentity, saveHostIdentity, type HostIdentity } from '../agent/identity.js';
import { agentResources, agentServices, resourceConnector, resourceReach, type ResourceReach } from '../agent/resources.js';
import type { DirectJoinAgent } from '../agent/directjoin.js';
import type { SessionEvent, SshService } from '../agent/ssh.js';
import type { GatewayConfig, ServiceName } from '../config/index.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';
import { watchCertificate } from '../metrics/certs.js';
import { watchUpgrade } from '../metrics/upgrade.js';
import { readLastRun } from '../upgrade/lastrun.js';
import { VERSION } from '../version.js';
import { ConnectionLimits, limitSettings } from '../net/deadlines.js';
import { AgentPool } from '../agent/pool.js';
import { E2EStreams } from '../agent/e2estream.js';
import { HostRenewal, type RenewAsk } from '../agent/renewal.js';
import { upgradeSoftware } from '../agent/tunnel.js';
import { agentUpgradeGroup, HealthReporter } from '../agent/rollout.js';
import { HEALTH_TIMEOUT_MS, HealthMonitor } from '../net/health.js';
import { readinessChecks } from './health.js';
import type { DialRequest, ServiceKind } from '../tunnel/protocol.js';
import type { DaemonEnvironment } from './environment.js';
import type { Lifecycle } from './lifecycle.js';
import { agentJoinRoles, localAddress } from './names.js';

/** How an agent joins on its first start (gateway start --token --ca-pin --proxy | --auth-server). */
export interface JoinFlags {
  token?: string;
  caPin?: string;
  /** The Proxy's web address to join through. */
  proxy?: string;
  /** Or the Auth Service's API address. */
  authServer?: string;
}

/** An Auth Service in this process: it issues host identities without a token (the process is trusted). */
export interface LocalJoiner {
  joinLocal(request: { roles: JoinRole[]; nodename: string; publicAddrs: string[]; publicKeyPem: string; sshPublicKey: string }): Promise<CertBundle & { hostId: string }>;
  renewHost(request: { hostId: string; publicKeyPem: string; via: string }): Promise<CertBundle & { hostId: string }>;
}

export interface AgentRoleOptions {
  config: GatewayConfig;
  /** The services this process runs; the agent ones among them are what the host identity must cover. */
  services: readonly ServiceName[];
  join?: JoinFlags;
  localAuth?: LocalJoiner;
  /** The bound web address of a Proxy in this process. */
  localProxy?: string;
  /** The process's Dialer: joining, the tunnel, the resources, the schedule's API calls. */
  dialer: Dialer;
  environment: DaemonEnvironment;
  /** Gets the tunnel, the SSH Service and the schedule export (agents phase). */
  lifecycle: Lifecycle;
  /** The process's listener limits; a process of agents alone makes its own (direct-join listeners). */
  limits?: ConnectionLimits;
}

export interface AgentRole {
  hostIdentity: HostIdentity;
  /** The agent's tunnels (one per Proxy behind its address, src/agent/pool.ts). None when the identity was issued here and no Proxy runs here. */
  tunnelAgent?: AgentPool;
  /** The SSH Service's own listener: only for agents that joined the Auth Service directly. */
  sshAddress?: string;
  /** Agents that joined the Auth Service directly: their listeners (bound) and what their presence advertises. */
  direct?: Pick<DirectJoinAgent, 'bound' | 'advertised' | 'heartbeat'>;
  /** The renewal of the host certificates (absent for an identity issued here when no Proxy runs here). */
  renewal?: HostRenewal;
  /** What its readiness checks (src/roles/health.ts): the resources it serves and how to reach each. */
  health: { resources: Array<{ kind: ServiceKind; name: string }>; reach: ResourceReach };
}

export async function startAgentRole(options: AgentRoleOptions): Promise<AgentRole> {
  const hostIdentity = await obtainIdentity(options);
  const health = agentHealth(options, hostIdentity);
  return { ...(await startAgentParts(options, hostIdentity, health.reach)), health };
}

/**
 * The resources /readyz checks every round, by kind and name, and their reachability (resourceReach): those a bare
 * connect-and-close cannot hurt. Not MySQL (a connection closed before its handshake counts towards the server's
 * max_connect_errors, which blocks the agent's host after 100 by default), TCP apps or desktops (a server that
 * takes one client at a time counts it as a failed client). gwctl probe, asked for by an operator, checks any.
 */
function agentHealth(options: AgentRoleOptions, identity: HostIdentity): AgentRole['health'] {
  return { resources: checkedResources(options), reach: resourceReach(options.config, options.services, options.dialer, identity.cluster) };
}

function checkedResources(options: AgentRoleOptions): AgentRole['health']['resources'] {
  const r = agentResources(options.config, options.services);
  return [
    ...r.databases.filter((d) => d.protocol !== 'mysql').map((d) => ({ kind: 'db' as const, name: d.name })),
    ...r.apps.filter((a) => a.kind !== 'tcp').map((a) => ({ kind: 'app' as const, name: a.name })),
    ...r.kube_clusters.map((k) => ({ kind: 'kube' as const, name: k.name })),
  ];
}

async function startAgentParts(options: AgentRoleOptions, hostIdentity: HostIdentity, reach: ResourceReach): Promise<Omit<AgentRole, 'health'>> {
  options.lifecycle.onStop('agents', watchCertificate('agent_host', () => hostIdentity.cert));
  // Joined the Auth Service directly: no tunnel (the Auth Service serves no /webapi/find); the Proxy dials its listeners.
  if (hostIdentity.joinedVia === 'auth') return { hostIdentity, ...(await startDirect(options, hostIdentity)) };
  // A locally issued identity's tunnel dials the web port of the Proxy in this same process.
  const tunnelIdentity =
    hostIdentity.server === 'local' ? (options.localProxy ? { ...hostIdentity, server: localAddress(options.localProxy) } : undefined) : hostIdentity;
  if (!tunnelIdentity) {
    logger('gateway').warn('agent services run next to an Auth Service without a Proxy: no reverse tunnel is opened');
    return { hostIdentity };
  }
  return { hostIdentity, ...(await startTunnel(options, tunnelIdentity, hostIdentity, reach)) };
}

/**
 * Renewal of the host certificates of `identity` (the object the agent's dials read), asked through `ask`; after
 * a renewal, onRenewed (and `mirror`, another object holding the same identity, gets the new certificates too).
 */
function startRenewal(options: AgentRoleOptions, identity: HostIdentity, ask: RenewAsk, onRenewed: () => void, mirror?: HostIdentity): HostRenewal {
  const renewal = new HostRenewal({
    identity,
    dataDir: options.config.gateway.data_dir,
    ask,
    onRenewed: () => {
      if (mirror && mirror !== identity) Object.assign(mirror, { cert: identity.cert, sshCert: identity.sshCert, identity: identity.identity });
      onRenewed();
    },
  });
  options.lifecycle.onStop('agents', () => renewal.stop());
  return renewal;
}

/** Certificates from the Auth Service in this process (an identity it issued). */
function localAsk(auth: LocalJoiner, hostId: string): RenewAsk {
  return (publicKeyPem) => auth.renewHost({ hostId, publicKeyPem, via: 'local' });
}

/** The stored identity (which must cover every agent service now run), else a new one. */
async function obtainIdentity(options: AgentRoleOptions): Promise<HostIdentity> {
  const { config, join: flags = {} } = options;
  const dataDir = config.gateway.data_dir;
  const joinRoles = agentJoinRoles(options.services);
  const stored = loadHostIdentity(dataDir);
  if (stored) {
    const missing = joinRoles.filter((r) => !stored.roles.includes(r));
    if (missing.length > 0) {
      throw new GatewayError('GW_ERR_AGENT_IDENTITY', `this agent joined as ${stored.roles.join(', ')} but now also runs ${missing.join(', ')}`, {
        hint: `Remove ${join(dataDir, 'host')} and join again with a token for ${joinRoles.join(', ')}.`,
      });
    }
    logger('gateway').info({ hostId: stored.hostId, cluster: stored.cluster }, 'using the stored host identity');
    return stored;
  }
  const publicAddrs = options.services.flatMap((s) => (config[s] as { public_addr: readonly { host: string; port?: number }[] }).public_addr.map((a) => (a.port ? formatHostPort(a.host, a.port) : a.host)));
  const nodename = config.gateway.nodename;
  if (flags.token) {
    const server = flags.proxy ?? flags.authServer;
    if (!server) throw new GatewayError('GW_ERR_USAGE', '--token needs --proxy host:port (or --auth-server host:port)');
    if (!flags.caPin) {
      throw new GatewayError('GW_ERR_USAGE', '--token needs --ca-pin sha256:...', {
        hint: "'gwctl tokens add' prints the pin; it is what makes the first connection to the cluster safe.",
      });
    }
    return joinCluster({ dataDir, server, joinedVia: flags.proxy ? 'proxy' : 'auth', token: flags.token, caPin: flags.caPin, roles: joinRoles, nodename, publicAddrs, dialer: options.dialer });
  }
  if (options.localAuth) {
    const keys = generateKeyPair();
    const bundle = await options.localAuth.joinLocal({ roles: joinRoles, nodename, publicAddrs, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
    saveHostIdentity(dataDir, keys.privateKeyPem, bundle, { roles: joinRoles, nodename, server: 'local', joinedVia: 'local' });
    return loadHostIdentity(dataDir)!;
  }
  throw new GatewayError('GW_ERR_AGENT_IDENTITY', 'this agent has not joined a cluster yet', {
    hint: "Start it once with --token, --ca-pin and --proxy, as printed by 'gwctl tokens add'.",
  });
}

/** The reverse tunnel out to the Proxy, and what it forwards to. */
async function startTunnel(options: AgentRoleOptions, identity: HostIdentity, stored: HostIdentity, reach: ResourceReach): Promise<{ tunnelAgent: AgentPool; renewal: HostRenewal }> {
  const { config, services, dialer, lifecycle } = options;
  let agent: AgentPool | undefined;
  const ssh = services.includes('ssh_service') ? await sshService(config, identity, (e) => agent?.sendEvent({ ...e })) : undefined;
  // An agent that joined through a Proxy is reached through its tunnel alone (direct-join agents: startDirect).
  if (ssh) lifecycle.onStop('agents', () => ssh.close());
  const resources = agentResources(config, services);
  if (ssh) resources.node_host_cert = identity.sshCert;
  const group = agentUpgradeGroup(config.gateway.upgrade_group, services.includes('ssh_service') ? config.ssh_service.labels : undefined);
  if (group.problem) logger('gateway').warn(group.problem);
  let reporter: HealthReporter | undefined;
  agent = new AgentPool({
    // An identity issued in this process dials the Proxy of this process: the only one it can reach.
    ...(identity.joinedVia === 'local' ? { maxLinks: 1 } : {}),
    identity,
    dialer,
    services: agentServices(services),
    resources,
    connectResource: resourceConnector(config, services, dialer, identity.cluster),
    reachResource: reach,
    ...(ssh ? { serveSsh: (channel: Duplex, request: DialRequest) => ssh.inject(channel, request.client_src) } : {}),
    heartbeatIntervalMs: config.auth_service.keep_alive_interval,
    heartbeatCountMax: config.auth_service.keep_alive_count_max,
    // The hello's version and upgrade channel, from the daemon's environment (GATEWAY_UPGRADE_*).
    software: () => upgradeSoftware(options.environment.env),
    ...(group.group === undefined ? {} : { upgradeGroup: group.group }),
    health: () => reporter?.current(),
    // This process's first hello on each Proxy drains the tunnel of the process before it (a hand-over, a pod
    // replaced, a restart) for the drain limit instead of cutting its sessions (src/handover.ts).
    takeOver: { drainMs: config.gateway.drain_limit },
    // End-to-end streams (docs/tunnels.md): one set of checks, used grants and locks for every tunnel of the pool.
    ...(config.gateway.e2e_pool > 0 ? { e2e: { pool: config.gateway.e2e_pool, streams: new E2EStreams({ identity, services: agentServices(services), resources, ssh: ssh !== undefined, log: logger('e2e') }) } } : {}),
    // The ladder's last rung: the tunnel's TLS inside a WebSocket on the web address, past a TLS-inspecting proxy
    // whose root the operator gave (src/dial/upgrade.ts verifies the outer TLS against it or the cluster's CA).
    openUpgrade: (d, webAddr) => openUpgradeStream(d, webAddr, { roots: operatorRoots(d), clusterCa: identity.hostCa }),
  });
  const tunnelAgent = agent;
  lifecycle.onStop('agents', () => tunnelAgent.stop());
  reporter = startHealthReporter(options, tunnelAgent, reach);
  const local = identity.joinedVia === 'local' && options.localAuth ? localAsk(options.localAuth, identity.hostId) : undefined;
  const renewal = startRenewal(options, identity, local ?? ((key: string) => tunnelAgent.requestRenewal(key)), () => {
    if (!ssh) return;
    resources.node_host_cert = identity.sshCert; // sent with every next hello, and now to the Proxies of the live tunnels
    tunnelAgent.announceHostCert(identity.sshCert);
  }, stored);
  // Over the tunnel, the first check waits for the first tunnel (the agent's only way to its Auth Service).
  if (local) renewal.start();
  else tunnelAgent.once('connected', () => renewal.start());
  tunnelAgent.start();
  await exportSchedule(options, identity, tunnelAgent);
  return { tunnelAgent, renewal };
}

/**
 * The agent's health for the rollout (src/agent/rollout.ts): the same checks /readyz runs (its tunnel, its
 * resources), measured every heartbeat interval by a monitor of its own (the diagnostics listener may be off),
 * and its upgrader's last run when the host has the upgrader.
 */
function startHealthReporter(options: AgentRoleOptions, pool: AgentPool, reach: ResourceReach): HealthReporter {
  const { config, environment, lifecycle } = options;
  const intervalMs = config.auth_service.keep_alive_interval;
  const resources = checkedResources(options);
  const monitor = new HealthMonitor(readinessChecks({ timeoutMs: Math.min(HEALTH_TIMEOUT_MS, intervalMs), tunnel: pool, resources, reach }), { intervalMs });
  const upgraderDir = environment.upgraderDir();
  const reporter = new HealthReporter({
    measure: async () => {
      await monitor.runRound();
      return monitor.report().checks.map((c) => ({ name: c.name, ok: c.ok, ...(c.detail ? { detail: c.detail } : {}) }));
    },
    send: (h) => pool.sendHealth(h),
    ...(existsSync(upgraderDir) ? { readLastRun: () => readLastRun(upgraderDir) } : {}),
    staleAfterMs: config.gateway.upgrade_stale_after,
    intervalMs,
  });
  pool.on('connected', () => void reporter.tick());
  reporter.start();
  lifecycle.onStop('agents', () => reporter.stop());
  return reporter;
}

async function sshService(config: GatewayConfig, identity: HostIdentity, onEvent: (e: SessionEvent) => void): Promise<SshService> {
  const { SshService } = await import('../agent/ssh.js');
  return new SshService({ hostKeyPem: identity.key, userCa: identity.sshUserCa, nodename: config.gateway.nodename, sftpServer: config.ssh_service.sftp_server, onEvent });
}

/**
 * A direct-join agent (src/agent/directjoin.ts): the SSH, Kubernetes and Windows Desktop listeners the Proxy
 * dials, and its own presence heartbeat to the Auth Service. No reverse tunnel.
 */
async function startDirect(options: AgentRoleOptions, identity: HostIdentity): Promise<Pick<AgentRole, 'sshAddress' | 'direct' | 'renewal'>> {
  const { config, services, lifecycle } = options;
  let limits = options.limits;
  if (!limits) {
    const own = new ConnectionLimits(limitSettings(config));
    lifecycle.onStop('backend', () => own.close());
    limits = own;
  }
  let direct: DirectJoinAgent | undefined;
  const ssh = services.includes('ssh_service') ? await sshService(config, identity, (e) => direct?.sendEvent({ ...e })) : undefined;
  if (ssh) lifecycle.onStop('agents', () => ssh.close());
  const { startDirectJoin } = await import('../agent/directjoin.js');
  direct = await startDirectJoin({ config, services, identity, dialer: options.dialer, limits, ...(ssh ? { ssh } : {}) });
  const running = direct;
  lifecycle.onStop('agents', () => running.stop());
  const renewal = startRenewal(options, identity, (key) => running.requestRenewal(key), () => running.renewed());
  renewal.start();
  await exportSchedule(options, identity);
  return { ...(running.bound.ssh ? { sshAddress: running.bound.ssh } : {}), direct: running, renewal };
}

/**
 * Automatic upgrades: when this machine has the upgrader (its directory exists), or in Kubernetes, keep the
 * schedule current: periodically, and whenever the Proxy says cluster_maintenance_config changed.
 */
async function exportSchedule(options: AgentRoleOptions, identity: HostIdentity, agent?: AgentPool): Promise<void> {
  const { environment, dialer } = options;
  const upgraderDir = environment.upgraderDir();
  const { kubeScheduleFile, kubeScheduleSecret } = environment;
  if (!existsSync(upgraderDir) && !kubeScheduleFile && !kubeScheduleSecret) return;
  options.lifecycle.onStop('agents', watchUpgrade(() => ({ current: VERSION, channel: upgradeSoftware(environment.env).channel, lastRun: readLastRun(upgraderDir) })));
  const { startScheduleExport } = await import('../upgrade/schedule.js');
  const api = identityClient(identity, { dialer });
  const exporter = startScheduleExport({
    fetchConfig: async () => (await api().call<{ config: ClusterMaintenanceConfig | null }>('GET', '/v1/agent/maintenance')).config ?? undefined,
    clusterVersion: async () => (await api().call<{ server_version: string }>('GET', '/webapi/ping')).server_version,
    ...(existsSync(upgraderDir) ? { dir: upgraderDir } : {}),
    ...(kubeScheduleFile ? { kubeStatePath: kubeScheduleFile } : {}),
    ...(kubeScheduleSecret
      ? {
          // In Kubernetes the chart sets these: the schedule goes into the Secret the updater pod reads. The client
          // library is loaded only there: it is large and other agents never need it.
          // Its host id goes with it: the updater asks the managed rollout for this agent (a canary is one by host id).
          writeKubeState: async (json: string) => (await import('../upgrade/kube/client.js')).kubeScheduleWriter({ ...kubeScheduleSecret, hostId: identity.hostId, env: environment.env })(json),
        }
      : {}),
  });
  agent?.on('maintenance-changed', () => void exporter.refresh());
  options.lifecycle.onStop('agents', () => exporter.stop());
}
