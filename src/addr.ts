/**
 * Host and host:port parsing shared by configuration, proxy selection, NO_PROXY and the CLIs: the one place that
 * says what an address is. Pure functions, no I/O, no DNS; every input is bounded (MAX_ADDR_LENGTH) and read
 * once from left to right.
 *
 * A host is an IPv4 literal (four decimal numbers 0-255, no leading zeros), an IPv6 literal, or a host name as
 * RFC 1123 section 2.1 defines it: labels of letters, digits and "-", 1 to 63 characters, not starting or ending
 * with "-", at most 253 characters in all, and not all-numeric in the last label (a name of that form would be
 * read as an IPv4 address). IPv6 literals with a port are written in brackets ([2001:db8::1]:443); without a port,
 * bare or bracketed. Ports are 1-65535.
 */
import { isIP } from 'node:net';

export interface HostPort {
  /** Lowercased DNS name without trailing dot, or an IP literal (IPv6 without brackets). */
  host: string;
  port: number;
}

export interface ParsedAddr {
  host: string;
  /** undefined when the text carried no port. */
  port: number | undefined;
}

/** Why an address was rejected: a short phrase for error messages, and what to write instead. */
export class AddrError extends Error {
  constructor(
    message: string,
    readonly hint?: string,
  ) {
    super(message);
    this.name = 'AddrError';
  }
}

/** Longest text accepted as an address: a 253-character name with a trailing dot and ":65535", with room to spare. */
export const MAX_ADDR_LENGTH = 300;
export const MAX_NAME_LENGTH = 253;
export const MAX_LABEL_LENGTH = 63;

export interface HostOptions {
  /**
   * Also accept "_" in labels: for names matched as text only (NO_PROXY entries, which must match whatever the
   * cluster is named) and names the gateway puts into the certificates it issues (a machine's host name may
   * carry one); never for an address that is dialled or advertised.
   */
  allowUnderscore?: boolean;
}

const NAME_HINT = 'Host names are labels of letters, digits and "-" (1 to 63 each, not starting or ending with "-") joined by dots, at most 253 characters (RFC 1123).';
const IPV4_HINT = 'An IPv4 address is four numbers from 0 to 255 separated by dots, e.g. 10.0.0.1; a host name cannot be all numbers.';
const PORT_HINT = 'A port is a number from 1 to 65535.';

function shorten(text: string): string {
  return text.length > 40 ? `${text.slice(0, 37)}...` : text;
}

/** Why dotted digits are not an IPv4 address, or undefined when they are one. */
function ipv4Problem(text: string): AddrError | undefined {
  const parts = text.split('.');
  if (parts.length !== 4) {
    return new AddrError(`"${shorten(text)}" is all numbers but has ${parts.length} part${parts.length === 1 ? '' : 's'}, not the four of an IPv4 address`, IPV4_HINT);
  }
  for (const part of parts) {
    if (part === '') return new AddrError(`"${text}" has an empty part, so it is not an IPv4 address`, IPV4_HINT);
    if (part.length > 1 && part.startsWith('0')) return new AddrError(`"${text}" has the number ${part} with a leading zero, which IPv4 addresses do not allow`, IPV4_HINT);
    if (part.length > 3 || Number(part) > 255) return new AddrError(`"${text}" has the number ${shorten(part)}, over 255, so it is not an IPv4 address`, IPV4_HINT);
  }
  return undefined;
}

/** Why text is not a host name, or undefined when it is one. text has no trailing dot. */
export function dnsNameProblem(text: string, options: HostOptions = {}): AddrError | undefined {
  if (text.length === 0) return new AddrError('the host name is empty', NAME_HINT);
  if (text.length > MAX_NAME_LENGTH) return new AddrError(`the host name "${shorten(text)}" has ${text.length} characters, more than ${MAX_NAME_LENGTH}`, NAME_HINT);
  const labels = text.split('.');
  for (const label of labels) {
    if (label === '') return new AddrError(`"${shorten(text)}" has an empty label (two dots in a row, or a leading dot)`, NAME_HINT);
    if (label.length > MAX_LABEL_LENGTH) return new AddrError(`"${shorten(text)}" has a label of ${label.length} characters, more than ${MAX_LABEL_LENGTH}`, NAME_HINT);
    if (label.startsWith('-') || label.endsWith('-')) return new AddrError(`"${shorten(text)}" has the label "${shorten(label)}", which starts or ends with "-"`, NAME_HINT);
    for (const ch of label) {
      const ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch === '-' || (options.allowUnderscore === true && ch === '_');
      if (ok) continue;
      if (ch === '_') return new AddrError(`"${shorten(text)}" contains "_", which host names may not contain`, `${NAME_HINT} Replace "_" with "-".`);
      return new AddrError(`"${shorten(text)}" contains ${JSON.stringify(ch)}, which host names may not contain`, NAME_HINT);
    }
  }
  if (/^\d+$/.test(labels[labels.length - 1]!)) {
    if (/^[\d.]+$/.test(text)) return ipv4Problem(text) ?? new AddrError(`"${text}" is an IPv4 address, not a host name`, NAME_HINT);
    return new AddrError(`"${shorten(text)}" ends in an all-numeric label, which a host name may not`, NAME_HINT);
  }
  return undefined;
}

/** A host name (a trailing dot is allowed). */
export function isDnsName(host: string, options: HostOptions = {}): boolean {
  const h = host.endsWith('.') ? host.slice(0, -1) : host;
  return dnsNameProblem(h, options) === undefined;
}

export function isIpLiteral(host: string): boolean {
  return isIP(host) !== 0;
}

/** Lowercases, drops a trailing dot and IPv6 brackets. */
export function normalizeHost(host: string): string {
  let h = host.trim().toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.') && isIP(h) === 0) h = h.slice(0, -1);
  return h;
}

export function parsePort(text: string): number {
  if (!/^\d{1,5}$/.test(text)) throw new AddrError(`port "${shorten(text)}" is not a number from 1 to 65535`, PORT_HINT);
  const port = Number(text);
  if (port < 1 || port > 65535) throw new AddrError(`port ${port} is outside 1-65535`, PORT_HINT);
  return port;
}

/** An IPv6 literal, with a zone (fe80::1%eth0) only of letters, digits, ".", "_" and "-". */
function isIpv6(text: string): boolean {
  const zone = text.indexOf('%');
  if (zone >= 0 && !/^[A-Za-z0-9._-]{1,64}$/.test(text.slice(zone + 1))) return false;
  return isIP(text) === 6;
}

/**
 * Checks one host (no port, no brackets): an IP literal or a host name. Returns it normalised (lowercase, no
 * trailing dot); throws AddrError saying what is wrong.
 */
export function parseHost(text: string, options: HostOptions = {}): string {
  if (text.length > MAX_ADDR_LENGTH) throw new AddrError(`the host is longer than ${MAX_ADDR_LENGTH} characters`, NAME_HINT);
  if (isIP(text) === 4 || isIpv6(text)) return normalizeHost(text);
  if (text.includes(':')) throw new AddrError(`"${shorten(text)}" is not a valid IPv6 address`, 'Write IPv6 addresses in full or compressed form, e.g. 2001:db8::1.');
  const name = text.endsWith('.') ? text.slice(0, -1) : text;
  const problem = /^[\d.]+$/.test(name) ? ipv4Problem(name) : dnsNameProblem(name, options);
  if (problem) throw problem;
  return normalizeHost(name);
}

/**
 * Splits "host", "host:port", "[v6]", "[v6]:port" or a bare IPv6 literal. The host must be an IP literal or a
 * host name. With allowEmptyHost, ":port" gives host "" (listen on every interface). With allowPortZero,
 * ":0" asks the OS for a free port (listeners in tests).
 */
export function parseAddr(
  text: string,
  options: { allowEmptyHost?: boolean; allowPortZero?: boolean } = {},
): ParsedAddr {
  if (text.length > MAX_ADDR_LENGTH) throw new AddrError(`the address is longer than ${MAX_ADDR_LENGTH} characters`, NAME_HINT);
  const raw = text.trim();
  if (raw === '') throw new AddrError('address is empty');
  if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(raw)) throw urlGiven(raw);
  let hostPart: string;
  let portPart: string | undefined;
  if (raw.startsWith('[')) {
    const close = raw.indexOf(']');
    if (close < 0) throw new AddrError(`"${shorten(raw)}" opens "[" without closing it`);
    hostPart = raw.slice(1, close);
    const rest = raw.slice(close + 1);
    if (rest !== '') {
      if (!rest.startsWith(':')) throw new AddrError(`unexpected "${shorten(rest)}" after "]" in "${shorten(raw)}"`);
      portPart = rest.slice(1);
    }
    if (!isIpv6(hostPart)) throw new AddrError(`"${shorten(hostPart)}" in brackets is not an IPv6 address`, 'Only IPv6 addresses go in brackets: [2001:db8::1]:443.');
  } else if (isIpv6(raw)) {
    hostPart = raw;
  } else {
    const colons = raw.split(':').length - 1;
    if (colons > 1) {
      throw new AddrError(`"${shorten(raw)}" is not an IPv6 address, and an IPv6 address with a port goes in brackets`, 'Write IPv6 addresses with a port as [2001:db8::1]:443.');
    }
    const idx = raw.lastIndexOf(':');
    if (idx >= 0) {
      hostPart = raw.slice(0, idx);
      portPart = raw.slice(idx + 1);
    } else {
      hostPart = raw;
    }
  }
  let port: number | undefined;
  if (portPart !== undefined) {
    if (options.allowPortZero && portPart === '0') port = 0;
    else port = parsePort(portPart);
  }
  if (hostPart === '') {
    if (!options.allowEmptyHost) throw new AddrError(`"${shorten(raw)}" has no host`);
    return { host: '', port };
  }
  return { host: parseHost(hostPart), port };
}

/** Default ports of the schemes a URL given for an address usually has. */
const SCHEME_PORTS: Record<string, number> = { https: 443, http: 80 };

/**
 * A URL where host:port belongs ("https://gw.example.com"): what to write instead, its host and port (the scheme's
 * default port when it has none). The colon of the scheme would otherwise be read as a port, or as IPv6.
 */
function urlGiven(raw: string): AddrError {
  const scheme = raw.slice(0, raw.indexOf(':')).toLowerCase();
  const authority = urlAuthority(raw) ?? '';
  const hasPort = /:\d+$/.test(authority) && !/^\[[^\]]*\]$/.test(authority);
  const defaultPort = SCHEME_PORTS[scheme];
  const instead = authority === '' ? '' : hasPort || defaultPort === undefined ? authority : `${authority}:${defaultPort}`;
  return new AddrError(
    `a URL (${scheme}://...) where host:port is expected`,
    `Drop the scheme: write host:port${instead && instead.length <= MAX_ADDR_LENGTH ? `, here ${instead}` : ', e.g. gateway.example.com:443'}.`,
  );
}

/**
 * The host[:port] of a scheme://[userinfo@]host[:port][/...] URL exactly as written, or undefined when text is not
 * of that form. For checking the host with parseAddr: URL() reads "1.2.3" as 1.2.0.3 and keeps "_".
 */
export function urlAuthority(text: string): string | undefined {
  if (text.length > 8 * 1024) return undefined;
  return /^[A-Za-z][A-Za-z0-9+.-]*:\/\/(?:[^@/?#]*@)?([^/?#]*)/.exec(text.trim())?.[1];
}

/** "host:port", with brackets around IPv6 literals. */
export function formatHostPort(host: string, port: number): string {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

/** localhost, *.localhost, 127.0.0.0/8, ::1 and IPv4-mapped loopback: never proxied, never advertised. */
export function isLoopbackHost(host: string): boolean {
  const h = normalizeHost(host);
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  const family = isIP(h);
  if (family === 4) return h.startsWith('127.');
  if (family === 6) {
    if (h === '::1' || /^0{0,4}(:0{0,4}){6}:0{0,3}1$/.test(h)) return true;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
    return mapped !== null && mapped[1]!.startsWith('127.');
  }
  return false;
}
