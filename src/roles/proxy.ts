/**
 * The proxy role: the front door (the multiplexer on the web port, or separate listeners), the reverse-tunnel
 * server, the SSH jump host, database/TCP/app/kube routing, and the version server.
 *
 * It uses the Auth Service only through ProxyAuth (src/auth/proxyauth.ts) and serves the API router it is given,
 * so an in-process AuthService is one way to run it; a client of a remote Auth Service will be another.
 */
import type http from 'node:http';
import { readFileSync } from 'node:fs';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { formatHostPort } from '../addr.js';
import { generateKeyPair, sshPrivateKeyPem as sshPrivateKey } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import type { GatewayConfig, UpgradeChannelConfig } from '../config/index.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import type { ConnectionLimits, LimitSettings } from '../net/deadlines.js';
import { createAccessHandler } from '../proxy/access.js';
import { startFrontDoor, type FrontDoor, type ProtocolServices } from '../proxy/frontdoor.js';
import { SshJumpServer } from '../proxy/sshjump.js';
import { createKubeHandler, createWebAppHandler } from '../proxy/webapps.js';
import { ReloadableVersionServer } from '../reload.js';
import { TunnelServer } from '../proxy/tunnel.js';
import { ClusterView } from '../proxy/cluster.js';
import { watchChannelDrift } from '../proxy/drift.js';
import { directDialer } from '../proxy/direct.js';
import type { Presence } from '../auth/records.js';
import type { DialRequest } from '../tunnel/protocol.js';
import type { Duplex } from 'node:stream';
import { VERSION } from '../version.js';
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
}

export interface ProxyRole {
  tunnels: TunnelServer;
  /** The cluster's Proxies and where agents are. */
  cluster: ClusterView;
  /** Bound addresses: web, and proxy_<name> for each separate listener. */
  addresses: Record<string, string>;
  /** SIGHUP (src/reload.ts): the version server's channels. Throws, changing nothing, when they are invalid. */
  setChannels(channels: Readonly<Record<string, UpgradeChannelConfig>>): void;
  /** Reaches an agent that joined the Auth Service directly by dialing its listener (src/proxy/direct.ts). */
  direct: (presence: Presence, request: DialRequest) => Promise<Duplex>;
}

export async function startProxyRole(options: ProxyRoleOptions): Promise<ProxyRole> {
  const { config, auth, limits } = options;
  const webTls = await webCertificate(config, async () => {
    const keys = generateKeyPair();
    return { key: keys.privateKeyPem, cert: await auth.issueServerCert(keys.publicKeyPem, webServerNames(config), options.proxyId) };
  });
  const tunnelKey = generateKeyPair();
  const hostKey = sshPrivateKey(tunnelKey.privateKeyPem);
  const publicWeb = config.proxy_service.public_addr[0];
  const heartbeatMs = config.auth_service.keep_alive_interval;
  const cluster = new ClusterView({
    directory: auth,
    self: { id: options.proxyId, nodename: config.gateway.nodename, version: VERSION, public_addr: publicWeb ? formatHostPort(publicWeb.host, publicWeb.port) : config.gateway.nodename },
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
    publicAddr: publicWeb ? formatHostPort(publicWeb.host, publicWeb.port) : config.gateway.nodename,
  });
  let frontDoor: FrontDoor | undefined;
  // Agents are told to reconnect before the listeners drop their connections.
  options.lifecycle.onStop('proxy', async () => {
    await cluster.close();
    await tunnels.close();
    await frontDoor?.close();
  });
  const jump = new SshJumpServer(auth, tunnels, hostKey, limits.settings);
  const versions = new ReloadableVersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: options.dialer, proxyId: options.proxyId });
  frontDoor = await startFrontDoor({
    config,
    clusterName: auth.clusterName,
    webApps: createWebAppHandler(auth, tunnels),
    services: services(auth, tunnels, jump, limits.settings),
    findExtras: () => ({ tunnel_host_keys: [tunnelKey.sshPublicKey], proxies: cluster.proxies().map((p) => ({ id: p.id, nodename: p.nodename, public_addr: p.public_addr, version: p.version })) }),
    tls: { ...webTls, ca: [auth.host.tls.certPem, auth.user.tls.certPem] },
    api: options.api,
    limits,
    versions,
  });
  const addresses: Record<string, string> = {};
  for (const [name, addr] of Object.entries(frontDoor.addresses)) addresses[name === 'web' ? 'web' : `proxy_${name}`] = addr;
  options.lifecycle.onStop('proxy', watchChannelDrift(cluster));
  await cluster.start();
  return {
    tunnels,
    cluster,
    addresses,
    direct: directDialer((key) => auth.issueServerCert(key, [config.gateway.nodename], options.proxyId), { dialer: options.dialer, hostCa: auth.host.tls.certPem }),
    setChannels: (channels) => {
      versions.setChannels(channels);
      cluster.setChannels(channels);
    },
  };
}

/** The services behind the front door, by route kind: the protocol table (src/proxy/protocols.ts) says which protocols each serves. */
function services(auth: ProxyAuth, tunnels: TunnelServer, jump: SshJumpServer, deadlines: LimitSettings): ProtocolServices {
  return { resource: createAccessHandler(auth, tunnels, deadlines.headerMs), kube: createKubeHandler(auth, tunnels, deadlines), tunnel: tunnels.handle, ssh: jump.handle };
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
