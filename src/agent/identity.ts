/**
 * An agent's host identity: obtained once with a join token (the trust connection on the Proxy's web port,
 * through the Dialer, the CA checked against the pin before the token is sent), then kept in
 * <data_dir>/host/ so that a restart needs no token.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { generateKeyPair, identityFromCert, type Identity } from '../auth/pki.js';
import type { CertBundle, JoinRole } from '../wire/certs.js';
import { ApiClient, fetchPinnedCas, normalizeAddress, type ApiClientOptions } from '../client/api.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError } from '../errors.js';
import { writePublicFile, writeSecretFile } from '../fsutil.js';
import { logger } from '../log.js';

export interface HostIdentity {
  hostId: string;
  cluster: string;
  roles: JoinRole[];
  nodename: string;
  /** Where it joined: the Proxy (or Auth Service) address. */
  server: string;
  /** proxy: through the Proxy's web port; auth: the Auth Service directly (self-hosted); local: same process. */
  joinedVia: 'proxy' | 'auth' | 'local';
  key: string;
  cert: string;
  sshCert: string;
  hostCa: string;
  userCa: string;
  /** The cluster's SSH user CA (OpenSSH public key line): who may log in to the SSH Service. */
  sshUserCa: string;
  identity: Identity;
}

export interface JoinOptions {
  dataDir: string;
  server: string;
  token: string;
  caPin: string;
  roles: JoinRole[];
  nodename: string;
  publicAddrs: string[];
  dialer: Dialer;
  joinedVia: 'proxy' | 'auth';
}

const DIR = 'host';

export function loadHostIdentity(dataDir: string): HostIdentity | undefined {
  const dir = join(dataDir, DIR);
  let meta: { hostId: string; cluster: string; roles: JoinRole[]; nodename: string; server: string; joinedVia?: 'proxy' | 'auth' | 'local' };
  try {
    meta = JSON.parse(readFileSync(join(dir, 'identity.json'), 'utf8')) as typeof meta;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new GatewayError('GW_ERR_AGENT_IDENTITY', `cannot read the host identity in ${dir}: ${(err as Error).message}`, {
      hint: `Remove ${dir} and join again with a new token.`,
    });
  }
  const cert = readFileSync(join(dir, 'cert.pem'), 'utf8');
  return {
    ...meta,
    joinedVia: meta.joinedVia ?? (meta.server === 'local' ? 'local' : 'proxy'),
    key: readFileSync(join(dir, 'key.pem'), 'utf8'),
    cert,
    sshCert: readFileSync(join(dir, 'ssh-cert.pub'), 'utf8').trim(),
    hostCa: readFileSync(join(dir, 'host-ca.pem'), 'utf8'),
    userCa: readFileSync(join(dir, 'user-ca.pem'), 'utf8'),
    sshUserCa: readFileSync(join(dir, 'ssh-user-ca.pub'), 'utf8').trim(),
    identity: identityFromCert(cert),
  };
}

/**
 * A client of identity.server (the Proxy or the Auth API) with the identity's certificate as it is now: made again
 * only when a renewal (src/agent/renewal.ts) has replaced the certificate.
 */
export function identityClient(identity: HostIdentity, options: Omit<ApiClientOptions, 'address' | 'ca' | 'cert' | 'key'> = {}): () => ApiClient {
  let made: { cert: string; client: ApiClient } | undefined;
  return () => {
    if (made?.cert !== identity.cert) made = { cert: identity.cert, client: new ApiClient({ server: identity.joinedVia === 'auth' ? 'auth' : 'proxy', ...options, address: identity.server, ca: identity.hostCa, cert: identity.cert, key: identity.key }) };
    return made.client;
  };
}

export async function joinCluster(options: JoinOptions): Promise<HostIdentity> {
  const log = logger('join');
  const server = normalizeAddress(options.server);
  // 1. Trust: the CA, fetched without trusting the connection, must match the pin. Nothing secret is sent before.
  const cas = await fetchPinnedCas(server, options.caPin, options.dialer);
  log.info({ server, cluster: cas.cluster_name }, 'cluster CA matches the pin; joining');
  // 2. Join over TLS verified against that CA.
  const keys = generateKeyPair();
  const client = new ApiClient({ address: server, dialer: options.dialer, ca: cas.host_ca, server: options.joinedVia });
  const bundle = await client.call<CertBundle & { hostId: string }>('POST', '/webapi/join', {
    token: options.token,
    roles: options.roles,
    nodename: options.nodename,
    public_addrs: options.publicAddrs,
    public_key: keys.publicKeyPem,
    ssh_public_key: keys.sshPublicKey,
  });
  saveHostIdentity(options.dataDir, keys.privateKeyPem, bundle, { roles: options.roles, nodename: options.nodename, server, joinedVia: options.joinedVia });
  log.info({ hostId: bundle.hostId, cluster: bundle.clusterName, roles: options.roles }, 'joined the cluster');
  return loadHostIdentity(options.dataDir)!;
}

/** Writes what a join returned into <dataDir>/host/ (private key and certificates 0600). */
export function saveHostIdentity(
  dataDir: string,
  privateKeyPem: string,
  bundle: CertBundle & { hostId: string },
  meta: { roles: JoinRole[]; nodename: string; server: string; joinedVia: 'proxy' | 'auth' | 'local' },
): void {
  const dir = join(dataDir, DIR);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeSecretFile(join(dir, 'key.pem'), privateKeyPem);
  writeSecretFile(join(dir, 'cert.pem'), bundle.tlsCert);
  writeSecretFile(join(dir, 'ssh-cert.pub'), `${bundle.sshCert}\n`);
  writePublicFile(join(dir, 'host-ca.pem'), bundle.hostCaPem);
  writePublicFile(join(dir, 'user-ca.pem'), bundle.userCaPem);
  writePublicFile(join(dir, 'ssh-user-ca.pub'), `${bundle.sshUserCa}\n`);
  const record = { hostId: bundle.hostId, cluster: bundle.clusterName, ...meta };
  writeSecretFile(join(dir, 'identity.json'), `${JSON.stringify(record, null, 2)}\n`);
}
