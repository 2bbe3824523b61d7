/**
 * PROXY protocol v1 (text) and v2 (binary) headers, as specified in haproxy's doc/proxy-protocol.txt. Pure:
 * the multiplexer calls parseProxyHeader with every byte received so far (from the start of the connection,
 * and only on connections from trusted load balancers) and gets
 *
 *   { kind: 'need-more' }   what has arrived could still become a valid header,
 *   { kind: 'header', ... } a complete header of `length` bytes; the proxied stream starts right after it,
 *
 * or a thrown GatewayError GW_ERR_MUX_BAD_PROXY_HEADER (and nothing else). Malformed input is refused as soon
 * as it is seen; a prefix of a valid header is never refused.
 *
 * v1: "PROXY TCP4|TCP6 <src> <dst> <sport> <dport>\r\n" or "PROXY UNKNOWN[ anything]\r\n", at most 107 bytes
 *   CRLF included, fields separated by exactly one space. Addresses must be of the announced family (IPv4
 *   dotted quads without leading zeros; IPv6 in any RFC 4291 text form, without zone), ports 0..65535 without
 *   leading zeros. For UNKNOWN the rest of the line is ignored, but it must still be printable ASCII. A bare
 *   CR or LF is refused. v1 has no LOCAL command: command is always 'PROXY'.
 * v2: the 12-byte signature, version 2, command LOCAL (0) or PROXY (1), family/transport byte, 16-bit length.
 *   Decisions:
 *   - The length after the 16-byte header is capped at `maxV2Length` (default 4096, well above the 216-byte
 *     AF_UNIX block plus the TLVs that load balancers send) so a header stays bounded; longer ones are refused.
 *   - LOCAL (health checks): the block is skipped whatever it holds, as the spec requires: family 'unknown',
 *     no addresses, no TLVs.
 *   - PROXY with 0x11 (TCP over IPv4) / 0x21 (TCP over IPv6): addresses and ports are read (the length must
 *     cover them) and the rest of the block is parsed as TLVs, each bounded by the block.
 *   - PROXY with 0x00 (UNSPEC) or 0x31 (UNIX stream): accepted as family 'unknown' (the spec's fallback: use
 *     the real connection endpoints); the block is ignored, no TLVs.
 *   - PROXY with 0x12, 0x22, 0x32 (datagram): refused, the gateway's port is TCP only and a datagram header on
 *     a stream connection means a misconfigured load balancer. Any other family/transport byte is refused.
 *   - TLVs: CRC32C (0x03) must be 4 bytes, at most one, and is verified (RFC 4960 appendix B); UNIQUE_ID (0x05)
 *     at most 128 bytes; SSL (0x20) must hold client (1) + verify (4) + well-formed sub-TLVs. Every TLV,
 *     NOOP and CRC32C included, is returned with a copy of its value, in order.
 * Addresses are returned in the form Node gives socket.remoteAddress (inet_ntop): IPv4 dotted quad; IPv6 per
 * RFC 5952 (lowercase, longest zero run compressed), IPv4-mapped addresses as ::ffff:a.b.c.d.
 */
import { GatewayError } from '../errors.js';

export const PROXY_V1_MAX_LENGTH = 107;
export const PROXY_V2_HEADER_LENGTH = 16;
export const PROXY_V2_DEFAULT_MAX_LENGTH = 4096;
export const PROXY_V2_SIGNATURE: Buffer = Buffer.from([
  0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
]);

/** Registered v2 TLV types. */
export const PP2_TYPE = Object.freeze({
  ALPN: 0x01,
  AUTHORITY: 0x02,
  CRC32C: 0x03,
  NOOP: 0x04,
  UNIQUE_ID: 0x05,
  SSL: 0x20,
  NETNS: 0x30,
});

export type ProxyFamily = 'tcp4' | 'tcp6' | 'unknown';
export type ProxyCommand = 'PROXY' | 'LOCAL';

export interface ProxyAddress {
  address: string;
  port: number;
}

export interface ProxyTlv {
  type: number;
  value: Buffer;
}

export interface ProxyHeader {
  kind: 'header';
  /** 1 for the text header, 2 for the binary one. */
  version: 1 | 2;
  /** Bytes of the header; the proxied stream starts at buf[length]. */
  length: number;
  command: ProxyCommand;
  family: ProxyFamily;
  /** Present for tcp4 / tcp6 with the PROXY command. */
  source?: ProxyAddress;
  destination?: ProxyAddress;
  /** v2 PROXY with tcp4 / tcp6 only ([] when none). */
  tlvs?: ProxyTlv[];
}

export type ProxyHeaderResult = { kind: 'need-more' } | ProxyHeader;

export interface ProxyHeaderLimits {
  /** Largest v2 length field (bytes after the 16-byte header) accepted. Default 4096; at most 65535. */
  maxV2Length?: number;
}

function bad(reason: string): GatewayError {
  return new GatewayError('GW_ERR_MUX_BAD_PROXY_HEADER', `bad PROXY protocol header: ${reason}`, {
    details: { reason },
  });
}

/**
 * Parses a PROXY protocol header (v1 or v2) at the start of `buf`. Returns need-more or the header; throws
 * GW_ERR_MUX_BAD_PROXY_HEADER and nothing else. Reads at most 107 bytes (v1) or 16 + maxV2Length bytes (v2).
 */
export function parseProxyHeader(buf: Buffer, limits: ProxyHeaderLimits = {}): ProxyHeaderResult {
  const maxV2Length = limits.maxV2Length ?? PROXY_V2_DEFAULT_MAX_LENGTH;
  if (!Number.isInteger(maxV2Length) || maxV2Length < 0 || maxV2Length > 0xffff) {
    throw new GatewayError('GW_ERR_INTERNAL', `parseProxyHeader: maxV2Length must be 0..65535, got ${maxV2Length}`);
  }
  if (buf.length === 0) return { kind: 'need-more' };
  if (buf[0] === 0x50 /* P */) return parseV1(buf);
  if (buf[0] === 0x0d) return parseV2(buf, maxV2Length);
  throw bad('does not start with "PROXY " or the v2 signature');
}

// ---- v1 ------------------------------------------------------------------------------------------------------

/** Every valid v1 line starts with one of these. */
const V1_STARTS = ['PROXY TCP4 ', 'PROXY TCP6 ', 'PROXY UNKNOWN\r', 'PROXY UNKNOWN '].map((s) => Buffer.from(s));

function parseV1(buf: Buffer): ProxyHeaderResult {
  const window = buf.subarray(0, PROXY_V1_MAX_LENGTH);
  if (!V1_STARTS.some((start) => startsCompatible(window, start))) {
    throw bad('v1 header does not start with "PROXY TCP4 ", "PROXY TCP6 " or "PROXY UNKNOWN"');
  }
  const lf = window.indexOf(0x0a);
  const lineEnd = lf < 0 ? window.length : lf; // exclusive; bytes before it must be printable, then CR
  for (let i = 0; i < lineEnd; i++) {
    const b = window[i]!;
    if (b === 0x0d && i === lineEnd - 1) break; // the CR of the CRLF (or the last byte so far)
    if (b < 0x20 || b > 0x7e) throw bad(`v1 header has a non-printable byte 0x${b.toString(16)} at ${i}`);
  }
  if (lf < 0) {
    if (window.length >= PROXY_V1_MAX_LENGTH) throw bad('v1 header has no CRLF within 107 bytes');
    return { kind: 'need-more' };
  }
  if (lf === 0 || window[lf - 1] !== 0x0d) throw bad('v1 header ends with LF without CR');
  const line = window.toString('latin1', 0, lf - 1);
  const length = lf + 1;
  const fields = line.split(' ');
  if (fields[1] === 'UNKNOWN') return { kind: 'header', version: 1, length, command: 'PROXY', family: 'unknown' };
  const family: ProxyFamily = fields[1] === 'TCP4' ? 'tcp4' : 'tcp6';
  if (fields.length !== 6) throw bad(`v1 ${fields[1]} header needs 6 fields separated by single spaces`);
  const parseAddr = family === 'tcp4' ? parseIPv4 : parseIPv6;
  const src = parseAddr(fields[2]!);
  const dst = parseAddr(fields[3]!);
  if (src === null) throw bad(`v1 source address is not a valid ${family === 'tcp4' ? 'IPv4' : 'IPv6'} address`);
  if (dst === null) throw bad(`v1 destination address is not a valid ${family === 'tcp4' ? 'IPv4' : 'IPv6'} address`);
  const sport = parsePortText(fields[4]!, 'source');
  const dport = parsePortText(fields[5]!, 'destination');
  return {
    kind: 'header',
    version: 1,
    length,
    command: 'PROXY',
    family,
    source: { address: formatIP(src), port: sport },
    destination: { address: formatIP(dst), port: dport },
  };
}

function startsCompatible(buf: Buffer, start: Buffer): boolean {
  const n = Math.min(buf.length, start.length);
  return buf.subarray(0, n).equals(start.subarray(0, n));
}

function parsePortText(text: string, which: string): number {
  if (!/^(0|[1-9][0-9]{0,4})$/.test(text) || Number(text) > 65535) {
    throw bad(`v1 ${which} port is not a number 0..65535 without leading zeros`);
  }
  return Number(text);
}

// ---- v2 ------------------------------------------------------------------------------------------------------

function parseV2(buf: Buffer, maxV2Length: number): ProxyHeaderResult {
  const sigLen = Math.min(buf.length, PROXY_V2_SIGNATURE.length);
  if (!buf.subarray(0, sigLen).equals(PROXY_V2_SIGNATURE.subarray(0, sigLen))) {
    throw bad('does not start with the v2 signature');
  }
  if (buf.length < 13) return { kind: 'need-more' };
  const verCmd = buf[12]!;
  if (verCmd >> 4 !== 2) throw bad(`v2 version ${verCmd >> 4} is not 2`);
  const cmd = verCmd & 0x0f;
  if (cmd > 1) throw bad(`v2 command ${cmd} is neither LOCAL (0) nor PROXY (1)`);
  const command: ProxyCommand = cmd === 0 ? 'LOCAL' : 'PROXY';
  if (buf.length < 14) return { kind: 'need-more' };
  const fam = buf[13]!;
  if (command === 'PROXY') checkFamilyByte(fam);
  if (buf.length < PROXY_V2_HEADER_LENGTH) return { kind: 'need-more' };
  const len = buf.readUInt16BE(14);
  if (len > maxV2Length) throw bad(`v2 length ${len} exceeds the limit of ${maxV2Length}`);
  const length = PROXY_V2_HEADER_LENGTH + len;
  if (buf.length < length) return { kind: 'need-more' };

  if (command === 'LOCAL' || fam === 0x00 || fam === 0x31) {
    return { kind: 'header', version: 2, length, command, family: 'unknown' };
  }
  const header = buf.subarray(0, length);
  const v6 = fam === 0x21;
  const addrLen = v6 ? 36 : 12;
  if (len < addrLen) throw bad(`v2 length ${len} is too short for ${v6 ? 'IPv6' : 'IPv4'} addresses (${addrLen})`);
  const ipLen = v6 ? 16 : 4;
  const at = PROXY_V2_HEADER_LENGTH;
  const src = header.subarray(at, at + ipLen);
  const dst = header.subarray(at + ipLen, at + 2 * ipLen);
  const sport = header.readUInt16BE(at + 2 * ipLen);
  const dport = header.readUInt16BE(at + 2 * ipLen + 2);
  const tlvs = parseTlvs(header, at + addrLen);
  return {
    kind: 'header',
    version: 2,
    length,
    command,
    family: v6 ? 'tcp6' : 'tcp4',
    source: { address: formatIP(src), port: sport },
    destination: { address: formatIP(dst), port: dport },
    tlvs,
  };
}

function checkFamilyByte(fam: number): void {
  switch (fam) {
    case 0x00:
    case 0x11:
    case 0x21:
    case 0x31:
      return;
    case 0x12:
    case 0x22:
    case 0x32:
      throw bad('v2 header announces a datagram (UDP / UNIX datagram) connection; only stream connections are accepted');
    default:
      throw bad(`v2 family/transport byte 0x${fam.toString(16).padStart(2, '0')} is not defined`);
  }
}

function parseTlvs(header: Buffer, start: number): ProxyTlv[] {
  const tlvs: ProxyTlv[] = [];
  let off = start;
  let crcAt = -1;
  while (off < header.length) {
    if (header.length - off < 3) throw bad(`v2 TLV header truncated (${header.length - off} bytes left)`);
    const type = header[off]!;
    const len = header.readUInt16BE(off + 1);
    const valueAt = off + 3;
    if (len > header.length - valueAt) {
      throw bad(`v2 TLV 0x${type.toString(16)} of ${len} bytes runs past the header (${header.length - valueAt} left)`);
    }
    const value = header.subarray(valueAt, valueAt + len);
    switch (type) {
      case PP2_TYPE.CRC32C:
        if (len !== 4) throw bad('v2 CRC32C TLV is not 4 bytes');
        if (crcAt >= 0) throw bad('v2 header has two CRC32C TLVs');
        crcAt = valueAt;
        break;
      case PP2_TYPE.UNIQUE_ID:
        if (len > 128) throw bad('v2 UNIQUE_ID TLV is longer than 128 bytes');
        break;
      case PP2_TYPE.SSL:
        checkSslTlv(value);
        break;
      default:
        break;
    }
    tlvs.push({ type, value: Buffer.from(value) });
    off = valueAt + len;
  }
  if (crcAt >= 0) {
    const expected = header.readUInt32BE(crcAt);
    if (crc32c(header, crcAt) !== expected) throw bad('v2 CRC32C checksum does not match');
  }
  return tlvs;
}

function checkSslTlv(value: Buffer): void {
  if (value.length < 5) throw bad('v2 SSL TLV shorter than 5 bytes');
  let off = 5;
  while (off < value.length) {
    if (value.length - off < 3) throw bad('v2 SSL sub-TLV header truncated');
    const len = value.readUInt16BE(off + 1);
    if (len > value.length - off - 3) throw bad('v2 SSL sub-TLV runs past the SSL TLV');
    off += 3 + len;
  }
}

// ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) ---------------------------------------------------

let crcTable: Uint32Array | undefined;

function table(): Uint32Array {
  if (crcTable !== undefined) return crcTable;
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[n] = c >>> 0;
  }
  crcTable = t;
  return t;
}

/** CRC32C of `data`, with the 4 bytes at `zeroAt` (if >= 0) taken as zeros. */
export function crc32c(data: Uint8Array, zeroAt = -1): number {
  const t = table();
  let c = 0xffffffff;
  for (let i = 0; i < data.length; i++) {
    const b = zeroAt >= 0 && i >= zeroAt && i < zeroAt + 4 ? 0 : data[i]!;
    c = t[(c ^ b) & 0xff]! ^ (c >>> 8);
  }
  return (c ^ 0xffffffff) >>> 0;
}

// ---- addresses ---------------------------------------------------------------------------------------------

const OCTET = '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])';
const IPV4 = new RegExp(`^${OCTET}\\.${OCTET}\\.${OCTET}\\.${OCTET}$`);

/** Dotted-quad IPv4 (no leading zeros) to 4 bytes, or null. */
export function parseIPv4(text: string): Buffer | null {
  if (!IPV4.test(text)) return null;
  return Buffer.from(text.split('.').map(Number));
}

/** RFC 4291 IPv6 text (optionally with a dotted-quad tail; no zone, no brackets) to 16 bytes, or null. */
export function parseIPv6(text: string): Buffer | null {
  if (text.length > 45 || !/^[0-9A-Fa-f:.]+$/.test(text)) return null;
  let tail: Buffer | null = null;
  let t = text;
  if (t.includes('.')) {
    const lastColon = t.lastIndexOf(':');
    if (lastColon < 0) return null;
    tail = parseIPv4(t.slice(lastColon + 1));
    if (tail === null) return null;
    t = t.slice(0, lastColon + 1);
    // "::1.2.3.4" leaves "::"; "a::b:1.2.3.4" leaves "a::b:" whose final ':' only separated the tail.
    if (!t.endsWith('::')) t = t.slice(0, -1);
  }
  const groupsOf = (s: string): number[] | null => {
    if (s === '') return [];
    const parts = s.split(':');
    if (!parts.every((p) => /^[0-9A-Fa-f]{1,4}$/.test(p))) return null;
    return parts.map((p) => parseInt(p, 16));
  };
  const want = tail === null ? 8 : 6;
  const halves = t.split('::');
  let groups: number[];
  if (halves.length === 1) {
    const g = groupsOf(t);
    if (g === null || g.length !== want) return null;
    groups = g;
  } else if (halves.length === 2) {
    const a = groupsOf(halves[0]!);
    const b = groupsOf(halves[1]!);
    if (a === null || b === null || a.length + b.length > want - 1) return null;
    groups = [...a, ...new Array<number>(want - a.length - b.length).fill(0), ...b];
  } else {
    return null;
  }
  const out = Buffer.alloc(16);
  groups.forEach((g, i) => out.writeUInt16BE(g, i * 2));
  if (tail !== null) tail.copy(out, 12);
  return out;
}

/**
 * 4 or 16 bytes to text, exactly as Node prints socket addresses (inet_ntop): RFC 5952 compression, with
 * IPv4-mapped (::ffff:a.b.c.d) and IPv4-compatible (::a.b.c.d, when the 7th group is not 0) tails.
 */
export function formatIP(bytes: Uint8Array): string {
  if (bytes.length === 4) return Array.from(bytes).join('.');
  if (bytes.length !== 16) throw new GatewayError('GW_ERR_INTERNAL', `formatIP: ${bytes.length} bytes`);
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, 16);
  const v4 = Array.from(b.subarray(12)).join('.');
  if (b.subarray(0, 10).every((x) => x === 0)) {
    if (b[10] === 0xff && b[11] === 0xff) return `::ffff:${v4}`; // IPv4-mapped
    if (b[10] === 0 && b[11] === 0 && (b[12] !== 0 || b[13] !== 0)) return `::${v4}`; // IPv4-compatible
  }
  const groups: number[] = [];
  for (let i = 0; i < 8; i++) groups.push(b.readUInt16BE(i * 2));
  // Longest run of at least two zero groups (the first one on a tie) becomes "::".
  let bestAt = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestAt = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (gs: number[]): string => gs.map((g) => g.toString(16)).join(':');
  if (bestAt < 0) return hex(groups);
  return `${hex(groups.slice(0, bestAt))}::${hex(groups.slice(bestAt + bestLen))}`;
}

// ---- builders ----------------------------------------------------------------------------------------------

export interface ProxyHeaderV1Options {
  family: ProxyFamily;
  /** Required for tcp4 / tcp6, ignored for unknown. */
  source?: ProxyAddress;
  destination?: ProxyAddress;
}

export interface ProxyHeaderV2Options {
  /** Default 'PROXY'. LOCAL headers carry no addresses (family must be 'unknown' or omitted). */
  command?: ProxyCommand;
  /** Default 'unknown' (AF_UNSPEC). */
  family?: ProxyFamily;
  source?: ProxyAddress;
  destination?: ProxyAddress;
  /** Written in order after the addresses. */
  tlvs?: readonly ProxyTlv[];
  /** Append a CRC32C TLV and fill it in. */
  crc32c?: boolean;
}

function buildError(reason: string): GatewayError {
  return new GatewayError('GW_ERR_MUX_BAD_PROXY_HEADER', `cannot build PROXY protocol header: ${reason}`, {
    details: { reason },
  });
}

function addressBytes(family: 'tcp4' | 'tcp6', a: ProxyAddress | undefined, which: string): Buffer {
  if (a === undefined) throw buildError(`${family} needs a ${which} address`);
  const bytes = family === 'tcp4' ? parseIPv4(a.address) : parseIPv6(a.address);
  if (bytes === null) throw buildError(`${which} address "${a.address}" is not ${family === 'tcp4' ? 'IPv4' : 'IPv6'}`);
  if (!Number.isInteger(a.port) || a.port < 0 || a.port > 65535) throw buildError(`${which} port ${a.port} is not 0..65535`);
  return bytes;
}

/** "PROXY TCP4 ...\r\n" (addresses in canonical form) or "PROXY UNKNOWN\r\n". */
export function buildProxyHeaderV1(options: ProxyHeaderV1Options): Buffer {
  if (options.family === 'unknown') return Buffer.from('PROXY UNKNOWN\r\n', 'latin1');
  const family = options.family;
  const src = addressBytes(family, options.source, 'source');
  const dst = addressBytes(family, options.destination, 'destination');
  const proto = family === 'tcp4' ? 'TCP4' : 'TCP6';
  const line = `PROXY ${proto} ${formatIP(src)} ${formatIP(dst)} ${options.source!.port} ${options.destination!.port}\r\n`;
  return Buffer.from(line, 'latin1');
}

/** A binary v2 header. Throws GW_ERR_MUX_BAD_PROXY_HEADER for inputs that cannot be encoded. */
export function buildProxyHeaderV2(options: ProxyHeaderV2Options): Buffer {
  const command = options.command ?? 'PROXY';
  const family = options.family ?? 'unknown';
  let famByte = 0x00;
  let addr = Buffer.alloc(0);
  if (command === 'LOCAL') {
    if (family !== 'unknown' || options.source !== undefined || options.destination !== undefined) {
      throw buildError('a LOCAL header carries no addresses');
    }
  } else if (family !== 'unknown') {
    const src = addressBytes(family, options.source, 'source');
    const dst = addressBytes(family, options.destination, 'destination');
    famByte = family === 'tcp4' ? 0x11 : 0x21;
    const ports = Buffer.alloc(4);
    ports.writeUInt16BE(options.source!.port, 0);
    ports.writeUInt16BE(options.destination!.port, 2);
    addr = Buffer.concat([src, dst, ports]);
  }
  const parts: Buffer[] = [addr];
  const tlvs = [...(options.tlvs ?? [])];
  if (options.crc32c === true) {
    if (tlvs.some((t) => t.type === PP2_TYPE.CRC32C)) throw buildError('crc32c requested and a CRC32C TLV given');
    tlvs.push({ type: PP2_TYPE.CRC32C, value: Buffer.alloc(4) });
  }
  for (const tlv of tlvs) {
    if (!Number.isInteger(tlv.type) || tlv.type < 0 || tlv.type > 0xff) throw buildError(`TLV type ${tlv.type}`);
    if (tlv.value.length > 0xffff) throw buildError(`TLV 0x${tlv.type.toString(16)} longer than 65535 bytes`);
    const head = Buffer.alloc(3);
    head[0] = tlv.type;
    head.writeUInt16BE(tlv.value.length, 1);
    parts.push(head, Buffer.from(tlv.value));
  }
  const body = Buffer.concat(parts);
  if (body.length > 0xffff) throw buildError(`addresses and TLVs take ${body.length} bytes, more than 65535`);
  const head = Buffer.alloc(PROXY_V2_HEADER_LENGTH);
  PROXY_V2_SIGNATURE.copy(head, 0);
  head[12] = 0x20 | (command === 'LOCAL' ? 0 : 1);
  head[13] = famByte;
  head.writeUInt16BE(body.length, 14);
  const out = Buffer.concat([head, body]);
  if (options.crc32c === true) {
    const crcAt = out.length - 4;
    out.writeUInt32BE(crc32c(out, crcAt), crcAt);
  }
  return out;
}
