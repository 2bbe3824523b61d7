/**
 * SSH wire encoding (RFC 4251 section 5) for keys, certificates (OpenSSH PROTOCOL.certkeys) and signatures
 * (RFC 5656 for ECDSA, RFC 8709 for Ed25519, RFC 8332 for RSA). Pure functions over Buffers and node:crypto
 * KeyObjects; everything is synchronous.
 */
import { createPublicKey, sign, verify, type KeyObject } from 'node:crypto';
import { bitString, children, oid, readOnly, seq, TAG, tlv, unsignedInteger } from './der.js';

export class SshWireError extends Error {}

export class SshWriter {
  private readonly parts: Buffer[] = [];

  uint32(n: number): this {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n >>> 0);
    this.parts.push(b);
    return this;
  }

  uint64(n: bigint): this {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(n);
    this.parts.push(b);
    return this;
  }

  string(s: string | Uint8Array): this {
    const body = typeof s === 'string' ? Buffer.from(s, 'utf8') : Buffer.from(s);
    this.uint32(body.length);
    this.parts.push(body);
    return this;
  }

  /** A non-negative mpint from big-endian magnitude bytes. */
  mpint(magnitude: Uint8Array): this {
    let i = 0;
    while (i < magnitude.length && magnitude[i] === 0) i++;
    let body = Buffer.from(magnitude.subarray(i));
    if (body.length > 0 && (body[0] as number) & 0x80) body = Buffer.concat([Buffer.from([0]), body]);
    return this.string(body);
  }

  raw(b: Uint8Array): this {
    this.parts.push(Buffer.from(b));
    return this;
  }

  toBuffer(): Buffer {
    return Buffer.concat(this.parts);
  }
}

export class SshReader {
  pos = 0;
  constructor(readonly buf: Buffer) {}

  private take(n: number): Buffer {
    if (n < 0 || this.pos + n > this.buf.length) throw new SshWireError('truncated');
    const out = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  uint32(): number {
    return this.take(4).readUInt32BE(0);
  }

  uint64(): bigint {
    return this.take(8).readBigUInt64BE(0);
  }

  bytes(): Buffer {
    return this.take(this.uint32());
  }

  /** A string field that must be UTF-8 text. */
  text(): string {
    const b = this.bytes();
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(b);
    } catch {
      throw new SshWireError('string is not UTF-8');
    }
  }

  /** mpint as big-endian magnitude without leading zeros; negative values are refused. */
  mpint(): Buffer {
    const b = this.bytes();
    if (b.length > 0 && (b[0] as number) & 0x80) throw new SshWireError('negative mpint');
    let i = 0;
    while (i < b.length && b[i] === 0) i++;
    return b.subarray(i);
  }

  done(): boolean {
    return this.pos === this.buf.length;
  }

  expectDone(): void {
    if (!this.done()) throw new SshWireError('trailing bytes');
  }
}

// --- public keys ---------------------------------------------------------------------------------------------
//
// Keys move between SSH blobs and node:crypto through SubjectPublicKeyInfo DER, never JWK: on Node 20,
// KeyObject.export({ format: 'jwk' }) on a key made by generateKeyPairSync (or derived from one) deadlocks when a
// garbage collection runs during the export (the KeyGenJob's destructor locks the mutex the export holds).

const CURVES = {
  nistp256: { oid: '1.2.840.10045.3.1.7', size: 32, hash: 'sha256', openssl: 'prime256v1' },
  nistp384: { oid: '1.3.132.0.34', size: 48, hash: 'sha384', openssl: 'secp384r1' },
  nistp521: { oid: '1.3.132.0.35', size: 66, hash: 'sha512', openssl: 'secp521r1' },
} as const;
type Curve = keyof typeof CURVES;

const OID_EC_PUBLIC_KEY = '1.2.840.10045.2.1';
const OID_ED25519 = '1.3.101.112';
const OID_RSA = '1.2.840.113549.1.1.1';

const isCurve = (name: string): name is Curve => Object.prototype.hasOwnProperty.call(CURVES, name);

const leftPad = (b: Buffer, size: number): Buffer => {
  if (b.length > size) throw new SshWireError('integer too large for the curve');
  return Buffer.concat([Buffer.alloc(size - b.length), b]);
};

/** Key types the gateway certifies and accepts as CA keys, with the number of fields after the type name. */
export const SSH_KEY_FIELDS: Record<string, number> = {
  'ecdsa-sha2-nistp256': 2,
  'ecdsa-sha2-nistp384': 2,
  'ecdsa-sha2-nistp521': 2,
  'ssh-ed25519': 1,
  'ssh-rsa': 2,
};

/** The SSH public key blob (type name and fields) of a public or private KeyObject. */
export function sshBlobFromKey(key: KeyObject): Buffer {
  const pub = key.type === 'private' ? createPublicKey(key) : key;
  const spki = pub.export({ type: 'spki', format: 'der' });
  try {
    const [algorithm, bits] = children(readOnly(spki, TAG.SEQUENCE).content);
    if (!algorithm || !bits || bits.tag !== TAG.BIT_STRING || bits.content[0] !== 0) throw new SshWireError('bad SPKI');
    const [algOid, params] = children(algorithm.content);
    const keyBytes = bits.content.subarray(1);
    const alg = algOid?.raw;
    if (alg?.equals(oid(OID_EC_PUBLIC_KEY))) {
      const curve = (Object.keys(CURVES) as Curve[]).find((c) => params?.raw.equals(oid(CURVES[c].oid)));
      if (!curve) throw new SshWireError('unsupported ECDSA curve');
      if (keyBytes.length !== 1 + 2 * CURVES[curve].size || keyBytes[0] !== 4) throw new SshWireError('EC point is not uncompressed');
      return new SshWriter().string(`ecdsa-sha2-${curve}`).string(curve).string(keyBytes).toBuffer();
    }
    if (alg?.equals(oid(OID_ED25519))) return new SshWriter().string('ssh-ed25519').string(keyBytes).toBuffer();
    if (alg?.equals(oid(OID_RSA))) {
      const [n, e] = children(readOnly(keyBytes, TAG.SEQUENCE).content);
      if (!n || !e || n.tag !== TAG.INTEGER || e.tag !== TAG.INTEGER) throw new SshWireError('bad RSA key');
      return new SshWriter().string('ssh-rsa').mpint(e.content).mpint(n.content).toBuffer();
    }
  } catch (err) {
    if (err instanceof SshWireError) throw err;
    throw new SshWireError('the key cannot be read');
  }
  throw new SshWireError(`key type ${pub.asymmetricKeyType ?? 'unknown'} has no SSH form the gateway supports`);
}

function publicKeyFromSpki(spki: Buffer): KeyObject {
  try {
    return createPublicKey({ key: spki, format: 'der', type: 'spki' });
  } catch {
    throw new SshWireError('the key is not a valid point or modulus');
  }
}

/** Reads the key fields of `type` from `r` (positioned after the type name) and returns a public KeyObject. */
export function readKeyFields(type: string, r: SshReader): KeyObject {
  if (type.startsWith('ecdsa-sha2-')) {
    const curve = type.slice('ecdsa-sha2-'.length);
    const curveName = r.text();
    if (!isCurve(curve) || curveName !== curve) throw new SshWireError('ECDSA curve does not match the key type');
    const q = r.bytes();
    if (q.length !== 1 + 2 * CURVES[curve].size || q[0] !== 4) throw new SshWireError('ECDSA point is not uncompressed');
    return publicKeyFromSpki(seq(seq(oid(OID_EC_PUBLIC_KEY), oid(CURVES[curve].oid)), bitString(q)));
  }
  if (type === 'ssh-ed25519') {
    const x = r.bytes();
    if (x.length !== 32) throw new SshWireError('Ed25519 key is not 32 bytes');
    return publicKeyFromSpki(seq(seq(oid(OID_ED25519)), bitString(x)));
  }
  if (type === 'ssh-rsa') {
    const e = r.mpint();
    const n = r.mpint();
    if (e.length === 0 || n.length === 0) throw new SshWireError('bad RSA key');
    const rsa = seq(unsignedInteger(n), unsignedInteger(e));
    return publicKeyFromSpki(seq(seq(oid(OID_RSA), tlv(0x05, Buffer.alloc(0))), bitString(rsa)));
  }
  throw new SshWireError(`unsupported key type ${type}`);
}

/** Parses a public key blob (type name + fields, nothing after). */
export function keyFromBlob(blob: Buffer): { type: string; key: KeyObject } {
  const r = new SshReader(blob);
  const type = r.text();
  const key = readKeyFields(type, r);
  r.expectDone();
  return { type, key };
}

/** "type base64 [comment]" -> blob; the type name must match the blob's. */
export function blobFromLine(line: string): { type: string; blob: Buffer; comment: string } {
  const m = /^\s*(\S+)\s+([A-Za-z0-9+/]+={0,2})(?:\s+(.*?))?\s*$/.exec(line);
  if (!m) throw new SshWireError('not an OpenSSH "type base64 [comment]" line');
  const type = m[1] as string;
  const blob = Buffer.from(m[2] as string, 'base64');
  const inner = new SshReader(blob).text();
  if (inner !== type) throw new SshWireError('the type name does not match the encoded key');
  return { type, blob, comment: m[3] ?? '' };
}

export const lineFromBlob = (blob: Buffer): string => `${new SshReader(blob).text()} ${blob.toString('base64')}`;

// --- signatures ----------------------------------------------------------------------------------------------

/** Signs `data` with a CA private key, returning the SSH signature blob (name + signature). */
export function sshSign(privateKey: KeyObject, data: Buffer): Buffer {
  if (privateKey.asymmetricKeyType === 'ec') {
    const curve = (Object.keys(CURVES) as Curve[]).find((c) => CURVES[c].openssl === privateKey.asymmetricKeyDetails?.namedCurve);
    if (!curve) throw new SshWireError('unsupported ECDSA curve');
    const c = CURVES[curve];
    const rs = sign(c.hash, data, { key: privateKey, dsaEncoding: 'ieee-p1363' });
    const inner = new SshWriter().mpint(rs.subarray(0, c.size)).mpint(rs.subarray(c.size)).toBuffer();
    return new SshWriter().string(`ecdsa-sha2-${curve}`).string(inner).toBuffer();
  }
  if (privateKey.asymmetricKeyType === 'ed25519') {
    return new SshWriter().string('ssh-ed25519').string(sign(null, data, privateKey)).toBuffer();
  }
  if (privateKey.asymmetricKeyType === 'rsa') {
    return new SshWriter().string('rsa-sha2-512').string(sign('sha512', data, privateKey)).toBuffer();
  }
  throw new SshWireError(`key type ${privateKey.asymmetricKeyType ?? 'unknown'} cannot sign SSH certificates`);
}

/** True when `signature` (an SSH signature blob) is a valid signature of `data` by the key in `keyBlob`. */
export function sshVerify(keyBlob: Buffer, data: Buffer, signature: Buffer): boolean {
  const { type, key } = keyFromBlob(keyBlob);
  const r = new SshReader(signature);
  const sigType = r.text();
  const sig = r.bytes();
  r.expectDone();
  if (type.startsWith('ecdsa-sha2-')) {
    if (sigType !== type) return false;
    const c = CURVES[type.slice('ecdsa-sha2-'.length) as Curve];
    const inner = new SshReader(sig);
    const rr = inner.mpint();
    const ss = inner.mpint();
    inner.expectDone();
    if (rr.length > c.size || ss.length > c.size) return false;
    const rs = Buffer.concat([leftPad(rr, c.size), leftPad(ss, c.size)]);
    return verify(c.hash, data, { key, dsaEncoding: 'ieee-p1363' }, rs);
  }
  if (type === 'ssh-ed25519') return sigType === 'ssh-ed25519' && verify(null, data, key, sig);
  if (type === 'ssh-rsa') {
    // SHA-1 signatures ("ssh-rsa") are refused, as OpenSSH >= 8.8 does by default.
    const hash = ({ 'rsa-sha2-256': 'sha256', 'rsa-sha2-512': 'sha512' } as Record<string, string>)[sigType];
    return hash !== undefined && verify(hash, data, key, sig);
  }
  return false;
}
