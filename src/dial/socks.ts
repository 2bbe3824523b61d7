/**
 * SOCKS5 (RFC 1928) with username/password authentication (RFC 1929), client side: the requests we send and a
 * strict, bounded, incremental parser for each of the server's answers. Pure functions, like connect.ts for
 * HTTP CONNECT; the Dialer drives them over the socket under one deadline (dialer.ts, socksHandshake).
 *
 * Written here rather than taken from the `socks` package (2.8.11), which the Dialer tried first: it hands the
 * bytes a server sends right after its reply (an SSH banner in the same packet) to the socket with a synthetic
 * 'data' event after a setImmediate, so a caller that starts reading a tick later loses them; it accepts a reply
 * with an unknown address type as a success (and then passes the reply's bytes on as tunnel data); and it
 * buffers whatever the server sends during the handshake without a bound. Each of those is a test in
 * test/dial/socks-lying.test.ts.
 *
 * Bounds: every answer is complete or refused by its 262nd byte (a domain-name reply: 4 + 1 + 255 + 2), so a
 * parser never holds more than one read's worth of bytes; bytes after the reply belong to the tunnel.
 * SOCKS4 and SOCKS4a are not offered: they carry no password, and select.ts refuses socks4:// with a hint.
 */
import net from 'node:net';
import { GatewayError, type ErrorCode } from '../errors.js';

export const SOCKS_VERSION = 5;
const AUTH_VERSION = 1;
const METHOD_NONE = 0x00;
const METHOD_USERPASS = 0x02;
const NO_ACCEPTABLE = 0xff;

/** The longest reply: VER REP RSV ATYP, a domain name of up to 255 bytes with its length byte, and the port. */
export const MAX_SOCKS_REPLY = 4 + 1 + 255 + 2;

export interface SocksCredentials {
  username: string;
  password: string;
}

/** RFC 1928 section 6, the reply field. */
export const SOCKS_REPLY_NAMES: Readonly<Record<number, string>> = {
  1: 'general SOCKS server failure',
  2: 'connection not allowed by ruleset',
  3: 'network unreachable',
  4: 'host unreachable',
  5: 'connection refused',
  6: 'TTL expired',
  7: 'command not supported',
  8: 'address type not supported',
};

function fail(code: ErrorCode, why: string, details: Record<string, unknown> = {}): GatewayError {
  return new GatewayError(code, why, { details });
}

/** The method selection message: no authentication, plus username/password when we have credentials. */
export function buildGreeting(withCredentials: boolean): Buffer {
  return Buffer.from(withCredentials ? [SOCKS_VERSION, 2, METHOD_NONE, METHOD_USERPASS] : [SOCKS_VERSION, 1, METHOD_NONE]);
}

/** RFC 1929's request. The lengths were checked when the proxy URL was parsed (select.ts): 1-255 and 0-255 bytes. */
export function buildUserPass(creds: SocksCredentials): Buffer {
  const user = Buffer.from(creds.username, 'utf8');
  const pass = Buffer.from(creds.password, 'utf8');
  if (user.length < 1 || user.length > 255 || pass.length > 255) throw new RangeError('SOCKS5 user name or password length out of range');
  return Buffer.concat([Buffer.from([AUTH_VERSION, user.length]), user, Buffer.from([pass.length]), pass]);
}

/** CONNECT to an IPv4 or IPv6 literal (ATYP 1 / 4), or to a name the proxy resolves (ATYP 3). */
export function buildSocksConnect(host: string, port: number): Buffer {
  const head = [SOCKS_VERSION, 1, 0];
  let addr: Buffer;
  if (net.isIPv4(host)) addr = Buffer.from([1, ...host.split('.').map(Number)]);
  else if (net.isIPv6(host)) addr = Buffer.concat([Buffer.from([4]), ipv6Bytes(host)]);
  else {
    const name = Buffer.from(host, 'ascii');
    if (name.length < 1 || name.length > 255) throw new RangeError('SOCKS5 host name length out of range');
    addr = Buffer.concat([Buffer.from([3, name.length]), name]);
  }
  const portBytes = Buffer.from([port >> 8, port & 0xff]);
  return Buffer.concat([Buffer.from(head), addr, portBytes]);
}

/** The 16 bytes of an IPv6 literal (net.isIPv6 has accepted it), an embedded IPv4 tail included. */
function ipv6Bytes(host: string): Buffer {
  let text = host;
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (v4) {
    const [a, b, c, d] = v4.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, v4.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [left = '', right] = text.split('::');
  const l = left === '' ? [] : left.split(':');
  const r = right === undefined || right === '' ? [] : right.split(':');
  const words = right === undefined ? l : [...l, ...new Array<string>(8 - l.length - r.length).fill('0'), ...r];
  const out = Buffer.alloc(16);
  words.forEach((w, i) => out.writeUInt16BE(parseInt(w, 16), i * 2));
  return out;
}

export type SocksParse<T> = { complete: false } | ({ complete: true; length: number } & T);

function checkVersion(buf: Buffer, want: number, what: string, also: number[] = []): void {
  if (buf.length === 0 || buf[0] === want || also.includes(buf[0]!)) return;
  // "H": the first byte of "HTTP/1.1 400 ...", what an HTTP proxy answers to bytes it cannot parse.
  const http = buf[0] === 0x48;
  throw fail(
    'GW_ERR_DIAL_SOCKS_MALFORMED',
    `the ${what} has version ${buf[0]}, not ${want}${http ? ' (it looks like an HTTP answer: is this an HTTP proxy? then use http://)' : ''}`,
    { version: buf[0] },
  );
}

/** The server's choice of method. Throws for another version, "no acceptable method", or a method not offered. */
export function parseMethodChoice(buf: Buffer, offeredCredentials: boolean): SocksParse<{ method: 'none' | 'userpass' }> {
  checkVersion(buf, SOCKS_VERSION, 'method choice');
  if (buf.length < 2) return { complete: false };
  const method = buf[1]!;
  if (method === METHOD_NONE) return { complete: true, length: 2, method: 'none' };
  if (method === METHOD_USERPASS && offeredCredentials) return { complete: true, length: 2, method: 'userpass' };
  if (method === NO_ACCEPTABLE) {
    throw offeredCredentials
      ? fail('GW_ERR_DIAL_SOCKS_AUTH_REFUSED', 'the SOCKS server accepts neither no authentication nor username/password (it may want GSSAPI)', { method })
      : fail('GW_ERR_DIAL_SOCKS_AUTH_REQUIRED', 'the SOCKS server requires authentication and the proxy URL has no user name', { method });
  }
  throw fail('GW_ERR_DIAL_SOCKS_MALFORMED', `the SOCKS server chose method 0x${method.toString(16).padStart(2, '0')}, which was not offered`, { method });
}

/**
 * RFC 1929's answer. Version 1 is the RFC's; 5 is accepted too, since servers that echo the SOCKS version there
 * exist and the status byte is what matters.
 */
export function parseAuthReply(buf: Buffer, username: string): SocksParse<object> {
  checkVersion(buf, AUTH_VERSION, 'username/password answer', [SOCKS_VERSION]);
  if (buf.length < 2) return { complete: false };
  if (buf[1] !== 0) throw fail('GW_ERR_DIAL_SOCKS_AUTH_REFUSED', `the SOCKS server refused the credentials of user "${username}" (status ${buf[1]})`, { status: buf[1] });
  return { complete: true, length: 2 };
}

/** The reply to CONNECT: refused as soon as its reply code is known, complete once the bound address is in. */
export function parseConnectReply(buf: Buffer): SocksParse<{ bound: string }> {
  checkVersion(buf, SOCKS_VERSION, 'reply');
  if (buf.length < 2) return { complete: false };
  const rep = buf[1]!;
  if (rep !== 0) {
    const name = SOCKS_REPLY_NAMES[rep] ?? `unassigned reply code ${rep}`;
    throw fail('GW_ERR_DIAL_SOCKS_REFUSED', `the SOCKS server refused the connection: ${name} (reply ${rep})`, { reply: rep });
  }
  if (buf.length < 5) return { complete: false };
  const atyp = buf[3]!;
  let length: number;
  if (atyp === 1) length = 4 + 4 + 2;
  else if (atyp === 4) length = 4 + 16 + 2;
  else if (atyp === 3) {
    if (buf[4] === 0) throw fail('GW_ERR_DIAL_SOCKS_MALFORMED', 'the reply names a bound address of length 0', { atyp });
    length = 4 + 1 + buf[4]! + 2;
  } else throw fail('GW_ERR_DIAL_SOCKS_MALFORMED', `the reply has address type ${atyp}, which is none of 1 (IPv4), 3 (name), 4 (IPv6)`, { atyp });
  if (buf.length < length) return { complete: false };
  const port = buf.readUInt16BE(length - 2);
  const v6 = () => `[${Array.from({ length: 8 }, (_, i) => buf.readUInt16BE(4 + i * 2).toString(16)).join(':')}]`;
  const bound = atyp === 1 ? buf.subarray(4, 8).join('.') : atyp === 3 ? buf.subarray(5, length - 2).toString('latin1') : v6();
  return { complete: true, length, bound: `${bound}:${port}` };
}
