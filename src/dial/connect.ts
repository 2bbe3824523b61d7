/**
 * HTTP CONNECT (RFC 9110 section 9.3.6, RFC 7230 section 5.3.3 authority-form): the request we send, a
 * strict, bounded parser for the proxy's answer, and whether a refusal's connection can carry the next request
 * (the authentication handshake answers a 407 on the same connection when it can). Pure functions, so they get
 * table and property tests.
 */
import { formatHostPort, type HostPort } from '../addr.js';
import { GatewayError } from '../errors.js';

/** The proxy's answer head may not exceed this; squid's is a few hundred bytes. */
export const MAX_CONNECT_RESPONSE_HEAD = 16 * 1024;

/** The request head; `authorization` is a whole Proxy-Authorization value (src/dial/auth/ makes them). */
export function buildConnectRequest(target: HostPort, authorization?: string, userAgent?: string): string {
  const authority = formatHostPort(target.host, target.port);
  const lines = [`CONNECT ${authority} HTTP/1.1`, `Host: ${authority}`];
  if (userAgent) lines.push(`User-Agent: ${userAgent}`);
  if (authorization !== undefined) lines.push(`Proxy-Authorization: ${authorization}`);
  return `${lines.join('\r\n')}\r\n\r\n`;
}

export interface ConnectResponse {
  httpVersion: string;
  statusCode: number;
  reason: string;
  /** Header names lowercased, in order. */
  headers: Array<[string, string]>;
  /** Length of the head including its blank line; bytes after it belong to the tunnel. */
  headLength: number;
}

export type ConnectParse = { complete: false } | ({ complete: true } & ConnectResponse);

const STATUS_LINE = /^HTTP\/(\d)\.(\d) ([1-9]\d\d)(?: ([^\r\n]*))?$/;
const HEADER_LINE = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*(.*?)[ \t]*$/;
const PREFIX = Buffer.from('HTTP/', 'latin1');

function malformed(why: string): GatewayError {
  return new GatewayError('GW_ERR_DIAL_PROXY_MALFORMED', why);
}

/** Finds the end of the head: CRLF CRLF (or, leniently, LF LF). Returns the index after it, or -1. */
function headEnd(buf: Buffer): number {
  const crlf = buf.indexOf('\r\n\r\n', 0, 'latin1');
  const lf = buf.indexOf('\n\n', 0, 'latin1');
  if (crlf < 0 && lf < 0) return -1;
  if (crlf < 0) return lf + 2;
  if (lf < 0) return crlf + 4;
  return Math.min(crlf + 4, lf + 2);
}

/**
 * Parses the start of what the proxy sent. { complete: false } means "need more bytes"; a GatewayError with
 * GW_ERR_DIAL_PROXY_MALFORMED means no amount of further bytes can make it a valid answer.
 */
export function parseConnectResponse(buf: Buffer, maxHead = MAX_CONNECT_RESPONSE_HEAD): ConnectParse {
  const prefixLen = Math.min(buf.length, PREFIX.length);
  if (buf.subarray(0, prefixLen).compare(PREFIX, 0, prefixLen) !== 0) {
    throw malformed(`the answer does not start with "HTTP/" (first bytes: ${JSON.stringify(buf.subarray(0, 16).toString('latin1'))})`);
  }
  const end = headEnd(buf);
  if (end < 0) {
    if (buf.length > maxHead) throw malformed(`the answer's head is longer than ${maxHead} bytes`);
    return { complete: false };
  }
  if (end > maxHead) throw malformed(`the answer's head is longer than ${maxHead} bytes`);
  const lines = buf.subarray(0, end).toString('latin1').split(/\r?\n/);
  // The split leaves two empty strings for the blank line that ends the head.
  lines.length -= 2;
  const status = STATUS_LINE.exec(lines[0] ?? '');
  if (!status) throw malformed(`bad status line ${JSON.stringify(lines[0]?.slice(0, 80))}`);
  const headers: Array<[string, string]> = [];
  for (const line of lines.slice(1)) {
    const m = HEADER_LINE.exec(line);
    if (!m) throw malformed(`bad header line ${JSON.stringify(line.slice(0, 80))}`);
    headers.push([m[1]!.toLowerCase(), m[2]!]);
  }
  return {
    complete: true,
    httpVersion: `${status[1]}.${status[2]}`,
    statusCode: Number(status[3]),
    reason: status[4] ?? '',
    headers,
    headLength: end,
  };
}

export function headerValue(res: ConnectResponse, name: string): string | undefined {
  return res.headers.find(([n]) => n === name)?.[1];
}

/** A 407's body is read and dropped so the connection can carry the answer, up to this size; larger: re-dial. */
export const MAX_REFUSAL_BODY = 64 * 1024;

/**
 * Whether the connection that brought this non-2xx answer can carry another request, and how many body bytes
 * follow the head (RFC 9112 sections 6.3 and 9.3): not after Connection: close, nor from HTTP/1.0 without
 * keep-alive, nor when the body's end is the connection's end (no Content-Length) or chunked (not parsed here),
 * nor for a body over MAX_REFUSAL_BODY.
 */
export function refusalFraming(res: ConnectResponse): { reusable: boolean; bodyLength: number } {
  const connection = res.headers
    .filter(([n]) => n === 'connection' || n === 'proxy-connection')
    .flatMap(([, v]) => v.toLowerCase().split(',').map((t) => t.trim()));
  const closes = connection.includes('close') || (res.httpVersion === '1.0' && !connection.includes('keep-alive'));
  const lengths = res.headers.filter(([n]) => n === 'content-length').map(([, v]) => v.trim());
  const chunked = res.headers.some(([n]) => n === 'transfer-encoding');
  const length = lengths.length > 0 && lengths.every((v) => v === lengths[0] && /^\d{1,9}$/.test(v)) ? Number(lengths[0]) : undefined;
  if (closes || chunked || length === undefined || length > MAX_REFUSAL_BODY) return { reusable: false, bodyLength: 0 };
  return { reusable: true, bodyLength: length };
}
