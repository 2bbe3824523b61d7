/**
 * TLS ClientHello parser for the multiplexer's ALPN/SNI router. Pure and strictly bounded: the multiplexer calls
 * parseClientHello with every byte received so far (from the first TLS record header on) and gets
 *
 *   { kind: 'need-more' }  the bytes so far are a valid prefix of a ClientHello; call again with more bytes,
 *   { kind: 'hello', ... } the complete ClientHello; `length` bytes (record headers included) were used,
 *
 * or a thrown GatewayError: GW_ERR_MUX_BAD_HELLO (malformed, message says why) or GW_ERR_MUX_HELLO_TOO_LARGE.
 * A prefix of a valid hello is always 'need-more', never an error: the body is only parsed once the whole
 * handshake message is in. Malformed framing (record type, record version, record length, handshake type,
 * declared size) is refused as soon as it is seen.
 *
 * Record layer (RFC 8446 §5.1): every record must be a handshake record (content type 22) with version
 * 0x0300..0x0304 and a length 1..2^14. A ClientHello may span several records; the fragments are
 * reassembled. A record carrying bytes after the end of the ClientHello is refused (nothing legitimately
 * follows a ClientHello in the same record). Anything after the last record of the hello is not looked at.
 *
 * Bounds: the hello, record headers included, must fit in `maxBytes` (default 16384 + 5 * 4 = 16404). The
 * handshake header's 24-bit length is checked against that bound before any byte of the body is waited for,
 * so a hello that announces 64 KiB is refused at once. Nothing is allocated beyond the handshake message
 * itself (one copy when it spans several records, none otherwise), and every length is checked against the
 * bytes that remain in its enclosing vector before it is used. While the hello is incomplete a call does constant
 * work per record and allocates nothing, since the multiplexer calls again with every chunk that arrives.
 *
 * Decisions:
 * - server_name (RFC 6066 §3): entries are name_type + 2-byte length; entries of another type than host_name
 *   are skipped; two host_name entries are refused. The host_name must be 1..255 bytes of [A-Za-z0-9._-],
 *   with non-empty labels of at most 63 bytes and no trailing dot; otherwise the hello is refused. It is
 *   lowercased. An IP literal (an IPv6 address, or a name of only digits and dots such as 192.0.2.1), which
 *   RFC 6066 forbids but some clients send anyway, is ignored: serverName is then undefined.
 * - ALPN (RFC 7301): a non-empty list of names of 1..255 bytes of printable ASCII without space (0x21..0x7e).
 *   GREASE identifiers (RFC 8701: two equal bytes 0x?A) are skipped; anything else outside that range, and
 *   empty names, are refused. Order is kept; alpn is [] when the extension is absent.
 * - supported_versions (RFC 8446 §4.2.1): a 1-byte length, then 2-byte versions; GREASE values (0x?A?A) are
 *   left out. [] when absent.
 * - An extension type that appears twice is refused (RFC 8446 §4.2). Unknown extensions are skipped, bounded.
 * - legacy_version must have major 3; session_id at most 32 bytes; cipher_suites even and at least 2 bytes;
 *   at least one compression method; an extensions block, when present, must fill the message exactly.
 */
import { GatewayError } from '../errors.js';

export const TLS_RECORD_HEADER_LEN = 5;
/** RFC 8446 §5.1: a TLSPlaintext fragment is at most 2^14 bytes. */
export const TLS_MAX_RECORD_LEN = 16384;
export const DEFAULT_MAX_HELLO_BYTES = 16384 + 5 * 4;

const CONTENT_HANDSHAKE = 22;
const HANDSHAKE_CLIENT_HELLO = 1;
const EXT_SERVER_NAME = 0;
const EXT_ALPN = 16;
const EXT_SUPPORTED_VERSIONS = 43;
const NAME_TYPE_HOST_NAME = 0;

export interface ClientHelloLimits {
  /** Largest hello accepted, TLS record headers included. Default 16384 + 5 * 4. */
  maxBytes?: number;
}

export interface ClientHello {
  kind: 'hello';
  /** Lowercased host_name from server_name; undefined when absent or an IP literal. */
  serverName?: string;
  /** ALPN protocol names in the client's order (GREASE left out); [] when the extension is absent. */
  alpn: string[];
  /** Bytes used, TLS record headers included: the hello is buf.subarray(0, length). */
  length: number;
  /** ClientHello.legacy_version, e.g. 0x0303. */
  legacyVersion: number;
  /** supported_versions in the client's order (GREASE left out); [] when the extension is absent. */
  supportedVersions: number[];
}

export type ClientHelloResult = { kind: 'need-more' } | ClientHello;

function bad(reason: string): GatewayError {
  return new GatewayError('GW_ERR_MUX_BAD_HELLO', `bad TLS ClientHello: ${reason}`, { details: { reason } });
}

function tooLarge(size: string, max: number): GatewayError {
  return new GatewayError(
    'GW_ERR_MUX_HELLO_TOO_LARGE',
    `TLS ClientHello too large: ${size} bytes, at most ${max} accepted`,
    { details: { max } },
  );
}

/**
 * Parses a TLS ClientHello from the start of `buf`. Returns need-more or the hello; throws a GatewayError
 * (GW_ERR_MUX_BAD_HELLO, GW_ERR_MUX_HELLO_TOO_LARGE) and nothing else.
 */
export function parseClientHello(buf: Buffer, limits: ClientHelloLimits = {}): ClientHelloResult {
  const maxBytes = limits.maxBytes ?? DEFAULT_MAX_HELLO_BYTES;
  if (!Number.isSafeInteger(maxBytes) || maxBytes < TLS_RECORD_HEADER_LEN + 4) {
    throw new GatewayError('GW_ERR_INTERNAL', `parseClientHello: maxBytes must be an integer >= 9, got ${maxBytes}`);
  }

  // Walk the record headers. The multiplexer calls again with every new chunk, so this pass allocates nothing
  // and does constant work per record; the fragments are only gathered once the hello is complete.
  const head: number[] = []; // the 4-byte handshake header, gathered across records
  let have = 0; // handshake bytes available so far
  let need = -1; // total handshake bytes (4 + body) once the handshake header is known
  let records = 0;
  let off = 0;
  for (;;) {
    if (buf.length - off < 1) return { kind: 'need-more' };
    records++;
    const type = buf[off]!;
    if (type !== CONTENT_HANDSHAKE) {
      if (type === 0x15) throw bad(`record ${records} is a TLS alert, not a handshake record`);
      if (off === 0 && (type & 0x80) !== 0) throw bad('SSLv2-compatible ClientHello is not supported');
      throw bad(`record ${records} has content type ${type}, expected 22 (handshake)`);
    }
    if (buf.length - off < 2) return { kind: 'need-more' };
    if (buf[off + 1] !== 0x03) throw bad(`record version major ${buf[off + 1]} is not 3`);
    if (buf.length - off < 3) return { kind: 'need-more' };
    if (buf[off + 2]! > 0x04) throw bad(`record version 0x03${hex2(buf[off + 2]!)} is unknown`);
    if (buf.length - off < TLS_RECORD_HEADER_LEN) return { kind: 'need-more' };
    const recLen = buf.readUInt16BE(off + 3);
    if (recLen === 0) throw bad('empty handshake record');
    if (recLen > TLS_MAX_RECORD_LEN) throw bad(`record length ${recLen} exceeds 2^14`);
    const recEnd = off + TLS_RECORD_HEADER_LEN + recLen;
    if (recEnd > maxBytes) throw tooLarge(`more than ${maxBytes}`, maxBytes);

    const bodyStart = off + TLS_RECORD_HEADER_LEN;
    const haveBefore = have;
    const available = Math.max(0, Math.min(buf.length, recEnd) - bodyStart);
    have += available;

    if (need < 0) {
      for (let i = bodyStart; i < bodyStart + available && head.length < 4; i++) head.push(buf[i]!);
      if (head.length >= 1 && head[0] !== HANDSHAKE_CLIENT_HELLO) {
        throw bad(`handshake type ${head[0]} is not ClientHello (1)`);
      }
      if (head.length === 4) {
        need = 4 + ((head[1]! << 16) | (head[2]! << 8) | head[3]!);
        // Smallest possible size on the wire: the message plus one record header per 2^14 bytes.
        const minWire = need + TLS_RECORD_HEADER_LEN * Math.ceil(need / TLS_MAX_RECORD_LEN);
        if (minWire > maxBytes) throw tooLarge(String(minWire), maxBytes);
      }
    }

    if (need >= 0 && haveBefore + recLen >= need) {
      // The hello ends in this record, which must end with it.
      if (haveBefore + recLen > need) throw bad('handshake record carries data after the ClientHello');
      if (buf.length < recEnd) return { kind: 'need-more' };
      return parseBody(gather(buf, recEnd, records, need).subarray(4), recEnd);
    }
    if (buf.length < recEnd) return { kind: 'need-more' };
    off = recEnd;
  }
}

/** The handshake message carried by the (already validated) records in buf[0, end): a view if one record. */
function gather(buf: Buffer, end: number, records: number, size: number): Buffer {
  if (records === 1) return buf.subarray(TLS_RECORD_HEADER_LEN, end);
  const msg = Buffer.allocUnsafe(size); // size <= maxBytes, and every byte is written below
  let at = 0;
  for (let off = 0; off < end; ) {
    const len = buf.readUInt16BE(off + 3);
    buf.copy(msg, at, off + TLS_RECORD_HEADER_LEN, off + TLS_RECORD_HEADER_LEN + len);
    at += len;
    off += TLS_RECORD_HEADER_LEN + len;
  }
  return msg;
}

function hex2(n: number): string {
  return n.toString(16).padStart(2, '0');
}

/** A cursor over a bounded slice; every read is checked against the slice's end. */
class Reader {
  private pos = 0;
  constructor(
    private readonly buf: Buffer,
    private readonly what: string,
  ) {}

  get remaining(): number {
    return this.buf.length - this.pos;
  }

  private take(n: number, field: string): number {
    if (n > this.remaining) {
      throw bad(`${field} needs ${n} bytes but only ${this.remaining} remain in ${this.what}`);
    }
    const at = this.pos;
    this.pos += n;
    return at;
  }

  u8(field: string): number {
    return this.buf[this.take(1, field)]!;
  }

  u16(field: string): number {
    return this.buf.readUInt16BE(this.take(2, field));
  }

  bytes(n: number, field: string): Buffer {
    const at = this.take(n, field);
    return this.buf.subarray(at, at + n);
  }

  /** A vector with a 1- or 2-byte length prefix, as a Reader bounded by its declared length. */
  vector(lenBytes: 1 | 2, field: string): Reader {
    const n = lenBytes === 1 ? this.u8(`${field} length`) : this.u16(`${field} length`);
    return new Reader(this.bytes(n, field), field);
  }
}

function parseBody(body: Buffer, length: number): ClientHello {
  const r = new Reader(body, 'the ClientHello');
  const legacyVersion = r.u16('legacy_version');
  if (legacyVersion >> 8 !== 0x03) throw bad(`legacy_version 0x${legacyVersion.toString(16)} is not TLS`);
  r.bytes(32, 'random');
  const sessionId = r.vector(1, 'session_id');
  if (sessionId.remaining > 32) throw bad(`session_id of ${sessionId.remaining} bytes (at most 32)`);
  const suites = r.vector(2, 'cipher_suites');
  if (suites.remaining < 2 || suites.remaining % 2 !== 0) {
    throw bad(`cipher_suites of ${suites.remaining} bytes (even, at least 2)`);
  }
  const compression = r.vector(1, 'compression_methods');
  if (compression.remaining < 1) throw bad('no compression method');

  const hello: ClientHello = { kind: 'hello', alpn: [], length, legacyVersion, supportedVersions: [] };
  if (r.remaining === 0) return hello; // no extensions (allowed before TLS 1.3)

  const exts = r.vector(2, 'extensions');
  if (r.remaining !== 0) throw bad(`${r.remaining} bytes after the extensions`);
  const seen = new Set<number>();
  while (exts.remaining > 0) {
    const type = exts.u16('extension type');
    const data = exts.vector(2, `extension ${type}`);
    if (seen.has(type)) throw bad(`extension ${type} appears twice`);
    seen.add(type);
    switch (type) {
      case EXT_SERVER_NAME: {
        const name = parseServerName(data);
        if (name !== undefined) hello.serverName = name;
        break;
      }
      case EXT_ALPN:
        hello.alpn = parseAlpn(data);
        break;
      case EXT_SUPPORTED_VERSIONS:
        hello.supportedVersions = parseSupportedVersions(data);
        break;
      default:
        break; // skipped; its length was already checked against the extensions block
    }
  }
  return hello;
}

function isGrease16(v: number): boolean {
  return (v & 0x0f0f) === 0x0a0a && v >> 8 === (v & 0xff);
}

function parseServerName(data: Reader): string | undefined {
  const list = data.vector(2, 'server_name list');
  if (data.remaining !== 0) throw bad('bytes after the server_name list');
  if (list.remaining === 0) throw bad('empty server_name list');
  let hostName: Buffer | undefined;
  while (list.remaining > 0) {
    const nameType = list.u8('server_name type');
    const name = list.vector(2, 'server_name entry');
    if (nameType !== NAME_TYPE_HOST_NAME) continue; // unknown name types are skipped
    if (hostName !== undefined) throw bad('two host_name entries in server_name');
    hostName = name.bytes(name.remaining, 'host_name');
  }
  if (hostName === undefined) return undefined;
  return checkHostName(hostName);
}

/** Validates a host_name; returns it lowercased, or undefined for an IP literal. */
function checkHostName(raw: Buffer): string | undefined {
  if (raw.length === 0) throw bad('empty host_name');
  if (raw.length > 255) throw bad(`host_name of ${raw.length} bytes (at most 255)`);
  const text = raw.toString('latin1');
  if (/^[0-9.]+$/.test(text)) return undefined; // IPv4 literal (or all-numeric): RFC 6066 forbids IPs
  if (text.includes(':') && isIPv6Literal(text)) return undefined;
  if (!/^[A-Za-z0-9._-]+$/.test(text)) throw bad('host_name has bytes outside [A-Za-z0-9._-]');
  if (text.endsWith('.')) throw bad('host_name ends with a dot');
  for (const label of text.split('.')) {
    if (label.length === 0) throw bad('host_name has an empty label');
    if (label.length > 63) throw bad('host_name has a label longer than 63 bytes');
  }
  return text.toLowerCase();
}

/** A bare IPv6 literal (optionally with a dotted-quad tail), no zone, no brackets. */
function isIPv6Literal(text: string): boolean {
  if (text.length > 45 || !/^[0-9A-Fa-f:.]+$/.test(text)) return false;
  let t = text;
  if (t.includes('.')) {
    const lastColon = t.lastIndexOf(':');
    if (lastColon < 0 || !isIPv4Literal(t.slice(lastColon + 1))) return false;
    t = `${t.slice(0, lastColon + 1)}0:0`; // the dotted quad stands for two groups
  }
  const parts = t.split('::');
  if (parts.length > 2) return false;
  const groups = (s: string): number | null => {
    if (s === '') return 0;
    const g = s.split(':');
    return g.every((x) => /^[0-9A-Fa-f]{1,4}$/.test(x)) ? g.length : null;
  };
  if (parts.length === 2) {
    const a = groups(parts[0]!);
    const b = groups(parts[1]!);
    return a !== null && b !== null && a + b <= 7;
  }
  return groups(parts[0]!) === 8;
}

/** Dotted-quad IPv4 with decimal octets 0..255 and no leading zeros. */
function isIPv4Literal(text: string): boolean {
  return /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/.test(text);
}

function parseAlpn(data: Reader): string[] {
  const list = data.vector(2, 'ALPN list');
  if (data.remaining !== 0) throw bad('bytes after the ALPN list');
  if (list.remaining === 0) throw bad('empty ALPN list');
  const out: string[] = [];
  while (list.remaining > 0) {
    const name = list.vector(1, 'ALPN protocol name');
    const bytes = name.bytes(name.remaining, 'ALPN protocol name');
    if (bytes.length === 0) throw bad('empty ALPN protocol name');
    if (bytes.length === 2 && isGrease16(bytes.readUInt16BE(0))) continue;
    for (const b of bytes) {
      if (b < 0x21 || b > 0x7e) throw bad('ALPN protocol name is not printable ASCII');
    }
    out.push(bytes.toString('latin1'));
  }
  return out;
}

function parseSupportedVersions(data: Reader): number[] {
  const list = data.vector(1, 'supported_versions');
  if (data.remaining !== 0) throw bad('bytes after the supported_versions list');
  if (list.remaining < 2 || list.remaining % 2 !== 0) {
    throw bad(`supported_versions of ${list.remaining} bytes (even, at least 2)`);
  }
  const out: number[] = [];
  while (list.remaining > 0) {
    const v = list.u16('supported version');
    if (!isGrease16(v)) out.push(v);
  }
  return out;
}
