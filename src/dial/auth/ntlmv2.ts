/**
 * NTLM's messages, NTLMv2 only: the three messages of MS-NLMP's connection-oriented handshake as pure functions
 * (no I/O, no clock or randomness of their own unless not given). The scheme that sends them in answer to a 407
 * is ntlm.ts; the spec sections they follow are cited in docs/dialing.md.
 *
 *   encodeNegotiate()        Type 1: the flags this client asks for, no domain or workstation (they would tell
 *                            an unauthenticated proxy who is asking, and NTLMv2 does not need them).
 *   parseChallenge(bytes)    Type 2: bounded (MAX_CHALLENGE_BYTES in all; every field inside the message; the
 *                            target info a well-formed AV pair list ending in MsvAvEOL, at most MAX_AV_PAIRS),
 *                            anything else a GatewayError GW_ERR_DIAL_PROXY_NTLM_CHALLENGE and nothing answered.
 *   encodeAuthenticate(...)  Type 3 with the NTLMv2 response: NTProofStr = HMAC-MD5(NTOWFv2, server challenge ||
 *                            blob), the blob carrying the time (the server's MsvAvTimestamp when it sent one), an
 *                            8-byte client challenge and the server's own target info.
 *
 * Decisions:
 * - Only NTLMv2 is ever sent. No LM or NTLMv1 response, whatever flags the proxy sets: a proxy offering only the
 *   weaker forms gets no answer computed from the password (the LmChallengeResponse is LMv2, or Z(24) when the
 *   server sent a timestamp, as the spec says). There is no session security (no signing or sealing, no key
 *   exchange): the proxy only authenticates the connection, and the tunnel inside has its own TLS.
 * - No MIC (the spec's SHOULD when a timestamp is present): squid's helpers (Samba's ntlm_auth) accept without
 *   it, as they do for curl, which sends none either.
 * - Written here rather than taken from npm: the maintained-looking packages (httpntlm, axios-ntlm,
 *   @node-ntlm/core) carry LM and NTLMv1 code (des.js) this client must never use, are tied to an HTTP client,
 *   and parse the challenge without the bounds above; the encoding is small and is tested against the spec's
 *   test vectors and a real NTLM backend (Samba behind squid).
 * - MD4 comes from md4.ts (Node's OpenSSL 3 has it only in the legacy provider; see there).
 * - Strings are UTF-16LE when the proxy sets NEGOTIATE_UNICODE (every current one does), else Latin-1 (OEM).
 */
import { createHmac, randomBytes } from 'node:crypto';
import { GatewayError } from '../../errors.js';
import { md4 } from './md4.js';

const SIGNATURE = Buffer.from('NTLMSSP\0', 'latin1');
export const MAX_CHALLENGE_BYTES = 4096;
export const MAX_AV_PAIRS = 64;
/** User, domain and password each: far above Windows' own limits (256 characters for a password). */
const MAX_CREDENTIAL_LENGTH = 512;

export const NTLM_FLAGS = Object.freeze({
  UNICODE: 0x00000001,
  OEM: 0x00000002,
  REQUEST_TARGET: 0x00000004,
  NTLM: 0x00000200,
  ALWAYS_SIGN: 0x00008000,
  EXTENDED_SESSIONSECURITY: 0x00080000,
  TARGET_INFO: 0x00800000,
  VERSION: 0x02000000,
  N128: 0x20000000,
  N56: 0x80000000,
});

/** What the client asks for in Type 1 (and keeps, of what the server grants, in Type 3). */
const CLIENT_FLAGS =
  NTLM_FLAGS.UNICODE | NTLM_FLAGS.OEM | NTLM_FLAGS.REQUEST_TARGET | NTLM_FLAGS.NTLM | NTLM_FLAGS.ALWAYS_SIGN |
  NTLM_FLAGS.EXTENDED_SESSIONSECURITY | NTLM_FLAGS.N128 | NTLM_FLAGS.N56;

const AV_EOL = 0;
const AV_TIMESTAMP = 7;

export interface NtlmChallenge {
  flags: number;
  /** The 8-byte server challenge. */
  serverChallenge: Buffer;
  /** The raw target info (AV pairs, MsvAvEOL included), or an empty buffer when the proxy sent none. */
  targetInfo: Buffer;
  /** MsvAvTimestamp (a FILETIME: 100 ns units since 1601), when the proxy sent one. */
  timestamp?: Buffer;
  /** The target name, decoded (informative: who challenged). */
  targetName: string;
}

export interface NtlmCredentials {
  user: string;
  domain: string;
  password: string;
}

function bad(what: string): GatewayError {
  return new GatewayError('GW_ERR_DIAL_PROXY_NTLM_CHALLENGE', `the proxy's NTLM challenge is not valid: ${what}`);
}

/** Type 1 (NEGOTIATE_MESSAGE): 32 bytes, empty domain and workstation fields. */
export function encodeNegotiate(): Buffer {
  const msg = Buffer.alloc(32);
  SIGNATURE.copy(msg, 0);
  msg.writeUInt32LE(1, 8);
  msg.writeUInt32LE(CLIENT_FLAGS >>> 0, 12);
  msg.writeUInt32LE(32, 20); // domain: length 0 at the end of the message
  msg.writeUInt32LE(32, 28); // workstation: the same
  return msg;
}

/** A (length, maxLength, offset) field of a message, checked to lie inside it. */
function field(msg: Buffer, at: number, name: string): Buffer {
  const length = msg.readUInt16LE(at);
  const offset = msg.readUInt32LE(at + 4);
  if (length === 0) return Buffer.alloc(0);
  if (offset > msg.length || length > msg.length - offset) throw bad(`the ${name} field (${length} bytes at ${offset}) lies outside the ${msg.length}-byte message`);
  return msg.subarray(offset, offset + length);
}

/** The AV pair list: well formed, ending with MsvAvEOL, at most MAX_AV_PAIRS; returns the timestamp if any. */
function parseTargetInfo(info: Buffer): Buffer | undefined {
  let timestamp: Buffer | undefined;
  for (let at = 0, pairs = 0; ; pairs++) {
    if (pairs >= MAX_AV_PAIRS) throw bad(`more than ${MAX_AV_PAIRS} target info entries`);
    if (info.length - at < 4) throw bad('the target info does not end with MsvAvEOL');
    const id = info.readUInt16LE(at);
    const length = info.readUInt16LE(at + 2);
    if (length > info.length - at - 4) throw bad(`target info entry ${id} runs past the end of the list`);
    if (id === AV_EOL) {
      if (length !== 0 || at + 4 !== info.length) throw bad('bytes after the target info list ends (MsvAvEOL)');
      return timestamp;
    }
    if (id === AV_TIMESTAMP) {
      if (length !== 8) throw bad(`a timestamp of ${length} bytes (8 expected)`);
      timestamp = Buffer.from(info.subarray(at + 4, at + 12));
    }
    at += 4 + length;
  }
}

/** Type 2 (CHALLENGE_MESSAGE), bounded: see the module doc. */
export function parseChallenge(msg: Buffer): NtlmChallenge {
  if (msg.length > MAX_CHALLENGE_BYTES) throw bad(`${msg.length} bytes (at most ${MAX_CHALLENGE_BYTES})`);
  if (msg.length < 32) throw bad(`${msg.length} bytes, shorter than its fixed part`);
  if (!msg.subarray(0, 8).equals(SIGNATURE)) throw bad('no NTLMSSP signature');
  const type = msg.readUInt32LE(8);
  if (type !== 2) throw bad(`message type ${type} (2 expected)`);
  const flags = msg.readUInt32LE(20);
  const targetName = field(msg, 12, 'target name');
  let targetInfo = Buffer.alloc(0);
  let timestamp: Buffer | undefined;
  if (flags & NTLM_FLAGS.TARGET_INFO) {
    if (msg.length < 48) throw bad('the target info flag is set but the message has no target info field');
    targetInfo = Buffer.from(field(msg, 40, 'target info'));
    if (targetInfo.length > 0) timestamp = parseTargetInfo(targetInfo);
  }
  return {
    flags,
    serverChallenge: Buffer.from(msg.subarray(24, 32)),
    targetInfo,
    ...(timestamp ? { timestamp } : {}),
    targetName: (flags & NTLM_FLAGS.UNICODE ? targetName.toString('utf16le') : targetName.toString('latin1')),
  };
}

const hmacMd5 = (key: Buffer, ...data: Buffer[]): Buffer => {
  const h = createHmac('md5', key);
  for (const d of data) h.update(d);
  return h.digest();
};

/** NTOWFv2 (MS-NLMP 3.3.2): HMAC-MD5(MD4(UTF-16LE(password)), UTF-16LE(UPPER(user) || domain)). */
export function ntowfv2(c: NtlmCredentials): Buffer {
  return hmacMd5(md4(Buffer.from(c.password, 'utf16le')), Buffer.from(c.user.toUpperCase() + c.domain, 'utf16le'));
}

export interface Ntlmv2Responses {
  /** NtChallengeResponse: NTProofStr || blob. */
  nt: Buffer;
  /** LmChallengeResponse: LMv2, or Z(24) when the server sent a timestamp. */
  lm: Buffer;
  /** The NTProofStr (the first 16 bytes of nt). */
  ntProofStr: Buffer;
  /** SessionBaseKey = HMAC-MD5(NTOWFv2, NTProofStr) (not used: no session security; for the spec's test vector). */
  sessionBaseKey: Buffer;
}

/** The NTLMv2 responses (MS-NLMP 3.3.2) for a challenge, a FILETIME and an 8-byte client challenge. */
export function ntlmv2Responses(c: NtlmCredentials, ch: NtlmChallenge, time: Buffer, clientChallenge: Buffer): Ntlmv2Responses {
  const key = ntowfv2(c);
  const blob = Buffer.concat([Buffer.from([1, 1, 0, 0, 0, 0, 0, 0]), time, clientChallenge, Buffer.alloc(4), ch.targetInfo, Buffer.alloc(4)]);
  const ntProofStr = hmacMd5(key, ch.serverChallenge, blob);
  const lm = ch.timestamp ? Buffer.alloc(24) : Buffer.concat([hmacMd5(key, ch.serverChallenge, clientChallenge), clientChallenge]);
  return { nt: Buffer.concat([ntProofStr, blob]), lm, ntProofStr, sessionBaseKey: hmacMd5(key, ntProofStr) };
}

/** Now as a FILETIME (100 ns units since 1601-01-01), little-endian. */
export function fileTimeNow(nowMs = Date.now()): Buffer {
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE((BigInt(nowMs) + 11_644_473_600_000n) * 10_000n);
  return out;
}

export interface AuthenticateOptions {
  /** FILETIME used when the server sent no timestamp. Default: now. */
  time?: Buffer;
  /** The 8-byte client challenge. Default: random. */
  clientChallenge?: Buffer;
  /** Workstation name. Default: empty. */
  workstation?: string;
}

/** Type 3 (AUTHENTICATE_MESSAGE) with NTLMv2 responses, no MIC, no session key: see the module doc. */
export function encodeAuthenticate(ch: NtlmChallenge, c: NtlmCredentials, o: AuthenticateOptions = {}): Buffer {
  const time = ch.timestamp ?? o.time ?? fileTimeNow();
  const { nt, lm } = ntlmv2Responses(c, ch, time, o.clientChallenge ?? randomBytes(8));
  const unicode = (ch.flags & NTLM_FLAGS.UNICODE) !== 0;
  const text = (s: string) => Buffer.from(s, unicode ? 'utf16le' : 'latin1');
  const fields = [lm, nt, text(c.domain), text(c.user), text(o.workstation ?? ''), Buffer.alloc(0)];
  const flags = ((ch.flags & CLIENT_FLAGS) | NTLM_FLAGS.NTLM) & ~(unicode ? NTLM_FLAGS.OEM : NTLM_FLAGS.UNICODE);
  const header = Buffer.alloc(64);
  SIGNATURE.copy(header, 0);
  header.writeUInt32LE(3, 8);
  let offset = 64;
  fields.forEach((f, i) => {
    header.writeUInt16LE(f.length, 12 + i * 8);
    header.writeUInt16LE(f.length, 14 + i * 8);
    header.writeUInt32LE(offset, 16 + i * 8);
    offset += f.length;
  });
  header.writeUInt32LE(flags >>> 0, 60);
  return Buffer.concat([header, ...fields]);
}

/**
 * The credentials of a proxy URL's user part, already percent-decoded: "DOMAIN\user" (the URL's %5C), or a bare
 * user (the domain is then the proxy's to choose: Samba and Windows take their own).
 */
export function ntlmCredentials(user: string, password: string): NtlmCredentials {
  const slash = user.indexOf('\\');
  const c = slash < 0 ? { user, domain: '', password } : { user: user.slice(slash + 1), domain: user.slice(0, slash), password };
  if (c.user === '') throw new GatewayError('GW_ERR_DIAL_PROXY_NTLM_CREDENTIALS', 'the proxy URL has no NTLM user name');
  if ([c.user, c.domain, c.password].some((s) => s.length > MAX_CREDENTIAL_LENGTH)) {
    throw new GatewayError('GW_ERR_DIAL_PROXY_NTLM_CREDENTIALS', `an NTLM user name, domain or password is longer than ${MAX_CREDENTIAL_LENGTH} characters`);
  }
  return c;
}
