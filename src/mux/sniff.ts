/**
 * First-byte protocol detection on the Proxy's shared port (see "Wire identifiers" in the architecture notes).
 * Pure: the multiplexer calls sniffProtocol with every byte received so far (from the start of the connection)
 * until the answer is no longer 'need-more'; the bytes are then handed, unconsumed, to the matching handler.
 *
 * The answer is decided as early as possible: 'need-more' only while what has arrived is a strict prefix of
 * one of the patterns below, so one byte is enough to say 'unknown' for most garbage (and an empty buffer is
 * 'need-more'). No pattern is a prefix of another, so the first complete match is the only one.
 *
 *   tls       0x16 (handshake record) then a record version 0x03 0x00..0x04
 *   ssh       "SSH-"
 *   http      a method followed by one space: GET HEAD POST PUT DELETE OPTIONS PATCH CONNECT TRACE
 *   proxy-v1  "PROXY "
 *   proxy-v2  the 12-byte signature \r\n\r\n\0\r\nQUIT\n
 *   gwdata    "GWDATA1 ": an agent's data connection for end-to-end streams (src/tunnel/e2e.ts)
 *   gwe2e     "GWE2E1 ": a client's end-to-end stream, its grant line ahead of its TLS (src/tunnel/e2e.ts)
 *
 * Matching is case-sensitive (methods and the PROXY keyword are upper case on the wire).
 */

export type SniffedKind = 'tls' | 'ssh' | 'http' | 'proxy-v1' | 'proxy-v2' | 'gwdata' | 'gwe2e';

export type SniffResult = { kind: 'need-more' } | { kind: SniffedKind } | { kind: 'unknown' };

import { DATA_MAGIC, E2E_MAGIC } from '../wire/protocols.js';

/** The PROXY protocol v2 signature. */
export const PROXY_V2_SIGNATURE: Buffer = Buffer.from([
  0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a,
]);

/** HTTP methods recognised by the sniffer (each must be followed by a space). */
export const HTTP_METHODS: readonly string[] = Object.freeze([
  'GET',
  'HEAD',
  'POST',
  'PUT',
  'DELETE',
  'OPTIONS',
  'PATCH',
  'CONNECT',
  'TRACE',
]);

/** A pattern is a sequence of byte predicates; the buffer matches when every position agrees. */
type Pattern = { kind: SniffedKind; bytes: ReadonlyArray<(b: number) => boolean> };

function literal(kind: SniffedKind, bytes: Uint8Array | string): Pattern {
  const raw = typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes;
  return { kind, bytes: [...raw].map((expected) => (b: number) => b === expected) };
}

const PATTERNS: readonly Pattern[] = [
  { kind: 'tls', bytes: [(b) => b === 0x16, (b) => b === 0x03, (b) => b <= 0x04] },
  literal('ssh', 'SSH-'),
  ...HTTP_METHODS.map((m) => literal('http', `${m} `)),
  literal('proxy-v1', 'PROXY '),
  literal('proxy-v2', PROXY_V2_SIGNATURE),
  literal('gwdata', DATA_MAGIC),
  literal('gwe2e', E2E_MAGIC),
];

/** The longest pattern: once this many bytes are in, the answer is never 'need-more'. */
export const SNIFF_MAX_BYTES: number = Math.max(...PATTERNS.map((p) => p.bytes.length));

/**
 * Classifies the first bytes of a connection. Reads at most SNIFF_MAX_BYTES bytes of `buf`; never throws.
 */
export function sniffProtocol(buf: Buffer): SniffResult {
  let couldStillMatch = false;
  for (const pattern of PATTERNS) {
    const n = Math.min(buf.length, pattern.bytes.length);
    let ok = true;
    for (let i = 0; i < n; i++) {
      if (!pattern.bytes[i]!(buf[i]!)) {
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    if (n === pattern.bytes.length) return { kind: pattern.kind };
    couldStillMatch = true;
  }
  return couldStillMatch ? { kind: 'need-more' } : { kind: 'unknown' };
}
