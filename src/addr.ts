/**
 * Host and host:port parsing shared by configuration, proxy selection and the CLIs. Pure functions, no I/O.
 * IPv6 literals with a port are written in brackets ([2001:db8::1]:443); without a port, bare or bracketed.
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

/** Why an address was rejected, as a short phrase for error messages. */
export class AddrError extends Error {}

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/;

/** A DNS name: labels of letters, digits, '-' and '_' (seen in service records), at most 253 characters. */
export function isDnsName(host: string): boolean {
  const h = host.endsWith('.') ? host.slice(0, -1) : host;
  if (h.length === 0 || h.length > 253) return false;
  return h.toLowerCase().split('.').every((label) => LABEL.test(label));
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
  if (!/^\d{1,5}$/.test(text)) throw new AddrError(`port "${text}" is not a number from 1 to 65535`);
  const port = Number(text);
  if (port < 1 || port > 65535) throw new AddrError(`port ${port} is outside 1-65535`);
  return port;
}

/**
 * Splits "host", "host:port", "[v6]", "[v6]:port" or a bare IPv6 literal. The host must be an IP literal or a
 * DNS name. With allowEmptyHost, ":port" gives host "" (listen on every interface). With allowPortZero,
 * ":0" asks the OS for a free port (listeners in tests).
 */
export function parseAddr(
  text: string,
  options: { allowEmptyHost?: boolean; allowPortZero?: boolean } = {},
): ParsedAddr {
  const raw = text.trim();
  if (raw === '') throw new AddrError('address is empty');
  let hostPart: string;
  let portPart: string | undefined;
  if (raw.startsWith('[')) {
    const close = raw.indexOf(']');
    if (close < 0) throw new AddrError(`"${raw}" opens "[" without closing it`);
    hostPart = raw.slice(1, close);
    const rest = raw.slice(close + 1);
    if (rest !== '') {
      if (!rest.startsWith(':')) throw new AddrError(`unexpected "${rest}" after "]" in "${raw}"`);
      portPart = rest.slice(1);
    }
    if (isIP(hostPart) !== 6) throw new AddrError(`"${hostPart}" in brackets is not an IPv6 address`);
  } else if (isIP(raw) === 6) {
    hostPart = raw;
  } else {
    const colons = raw.split(':').length - 1;
    if (colons > 1) throw new AddrError(`"${raw}" looks like an IPv6 address with a port; write it as [address]:port`);
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
    if (!options.allowEmptyHost) throw new AddrError(`"${raw}" has no host`);
    return { host: '', port };
  }
  if (isIP(hostPart) === 0 && !isDnsName(hostPart)) {
    throw new AddrError(`"${hostPart}" is neither an IP address nor a DNS name`);
  }
  return { host: normalizeHost(hostPart), port };
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
