/**
 * `gateway start`: opens the roles the configuration (or --roles) enables, in one process.
 *
 *   auth    backend (SQLite in the data directory), AuthService, its API on auth_service.listen_addr (mTLS),
 *           and the local admin identity in <data_dir>/admin/ for gwctl on this machine
 *   proxy   the web port (web_listen_addr): the same API router (login, join, CA, gwctl calls with user certs);
 *           needs the auth role in the same process for now
 *   agents  a host identity: joined with --token/--ca-pin/--proxy (or issued locally when auth runs here)
 */
import http from 'node:http';
import type net from 'node:net';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { formatHostPort, type HostPort } from './addr.js';
import { createApiHandler } from './auth/api.js';
import { generateKeyPair } from './auth/pki.js';
import { AuthService, JOIN_ROLES, type JoinRole } from './auth/service.js';
import { joinCluster, loadHostIdentity, saveHostIdentity, type HostIdentity } from './agent/identity.js';
import { openSqliteBackend, type Backend } from './backend/index.js';
import type { GatewayConfig, ServiceName } from './config/index.js';
import { enabledServices } from './config/index.js';
import { Dialer } from './dial/dialer.js';
import { GatewayError } from './errors.js';
import { writePublicFile, writeSecretFile } from './fsutil.js';
import { logger } from './log.js';
import { ConnectionLimits, limitSettings } from './net/deadlines.js';
import { guardHttpServer } from './net/http.js';
import { closeServer, guardedServer, listenOn } from './net/listen.js';
import { serverSecureContext, terminateTls } from './net/tls.js';
import { startFrontDoor } from './proxy/frontdoor.js';
import { createAccessHandler } from './proxy/access.js';
import { SshJumpServer } from './proxy/sshjump.js';
import { createKubeHandler, createWebAppHandler } from './proxy/webapps.js';
import { isIP } from 'node:net';
import { TunnelServer } from './tunnel/server.js';
import { TunnelAgent, sshPrivateKey } from './tunnel/agent.js';
import { agentResources, agentServices, resourceConnector } from './agent/resources.js';
import { SshService } from './agent/ssh.js';
import type { Duplex } from 'node:stream';
import type { DialRequest } from './tunnel/protocol.js';
import { ReloadableVersionServer } from './reload.js';
import { VERSION } from './version.js';
import { existsSync, readFileSync } from 'node:fs';
import { ApiClient } from './client/api.js';
import { resolveSettings } from './upgrade/settings.js';
import { startScheduleExport } from './upgrade/schedule.js';
import type { ClusterMaintenanceConfig } from './auth/resources/types.js';
import { X509Certificate, createPrivateKey } from 'node:crypto';

export interface StartFlags {
  /** --roles: node, db, app, kube, desktop, auth, proxy (overrides the services the configuration enables). */
  roles?: string[];
  token?: string;
  caPin?: string;
  /** The Proxy's web address to join through. */
  proxy?: string;
  /** Or the Auth Service's API address. */
  authServer?: string;
}

export interface Daemon {
  services: ServiceName[];
  tunnelAgent?: TunnelAgent;
  tunnels?: TunnelServer;
  /** Bound addresses, by listener name (auth, web). */
  addresses: Record<string, string>;
  /** Deadlines, caps and counters of the Auth API's and the Proxy's listeners (when either runs here). */
  limits?: ConnectionLimits;
  auth?: AuthService;
  hostIdentity?: HostIdentity;
  /**
   * SIGHUP (src/reload.ts): applies what can change without a restart, the version server's channels.
   * Throws, changing nothing, when they are invalid. Listeners, tunnels and sessions are not touched.
   */
  reload(config: GatewayConfig): void;
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

const SERVICE_TO_JOIN_ROLE: Partial<Record<ServiceName, JoinRole>> = {
  ssh_service: 'node',
  db_service: 'db',
  app_service: 'app',
  kube_service: 'kube',
  windows_desktop_service: 'desktop',
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


/** Where a client on this machine reaches a listener bound to addr (0.0.0.0 → 127.0.0.1). */
function localAddress(bound: string): string {
  return bound.replace(/^0\.0\.0\.0:/, '127.0.0.1:').replace(/^\[::\]:/, '[::1]:');
}

export async function startDaemon(config: GatewayConfig, flags: StartFlags = {}): Promise<Daemon> {
  const log = logger('gateway');
  const services = servicesFor(config, flags.roles);
  const dataDir = config.gateway.data_dir;
  const addresses: Record<string, string> = {};
  const servers: net.Server[] = [];
  let backend: Backend | undefined;
  let auth: AuthService | undefined;
  let hostIdentity: HostIdentity | undefined;
  let tunnels: TunnelServer | undefined;
  let tunnelAgent: TunnelAgent | undefined;
  let versionServer: ReloadableVersionServer | undefined;
  let connectionLimits: ConnectionLimits | undefined;

  const closers: Array<() => Promise<void>> = [];
  const stop = async () => {
    await Promise.all([...servers.map(closeServer), ...closers.map((c) => c())]);
    await backend?.close();
  };

  try {
    if (services.includes('auth_service')) {
      backend = await (await import('./backend/index.js')).openConfiguredBackend(config);
      const proxy = config.proxy_service;
      const proxyPublic = proxy.public_addr[0];
      auth = await AuthService.open({
        backend,
        clusterName: config.auth_service.cluster_name,
        ...(services.includes('proxy_service')
          ? { proxyPublicAddr: proxyPublic ? formatHostPort(proxyPublic.host, proxyPublic.port) : formatHostPort(config.gateway.nodename, proxy.web_listen_addr.port) }
          : {}),
      });
      const handler = createApiHandler(auth);
      // The listen address too when it is a specific one: it is what <data_dir>/admin/auth-addr gives gwctl.
      const authHost = config.auth_service.listen_addr.host;
      const names = [
        config.gateway.nodename,
        'localhost',
        '127.0.0.1',
        '::1',
        ...config.auth_service.public_addr.map((a) => a.host),
        ...(['', '0.0.0.0', '::'].includes(authHost) ? [] : [authHost]),
      ];
      const keys = generateKeyPair();
      const cert = await auth.issueServerCert(keys.publicKeyPem, names);
      // The limits of every listener of this process: the Auth API's here, the Proxy's in its front door.
      const limits = new ConnectionLimits(limitSettings(config));
      limits.startSummary();
      closers.push(async () => limits.close());
      connectionLimits = limits;
      const deadlines = limits.settings;
      const authServer = authApiServer(limits, { key: keys.privateKeyPem, cert, ca: [auth.host.tls.certPem, auth.user.tls.certPem] }, handler);
      servers.push(authServer);
      addresses.auth = await listenOn(authServer, config.auth_service.listen_addr, 'auth_service.listen_addr');
      log.info({ addr: addresses.auth }, 'auth API listening');

      // The local admin identity: gwctl on this machine, with full permissions, for whoever can read the data dir.
      const admin = generateKeyPair();
      const adminDir = join(dataDir, 'admin');
      mkdirSync(adminDir, { recursive: true, mode: 0o700 });
      writeSecretFile(join(adminDir, 'key.pem'), admin.privateKeyPem);
      writeSecretFile(join(adminDir, 'cert.pem'), await auth.issueAdminCert(admin.publicKeyPem));
      writePublicFile(join(adminDir, 'host-ca.pem'), auth.host.tls.certPem);
      writePublicFile(join(adminDir, 'auth-addr'), `${localAddress(addresses.auth)}\n`);

      if (services.includes('proxy_service')) {
        const webHost = config.proxy_service.web_listen_addr.host;
        // The wildcard covers HTTP apps under <app>.<proxy host> and kube-gateway-proxy-alpn.<proxy host>.
        const publicHosts = config.proxy_service.public_addr.map((a) => a.host);
        const webNames = [
          ...names,
          ...publicHosts,
          ...publicHosts.filter((h) => isIP(h) === 0).map((h) => `*.${h}`),
          ...(['', '0.0.0.0', '::'].includes(webHost) ? [] : [webHost]),
        ];
        const webTls = await webCertificate(config, async () => {
          const webKeys = generateKeyPair();
          return { key: webKeys.privateKeyPem, cert: await auth!.issueServerCert(webKeys.publicKeyPem, webNames, 'proxy') };
        });
        const tunnelKey = generateKeyPair();
        const publicWeb = config.proxy_service.public_addr[0];
        tunnels = new TunnelServer({
          auth,
          hostKey: sshPrivateKey(tunnelKey.privateKeyPem),
          heartbeatIntervalMs: config.auth_service.keep_alive_interval,
          heartbeatCountMax: config.auth_service.keep_alive_count_max,
          deadlines,
          publicAddr: publicWeb ? formatHostPort(publicWeb.host, publicWeb.port) : config.gateway.nodename,
        });
        const access = createAccessHandler(auth, tunnels, deadlines.headerMs);
        const jump = new SshJumpServer(auth, tunnels, sshPrivateKey(tunnelKey.privateKeyPem), deadlines);
        const tunnelHostKey = tunnelKey.sshPublicKey;
        const frontDoor = await startFrontDoor({
          config,
          clusterName: auth.clusterName,
          webApps: createWebAppHandler(auth, tunnels),
          services: {
            tls: {
              kube: createKubeHandler(auth, tunnels, deadlines),
              'gateway-reversetunnel': tunnels.handle,
              'gateway-postgres': access,
              'gateway-mysql': access,
              'gateway-mongodb': access,
              'gateway-redis': access,
              'gateway-tcp': access,
              'gateway-proxy-ssh': access,
            },
            tunnel: tunnels.handle,
            ssh: jump.handle,
          },
          findExtras: () => ({ tunnel_host_keys: [tunnelHostKey] }),
          tls: { ...webTls, ca: [auth.host.tls.certPem, auth.user.tls.certPem] },
          api: handler,
          limits,
          versions: (versionServer = new ReloadableVersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: new Dialer() })),
        });
        const tunnelServer = tunnels;
        closers.push(async () => {
          await tunnelServer.close();
          await frontDoor.close();
        });
        for (const [name, addr] of Object.entries(frontDoor.addresses)) addresses[name === 'web' ? 'web' : `proxy_${name}`] = addr;
      }
    } else if (services.includes('proxy_service')) {
      throw new GatewayError('GW_ERR_CONFIG_VALUE', 'the proxy service needs the auth service in the same process in this version', {
        hint: 'Enable auth_service next to proxy_service.',
      });
    }

    const joinRoles = services.map((s) => SERVICE_TO_JOIN_ROLE[s]).filter((r): r is JoinRole => r !== undefined);
    if (joinRoles.length > 0) {
      hostIdentity = loadHostIdentity(dataDir);
      const publicAddrs = services.flatMap((s) => (config[s] as { public_addr: readonly { host: string; port?: number }[] }).public_addr.map((a) => (a.port ? formatHostPort(a.host, a.port) : a.host)));
      if (hostIdentity) {
        const missing = joinRoles.filter((r) => !hostIdentity!.roles.includes(r));
        if (missing.length > 0) {
          throw new GatewayError('GW_ERR_AGENT_IDENTITY', `this agent joined as ${hostIdentity.roles.join(', ')} but now also runs ${missing.join(', ')}`, {
            hint: `Remove ${join(dataDir, 'host')} and join again with a token for ${joinRoles.join(', ')}.`,
          });
        }
        log.info({ hostId: hostIdentity.hostId, cluster: hostIdentity.cluster }, 'using the stored host identity');
      } else if (flags.token) {
        const server = flags.proxy ?? flags.authServer;
        if (!server) throw new GatewayError('GW_ERR_USAGE', '--token needs --proxy host:port (or --auth-server host:port)');
        if (!flags.caPin) {
          throw new GatewayError('GW_ERR_USAGE', '--token needs --ca-pin sha256:...', {
            hint: "'gwctl tokens add' prints the pin; it is what makes the first connection to the cluster safe.",
          });
        }
        hostIdentity = await joinCluster({
          dataDir,
          server,
          joinedVia: flags.proxy ? 'proxy' : 'auth',
          token: flags.token,
          caPin: flags.caPin,
          roles: joinRoles,
          nodename: config.gateway.nodename,
          publicAddrs,
          dialer: new Dialer(),
        });
      } else if (auth) {
        const keys = generateKeyPair();
        const bundle = await auth.joinLocal({ roles: joinRoles, nodename: config.gateway.nodename, publicAddrs, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
        saveHostIdentity(dataDir, keys.privateKeyPem, bundle, { roles: joinRoles, nodename: config.gateway.nodename, server: 'local', joinedVia: 'local' });
        hostIdentity = loadHostIdentity(dataDir);
      } else {
        throw new GatewayError('GW_ERR_AGENT_IDENTITY', 'this agent has not joined a cluster yet', {
          hint: "Start it once with --token, --ca-pin and --proxy, as printed by 'gwctl tokens add'.",
        });
      }
    }
    // The agent's reverse tunnel: out to the Proxy through the Dialer, then serve what it forwards. An agent
    // whose identity was issued locally dials the web port of the Proxy in this same process.
    const tunnelIdentity =
      hostIdentity?.server === 'local' ? (addresses.web ? { ...hostIdentity, server: localAddress(addresses.web) } : undefined) : hostIdentity;
    if (tunnelIdentity) {
      const dialer = new Dialer();
      const ssh = services.includes('ssh_service')
        ? new SshService({
            hostKeyPem: tunnelIdentity.key,
            userCa: tunnelIdentity.sshUserCa,
            nodename: config.gateway.nodename,
            sftpServer: config.ssh_service.sftp_server,
            onEvent: (e) => tunnelAgent?.sendEvent({ ...e }),
          })
        : undefined;
      if (ssh) {
        const direct = config.ssh_service.listen_addr;
        closers.push(async () => ssh.close());
        // Agent-side listeners exist only when the agent joined the Auth Service directly (seed: self-hosted).
        if (tunnelIdentity.joinedVia === 'auth') {
          addresses.ssh = await ssh.listen(direct.host, direct.port);
          log.info({ addr: addresses.ssh }, 'SSH Service listening directly');
        }
      }
      const resources = agentResources(config, services);
      if (ssh) resources.node_host_cert = tunnelIdentity.sshCert;
      const agent = new TunnelAgent({
        identity: tunnelIdentity,
        dialer,
        services: agentServices(services),
        resources,
        connectResource: resourceConnector(config, services, dialer, tunnelIdentity.cluster),
        ...(ssh ? { serveSsh: (channel: Duplex, request: DialRequest) => ssh.inject(channel, request.client_src) } : {}),
        heartbeatIntervalMs: config.auth_service.keep_alive_interval,
        heartbeatCountMax: config.auth_service.keep_alive_count_max,
      });
      tunnelAgent = agent;
      closers.unshift(async () => agent.stop());
      agent.start();

      // Automatic upgrades: when this machine has the upgrader (its directory exists), keep its schedule file
      // current: periodically, and whenever the Proxy says cluster_maintenance_config changed.
      const upgraderDir = resolveSettings().etcDir;
      const kubeStatePath = process.env.GATEWAY_KUBE_SCHEDULE_FILE;
      // In Kubernetes the chart sets these: the schedule goes into the Secret the updater pod reads.
      const kubeSecret = process.env.GATEWAY_KUBE_SCHEDULE_SECRET;
      const kubeNamespace = process.env.POD_NAMESPACE;
      if (existsSync(upgraderDir) || kubeStatePath || (kubeSecret && kubeNamespace)) {
        const api = new ApiClient({ address: tunnelIdentity.server, dialer, ca: tunnelIdentity.hostCa, cert: tunnelIdentity.cert, key: tunnelIdentity.key });
        const exporter = startScheduleExport({
          fetchConfig: async () => (await api.call<{ config: ClusterMaintenanceConfig | null }>('GET', '/v1/agent/maintenance')).config ?? undefined,
          clusterVersion: async () => (await api.call<{ server_version: string }>('GET', '/webapi/ping')).server_version,
          ...(existsSync(upgraderDir) ? { dir: upgraderDir } : {}),
          ...(kubeStatePath ? { kubeStatePath } : {}),
          ...(kubeSecret && kubeNamespace
            ? {
                // Loaded only in Kubernetes: the client library is large and other agents never need it.
                writeKubeState: async (json: string) =>
                  (await import('./upgrade/kube/client.js')).kubeScheduleWriter({ namespace: kubeNamespace, secretName: kubeSecret })(json),
              }
            : {}),
        });
        agent.on('maintenance-changed', () => void exporter.refresh());
        closers.unshift(async () => exporter.stop());
      }
    } else if (hostIdentity) {
      log.warn('agent services run next to an Auth Service without a Proxy: no reverse tunnel is opened');
    }
  } catch (err) {
    await stop();
    throw err;
  }

  return { services, addresses, ...(connectionLimits ? { limits: connectionLimits } : {}), ...(auth ? { auth } : {}), ...(hostIdentity ? { hostIdentity } : {}), ...(tunnelAgent ? { tunnelAgent } : {}), ...(tunnels ? { tunnels } : {}), reload: (next: GatewayConfig) => versionServer?.setChannels(next.proxy_service.automatic_upgrades_channels), stop };
}

export { JOIN_ROLES };

/**
 * The Auth API's listener: mutual TLS (a client certificate is asked for, not required: the router checks the
 * identity a call needs), then the router, with the deadlines and caps of gateway.limits like every listener.
 */
function authApiServer(limits: ConnectionLimits, tls: { key: string; cert: string; ca: string[] }, handler: http.RequestListener): net.Server {
  const termination = { secureContext: serverSecureContext(tls, 'auth'), alpn: [], handshakeMs: limits.settings.tlsHandshakeMs };
  const toApi = guardHttpServer(http.createServer(handler), limits.settings);
  return guardedServer(limits.listener('auth'), (socket) => terminateTls(socket, termination, toApi));
}

/**
 * The web port's certificate: the operator's own (proxy_service.https_keypairs, e.g. from a public CA) when
 * configured, else one from the cluster's host CA covering the node name and every public_addr.
 */
async function webCertificate(config: GatewayConfig, issue: () => Promise<{ key: string; cert: string }>): Promise<{ key: string; cert: string }> {
  const pair = config.proxy_service.https_keypairs?.[0];
  if (!pair?.cert_file || !pair.key_file) return issue();
  const read = (file: string, what: string) => {
    try {
      return readFileSync(file, 'utf8');
    } catch (err) {
      throw new GatewayError('GW_ERR_CONFIG_VALUE', `proxy_service.https_keypairs: cannot read the ${what} ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`, {
        hint: 'Check the path and that this user can read the file.',
      });
    }
  };
  const cert = read(pair.cert_file, 'certificate');
  const key = read(pair.key_file, 'key');
  try {
    const x509 = new X509Certificate(cert);
    if (!x509.checkPrivateKey(createPrivateKey(key))) throw new Error('the key does not belong to the certificate');
    if (Date.parse(x509.validTo) < Date.now()) throw new Error(`the certificate expired on ${x509.validTo}`);
  } catch (err) {
    throw new GatewayError('GW_ERR_CONFIG_VALUE', `proxy_service.https_keypairs: ${pair.cert_file} / ${pair.key_file}: ${(err as Error).message}`, {
      hint: 'Give a PEM certificate chain and the PEM private key that belongs to it.',
    });
  }
  return { key, cert };
}
