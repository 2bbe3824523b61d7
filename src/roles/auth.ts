/**
 * The auth role: the Backend (gateway.storage: SQLite in the data directory by default, or PostgreSQL), the AuthService on it, its API on
 * auth_service.listen_addr (mutual TLS), and the local admin identity in <data_dir>/admin/ for gwctl on this
 * machine. Runs alone: it needs nothing of the other roles.
 *
 * A Proxy without the Auth Service in its process gets connectRemoteAuth instead: a RemoteProxyAuth (the same
 * ProxyAuth, over mutual TLS to the Auth API) and a forwarder as the API router of its web port.
 */
import http from 'node:http';
import type net from 'node:net';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { formatHostPort } from '../addr.js';
import { joinCluster, loadHostIdentity, type HostIdentity } from '../agent/identity.js';
import { HostRenewal } from '../agent/renewal.js';
import { createApiHandler } from '../auth/api.js';
import { generateKeyPair } from '../auth/pki.js';
import { AuthService } from '../auth/service.js';
import { openConfiguredBackend, type Backend } from '../backend/index.js';
import { normalizeAuthAddress } from '../client/api.js';
import { createAuthForwarder } from '../client/forward.js';
import { RemoteProxyAuth } from '../client/remoteauth.js';
import type { GatewayConfig } from '../config/index.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { writePublicFile, writeSecretFile } from '../fsutil.js';
import { logger } from '../log.js';
import { watchCertificate } from '../metrics/certs.js';
import type { ConnectionLimits } from '../net/deadlines.js';
import { guardHttpServer } from '../net/http.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { serverSecureContext, terminateTls } from '../net/tls.js';
import type { Lifecycle } from './lifecycle.js';
import { authServerNames, configuredMemberNames, localAddress } from './names.js';

export interface AuthRoleOptions {
  config: GatewayConfig;
  /** Deadlines, caps and counters of this process's listeners. */
  limits: ConnectionLimits;
  /** Gets the Auth API's listener (auth phase) and the Backend (backend phase). */
  lifecycle: Lifecycle;
  /** What `gwctl tokens add` prints as --proxy: set when a Proxy runs in this process. */
  proxyPublicAddr?: string;
  /** Requests to identity providers (single sign-on) go through the process's Dialer. */
  dialer?: Dialer;
}

export interface AuthRole {
  auth: AuthService;
  /** The API router: served on the Auth API's listener here, and by the Proxy's web port. */
  api: http.RequestListener;
  /** The Auth API's bound address. */
  address: string;
  /** The Backend the Auth Service stands on (its readiness check, src/roles/health.ts). */
  backend: Backend;
}

export async function startAuthRole(options: AuthRoleOptions): Promise<AuthRole> {
  const { config, lifecycle } = options;
  const dataDir = config.gateway.data_dir;
  const backend = await openConfiguredBackend(config);
  lifecycle.onStop('backend', () => backend.close());
  const auth = await AuthService.open({
    backend,
    clusterName: config.auth_service.cluster_name,
    ...(options.proxyPublicAddr === undefined ? {} : { proxyPublicAddr: options.proxyPublicAddr }),
    ...(options.dialer ? { dialer: options.dialer } : {}),
    authentication: config.auth_service.authentication,
    memberNames: configuredMemberNames(config, options.proxyPublicAddr !== undefined),
  });
  // Every Proxy reads it (discovery tells agents); the last Auth Service to start decides.
  await auth.setTunnelStrategy(config.auth_service.tunnel_strategy.type === 'proxy_peering'
    ? { type: 'proxy_peering', agent_connection_count: config.auth_service.tunnel_strategy.agent_connection_count }
    : { type: 'agent_mesh' });
  auth.startRollout(config.auth_service.autoupdate_interval);
  lifecycle.onStop('auth', () => auth.closeRollout());
  // The Proxies' event streams send a keep-alive line well within the listener's idle timeout.
  const api = createApiHandler(auth, { streamKeepAliveMs: Math.max(250, Math.min(5000, Math.floor(options.limits.settings.idleMs / 3))) });
  const keys = generateKeyPair();
  const cert = await auth.issueServerCert(keys.publicKeyPem, authServerNames(config));
  const server = authApiServer(options.limits, { key: keys.privateKeyPem, cert, ca: [auth.host.tls.certPem, auth.user.tls.certPem] }, api);
  for (const [role, read] of [['host_ca', () => auth.host.tls.certPem], ['user_ca', () => auth.user.tls.certPem], ['auth_server', () => cert]] as const) lifecycle.onStop('auth', watchCertificate(role, read));
  lifecycle.onStop('auth', () => closeServer(server));
  const address = await listenOn(server, config.auth_service.listen_addr, 'auth_service.listen_addr');
  logger('gateway').info({ addr: address }, 'auth API listening');
  await writeAdminIdentity(dataDir, auth, address);
  return { auth, api, address, backend };
}

/**
 * The Auth API's listener: mutual TLS (a client certificate is asked for, not required: the router checks the
 * identity a call needs), then the router, with the deadlines and caps of gateway.limits like every listener.
 */
function authApiServer(limits: ConnectionLimits, tls: { key: string; cert: string; ca: string[] }, handler: http.RequestListener): net.Server {
  const termination = { secureContext: serverSecureContext(tls, 'auth'), alpn: [], handshakeMs: limits.settings.tlsHandshakeMs };
  const toApi = guardHttpServer(http.createServer(handler), limits.settings);
  return guardedServer(limits.listener('auth'), (socket) => terminateTls(socket, termination, toApi));
}

/** The local admin identity: gwctl on this machine, with full permissions, for whoever can read the data dir. */
async function writeAdminIdentity(dataDir: string, auth: AuthService, authAddress: string): Promise<void> {
  const admin = generateKeyPair();
  const adminDir = join(dataDir, 'admin');
  mkdirSync(adminDir, { recursive: true, mode: 0o700 });
  writeSecretFile(join(adminDir, 'key.pem'), admin.privateKeyPem);
  writeSecretFile(join(adminDir, 'cert.pem'), await auth.issueAdminCert(admin.publicKeyPem));
  writePublicFile(join(adminDir, 'host-ca.pem'), auth.host.tls.certPem);
  writePublicFile(join(adminDir, 'auth-addr'), `${localAddress(authAddress)}\n`);
}

export interface RemoteAuthOptions {
  config: GatewayConfig;
  /** --auth-server (comma-separated) overrides gateway.auth_server. */
  authServers?: string;
  /** The first start: a token of type proxy and the CA pin. */
  token?: string;
  caPin?: string;
  dialer: Dialer;
  /** Gets the event stream (auth phase: after the Proxy, which still writes its records while it stops). */
  lifecycle: Lifecycle;
}

export interface RemoteAuthRole {
  auth: RemoteProxyAuth;
  /** The web port's API router: every request forwarded to the Auth API (src/client/forward.ts). */
  api: http.RequestListener;
  /** The Proxy's host identity in <data_dir>/host/; its host ID is the proxyId. */
  identity: HostIdentity;
  /** The renewal of that identity's certificates (src/agent/renewal.ts), as an agent's. */
  renewal: HostRenewal;
}

/**
 * The auth role of a Proxy that runs without the Auth Service in its process: its host identity (joined once with
 * a token of type proxy, directly at the Auth API, after the CA pin check), then a RemoteProxyAuth over mutual TLS.
 */
export async function connectRemoteAuth(options: RemoteAuthOptions): Promise<RemoteAuthRole> {
  const { config, dialer } = options;
  const configured = config.gateway.auth_server.map((a) => formatHostPort(a.host, a.port));
  const addresses = options.authServers ? options.authServers.split(',').map((a) => normalizeAuthAddress(a.trim())) : configured;
  if (addresses.length === 0) {
    throw new GatewayError('GW_ERR_CONFIG_VALUE', 'the proxy service runs without the auth service here, but no Auth API address is given', {
      hint: 'Set gateway.auth_server (host:3025 of an Auth Service, or a list), or pass --auth-server host:3025; or enable auth_service in this process.',
    });
  }
  const dataDir = config.gateway.data_dir;
  let identity = loadHostIdentity(dataDir);
  if (identity && !identity.roles.includes('proxy')) {
    throw new GatewayError('GW_ERR_AGENT_IDENTITY', `the host identity in ${join(dataDir, 'host')} is for ${identity.roles.join(', ')}, not for a Proxy`, {
      hint: `Give this Proxy its own data directory (--data-dir), or remove ${join(dataDir, 'host')} and join again with a token of type proxy.`,
    });
  }
  if (!identity) {
    if (!options.token || !options.caPin) {
      throw new GatewayError('GW_ERR_AGENT_IDENTITY', 'this Proxy has not joined the cluster yet', {
        hint: "Start it once with --token and --ca-pin from 'gwctl tokens add --type=proxy' (and --auth-server host:3025).",
      });
    }
    identity = await joinCluster({ dataDir, server: addresses[0]!, joinedVia: 'auth', token: options.token, caPin: options.caPin, roles: ['proxy'], nodename: config.gateway.nodename, publicAddrs: config.proxy_service.public_addr.map((a) => formatHostPort(a.host, a.port)), dialer });
  } else {
    logger('gateway').info({ hostId: identity.hostId, cluster: identity.cluster }, 'using the stored host identity of this Proxy');
  }
  const auth = await RemoteProxyAuth.connect({ addresses, credentials: { cert: identity.cert, key: identity.key, hostCa: identity.hostCa, hostId: identity.hostId }, dialer });
  options.lifecycle.onStop('auth', () => auth.close());
  logger('gateway').info({ auth: addresses, hostId: identity.hostId }, 'Proxy connected to the Auth Service');
  // Its certificate for the Auth API lives a year, as an agent's: renewed the same way, from the Auth API itself.
  const renewal = new HostRenewal({ identity, dataDir, ask: (key) => auth.renewOwn(key), onRenewed: (renewed) => auth.useCertificate(renewed.cert) });
  renewal.start();
  options.lifecycle.onStop('auth', () => renewal.stop());
  return { auth, api: createAuthForwarder({ remote: auth, dialer }), identity, renewal };
}
