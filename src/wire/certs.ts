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

/**
 * The X.509 extension that carries a gateway identity (src/auth/pki/identity.ts writes it). Shared so that a client
 * can tell a gateway certificate from another cluster apart from a TLS-inspecting proxy's forgery
 * (src/dial/tlsverify.ts) without the Auth code. An arc of the unassigned 1.3.9999 branch (not Teleport's .1/.2):
 * every arc fits 31 bits, which Go's encoding/asn1 needs (docs/pki.md says why and how it will move to a PEN arc).
 */
export const IDENTITY_EXTENSION_OID = '1.3.9999.77.1';

/**
 * The identity extension's first OID (2.25.<UUID as one 128-bit arc>): Go refuses any certificate carrying it.
 * Read, never written: certificates issued before the move keep working until renewed.
 */
export const LEGACY_IDENTITY_EXTENSION_OID = '2.25.144055156550211512603578689614142843921';

/** The OID's DER encoding (tag 06, length, base-128 arcs), as it appears in a certificate's extension list. */
export const IDENTITY_OID_DER: Buffer = encodeOid(IDENTITY_EXTENSION_OID);
export const LEGACY_IDENTITY_OID_DER: Buffer = encodeOid(LEGACY_IDENTITY_EXTENSION_OID);
/** Every OID a reader takes the identity under. */
export const IDENTITY_OIDS_DER: readonly Buffer[] = [IDENTITY_OID_DER, LEGACY_IDENTITY_OID_DER];

function encodeOid(dotted: string): Buffer {
  const arcs = dotted.split('.').map((a) => BigInt(a));
  const body: number[] = [];
  for (const arc of [arcs[0]! * 40n + arcs[1]!, ...arcs.slice(2)]) {
    const bytes: number[] = [];
    let v = arc;
    do {
      bytes.unshift(Number(v & 0x7fn) | (bytes.length ? 0x80 : 0));
      v >>= 7n;
    } while (v > 0n);
    body.push(...bytes);
  }
  return Buffer.from([0x06, body.length, ...body]);
}
