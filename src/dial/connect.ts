/**
 * HTTP CONNECT (RFC 9110 section 9.3.6, RFC 7230 section 5.3.3 authority-form): the request we send and a
 * strict, bounded parser for the proxy's answer. Pure functions, so they get table and property tests.
 */
import { formatHostPort, type HostPort } from '../addr.js';
import { GatewayError } from '../errors.js';

/** The proxy's answer head may not exceed this; squid's is a few hundred bytes. */
export const MAX_CONNECT_RESPONSE_HEAD = 16 * 1024;

export interface ConnectCredentials {
  username: string;
  password?: string;
}

export function buildConnectRequest(target: HostPort, credentials?: ConnectCredentials, userAgent?: string): string {
  const authority = formatHostPort(target.host, target.port);
  const lines = [`CONNECT ${authority} HTTP/1.1`, `Host: ${authority}`];
  if (userAgent) lines.push(`User-Agent: ${userAgent}`);
  if (credentials) {
    const token = Buffer.from(`${credentials.username}:${credentials.password ?? ''}`, 'utf8').toString('base64');
    lines.push(`Proxy-Authorization: Basic ${token}`);
  }
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
