/**
 * The few DER (ASN.1 Distinguished Encoding Rules) pieces the gateway needs to build and read X.509
 * certificates. Pure functions over Buffers; the reader bounds-checks everything and throws DerError on
 * garbled input (callers turn that into GW_ERR_AUTH_BAD_CERT).
 *
 * Why not @peculiar/x509: its ASN.1 layer (asn1js 3.1) decodes an OID arc above 2^53 into a non-standard
 * "{hex}" form and X509CertificateGenerator re-parses every extension before encoding it, so the identity
 * extension's first OID, 2.25.<decimal UUID> (still read: docs/pki.md), came out as "2.25". Encoding the certificate here is ~150 lines
 * and leaves nothing to chance; openssl, Node's TLS stack and node:crypto X509Certificate check the result.
 */

export class DerError extends Error {}

// --- writer ------------------------------------------------------------------------------------------------

function encodeLength(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

export function tlv(tag: number, content: Uint8Array): Buffer {
  return Buffer.concat([Buffer.from([tag]), encodeLength(content.length), content]);
}

export const TAG = {
  BOOLEAN: 0x01,
  INTEGER: 0x02,
  BIT_STRING: 0x03,
  OCTET_STRING: 0x04,
  OID: 0x06,
  UTF8_STRING: 0x0c,
  PRINTABLE_STRING: 0x13,
  IA5_STRING: 0x16,
  UTC_TIME: 0x17,
  GENERALIZED_TIME: 0x18,
  SEQUENCE: 0x30,
  SET: 0x31,
} as const;

export const seq = (...items: Uint8Array[]): Buffer => tlv(TAG.SEQUENCE, Buffer.concat(items));
export const set = (...items: Uint8Array[]): Buffer => tlv(TAG.SET, Buffer.concat(items));
/** [n] EXPLICIT: constructed context-specific tag around a complete encoding. */
export const explicit = (n: number, inner: Uint8Array): Buffer => tlv(0xa0 | n, inner);
/** [n] IMPLICIT on a primitive type: context-specific primitive tag with the raw content. */
export const implicitPrimitive = (n: number, content: Uint8Array): Buffer => tlv(0x80 | n, content);

export const derTrue = (): Buffer => tlv(TAG.BOOLEAN, Buffer.from([0xff]));
export const octetString = (content: Uint8Array): Buffer => tlv(TAG.OCTET_STRING, content);
export const utf8String = (s: string): Buffer => tlv(TAG.UTF8_STRING, Buffer.from(s, 'utf8'));
export const bitString = (content: Uint8Array, unusedBits = 0): Buffer =>
  tlv(TAG.BIT_STRING, Buffer.concat([Buffer.from([unusedBits]), content]));

/** A non-negative INTEGER from big-endian magnitude bytes (minimal encoding, 0x00 added when the top bit is set). */
export function unsignedInteger(magnitude: Uint8Array): Buffer {
  let i = 0;
  while (i < magnitude.length - 1 && magnitude[i] === 0) i++;
  let body = Buffer.from(magnitude.subarray(i));
  if (body.length === 0) body = Buffer.from([0]);
  if ((body[0] as number) & 0x80) body = Buffer.concat([Buffer.from([0]), body]);
  return tlv(TAG.INTEGER, body);
}

export const smallInteger = (n: number): Buffer => unsignedInteger(Buffer.from([n & 0xff]));

/** OBJECT IDENTIFIER from dotted decimal; arcs of any size (BigInt). */
export function oid(dotted: string): Buffer {
  if (!/^[0-2](\.(0|[1-9]\d*))+$/.test(dotted)) throw new DerError(`not an OID: ${dotted}`);
  const arcs = dotted.split('.').map((a) => BigInt(a));
  const [first, second, ...rest] = arcs as [bigint, bigint, ...bigint[]];
  const out: number[] = [];
  for (const arc of [first * 40n + second, ...rest]) {
    const groups: number[] = [];
    let v = arc;
    do {
      groups.unshift(Number(v & 0x7fn));
      v >>= 7n;
    } while (v > 0n);
    for (let k = 0; k < groups.length - 1; k++) groups[k] = (groups[k] as number) | 0x80;
    out.push(...groups);
  }
  return tlv(TAG.OID, Buffer.from(out));
}

/** UTCTime for 1950-2049, GeneralizedTime otherwise (RFC 5280 4.1.2.5), whole seconds, always Zulu. */
export function time(ms: number): Buffer {
  const d = new Date(Math.floor(ms / 1000) * 1000);
  const year = d.getUTCFullYear();
  const p2 = (n: number): string => String(n).padStart(2, '0');
  const rest = `${p2(d.getUTCMonth() + 1)}${p2(d.getUTCDate())}${p2(d.getUTCHours())}${p2(d.getUTCMinutes())}${p2(d.getUTCSeconds())}Z`;
  if (year >= 1950 && year < 2050) return tlv(TAG.UTC_TIME, Buffer.from(`${p2(year % 100)}${rest}`, 'ascii'));
  if (year < 0 || year > 9999) throw new DerError(`year ${year} cannot be encoded in a certificate`);
  return tlv(TAG.GENERALIZED_TIME, Buffer.from(`${String(year).padStart(4, '0')}${rest}`, 'ascii'));
}

// --- reader ------------------------------------------------------------------------------------------------

export interface Tlv {
  tag: number;
  /** The whole element (tag, length and content). */
  raw: Buffer;
  content: Buffer;
}

/** Reads one element at `offset`; returns it and the offset after it. DER only (definite, minimal lengths). */
export function readTlv(buf: Buffer, offset = 0): { el: Tlv; next: number } {
  if (offset + 2 > buf.length) throw new DerError('truncated element');
  const tag = buf[offset] as number;
  if ((tag & 0x1f) === 0x1f) throw new DerError('multi-byte tags are not used in certificates');
  let len = buf[offset + 1] as number;
  let pos = offset + 2;
  if (len & 0x80) {
    const n = len & 0x7f;
    if (n === 0 || n > 4) throw new DerError('unsupported length encoding');
    if (pos + n > buf.length) throw new DerError('truncated length');
    len = 0;
    for (let k = 0; k < n; k++) len = len * 256 + (buf[pos + k] as number);
    pos += n;
  }
  const end = pos + len;
  if (end > buf.length) throw new DerError('element runs past the end of its container');
  return { el: { tag, raw: buf.subarray(offset, end), content: buf.subarray(pos, end) }, next: end };
}

/** The single element that makes up all of `buf`. */
export function readOnly(buf: Buffer, expectedTag?: number): Tlv {
  const { el, next } = readTlv(buf, 0);
  if (next !== buf.length) throw new DerError('trailing bytes after element');
  if (expectedTag !== undefined && el.tag !== expectedTag) throw new DerError(`expected tag 0x${expectedTag.toString(16)}`);
  return el;
}

/** The elements inside a constructed element's content. */
export function children(content: Buffer): Tlv[] {
  const out: Tlv[] = [];
  for (let pos = 0; pos < content.length; ) {
    const { el, next } = readTlv(content, pos);
    out.push(el);
    pos = next;
  }
  return out;
}

/** UTCTime / GeneralizedTime (the Z forms DER requires) to milliseconds since the epoch. */
export function readTime(el: Tlv): number {
  const s = el.content.toString('ascii');
  let m: RegExpExecArray | null;
  let year: number;
  if (el.tag === TAG.UTC_TIME && (m = /^(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})Z$/.exec(s))) {
    const yy = Number(m[1]);
    year = yy >= 50 ? 1900 + yy : 2000 + yy;
  } else if (el.tag === TAG.GENERALIZED_TIME && (m = /^(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})Z$/.exec(s))) {
    year = Number(m[1]);
  } else {
    throw new DerError('bad time');
  }
  return Date.UTC(year, Number(m[2]) - 1, Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6]));
}

/** The parts of a certificate the gateway reads, by position in TBSCertificate (RFC 5280 4.1). */
export interface CertParts {
  tbs: Tlv;
  serial: Buffer;
  issuer: Tlv;
  notBefore: number;
  notAfter: number;
  subject: Tlv;
  spki: Tlv;
  /** extnID (DER of the OID element) -> { critical, value (content of extnValue) }, in certificate order. */
  extensions: { oid: Buffer; critical: boolean; value: Buffer }[];
}

export function parseCertificate(der: Buffer): CertParts {
  const cert = readOnly(der, TAG.SEQUENCE);
  const [tbs] = children(cert.content);
  if (!tbs || tbs.tag !== TAG.SEQUENCE) throw new DerError('no TBSCertificate');
  const fields = children(tbs.content);
  let i = 0;
  if (fields[i]?.tag === 0xa0) i++; // [0] version
  const serial = fields[i++];
  const _sigAlg = fields[i++];
  const issuer = fields[i++];
  const validity = fields[i++];
  const subject = fields[i++];
  const spki = fields[i++];
  if (!serial || serial.tag !== TAG.INTEGER || !_sigAlg || !issuer || !validity || !subject || !spki) {
    throw new DerError('TBSCertificate is missing fields');
  }
  const times = children(validity.content);
  if (times.length !== 2) throw new DerError('bad validity');
  const extensions: CertParts['extensions'] = [];
  for (const f of fields.slice(i)) {
    if (f.tag !== 0xa3) continue; // [1] issuerUniqueID, [2] subjectUniqueID
    for (const ext of children(readOnly(f.content, TAG.SEQUENCE).content)) {
      const parts = children(ext.content);
      const id = parts[0];
      const last = parts[parts.length - 1];
      if (!id || id.tag !== TAG.OID || !last || last.tag !== TAG.OCTET_STRING || parts.length > 3) {
        throw new DerError('bad extension');
      }
      const critical = parts.length === 3 && parts[1]?.tag === TAG.BOOLEAN && parts[1].content[0] !== 0;
      extensions.push({ oid: id.raw, critical, value: last.content });
    }
  }
  return {
    tbs,
    serial: serial.content,
    issuer,
    notBefore: readTime(times[0] as Tlv),
    notAfter: readTime(times[1] as Tlv),
    subject,
    spki,
    extensions,
  };
}
