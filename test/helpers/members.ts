/**
 * A cluster's host CA for tests that stand in for a cluster member (a Proxy, an agent, the Auth Service): host
 * certificates with the gateway identity (kind, host ID, system roles) that clients now check, not only a chain
 * and a name. Made in memory with the gateway's own PKI (src/auth/pki.ts); test/helpers/tls.ts is the openssl one
 * for servers outside the cluster.
 */
import { generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority } from '../../src/auth/pki.js';

export interface IssuedCert {
  certPem: string;
  keyPem: string;
}

export interface ClusterPki {
  cluster: string;
  ca: CertAuthority;
  /** The host CA certificate (PEM): what clients and agents trust. */
  caPem: string;
  /** A certificate of this CA for a member: kind host unless said, its name (host ID), roles and SANs. */
  issue(options: { name: string; roles: string[]; kind?: 'host' | 'user'; dns?: string[]; ips?: string[] }): Promise<IssuedCert>;
}

export async function makeClusterPki(cluster = 'test'): Promise<ClusterPki> {
  const ca = await generateAuthority('host', cluster);
  return {
    cluster,
    ca,
    caPem: ca.tls.certPem,
    async issue({ name, roles, kind = 'host', dns = [], ips = [] }) {
      const keys = generateKeyPair();
      const certPem = await issueTlsCert(ca, { publicKeyPem: keys.publicKeyPem, identity: { kind, name, cluster, roles }, dnsNames: dns, ipAddresses: ips, ttlMs: 3600_000, usage: 'both' });
      return { certPem, keyPem: keys.privateKeyPem };
    },
  };
}
