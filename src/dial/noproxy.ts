/**
 * NO_PROXY: which targets bypass the proxy. Pure parsing and matching; no DNS lookups (an IP or CIDR entry
 * matches only targets written as IP literals, a name entry only targets written as names).
 *
 * Entry forms (comma-separated, blanks trimmed, case-insensitive), each optionally followed by :port, which then
 * matches that port only (IPv6 with a port goes in brackets):
 *   *                      every target (proxying off)
 *   10.1.2.3, 2001:db8::1  that IP address
 *   10.0.0.0/8, fd00::/8   that CIDR range ([fd00::]/8:443 or [fd00::/8]:443 with a port)
 *   example.com            example.com and its subdomains, on a label boundary
 *   .example.com           subdomains of example.com only
 *   *.example.com          subdomains of example.com only
 * An entry that is none of these is ignored and reported as a warning.
 */
import { BlockList, isIP } from 'node:net';
import { Netmask } from 'netmask';
import { AddrError, dnsNameProblem, normalizeHost, parsePort } from '../addr.js';

export type NoProxyEntry =
  | { kind: 'all'; text: string }
  | { kind: 'ip'; text: string; ip: string; port?: number }
  | { kind: 'cidr'; text: string; contains: (ip: string) => boolean; port?: number }
  | { kind: 'domain'; text: string; name: string; subdomainsOnly: boolean; port?: number };

export interface NoProxyList {
  entries: NoProxyEntry[];
  /** One sentence per entry that was ignored. */
  warnings: string[];
}

/** Canonical text of an IP literal (IPv6 compressed and lowercased), so "2001:DB8:0::1" equals "2001:db8::1". */
export function canonicalIp(ip: string): string {
  const h = normalizeHost(ip);
  return isIP(h) === 6 ? new URL(`http://[${h}]/`).hostname.slice(1, -1) : h;
}

function cidrMatcher(addr: string, prefixText: string): (ip: string) => boolean {
  if (!/^\d{1,3}$/.test(prefixText)) throw new AddrError(`prefix length "${prefixText}" is not a number`);
  const prefix = Number(prefixText);
  const family = isIP(addr);
  if (family === 4) {
    if (prefix > 32) throw new AddrError(`prefix length ${prefix} is over 32`);
    const block = new Netmask(`${addr}/${prefix}`);
    return (ip) => isIP(ip) === 4 && block.contains(ip);
  }
  if (family === 6) {
    if (prefix > 128) throw new AddrError(`prefix length ${prefix} is over 128`);
    const list = new BlockList();
    list.addSubnet(addr, prefix, 'ipv6');
    return (ip) => isIP(ip) === 6 && list.check(ip, 'ipv6');
  }
  throw new AddrError(`"${addr}" is not an IP address`);
}

/** Splits an optional trailing ":port" off an entry that is not a bracketed IPv6 form. */
function splitPort(text: string): { body: string; port?: number } {
  const colons = text.split(':').length - 1;
  if (colons === 0) return { body: text };
  if (colons > 1) {
    // A bare IPv6 address or range: it cannot carry a port without brackets.
    return { body: text };
  }
  const idx = text.lastIndexOf(':');
  return { body: text.slice(0, idx), port: parsePort(text.slice(idx + 1)) };
}

export function parseNoProxyEntry(raw: string): NoProxyEntry {
  const text = raw.trim().toLowerCase();
  if (text === '*') return { kind: 'all', text };
  let body: string;
  let port: number | undefined;
  if (text.startsWith('[')) {
    // [v6], [v6]:port, [v6/len], [v6/len]:port, [v6]/len, [v6]/len:port
    const close = text.indexOf(']');
    if (close < 0) throw new AddrError('"[" without "]"');
    let inside = text.slice(1, close);
    let rest = text.slice(close + 1);
    const slashAfter = /^\/(\d{1,3})/.exec(rest);
    if (slashAfter) {
      inside = `${inside}/${slashAfter[1]}`;
      rest = rest.slice(slashAfter[0].length);
    }
    if (rest !== '') {
      if (!rest.startsWith(':')) throw new AddrError(`unexpected "${rest}" after "]"`);
      port = parsePort(rest.slice(1));
    }
    body = inside;
    const slash = body.indexOf('/');
    const addr = slash < 0 ? body : body.slice(0, slash);
    if (isIP(addr) !== 6) throw new AddrError(`"${addr}" in brackets is not an IPv6 address`);
  } else {
    const split = splitPort(text);
    body = split.body;
    port = split.port;
  }

  const slash = body.indexOf('/');
  if (slash >= 0) {
    const contains = cidrMatcher(body.slice(0, slash), body.slice(slash + 1));
    return { kind: 'cidr', text, contains, ...(port === undefined ? {} : { port }) };
  }
  if (isIP(body) !== 0) return { kind: 'ip', text, ip: canonicalIp(body), ...(port === undefined ? {} : { port }) };
  let name = body;
  let subdomainsOnly = false;
  if (name.startsWith('*.')) {
    name = name.slice(2);
    subdomainsOnly = true;
  } else if (name.startsWith('.')) {
    name = name.slice(1);
    subdomainsOnly = true;
  }
  if (name.endsWith('.')) name = name.slice(0, -1);
  // Names are matched as text, so "_" is allowed: the entry must match whatever kube.<cluster>.local is called.
  const problem = dnsNameProblem(name, { allowUnderscore: true });
  if (problem) throw new AddrError(`"${body}" is not an IP address, CIDR range or domain name: ${problem.message}`);
  return { kind: 'domain', text, name, subdomainsOnly, ...(port === undefined ? {} : { port }) };
}

export function parseNoProxy(value: string | undefined): NoProxyList {
  const entries: NoProxyEntry[] = [];
  const warnings: string[] = [];
  for (const part of (value ?? '').split(',')) {
    if (part.trim() === '') continue;
    try {
      entries.push(parseNoProxyEntry(part));
    } catch (err) {
      const why = err instanceof AddrError ? err.message : String(err);
      warnings.push(`ignoring NO_PROXY entry "${part.trim()}": ${why}`);
    }
  }
  return { entries, warnings };
}

/** The first entry that exempts host:port from proxying, or undefined. host is normalized by the caller. */
export function matchNoProxy(list: NoProxyList, host: string, port: number): NoProxyEntry | undefined {
  const h = normalizeHost(host);
  const ipFamily = isIP(h);
  const ip = ipFamily === 0 ? undefined : canonicalIp(h);
  for (const entry of list.entries) {
    if (entry.kind === 'all') return entry;
    if (entry.port !== undefined && entry.port !== port) continue;
    switch (entry.kind) {
      case 'ip':
        if (ip !== undefined && ip === entry.ip) return entry;
        break;
      case 'cidr':
        if (ip !== undefined && entry.contains(ip)) return entry;
        break;
      case 'domain':
        if (ip === undefined) {
          if (h.endsWith(`.${entry.name}`) || (!entry.subdomainsOnly && h === entry.name)) return entry;
        }
        break;
    }
  }
  return undefined;
}
