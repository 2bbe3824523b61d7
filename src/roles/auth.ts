/**
 * The auth role: the Backend (gateway.storage: SQLite in the data directory by default, or PostgreSQL), the AuthService on it, its API on
 * auth_service.listen_addr (mutual TLS), and the local admin identity in <data_dir>/admin/ for gwctl on this
 * machine. Runs alone: it needs nothing of the other roles.
 */
import http from 'node:http';
import type net from 'node:net';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { createApiHandler } from '../auth/api.js';
import { generateKeyPair } from '../auth/pki.js';
import { AuthService } from '../auth/service.js';
import { openConfiguredBackend } from '../backend/index.js';
import type { GatewayConfig } from '../config/index.js';
import { writePublicFile, writeSecretFile } from '../fsutil.js';
import { logger } from '../log.js';
import type { ConnectionLimits } from '../net/deadlines.js';
import { guardHttpServer } from '../net/http.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { serverSecureContext, terminateTls } from '../net/tls.js';
import type { Lifecycle } from './lifecycle.js';
import { authServerNames, localAddress } from './names.js';

export interface AuthRoleOptions {
  config: GatewayConfig;
  /** Deadlines, caps and counters of this process's listeners. */
  limits: ConnectionLimits;
  /** Gets the Auth API's listener (auth phase) and the Backend (backend phase). */
  lifecycle: Lifecycle;
  /** What `gwctl tokens add` prints as --proxy: set when a Proxy runs in this process. */
  proxyPublicAddr?: string;
}

export interface AuthRole {
  auth: AuthService;
  /** The API router: served on the Auth API's listener here, and by the Proxy's web port. */
  api: http.RequestListener;
  /** The Auth API's bound address. */
  address: string;
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
  });
  // Every Proxy reads it (discovery tells agents); the last Auth Service to start decides.
  await auth.setTunnelStrategy(config.auth_service.tunnel_strategy.type === 'proxy_peering'
    ? { type: 'proxy_peering', agent_connection_count: config.auth_service.tunnel_strategy.agent_connection_count }
    : { type: 'agent_mesh' });
  const api = createApiHandler(auth);
  const keys = generateKeyPair();
  const cert = await auth.issueServerCert(keys.publicKeyPem, authServerNames(config));
  const server = authApiServer(options.limits, { key: keys.privateKeyPem, cert, ca: [auth.host.tls.certPem, auth.user.tls.certPem] }, api);
  lifecycle.onStop('auth', () => closeServer(server));
  const address = await listenOn(server, config.auth_service.listen_addr, 'auth_service.listen_addr');
  logger('gateway').info({ addr: address }, 'auth API listening');
  await writeAdminIdentity(dataDir, auth, address);
  return { auth, api, address };
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
