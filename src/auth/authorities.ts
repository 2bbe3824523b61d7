/**
 * The cluster's identity: its name and its two certificate authorities (host, user), created on first start and
 * shared by every Auth Service on the same Backend, and the certificates they sign (pki.ts does the signing).
 */
import { isIP } from 'node:net';
import type { Backend } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { CertBundle, PublicCas } from '../wire/certs.js';
import { caPin, generateAuthority, issueSshCert, issueTlsCert, type CertAuthority, type Identity, type TlsUsage } from './pki.js';
import { loadPublicKey, sshPublicKeyFromPem } from './pki/keys.js';
import { blobFromLine, keyFromBlob } from './pki/sshwire.js';
import { KEYS, readJson } from './records.js';

export const HOST_CERT_TTL_MS = 365 * 24 * 3600_000;

/** The bundle a login, join or renewal hands out and the public CAs (GET /webapi/ca): the wire's shapes. */
export type { CertBundle, PublicCas };

/** What a bundle certifies: one identity, one key pair (X.509 and SSH forms), for ttlMs. */
export interface BundleRequest {
  identity: Identity;
  publicKeyPem: string;
  sshPublicKey: string;
  ttlMs: number;
  usage: TlsUsage;
  /** DNS names and IP addresses of the X.509 certificate. */
  names: string[];
  sshPrincipals: string[];
}

const ADMIN: Identity = { kind: 'admin', name: 'admin', cluster: '', roles: [] };

export class Authorities {
  private readonly now: () => number;

  private constructor(
    readonly clusterName: string,
    readonly host: CertAuthority,
    readonly user: CertAuthority,
    /** Given to the signers only when injected (tests), as they default to the real time themselves. */
    private readonly clock: (() => number) | undefined,
  ) {
    this.now = clock ?? Date.now;
  }

  /**
   * Reads the cluster's name and authorities, creating them on first start. A data directory belongs to one
   * cluster: a different configured name is refused (GW_ERR_AUTH_CLUSTER_NAME).
   */
  static async open(backend: Backend, clusterName: string, clock?: () => number): Promise<Authorities> {
    const stored = await readJson<{ name: string }>(backend, KEYS.clusterName);
    if (stored && stored.name !== clusterName) {
      throw new GatewayError('GW_ERR_AUTH_CLUSTER_NAME', `the data directory belongs to cluster "${stored.name}", but the configuration names it "${clusterName}"`, {
        hint: `A cluster cannot be renamed: set auth_service.cluster_name to "${stored.name}", or use a new data directory.`,
      });
    }
    const host = await openAuthority(backend, 'host', clusterName, clock);
    const user = await openAuthority(backend, 'user', clusterName, clock);
    if (!stored) {
      try {
        await backend.create(KEYS.clusterName, JSON.stringify({ name: clusterName }));
      } catch (err) {
        if (!isGatewayError(err, 'GW_ERR_BACKEND_EXISTS')) throw err;
      }
    }
    return new Authorities(clusterName, host, user, clock);
  }

  caPin(): string {
    return caPin(this.host.tls.certPem);
  }

  publicCas(): PublicCas {
    return {
      cluster_name: this.clusterName,
      host_ca: this.host.tls.certPem,
      user_ca: this.user.tls.certPem,
      ssh_host_ca: this.host.ssh.publicKey,
      ssh_user_ca: this.user.ssh.publicKey,
    };
  }

  /** The local admin identity (full permissions), for gwctl on the Auth Service's own machine. */
  adminIdentity(): Identity {
    return { ...ADMIN, cluster: this.clusterName };
  }

  /**
   * A server certificate of the host CA (usage both: it also serves as the client certificate of peering and
   * of calls to the Auth API). The Auth API's own (host ID "auth") says role auth, which the clients of the Auth
   * API require (src/client/api.ts authServerIdentity); every other, a Proxy's, says proxy only, never auth.
   */
  async issueServerCert(publicKeyPem: string, names: string[], hostId = 'auth', roles: readonly string[] = hostId === 'auth' ? ['auth'] : ['proxy']): Promise<string> {
    const { dnsNames, ipAddresses } = splitNames(names);
    return issueTlsCert(this.host, {
      publicKeyPem,
      identity: { kind: 'host', name: hostId, cluster: this.clusterName, roles: [...roles] },
      dnsNames,
      ipAddresses,
      ttlMs: HOST_CERT_TTL_MS,
      usage: 'both',
      ...this.clockOption(),
    });
  }

  async issueAdminCert(publicKeyPem: string): Promise<string> {
    return issueTlsCert(this.user, { publicKeyPem, identity: this.adminIdentity(), ttlMs: HOST_CERT_TTL_MS, usage: 'client', ...this.clockOption() });
  }

  /** X.509 and SSH certificates for one key pair, signed by the host or the user CA, with the cluster's CAs. */
  async issueBundle(type: 'host' | 'user', request: BundleRequest): Promise<CertBundle> {
    const ca = type === 'host' ? this.host : this.user;
    const { identity, ttlMs } = request;
    const { dnsNames, ipAddresses } = splitNames(request.names);
    const tlsCert = await issueTlsCert(ca, { publicKeyPem: request.publicKeyPem, identity, dnsNames, ipAddresses, ttlMs, usage: request.usage, ...this.clockOption() });
    const sshCert = issueSshCert(ca, {
      publicKey: request.sshPublicKey,
      certType: ca.type,
      keyId: identity.name,
      principals: request.sshPrincipals,
      ttlMs,
      ...this.clockOption(),
    });
    return {
      tlsCert,
      sshCert,
      hostCaPem: this.host.tls.certPem,
      userCaPem: this.user.tls.certPem,
      sshHostCa: this.host.ssh.publicKey,
      sshUserCa: this.user.ssh.publicKey,
      clusterName: this.clusterName,
      validUntil: new Date(this.now() + ttlMs).toISOString(),
    };
  }

  private clockOption(): { clock?: () => number } {
    return this.clock ? { clock: this.clock } : {};
  }
}

async function openAuthority(backend: Backend, type: 'host' | 'user', clusterName: string, clock: (() => number) | undefined): Promise<CertAuthority> {
  const existing = await readJson<CertAuthority>(backend, KEYS.authority(type));
  if (existing) return existing;
  const ca = await generateAuthority(type, clusterName, clock ? { clock } : {});
  try {
    await backend.create(KEYS.authority(type), JSON.stringify(ca));
    return ca;
  } catch (err) {
    // Another auth server on a shared backend won the race: use its authority.
    if (!isGatewayError(err, 'GW_ERR_BACKEND_EXISTS')) throw err;
    return (await readJson<CertAuthority>(backend, KEYS.authority(type)))!;
  }
}

/** The host of "host", "host:port" or "[v6]:port". */
export function hostOf(addr: string): string {
  const m = /^\[([^\]]+)\](?::\d+)?$/.exec(addr);
  if (m) return m[1]!;
  const colons = addr.split(':').length - 1;
  return colons === 1 ? addr.slice(0, addr.lastIndexOf(':')) : addr;
}

function splitNames(names: string[]): { dnsNames: string[]; ipAddresses: string[] } {
  const hosts = [...new Set(names.map(hostOf))];
  return { dnsNames: hosts.filter((h) => isIP(h) === 0), ipAddresses: hosts.filter((h) => isIP(h) !== 0) };
}

/**
 * The keys of a login or join request, checked before anything else happens (no password check, no token
 * lookup): GW_ERR_API_BAD_KEY names the field. Never echoes key text.
 */
export function checkRequestKeys(publicKeyPem: string, sshPublicKey: string): void {
  try {
    loadPublicKey(publicKeyPem, 'public_key');
  } catch {
    throw new GatewayError('GW_ERR_API_BAD_KEY', '"public_key" is not a PEM public key (-----BEGIN PUBLIC KEY-----)');
  }
  try {
    keyFromBlob(blobFromLine(sshPublicKey.includes('-----BEGIN') ? sshPublicKeyFromPem(sshPublicKey) : sshPublicKey).blob);
  } catch {
    throw new GatewayError('GW_ERR_API_BAD_KEY', '"ssh_public_key" is not an OpenSSH public key line of a supported type ("ecdsa-sha2-nistp256 AAAA...")');
  }
}
