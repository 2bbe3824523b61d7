/**
 * The cluster's certificate authorities and certificates (docs/pki.md).
 *
 * Two authorities per cluster, `host` and `user`, each with an X.509 CA (mutual TLS: Auth API on 3025,
 * peering, client certificates) and an SSH CA (OpenSSH host and user certificates). Every key is ECDSA P-256.
 * X.509 leaf certificates carry the holder's Identity: Subject CN = name, O = cluster, and the full Identity
 * as compact JSON in a non-critical extension under IDENTITY_EXTENSION_OID.
 *
 *   pki/keys.ts      key pairs, PEM loading (GW_ERR_PKI_BAD_KEY, never echoing key text)
 *   pki/identity.ts  Identity, its validation and JSON form
 *   pki/der.ts       DER writer/reader for certificates
 *   pki/tls.ts       authorities, leaf certificates, identityFromCert, verifyCert, pins
 *   pki/sshwire.ts   SSH wire format, SSH key blobs and signatures
 *   pki/ssh.ts       OpenSSH certificates
 */
export { generateKeyPair, sameSshKey, sameSshLine, sshPrivateKeyPem, sshPublicKeyFromPem, type KeyPair } from './pki/keys.js';
export { IDENTITY_EXTENSION_OID, LEGACY_IDENTITY_EXTENSION_OID, type Identity } from './pki/identity.js';
export { presenceDigest, presenceProofRefusal, PRESENCE_PROOF_EVERY_MS, renewProofRefusal, RENEW_PROOF_SKEW_MS, signPresenceProof, signRenewProof, type PresenceClaim, type RenewProof } from './pki/proof.js';
export {
  bearsIdentity,
  CA_TYPES,
  caPin,
  CLOCK_SKEW_MS,
  DEFAULT_CA_TTL_MS,
  generateAuthority,
  identityFromCert,
  issueTlsCert,
  parsePin,
  pinMatches,
  verifyCert,
  type CaType,
  type CertAuthority,
  type IssueTlsCertOptions,
  type TlsUsage,
} from './pki/tls.js';
export {
  checkHostCert,
  DEFAULT_USER_EXTENSIONS,
  issueSshCert,
  parseSshCert,
  type HostCertExpectation,
  type IssueSshCertOptions,
  type ParsedSshCert,
  type SshCertType,
} from './pki/ssh.js';
