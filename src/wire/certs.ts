/**
 * What the Auth API hands a client or an agent that logs in, joins or renews (a certificate bundle), what it
 * publishes on GET /webapi/ca (the public CAs), and the roles a join may ask for. Written by the Auth Service
 * (src/auth/authorities.ts, joining.ts), read by gwsh, gwctl and agents (src/client/, src/agent/, src/cli/).
 */

export interface CertBundle {
  /** PEM, X.509. */
  tlsCert: string;
  /** OpenSSH certificate line. */
  sshCert: string;
  /** Host CA certificate (PEM): what servers of this cluster present. */
  hostCaPem: string;
  /** User CA certificate (PEM): what clients of this cluster present. */
  userCaPem: string;
  /** SSH CA public keys. */
  sshHostCa: string;
  sshUserCa: string;
  clusterName: string;
  validUntil: string;
}

/** GET /webapi/ca. */
export interface PublicCas {
  cluster_name: string;
  host_ca: string;
  user_ca: string;
  ssh_host_ca: string;
  ssh_user_ca: string;
}

/** The roles a join token may grant and a join may ask for. */
export const JOIN_ROLES = ['node', 'db', 'app', 'kube', 'desktop', 'proxy'] as const;
export type JoinRole = (typeof JOIN_ROLES)[number];
