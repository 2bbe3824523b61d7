/**
 * X.509 side of the cluster PKI: the host and user certificate authorities, leaf certificates carrying an
 * Identity, reading that identity back from a peer's certificate, chain verification and CA pins.
 *
 * Certificates are encoded by ./der.ts and signed with node:crypto (see der.ts for why not @peculiar/x509);
 * parsing for validation uses node:crypto X509Certificate (OpenSSL).
 */
import { createHash, createPublicKey, randomBytes, sign, timingSafeEqual, X509Certificate, type KeyObject } from 'node:crypto';
import { isIP } from 'node:net';
import { isDnsName } from '../../addr.js';
import { GatewayError } from '../../errors.js';
import {
  bitString,
  children,
  DerError,
  derTrue,
  explicit,
  implicitPrimitive,
  octetString,
  oid,
  parseCertificate,
  readOnly,
  seq,
  set,
  smallInteger,
  TAG,
  time,
  tlv,
  unsignedInteger,
  utf8String,
  type CertParts,
} from './der.js';
import {
  badIdentityString,
  decodeIdentity,
  encodeIdentity,
  IDENTITY_EXTENSION_OID,
  LEGACY_IDENTITY_EXTENSION_OID,
  type Identity,
} from './identity.js';
import { generateKeyPair, loadPrivateKey, loadPublicKey } from './keys.js';

export type CaType = 'host' | 'user';
export const CA_TYPES: readonly CaType[] = ['host', 'user'];

export interface CertAuthority {
  type: CaType;
  clusterName: string;
  /** Self-signed CA certificate (PEM) and its PKCS#8 private key (PEM). */
  tls: { certPem: string; keyPem: string };
  /** SSH CA: public key line ("ecdsa-sha2-nistp256 AAAA...") and PKCS#8 private key (PEM). */
  ssh: { publicKey: string; privateKeyPem: string };
}

export type TlsUsage = 'server' | 'client' | 'both';

export interface IssueTlsCertOptions {
  /** The subject's public key, SPKI PEM. */
  publicKeyPem: string;
  identity: Identity;
  dnsNames?: string[];
  ipAddresses?: string[];
  ttlMs: number;
  usage: TlsUsage;
  clock?: () => number;
}

/** Default lifetime of a certificate authority: 10 years. */
export const DEFAULT_CA_TTL_MS = 10 * 365 * 24 * 3600 * 1000;
/** notBefore is set this far in the past, so that peers whose clocks lag a little accept a fresh certificate. */
export const CLOCK_SKEW_MS = 60 * 1000;

const OID = {
  commonName: '2.5.4.3',
  organizationName: '2.5.4.10',
  subjectKeyIdentifier: '2.5.29.14',
  keyUsage: '2.5.29.15',
  subjectAltName: '2.5.29.17',
  basicConstraints: '2.5.29.19',
  authorityKeyIdentifier: '2.5.29.35',
  extKeyUsage: '2.5.29.37',
  serverAuth: '1.3.6.1.5.5.7.3.1',
  clientAuth: '1.3.6.1.5.5.7.3.2',
} as const;

/** Written: the new OID only. Read: either (docs/pki.md, the identity extension's migration). */
const IDENTITY_OIDS_DER = [oid(IDENTITY_EXTENSION_OID), oid(LEGACY_IDENTITY_EXTENSION_OID)];
const isIdentityOid = (o: Buffer): boolean => IDENTITY_OIDS_DER.some((d) => d.equals(o));
const SKI_OID_DER = oid(OID.subjectKeyIdentifier);

const badRequest = (reason: string): GatewayError => new GatewayError('GW_ERR_PKI_BAD_REQUEST', reason);
const badCert = (reason: string): GatewayError => new GatewayError('GW_ERR_AUTH_BAD_CERT', reason);

// --- building blocks ---------------------------------------------------------------------------------------------

/** 16 random bytes, top bit cleared (positive) and the next one set (always exactly 16 bytes in DER). */
function randomSerial(): Buffer {
  const b = randomBytes(16);
  b[0] = ((b[0] as number) & 0x7f) | 0x40;
  return b;
}

/** Name with O then CN (most significant first, as Go's pkix does); as an RFC 4514 string: "CN=<cn>,O=<o>". */
function distinguishedName(cn: string, o: string): Buffer {
  const rdn = (type: string, value: string): Buffer => set(seq(oid(type), utf8String(value)));
  return seq(rdn(OID.organizationName, o), rdn(OID.commonName, cn));
}

function extension(id: string, critical: boolean, value: Buffer): Buffer {
  return seq(oid(id), ...(critical ? [derTrue()] : []), octetString(value));
}

/** Subject key identifier: SHA-1 of the subjectPublicKey BIT STRING (RFC 5280 4.2.1.2, method 1). */
function keyIdentifier(spkiDer: Buffer): Buffer {
  const [, bits] = children(readOnly(spkiDer, TAG.SEQUENCE).content);
  if (!bits || bits.tag !== TAG.BIT_STRING) throw new DerError('bad SubjectPublicKeyInfo');
  return createHash('sha1').update(bits.content.subarray(1)).digest();
}

/** Signature algorithm for a CA key: AlgorithmIdentifier DER and the digest node:crypto signs with. */
function signatureAlgorithm(key: KeyObject): { algId: Buffer; hash: string | null } {
  if (key.asymmetricKeyType === 'ec') {
    const byCurve: Record<string, [string, string]> = {
      prime256v1: ['1.2.840.10045.4.3.2', 'sha256'],
      secp384r1: ['1.2.840.10045.4.3.3', 'sha384'],
      secp521r1: ['1.2.840.10045.4.3.4', 'sha512'],
    };
    const alg = byCurve[key.asymmetricKeyDetails?.namedCurve ?? ''];
    if (alg) return { algId: seq(oid(alg[0])), hash: alg[1] };
  } else if (key.asymmetricKeyType === 'ed25519') {
    return { algId: seq(oid('1.3.101.112')), hash: null };
  } else if (key.asymmetricKeyType === 'rsa') {
    return { algId: seq(oid('1.2.840.113549.1.1.11'), tlv(0x05, Buffer.alloc(0))), hash: 'sha256' };
  }
  throw new GatewayError('GW_ERR_PKI_BAD_KEY', 'the CA key type cannot sign X.509 certificates', {
    details: { keyType: key.asymmetricKeyType, curve: key.asymmetricKeyDetails?.namedCurve },
  });
}

function buildCertificate(p: {
  issuer: Buffer;
  subject: Buffer;
  spki: Buffer;
  notBefore: number;
  notAfter: number;
  extensions: Buffer[];
  signingKey: KeyObject;
}): string {
  const { algId, hash } = signatureAlgorithm(p.signingKey);
  const tbs = seq(
    explicit(0, smallInteger(2)),
    unsignedInteger(randomSerial()),
    algId,
    p.issuer,
    seq(time(p.notBefore), time(p.notAfter)),
    p.subject,
    p.spki,
    explicit(3, seq(...p.extensions)),
  );
  const signature = sign(hash, tbs, p.signingKey); // ECDSA: DER Ecdsa-Sig-Value, as X.509 wants
  const der = seq(tbs, algId, bitString(signature));
  return `-----BEGIN CERTIFICATE-----\n${der.toString('base64').replace(/.{1,64}/g, '$&\n')}-----END CERTIFICATE-----\n`;
}

function spkiDer(key: KeyObject): Buffer {
  return key.export({ type: 'spki', format: 'der' });
}

function checkTtl(ttlMs: unknown, what: string): number {
  if (typeof ttlMs !== 'number' || !Number.isFinite(ttlMs) || ttlMs <= 0) {
    throw badRequest(`${what} must be a positive number of milliseconds`);
  }
  return ttlMs;
}

/** DER bytes of a certificate given as PEM text or DER (or PEM) bytes; undefined when it is not one. */
function certificateDer(cert: string | Uint8Array | null | undefined): Buffer | undefined {
  if (cert === null || cert === undefined) return undefined;
  if (typeof cert !== 'string' && !(cert instanceof Uint8Array)) return undefined;
  if (cert.length === 0) return undefined;
  try {
    return new X509Certificate(typeof cert === 'string' ? cert : Buffer.from(cert)).raw;
  } catch {
    return undefined;
  }
}

function parseCertOrThrow(cert: string | Uint8Array | null | undefined, what: string): { der: Buffer; parts: CertParts } {
  const der = certificateDer(cert);
  if (!der) throw badCert(`${what} is missing or is not an X.509 certificate`);
  try {
    return { der, parts: parseCertificate(der) };
  } catch {
    throw badCert(`${what} is not a well-formed X.509 certificate`);
  }
}

// --- authorities ---------------------------------------------------------------------------------------------------

/** A new certificate authority: a self-signed X.509 CA and an SSH CA key, both ECDSA P-256, separate keys. */
export async function generateAuthority(
  type: CaType,
  clusterName: string,
  options: { clock?: () => number; ttlMs?: number } = {},
): Promise<CertAuthority> {
  if (!CA_TYPES.includes(type)) throw badRequest(`CA type must be one of ${CA_TYPES.join(', ')}`);
  const why = badIdentityString(clusterName);
  if (why) throw badRequest(`cluster name ${why}`);
  const ttlMs = checkTtl(options.ttlMs ?? DEFAULT_CA_TTL_MS, 'CA ttlMs');
  const now = (options.clock ?? Date.now)();

  const tlsKeys = generateKeyPair();
  const privateKey = loadPrivateKey(tlsKeys.privateKeyPem, 'the new CA key');
  const spki = spkiDer(createPublicKey(privateKey));
  const keyId = keyIdentifier(spki);
  const name = distinguishedName(`${clusterName} ${type} CA`, clusterName);
  const certPem = buildCertificate({
    issuer: name,
    subject: name,
    spki,
    notBefore: now - CLOCK_SKEW_MS,
    notAfter: now + ttlMs,
    signingKey: privateKey,
    extensions: [
      extension(OID.basicConstraints, true, seq(derTrue())),
      extension(OID.keyUsage, true, bitString(Buffer.from([0x06]), 1)), // keyCertSign (5), cRLSign (6)
      extension(OID.subjectKeyIdentifier, false, octetString(keyId)),
      extension(OID.authorityKeyIdentifier, false, seq(implicitPrimitive(0, keyId))),
    ],
  });

  const sshKeys = generateKeyPair();
  return {
    type,
    clusterName,
    tls: { certPem, keyPem: tlsKeys.privateKeyPem },
    ssh: { publicKey: sshKeys.sshPublicKey, privateKeyPem: sshKeys.privateKeyPem },
  };
}

// --- pins ------------------------------------------------------------------------------------------------------------

/** sha256 of the CA certificate's SubjectPublicKeyInfo (DER), as "sha256:<64 lowercase hex>". */
export function caPin(certPem: string): string {
  const { parts } = parseCertOrThrow(certPem, 'the CA certificate');
  return `sha256:${createHash('sha256').update(parts.spki.raw).digest('hex')}`;
}

/**
 * The 32 digest bytes of a CA pin: "sha256:<64 hex>" as printed, or the 64 hex digits alone (prefix and hex in any
 * case, surrounding blanks ignored); GW_ERR_AUTH_BAD_PIN otherwise, with a hint for the usual slips.
 */
export function parsePin(pin: string): Buffer {
  const text = typeof pin === 'string' ? pin.trim() : '';
  const m = /^(?:sha256:)?([0-9a-f]{64})$/i.exec(text);
  if (!m) {
    const doubled = /^sha256:sha256:/i.test(text);
    throw new GatewayError('GW_ERR_AUTH_BAD_PIN', doubled ? 'the CA pin has its sha256: prefix twice' : 'the CA pin is not of the form sha256:<64 hexadecimal digits>', {
      ...(doubled ? { hint: "Give the pin once, exactly as 'gwctl status' prints it: --ca-pin=sha256:<64 hex digits>." } : {}),
      details: { length: typeof pin === 'string' ? pin.length : undefined },
    });
  }
  return Buffer.from(m[1] as string, 'hex');
}

/** True when the certificate's public key has this pin. Constant-time compare; a malformed pin -> GW_ERR_AUTH_BAD_PIN. */
export function pinMatches(certPem: string, pin: string): boolean {
  const wanted = parsePin(pin);
  const actual = Buffer.from(caPin(certPem).slice('sha256:'.length), 'hex');
  return timingSafeEqual(wanted, actual);
}

// --- leaf certificates -----------------------------------------------------------------------------------------

function checkNames(dnsNames: unknown, ipAddresses: unknown): { dns: string[]; ips: Buffer[] } {
  if (!Array.isArray(dnsNames) || !Array.isArray(ipAddresses)) throw badRequest('dnsNames and ipAddresses must be lists');
  const dns = dnsNames.map((n: unknown) => {
    if (typeof n !== 'string' || isIP(n) !== 0 || !isDnsName(n.startsWith('*.') ? n.slice(2) : n, { allowUnderscore: true })) {
      throw badRequest(`"${String(n).slice(0, 80)}" is not a DNS name (IP addresses go in ipAddresses)`);
    }
    return n;
  });
  const ips = ipAddresses.map((a: unknown) => {
    const bytes = typeof a === 'string' ? ipBytes(a) : undefined;
    if (!bytes) throw badRequest(`"${String(a).slice(0, 80)}" is not an IPv4 or IPv6 address`);
    return bytes;
  });
  return { dns, ips };
}

/** 4 or 16 bytes of an IP literal (no zone id), or undefined. */
export function ipBytes(text: string): Buffer | undefined {
  const family = isIP(text);
  if (family === 4) return Buffer.from(text.split('.').map(Number));
  if (family !== 6 || text.includes('%')) return undefined;
  let s = text;
  let v4: number[] = [];
  const m = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (m) {
    const [a = 0, b = 0, c = 0, d = 0] = (m[2] as string).split('.').map(Number);
    v4 = [(a << 8) | b, (c << 8) | d];
    s = (m[1] as string).endsWith('::') ? (m[1] as string) : (m[1] as string).slice(0, -1);
  }
  const groups = (part: string): number[] => (part === '' ? [] : part.split(':').map((g) => parseInt(g, 16)));
  const halves = s.split('::');
  let words: number[];
  if (halves.length === 1) {
    words = [...groups(s), ...v4];
  } else {
    const head = groups(halves[0] as string);
    const tail = [...groups(halves[1] as string), ...v4];
    words = [...head, ...Array<number>(Math.max(0, 8 - head.length - tail.length)).fill(0), ...tail];
  }
  if (words.length !== 8 || words.some((w) => !(w >= 0 && w <= 0xffff))) return undefined;
  const out = Buffer.alloc(16);
  words.forEach((w, i) => out.writeUInt16BE(w, i * 2));
  return out;
}

/** Issues a leaf certificate for `identity` signed by the CA's X.509 key. Returns PEM. */
export async function issueTlsCert(ca: CertAuthority, options: IssueTlsCertOptions): Promise<string> {
  const ttlMs = checkTtl(options.ttlMs, 'ttlMs');
  if (!['server', 'client', 'both'].includes(options.usage)) throw badRequest('usage must be server, client or both');
  const identityJson = encodeIdentity(options.identity, (r) => badRequest(r));
  const identity = JSON.parse(identityJson) as Identity;
  if (identity.cluster !== ca.clusterName) {
    throw badRequest(`the identity's cluster "${identity.cluster}" is not the CA's cluster "${ca.clusterName}"`);
  }
  const { dns, ips } = checkNames(options.dnsNames ?? [], options.ipAddresses ?? []);
  const subjectKey = loadPublicKey(options.publicKeyPem, 'the subject public key');
  const caKey = loadPrivateKey(ca.tls.keyPem, "the CA's private key");
  const { parts: caParts } = parseCertOrThrow(ca.tls.certPem, 'the CA certificate');
  if (!spkiDer(createPublicKey(caKey)).equals(caParts.spki.raw)) {
    throw new GatewayError('GW_ERR_PKI_BAD_KEY', "the CA's private key does not match the CA certificate");
  }

  const now = (options.clock ?? Date.now)();
  if (now < caParts.notBefore || now >= caParts.notAfter) {
    throw new GatewayError('GW_ERR_PKI_CA_EXPIRED', `the ${ca.clusterName} ${ca.type} CA is not valid now`, {
      details: { notBefore: new Date(caParts.notBefore).toISOString(), notAfter: new Date(caParts.notAfter).toISOString() },
    });
  }
  const spki = spkiDer(subjectKey);
  const caSki = caParts.extensions.find((e) => e.oid.equals(SKI_OID_DER));
  const authorityKeyId = caSki ? readOnly(caSki.value, TAG.OCTET_STRING).content : keyIdentifier(caParts.spki.raw);
  const eku = { server: [OID.serverAuth], client: [OID.clientAuth], both: [OID.serverAuth, OID.clientAuth] }[options.usage];

  const extensions = [
    extension(OID.basicConstraints, true, seq()),
    extension(OID.keyUsage, true, bitString(Buffer.from([0x80]), 7)), // digitalSignature (0)
    extension(OID.extKeyUsage, false, seq(...eku.map((u) => oid(u)))),
  ];
  if (dns.length + ips.length > 0) {
    const names = [...dns.map((d) => implicitPrimitive(2, Buffer.from(d, 'ascii'))), ...ips.map((ip) => implicitPrimitive(7, ip))]; // [2] dNSName, [7] iPAddress
    extensions.push(extension(OID.subjectAltName, false, seq(...names)));
  }
  extensions.push(
    extension(OID.subjectKeyIdentifier, false, octetString(keyIdentifier(spki))),
    extension(OID.authorityKeyIdentifier, false, seq(implicitPrimitive(0, authorityKeyId))),
    extension(IDENTITY_EXTENSION_OID, false, utf8String(identityJson)),
  );

  return buildCertificate({
    issuer: caParts.subject.raw,
    subject: distinguishedName(identity.name, identity.cluster),
    spki,
    notBefore: now - CLOCK_SKEW_MS,
    notAfter: Math.min(now + ttlMs, caParts.notAfter), // a leaf never outlives its CA
    signingKey: caKey,
    extensions,
  });
}

/**
 * Reads the identity from a certificate issued by issueTlsCert: PEM text, or DER bytes such as
 * tls PeerCertificate.raw. GW_ERR_AUTH_BAD_CERT when the certificate is absent, garbled or has no identity.
 * This reads; it does not verify: the TLS handshake (or verifyCert) decides whether to trust the certificate.
 */
export function identityFromCert(cert: string | Buffer | null | undefined): Identity {
  const { parts } = parseCertOrThrow(cert, 'the certificate');
  // Under either OID, exactly one: a certificate with both (the same identity or not) is refused, never read by
  // picking one, since a reader that picked differently would see another identity in the same certificate.
  const found = parts.extensions.filter((e) => isIdentityOid(e.oid));
  if (found.length !== 1) {
    throw badCert(found.length === 0 ? 'the certificate carries no gateway identity' : 'the certificate carries two identities');
  }
  let json: string;
  try {
    const str = readOnly((found[0] as { value: Buffer }).value, TAG.UTF8_STRING);
    json = new TextDecoder('utf-8', { fatal: true }).decode(str.content);
  } catch {
    throw badCert('the identity extension is not a UTF8String');
  }
  return decodeIdentity(json, (r) => badCert(r));
}

/**
 * Whether a certificate (PEM, or DER such as tls PeerCertificate.raw) bears the gateway identity: an extension with
 * its OID in the certificate's extension list. Every certificate a cluster CA issues has one (issueTlsCert), so a
 * client that also trusts CAs outside the cluster tells the cluster's certificates from the others by it; the OID's
 * bytes elsewhere (a subject name, another extension's value) do not count. DER that the certificate reader
 * (der.ts) cannot follow is searched for the OID's bytes anywhere, as before it was read: such a certificate gets
 * the full identity check (and fails it) rather than the check for certificates of other CAs. Absent input, or PEM
 * that is no certificate, bears none.
 */
export function bearsIdentity(cert: string | Buffer | null | undefined): boolean {
  const der = typeof cert === 'string' ? certificateDer(cert) : cert;
  if (der === undefined || der === null) return false;
  try {
    return parseCertificate(der).extensions.some((e) => isIdentityOid(e.oid));
  } catch (err) {
    if (!(err instanceof DerError)) throw err;
    return IDENTITY_OIDS_DER.some((d) => der.includes(d));
  }
}

/** A readable summary of certificate parts for reasons: "CN=..., O=..." from Node's parser. */
function subjectOf(der: Buffer, which: 'subject' | 'issuer'): string {
  try {
    return new X509Certificate(der)[which].split('\n').reverse().join(', ');
  } catch {
    return '?';
  }
}

/**
 * Checks that `certPem` is signed by the CA in `caCertPem` (which must be a CA) and that both are within their
 * validity period at `now` (default: the current time). Returns a reason on failure, undefined on success.
 */
export async function verifyCert(certPem: string, caCertPem: string, now: number = Date.now()): Promise<string | undefined> {
  const leafDer = certificateDer(certPem);
  if (!leafDer) return 'the certificate is missing or cannot be parsed';
  const caDer = certificateDer(caCertPem);
  if (!caDer) return 'the CA certificate is missing or cannot be parsed';
  let leaf: CertParts;
  let caParts: CertParts;
  try {
    leaf = parseCertificate(leafDer);
    caParts = parseCertificate(caDer);
  } catch {
    return 'a certificate is not well-formed DER';
  }
  const leafX = new X509Certificate(leafDer);
  const caX = new X509Certificate(caDer);
  if (!caX.ca) return 'the issuer certificate is not a CA (basicConstraints CA:TRUE missing)';
  if (!leaf.issuer.raw.equals(caParts.subject.raw) || !leafX.checkIssued(caX)) {
    return `the certificate was issued by "${subjectOf(leafDer, 'issuer')}", not by "${subjectOf(caDer, 'subject')}"`;
  }
  let signed = false;
  try {
    signed = leafX.verify(caX.publicKey);
  } catch {
    signed = false;
  }
  if (!signed) return "the certificate's signature does not verify with the CA's key";
  const iso = (ms: number): string => new Date(ms).toISOString();
  if (now < caParts.notBefore) return `the CA certificate is not valid before ${iso(caParts.notBefore)}`;
  if (now > caParts.notAfter) return `the CA certificate expired at ${iso(caParts.notAfter)}`;
  if (now < leaf.notBefore) return `the certificate is not valid before ${iso(leaf.notBefore)}`;
  if (now > leaf.notAfter) return `the certificate expired at ${iso(leaf.notAfter)}`;
  return undefined;
}
