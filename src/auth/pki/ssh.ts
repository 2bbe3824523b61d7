/**
 * OpenSSH certificates (PROTOCOL.certkeys, "<type>-cert-v01@openssh.com") signed by a CertAuthority's SSH key:
 * user certificates for people reaching resources, host certificates for agents. Encoded and verified here
 * with node:crypto, synchronously; ssh-keygen and sshpk read the result (see test/auth/pki.test.ts).
 */
import { createPublicKey, randomBytes } from 'node:crypto';
import { GatewayError } from '../../errors.js';
import { badIdentityString } from './identity.js';
import { loadPrivateKey, sameSshLine, sshPublicKeyFromPem } from './keys.js';
import {
  blobFromLine,
  keyFromBlob,
  lineFromBlob,
  readKeyFields,
  SSH_KEY_FIELDS,
  sshBlobFromKey,
  SshReader,
  sshSign,
  sshVerify,
  SshWriter,
} from './sshwire.js';
import { CLOCK_SKEW_MS, type CertAuthority } from './tls.js';

export type SshCertType = 'user' | 'host';

/** Extensions a user certificate gets when the caller names none (what ssh-keygen -s gives by default). */
export const DEFAULT_USER_EXTENSIONS: readonly string[] = [
  'permit-X11-forwarding',
  'permit-agent-forwarding',
  'permit-port-forwarding',
  'permit-pty',
  'permit-user-rc',
];

export interface IssueSshCertOptions {
  /** The subject's public key: an OpenSSH line ("ecdsa-sha2-nistp256 AAAA...") or SPKI PEM. */
  publicKey: string;
  certType: SshCertType;
  /** Shown by sshd in its logs ("ID <keyId>"): the user name or host ID. */
  keyId: string;
  /** Logins (user) or host names (host) the certificate is valid for; never empty (empty would mean "any"). */
  principals: string[];
  ttlMs: number;
  /** Flag extensions; user default DEFAULT_USER_EXTENSIONS; host certificates carry none. */
  extensions?: string[];
  clock?: () => number;
}

export interface ParsedSshCert {
  certType: SshCertType;
  keyId: string;
  principals: string[];
  /** Milliseconds since the epoch (OpenSSH stores seconds). */
  validAfter: number;
  /** Milliseconds since the epoch; Infinity for OpenSSH's "forever". */
  validBefore: number;
  /** Whether ca's key signed it (signature checked); undefined when no CA key was given. */
  signedByCa: boolean | undefined;
  /** Serial number, decimal. */
  serial: string;
  /** Extension names, in certificate order. */
  extensions: string[];
  /** Critical options (force-command, source-address, ...): name -> value. */
  criticalOptions: Record<string, string>;
  /** The certified key, "type base64". */
  publicKey: string;
  /** The key that signed the certificate, "type base64". */
  signatureKey: string;
}

const CERT_SUFFIX = '-cert-v01@openssh.com';
const TYPE_CODE = { user: 1, host: 2 } as const;
const FOREVER = 0xffffffffffffffffn;

const badRequest = (reason: string): GatewayError => new GatewayError('GW_ERR_PKI_BAD_REQUEST', reason);
const badCert = (reason: string): GatewayError => new GatewayError('GW_ERR_AUTH_BAD_CERT', reason);
const badKey = (reason: string): GatewayError => new GatewayError('GW_ERR_PKI_BAD_KEY', reason);

function subjectKeyBlob(publicKey: string): { type: string; blob: Buffer } {
  if (typeof publicKey !== 'string') throw badKey('the subject public key is not a string');
  const line = publicKey.includes('-----BEGIN') ? sshPublicKeyFromPem(publicKey) : publicKey;
  let parsed: { type: string; blob: Buffer };
  try {
    parsed = blobFromLine(line);
    keyFromBlob(parsed.blob);
  } catch (err) {
    throw badKey(`the subject public key is not an OpenSSH public key the gateway supports (${(err as Error).message})`);
  }
  if (!(parsed.type in SSH_KEY_FIELDS)) throw badKey(`key type ${parsed.type} cannot be certified`);
  return parsed;
}

function packStrings(items: string[]): Buffer {
  const w = new SshWriter();
  for (const s of items) w.string(s);
  return w.toBuffer();
}

/** Issues an OpenSSH certificate signed by the CA's SSH key. Returns one line: "<type>-cert-v01@openssh.com <base64>". */
export function issueSshCert(ca: CertAuthority, options: IssueSshCertOptions): string {
  const { certType } = options;
  if (certType !== 'user' && certType !== 'host') throw badRequest('certType must be user or host');
  const keyIdWhy = badIdentityString(options.keyId);
  if (keyIdWhy) throw badRequest(`keyId ${keyIdWhy}`);
  if (!Array.isArray(options.principals) || options.principals.length === 0) {
    throw badRequest('an SSH certificate needs at least one principal (none would mean every principal)');
  }
  options.principals.forEach((p, i) => {
    const why = badIdentityString(p);
    if (why) throw badRequest(`principals[${i}] ${why}`);
  });
  if (typeof options.ttlMs !== 'number' || !Number.isFinite(options.ttlMs) || options.ttlMs <= 0) {
    throw badRequest('ttlMs must be a positive number of milliseconds');
  }
  const extensions = options.extensions ?? (certType === 'user' ? [...DEFAULT_USER_EXTENSIONS] : []);
  if (certType === 'host' && extensions.length > 0) throw badRequest('host certificates carry no extensions');
  for (const e of extensions) {
    if (typeof e !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9@._-]*$/.test(e)) throw badRequest(`"${String(e).slice(0, 80)}" is not an extension name`);
  }
  // OpenSSH requires extensions sorted (by byte value) and unique.
  const sortedExtensions = [...new Set(extensions)].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));

  const subject = subjectKeyBlob(options.publicKey);
  const caKey = loadPrivateKey(ca.ssh.privateKeyPem, "the CA's SSH private key");
  let caBlob: Buffer;
  try {
    caBlob = sshBlobFromKey(createPublicKey(caKey));
  } catch {
    throw badKey("the CA's SSH key type cannot sign SSH certificates");
  }
  if (ca.ssh.publicKey) {
    let declared: Buffer | undefined;
    try {
      declared = blobFromLine(ca.ssh.publicKey).blob;
    } catch {
      declared = undefined;
    }
    if (!declared || !declared.equals(caBlob)) throw badKey("the CA's SSH private key does not match its public key");
  }

  const now = (options.clock ?? Date.now)();
  const validAfter = BigInt(Math.max(0, Math.floor((now - CLOCK_SKEW_MS) / 1000)));
  const validBefore = BigInt(Math.floor((now + options.ttlMs) / 1000));
  const keyFields = (() => {
    const r = new SshReader(subject.blob);
    r.text();
    return subject.blob.subarray(r.pos);
  })();

  const extWriter = new SshWriter();
  for (const e of sortedExtensions) extWriter.string(e).string('');
  const body = new SshWriter()
    .string(`${subject.type}${CERT_SUFFIX}`)
    .string(randomBytes(32))
    .raw(keyFields)
    .uint64(randomBytes(8).readBigUInt64BE(0))
    .uint32(TYPE_CODE[certType])
    .string(options.keyId)
    .string(packStrings(options.principals))
    .uint64(validAfter)
    .uint64(validBefore)
    .string('') // critical options: none
    .string(extWriter.toBuffer())
    .string('') // reserved
    .string(caBlob)
    .toBuffer();
  let signature: Buffer;
  try {
    signature = sshSign(caKey, body);
  } catch {
    throw badKey("the CA's SSH key type cannot sign SSH certificates");
  }
  const blob = new SshWriter().raw(body).string(signature).toBuffer();
  return `${subject.type}${CERT_SUFFIX} ${blob.toString('base64')}`;
}

function parsePairs(data: Buffer): [string, string][] {
  const r = new SshReader(data);
  const out: [string, string][] = [];
  while (!r.done()) {
    const name = r.text();
    const value = r.bytes();
    out.push([name, value.length === 0 ? '' : new SshReader(value).text()]);
  }
  return out;
}

/**
 * Parses an OpenSSH certificate line (a trailing comment is allowed). With `caPublicKey` (an OpenSSH public
 * key line, e.g. ca.ssh.publicKey) it also checks that this key signed the certificate. Garbled input ->
 * GW_ERR_AUTH_BAD_CERT; a malformed caPublicKey -> GW_ERR_PKI_BAD_KEY.
 */
export function parseSshCert(line: string, caPublicKey?: string): ParsedSshCert {
  let caBlob: Buffer | undefined;
  if (caPublicKey !== undefined) {
    try {
      caBlob = blobFromLine(caPublicKey).blob;
      keyFromBlob(caBlob);
    } catch {
      throw badKey('the CA public key is not an OpenSSH public key line the gateway supports');
    }
  }
  try {
    if (typeof line !== 'string') throw new Error('not a string');
    const { type, blob } = blobFromLine(line);
    if (!type.endsWith(CERT_SUFFIX)) throw new Error('not a certificate type');
    const keyType = type.slice(0, -CERT_SUFFIX.length);
    if (!(keyType in SSH_KEY_FIELDS)) throw new Error(`unsupported key type ${keyType}`);
    const r = new SshReader(blob);
    r.text();
    r.bytes(); // nonce
    const keyStart = r.pos;
    readKeyFields(keyType, r);
    const publicKey = lineFromBlob(new SshWriter().string(keyType).raw(blob.subarray(keyStart, r.pos)).toBuffer());
    const serial = r.uint64();
    const code = r.uint32();
    const certType = code === 1 ? 'user' : code === 2 ? 'host' : undefined;
    if (!certType) throw new Error('unknown certificate type');
    const keyId = r.text();
    const principalReader = new SshReader(r.bytes());
    const principals: string[] = [];
    while (!principalReader.done()) principals.push(principalReader.text());
    const after = r.uint64();
    const before = r.uint64();
    const criticalOptions = Object.fromEntries(parsePairs(r.bytes()));
    const extensions = parsePairs(r.bytes()).map(([name]) => name);
    r.bytes(); // reserved
    const signatureKey = r.bytes();
    const signedLength = r.pos;
    const signature = r.bytes();
    r.expectDone();
    keyFromBlob(signatureKey);

    let signedByCa: boolean | undefined;
    if (caBlob) {
      try {
        signedByCa = signatureKey.equals(caBlob) && sshVerify(signatureKey, blob.subarray(0, signedLength), signature);
      } catch {
        signedByCa = false;
      }
    }
    return {
      certType,
      keyId,
      principals,
      validAfter: Number(after) * 1000,
      validBefore: before === FOREVER ? Number.POSITIVE_INFINITY : Number(before) * 1000,
      signedByCa,
      serial: serial.toString(),
      extensions,
      criticalOptions,
      publicKey,
      signatureKey: lineFromBlob(signatureKey),
    };
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw badCert(`not an OpenSSH certificate the gateway can read (${(err as Error).message})`);
  }
}

/** What a host certificate must be: signed by caKey, of hostId (its key ID and a principal), for sshKey. */
export interface HostCertExpectation {
  /** The signing CA's public key (OpenSSH line). */
  caKey: string;
  hostId: string;
  /** The certified key (OpenSSH line). */
  sshKey: string;
  now: number;
}

/**
 * An OpenSSH line checked as the host certificate `expected` describes, valid at its `now`: the parsed certificate,
 * or why it is not (a line that cannot be read included). Never throws. Used where a renewed host certificate
 * arrives: the agent's (src/agent/renewal.ts) and the Proxy's (host-cert, src/proxy/tunnel.ts).
 */
export function checkHostCert(line: string, expected: HostCertExpectation): { cert: ParsedSshCert } | { refusal: string } {
  let cert: ParsedSshCert;
  try {
    cert = parseSshCert(line, expected.caKey);
  } catch (err) {
    return { refusal: `it cannot be read (${(err as Error).message})` };
  }
  if (cert.signedByCa !== true) return { refusal: 'it is not signed by the CA it must be' };
  if (cert.certType !== 'host' || cert.keyId !== expected.hostId || !cert.principals.includes(expected.hostId)) return { refusal: `it is not a host certificate of ${expected.hostId}` };
  if (!sameSshLine(cert.publicKey, expected.sshKey)) return { refusal: 'it certifies another key' };
  if (expected.now < cert.validAfter || expected.now >= cert.validBefore) return { refusal: 'it is not valid now' };
  return { cert };
}
