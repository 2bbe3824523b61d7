/**
 * The proxy role: the front door (the multiplexer on the web port, or separate listeners), the reverse-tunnel
 * server, the SSH jump host, database/TCP/app/kube routing, and the version server.
 *
 * It uses the Auth Service only through ProxyAuth (src/auth/proxyauth.ts) and serves the API router it is given,
 * so an in-process AuthService is one way to run it; a client of a remote Auth Service will be another.
 */
import type http from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { formatHostPort, parseAddr } from '../addr.js';
import { generateKeyPair, sshPrivateKeyPem as sshPrivateKey } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import type { Presence } from '../auth/records.js';
import type { GatewayConfig, UpgradeChannelConfig } from '../config/index.js';
import type { Dialer } from '../dial/dialer.js';
import { decisionAttributes } from '../dial/select.js';
import { GatewayError } from '../errors.js';
import type { ConnectionLimits, LimitSettings } from '../net/deadlines.js';
import { createAccessHandler } from '../proxy/access.js';
import { E2E_FORWARD_DIAL_MS, e2eServices, type E2EWiring } from '../proxy/e2erelay.js';
import { startFrontDoor, type FrontDoor, type ProtocolServices } from '../proxy/frontdoor.js';
import { cachedAuthPreference } from '../proxy/ping.js';
import { SshJumpServer } from '../proxy/sshjump.js';
import { createWebAppUpgradeHandler } from '../proxy/appupgrade.js';
import { createKubeHandler, createWebAppHandler } from '../proxy/webapps.js';
import { ReloadableVersionServer } from '../reload.js';
import { AutoupdateEndpoint } from '../proxy/autoupdate.js';
import { TunnelServer } from '../proxy/tunnel.js';
import { ClusterView } from '../proxy/cluster.js';
import { watchChannelDrift } from '../proxy/drift.js';
import { directDialer } from '../proxy/direct.js';
import { PeerClient, PeerServer, type PeerTls } from '../proxy/peer.js';
import { probeRoute } from '../proxy/probe.js';
import { Router } from '../proxy/router.js';
import { SessionAudit } from '../proxy/sessionaudit.js';
import { createWebRoutes } from '../proxy/web.js';
import { ArtifactRelay } from '../proxy/artifacts.js';
import type { ClusterMaintenanceConfig } from '../auth/resources/index.js';
import { nextWindows } from '../upgrade/windows.js';
import type { DialRequest } from '../tunnel/protocol.js';
import type { Duplex } from 'node:stream';
import { VERSION } from '../version.js';
import { logger } from '../log.js';
import { watchCertificate } from '../metrics/certs.js';
import type { FindExtras } from '../wire/ping.js';
import type { RolloutStatus } from '../wire/autoupdate.js';
import type { Identity } from '../auth/pki.js';
import type { Lifecycle } from './lifecycle.js';
import { webServerNames } from './names.js';

export interface ProxyRoleOptions {
  config: GatewayConfig;
  /** What the Proxy uses of the Auth Service. */
  auth: ProxyAuth;
  /** The Auth API router the web port serves (login, join, gwctl calls with user certificates). */
  api: http.RequestListener;
  /** Deadlines, caps and counters of this process's listeners. */
  limits: ConnectionLimits;
  /** The process's Dialer: the version server's upstream calls. */
  dialer: Dialer;
  /** Gets the tunnel server and the front door's listeners (proxy phase). */
  lifecycle: Lifecycle;
  /** This Proxy's host ID: in its record, the agents' welcome, presence and peering. Stable across restarts. */
  proxyId: string;
  /** Reaches agents joined directly; by default src/proxy/direct.ts with a certificate naming this Proxy. */
  direct?: (presence: Presence, request: DialRequest) => Promise<Duplex>;
}

export interface ProxyRole {
  tunnels: TunnelServer;
  /** The cluster's Proxies and where agents are. */
  cluster: ClusterView;
  /** How this Proxy reaches an agent: its own tunnels, a peer's, or directly (src/proxy/router.ts). */
  router: Router;
  /** The peering listener (src/proxy/peer.ts): its bound address is addresses.proxy_peer once it runs. */
  peer: PeeringControl;
  /** Bound addresses: web, and proxy_<name> for each separate listener. */
  addresses: Record<string, string>;
  /** SIGHUP (src/reload.ts): the version server's channels. Throws, changing nothing, when they are invalid. */
  setChannels(channels: Readonly<Record<string, UpgradeChannelConfig>>): void;
  /** SIGHUP: the sources PROXY headers are believed from, for headers that arrive from now on. */
  setProxyProtocolTrusted(sources: readonly string[]): void;
  /** Reaches an agent that joined the Auth Service directly by dialing its listener (src/proxy/direct.ts). */
  direct: (presence: Presence, request: DialRequest) => Promise<Duplex>;
  /** The front door's listeners and whether each listens now (readiness, src/roles/health.ts). */
  listening(): Array<{ name: string; address: string; listening: boolean }>;
}

export async function startProxyRole(options: ProxyRoleOptions): Promise<ProxyRole> {
  const { config, auth, limits } = options;
  const webTls = await webCertificate(config, () => clusterCertificate(options));
  options.lifecycle.onStop('proxy', watchCertificate('proxy_web', () => webTls.cert));
  const tunnelKey = generateKeyPair();
  const hostKey = sshPrivateKey(tunnelKey.privateKeyPem);
  const publicAddr = ownPublicAddr(config);
  const heartbeatMs = config.auth_service.keep_alive_interval;
  const cluster = new ClusterView({
    directory: auth,
    self: {
      id: options.proxyId,
      nodename: config.gateway.nodename,
      version: VERSION,
      public_addr: publicAddr,
      public_addrs: config.proxy_service.public_addr.map((a) => formatHostPort(a.host, a.port)),
      tunnel_host_key: tunnelKey.sshPublicKey,
    },
    channels: config.proxy_service.automatic_upgrades_channels,
    heartbeatMs,
    ttlMs: heartbeatMs * (config.auth_service.keep_alive_count_max + 1),
  });
  const tunnels = new TunnelServer({
    auth,
    proxyId: options.proxyId,
    cluster,
    hostKey,
    heartbeatIntervalMs: config.auth_service.keep_alive_interval,
    heartbeatCountMax: config.auth_service.keep_alive_count_max,
    deadlines: limits.settings,
    publicAddr,
  });
  // The web certificate serves peering too when it is the cluster's (host kind, role proxy, name = this Proxy).
  const ownWebCert = !config.proxy_service.https_keypairs?.[0]?.cert_file;
  const peering = await startPeering(options, cluster, tunnels, ownWebCert ? webTls : await clusterCertificate(options));
  // Agents that joined the Auth Service directly: their listeners, with a certificate naming this Proxy.
  const direct = options.direct ?? directDialer((key) => auth.issueServerCert(key, [config.gateway.nodename], options.proxyId), { dialer: options.dialer, hostCa: auth.host.tls.certPem, sessions: auth.sessions });
  const router = new Router({ tunnels, cluster, peers: peering.client, direct, dialPlan: (address) => decisionAttributes(options.dialer.plan(address)) });
  // The sessions this Proxy carries (registered first: their ends are recorded before the listeners close them).
  const audit = new SessionAudit({ proxyId: options.proxyId, report: (event) => auth.recordProxyEvent(options.proxyId, event) });
  options.lifecycle.onStop('proxy', () => audit.stop());
  let frontDoor: FrontDoor | undefined;
  // Agents are told to reconnect before the listeners drop their connections.
  options.lifecycle.onStop('proxy', async () => {
    await cluster.close();
    await peering.stop();
    peering.client.close();
    await tunnels.close();
    await frontDoor?.close();
  });
  const jump = new SshJumpServer(auth, router, hostKey, limits.settings);
  const versions = new ReloadableVersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: options.dialer, proxyId: options.proxyId });
  const web = createWebRoutes({
    auth,
    agents: router,
    presence: () => cluster.agents(),
    targetVersion: (channel) => versions.resolve(channel, 'version'),
    nextWindow: (maintenance, now) => {
      const next = nextWindows(maintenance as ClusterMaintenanceConfig, now, 1)[0];
      return next ? { start: next.start, end: next.stop } : undefined;
    },
    limits: limits.settings, ...rolloutStatusOf(auth),
  });
  options.lifecycle.onStop('proxy', () => web.close());
  frontDoor = await startFrontDoor({
    config,
    clusterName: auth.clusterName,
    web,
    webApps: createWebAppHandler(auth, router, { webAddrs: () => webAddrs(config, frontDoor?.addresses.web), audit }),
    webAppUpgrades: createWebAppUpgradeHandler(auth, router, { deadlines: limits.settings, audit }),
    services: { ...services(auth, router, tunnels, jump, limits.settings, audit), ...endToEnd(options, peering, { auth, agents: router, tunnels, tls: ownWebCert ? webTls : undefined, proxyId: options.proxyId, cluster, audit }, router) },
    // Every live Proxy's tunnel key: behind a balancer, the agent's raw SSH tunnel may land on any of them.
    findExtras: () => findExtras(options.proxyId, tunnelKey.sshPublicKey, cluster),
    tls: { ...webTls, ca: [auth.host.tls.certPem, auth.user.tls.certPem] },
    api: probeRoute(auth, router, options.api),
    authPreference: cachedAuthPreference(() => auth.authPreference()),
    limits,
    versions, ...autoupdateOf(auth),
    artifacts: artifactRelay(config, options.dialer),
  });
  const addresses: Record<string, string> = {};
  for (const [name, addr] of Object.entries(frontDoor.addresses)) addresses[name === 'web' ? 'web' : `proxy_${name}`] = addr;
  options.lifecycle.onStop('proxy', watchChannelDrift(cluster));
  await cluster.start();
  await peering.startWhenNeeded(addresses);
  return {
    tunnels,
    cluster,
    router,
    peer: peering,
    addresses,
    direct,
    setChannels: (channels) => {
      versions.setChannels(channels);
      cluster.setChannels(channels);
    },
    setProxyProtocolTrusted: (sources) => frontDoor!.setProxyProtocolTrusted(sources),
    listening: () => frontDoor!.listening(),
  };
}

/**
 * The routes of end-to-end streams (e2erelay.ts); over peering, a stream for an agent whose tunnel a peer holds is
 * relayed raw (through the Dialer) to that peer's listener, which takes such streams (peered: never relayed again).
 */
function endToEnd(options: ProxyRoleOptions, peering: PeeringControl, wiring: Omit<E2EWiring, 'peering'>, router: Router): ReturnType<typeof e2eServices> {
  const e2e = e2eServices({ ...wiring, peering: { router, dial: (addr) => options.dialer.dial(addr, { signal: AbortSignal.timeout(E2E_FORWARD_DIAL_MS) }) } });
  peering.server.serveE2E(e2e.e2e.peered);
  return e2e;
}

/** This Proxy's first public address (host:port), else its node name: what its Proxy record and the tunnels name. */
function ownPublicAddr(config: GatewayConfig): string {
  const publicWeb = config.proxy_service.public_addr[0];
  return publicWeb ? formatHostPort(publicWeb.host, publicWeb.port) : config.gateway.nodename;
}

/** proxy_service.autoupdate_artifacts: the relay of release tarballs and the package repository (src/proxy/artifacts.ts). */
function artifactRelay(config: GatewayConfig, dialer: Dialer): ArtifactRelay {
  const a = config.proxy_service.autoupdate_artifacts;
  return new ArtifactRelay({
    downloadUrl: a.download_url,
    repoUrl: a.repo_url,
    cacheDir: a.cache_dir ?? join(config.gateway.data_dir, 'artifacts'),
    cacheMaxBytes: a.cache_max_bytes,
    fetchTimeoutMs: a.fetch_timeout,
    fetchDeadlineMs: a.fetch_deadline,
    indexTtlMs: a.index_ttl,
    maxFetches: a.max_fetches,
    dialer,
  });
}

/** The services behind the front door, by route kind: the protocol table (src/proxy/protocols.ts) says which protocols each serves. */
function services(auth: ProxyAuth, router: Router, tunnels: TunnelServer, jump: SshJumpServer, deadlines: LimitSettings, audit: SessionAudit): ProtocolServices {
  return { resource: createAccessHandler(auth, router, deadlines.headerMs, audit), kube: createKubeHandler(auth, router, deadlines, audit), tunnel: tunnels.handle, ssh: jump.handle };
}

/** The peering listener and client of one Proxy; tests stop and start the listener to cut and restore the link. */
export interface PeeringControl {
  server: PeerServer;
  client: PeerClient;
  /** The bound peering address, while the listener runs. */
  address(): string | undefined;
  /** Binds proxy_service.peer_listen_addr (again) and publishes the peering address in this Proxy's record. */
  start(): Promise<string>;
  /** Stops the listener (peers' streams to this Proxy are reset) and withdraws the address. */
  stop(): Promise<void>;
  /** Starts now when the listener mode is separate or the cluster's strategy is proxy_peering, else when the strategy becomes it. */
  startWhenNeeded(addresses: Record<string, string>): Promise<void>;
}

/**
 * What /webapi/find adds for agents: every live Proxy's reverse-tunnel host key, and which Proxy holds which
 * (tunnel_proxies: on raw SSH the agent records the Proxy whose key it was shown, never the welcome's claim).
 */
function findExtras(selfId: string, selfKey: string, cluster: ClusterView): FindExtras {
  const byKey = new Map<string, string>([[selfKey, selfId]]);
  for (const p of cluster.proxies()) if (p.tunnel_host_key && !byKey.has(p.tunnel_host_key)) byKey.set(p.tunnel_host_key, p.id);
  return {
    tunnel_host_keys: [...byKey.keys()],
    tunnel_proxies: [...byKey].map(([key, id]) => ({ proxy_id: id, host_key: key })),
    proxies: cluster.proxies().map((p) => ({ id: p.id, nodename: p.nodename, public_addr: p.public_addr, version: p.version })),
  };
}

/** A new key and its certificate from the cluster's host CA: host kind, role proxy, named by this Proxy's host ID. */
async function clusterCertificate(options: ProxyRoleOptions): Promise<{ key: string; cert: string }> {
  const keys = generateKeyPair();
  return { key: keys.privateKeyPem, cert: await options.auth.issueServerCert(keys.publicKeyPem, webServerNames(options.config), options.proxyId) };
}

/**
 * Proxy peering (src/proxy/peer.ts) with a certificate from the host CA (role proxy, name = this Proxy's host ID:
 * the web port's when it is the cluster's, else one of its own, for the web port's may be the operator's). The listener runs in separate mode
 * (3021 is one of the separate ports), and in multiplex mode when auth_service.tunnel_strategy is proxy_peering.
 */
async function startPeering(options: ProxyRoleOptions, cluster: ClusterView, tunnels: TunnelServer, cert: { key: string; cert: string }): Promise<PeeringControl> {
  const { config, auth, limits } = options;
  const tls: PeerTls = { ...cert, ca: auth.host.tls.certPem };
  const server = new PeerServer({ trust: auth, tls, cluster, tunnels, limits });
  const client = new PeerClient({
    tls,
    clusterName: auth.clusterName,
    dialer: options.dialer,
    tlsHandshakeMs: limits.settings.tlsHandshakeMs,
    dialTimeoutMs: 30_000,
    idleMs: limits.settings.idleMs,
  });
  // A peer that leaves the list (locked, removed, dead) carries none of this Proxy's streams any more.
  cluster.on('proxies', () => client.dropDeparted((id) => cluster.proxy(id) !== undefined));
  let bound: string | undefined;
  let starting: Promise<string> | undefined;
  // stop() is kept until start(): a change of the cluster does not bring the listener back.
  let held = false;
  const control: PeeringControl = {
    server,
    client,
    address: () => bound,
    start: () => {
      held = false;
      return (starting ??= server.listen(config.proxy_service.peer_listen_addr).then(
        (addr) => {
          bound = addr;
          cluster.setPeerAddr(peerAddrOf(config, addr));
          return addr;
        },
        (err: unknown) => {
          starting = undefined;
          throw err;
        },
      ));
    },
    stop: async () => {
      held = true;
      starting = undefined;
      bound = undefined;
      cluster.setPeerAddr(undefined);
      await server.close();
    },
    startWhenNeeded: async (addresses) => {
      const needed = () => config.auth_service.proxy_listener_mode === 'separate' || cluster.strategy().type === 'proxy_peering';
      const run = async () => {
        if (!needed() || bound || held) return;
        addresses.proxy_peer = await control.start();
      };
      cluster.on('proxies', () => void run().catch((err: unknown) => logger('peer').error({ err: (err as Error).message }, 'cannot start the peering listener')));
      await run();
    },
  };
  return control;
}

/**
 * The Proxy's public web addresses (host:port), where an app launch sends the browser for its token: public_addr,
 * else this node's name with the bound web port. Configuration only, never a request's Host.
 */
function webAddrs(config: GatewayConfig, bound: string | undefined): string[] {
  const configured = config.proxy_service.public_addr.map((a) => formatHostPort(a.host, a.port));
  if (configured.length > 0) return configured;
  const port = bound ? parseAddr(bound).port : 443;
  return [formatHostPort(config.gateway.nodename, port ?? 443)];
}

/** Where other Proxies reach this one: peer_public_addr, else the bound address (this node's name when bound to every interface). */
function peerAddrOf(config: GatewayConfig, bound: string): string {
  const pub = config.proxy_service.peer_public_addr[0];
  if (pub) return formatHostPort(pub.host, pub.port);
  const { host, port } = parseAddr(bound);
  const wildcard = host === '0.0.0.0' || host === '::' || host === '';
  return formatHostPort(wildcard ? config.gateway.nodename : host, port ?? 3021);
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

/** The Web UI's rollout panel asks the Auth Service, in process or through its API (ProxyAuth.autoupdateStatus). */
function rolloutStatusOf(auth: ProxyAuth): { rolloutStatus?: (identity: Identity) => Promise<RolloutStatus> } {
  const status = auth.autoupdateStatus?.bind(auth);
  return status ? { rolloutStatus: (identity) => status(identity) } : {};
}

/** The managed rollout's answer to upgraders, when the Auth Service behind this Proxy gives instructions (404 otherwise). */
function autoupdateOf(auth: ProxyAuth): { autoupdate?: AutoupdateEndpoint } {
  const ask = auth.autoupdateInstruction?.bind(auth);
  return ask ? { autoupdate: new AutoupdateEndpoint({ instruction: ask }) } : {};
}
