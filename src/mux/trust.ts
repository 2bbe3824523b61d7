/**
 * Who may send a PROXY protocol header: the decision, pure, with the reason it was taken. A PROXY header names
 * the client's address, and that address is what logs, rate limits, source caps and the audit log then see; a
 * header believed from anyone lets any client pick the address it is counted under (and lock out a victim's). So
 * the header is believed only from the load balancers the operator lists
 * (`proxy_service.proxy_protocol_trusted_sources`), judged by the TCP peer of the socket, never by anything the
 * connection sent:
 *
 *   proxy_protocol off                       every header refused              proxy-protocol-off
 *   a second header on one connection        refused                           proxy-protocol-twice
 *   a header inside a connection upgrade     refused                           proxy-protocol-in-upgrade
 *   on, a list, the peer is not in it        refused                           proxy-protocol-untrusted-source
 *   on, a list, the peer is in it            taken ("trusted: <the entry>")
 *   on, no list                              taken from anyone (compatibility; the Proxy warns at start)
 *
 * A connection without a header is not this file's question: it keeps its socket's address, whoever it is from
 * (the header has always been optional with proxy_protocol on: balancers' health checks and direct clients).
 *
 * Entries: an IPv4 or IPv6 address (a single source), or a network in CIDR form (10.0.0.0/8, 2001:db8::/32)
 * without host bits set (10.1.2.3/8 is refused: it is either a typo for a /32 or for 10.0.0.0/8). No names (a
 * name would need a resolver each time, and a resolver can be lied to), ports or zones. An IPv4-mapped IPv6 peer
 * (::ffff:10.1.2.3, what a dual-stack listener reports for an IPv4 client) is the IPv4 address it maps, and an
 * IPv4-mapped entry (::ffff:10.0.0.0/104) is the IPv4 network it maps: IPv4 clients match IPv4 entries whatever
 * the listener's family, and an IPv6 entry such as ::/0 does not take in every IPv4 client.
 */
import { isIP } from 'node:net';
import { AddrError } from '../addr.js';
import type { ErrorCode } from '../errors.js';

/** One entry of the list, as parsed: a network of `bits` leading bits (32 or 128 for a single address). */
export interface TrustedSource {
  /** The entry as the operator wrote it (trimmed), for reasons and logs. */
  readonly text: string;
  readonly family: 4 | 6;
  readonly base: bigint;
  readonly bits: number;
}

/** What the connection's listener was told about PROXY headers. */
export type ProxyHeaderPolicy =
  | { readonly mode: 'off' }
  /** proxy_protocol on without a list: from any source. */
  | { readonly mode: 'any' }
  | { readonly mode: 'listed'; readonly sources: readonly TrustedSource[] };

export type ProxyHeaderRefusal = 'proxy-protocol-off' | 'proxy-protocol-twice' | 'proxy-protocol-in-upgrade' | 'proxy-protocol-untrusted-source';

export type ProxyHeaderVerdict =
  | { readonly take: true; readonly reason: string }
  | { readonly take: false; readonly refusal: ProxyHeaderRefusal; readonly reason: string; readonly code?: ErrorCode };

/** Where a header arrived: the socket's own peer address, and what the connection already did. */
export interface HeaderArrival {
  /** The TCP peer (socket.remoteAddress), never an address a header named. */
  readonly peer: string;
  /** Headers already taken on this connection. */
  readonly headersTaken: number;
  /** The stream came through a connection upgrade (its client is the upgrading HTTP request's). */
  readonly upgraded: boolean;
}

/** At most this many entries: the list is the operator's balancers, and each connection with a header walks it. */
export const MAX_TRUSTED_SOURCES = 256;

/** The policy for a listener: proxy_protocol and the list of trusted sources (already checked by the config). */
export function proxyHeaderPolicy(proxyProtocol: boolean, sources: readonly string[] = []): ProxyHeaderPolicy {
  if (!proxyProtocol) return { mode: 'off' };
  if (sources.length === 0) return { mode: 'any' };
  return { mode: 'listed', sources: parseTrustedSources(sources) };
}

/**
 * Whether a listener believes a PROXY header from anyone: proxy_protocol on without a list, on the one port (the
 * only listener that reads headers). The Proxy warns at start, and the start banner says so.
 */
export function anySourceBelieved(o: { onePort: boolean; proxyProtocol: boolean; sources: readonly string[] }): boolean {
  return o.onePort && o.proxyProtocol && o.sources.length === 0;
}

/** Whether a PROXY header that arrived as `at` says is taken (the table at the top of this file). */
export function decideProxyHeader(policy: ProxyHeaderPolicy, at: HeaderArrival): ProxyHeaderVerdict {
  if (policy.mode === 'off') return { take: false, refusal: 'proxy-protocol-off', reason: 'a PROXY header arrived but proxy_protocol is off' };
  if (at.headersTaken > 0) return { take: false, refusal: 'proxy-protocol-twice', reason: 'a second PROXY header on one connection' };
  if (at.upgraded) return { take: false, refusal: 'proxy-protocol-in-upgrade', reason: 'a PROXY header inside a connection upgrade' };
  if (policy.mode === 'any') return { take: true, reason: 'proxy_protocol is on and no trusted sources are listed: any source is believed' };
  const entry = trustedEntryFor(policy.sources, at.peer);
  if (entry) return { take: true, reason: `the peer ${at.peer} is trusted by the entry ${entry.text}` };
  return {
    take: false,
    refusal: 'proxy-protocol-untrusted-source',
    reason: `a PROXY header from ${at.peer || 'an unknown peer'}, which proxy_service.proxy_protocol_trusted_sources does not list`,
    code: 'GW_ERR_MUX_PROXY_HEADER_UNTRUSTED',
  };
}

/** The first entry that holds `peer` (a socket's remote address), or undefined. */
export function trustedEntryFor(sources: readonly TrustedSource[], peer: string): TrustedSource | undefined {
  const ip = ipValue(peer);
  if (!ip) return undefined;
  return sources.find((s) => s.family === ip.family && inNetwork(ip.value, s));
}

/** Every entry parsed; throws AddrError naming the first bad one, or a list that is too long. */
export function parseTrustedSources(texts: readonly string[]): TrustedSource[] {
  if (texts.length > MAX_TRUSTED_SOURCES) throw new AddrError(`${texts.length} trusted sources, more than ${MAX_TRUSTED_SOURCES}`, 'List the balancers by network (10.0.0.0/24) rather than one by one.');
  return texts.map(parseTrustedSource);
}

const ENTRY_HINT = 'Write the load balancer\'s IP address (10.0.0.5, 2001:db8::5) or network (10.0.0.0/24, 2001:db8::/64); names, ports and zones are not taken.';

/** One entry: an address or a CIDR network (rules at the top of this file). Throws AddrError with a hint. */
export function parseTrustedSource(raw: string): TrustedSource {
  const text = raw.trim();
  if (text.length === 0 || text.length > 64) throw new AddrError(`${JSON.stringify(raw.slice(0, 70))} is not an IP address or network`, ENTRY_HINT);
  const slash = text.indexOf('/');
  const addrText = slash < 0 ? text : text.slice(0, slash);
  if (addrText.includes('%')) throw new AddrError(`"${text}" has a zone; trusted sources are matched without one`, ENTRY_HINT);
  const ip = ipValue(addrText, false);
  if (!ip) throw new AddrError(`"${addrText}" is not an IP address`, ENTRY_HINT);
  const width = ip.family === 4 ? 32 : 128;
  let bits = width;
  if (slash >= 0) {
    const prefix = text.slice(slash + 1);
    if (!/^\d{1,3}$/.test(prefix) || Number(prefix) > width) throw new AddrError(`"${prefix}" is not a prefix length of an IPv${ip.family} network (0 to ${width})`, ENTRY_HINT);
    bits = Number(prefix);
  }
  let entry: TrustedSource = { text, family: ip.family, base: ip.value, bits };
  // ::ffff:a.b.c.d/n (n >= 96) is the IPv4 network a.b.c.d/(n - 96): IPv4 peers are matched as IPv4.
  if (ip.family === 6 && bits >= 96 && ip.value >> 32n === 0xffffn) entry = { text, family: 4, base: ip.value & 0xffffffffn, bits: bits - 96 };
  const hostBits = BigInt((entry.family === 4 ? 32 : 128) - entry.bits);
  if (entry.base & ((1n << hostBits) - 1n)) {
    const network = `${formatIp(entry.family, (entry.base >> hostBits) << hostBits)}/${entry.bits}`;
    throw new AddrError(`"${text}" has host bits set`, `Write the network (${network}) or the single address without a prefix length.`);
  }
  return entry;
}

function inNetwork(value: bigint, s: TrustedSource): boolean {
  const shift = BigInt((s.family === 4 ? 32 : 128) - s.bits);
  return value >> shift === s.base >> shift;
}

/**
 * An address as a number and its family; undefined when it is not an IP address. `unmap` (peers): an
 * IPv4-mapped IPv6 address is its IPv4 address, and a zone (fe80::1%eth0) is dropped.
 */
function ipValue(text: string, unmap = true): { family: 4 | 6; value: bigint } | undefined {
  const address = unmap ? text.replace(/%.*$/, '') : text;
  const family = isIP(address);
  if (family === 4) return { family, value: v4Value(address) };
  if (family !== 6) return undefined;
  const value = v6Value(address);
  if (unmap && value >> 32n === 0xffffn) return { family: 4, value: value & 0xffffffffn };
  return { family, value };
}

function v4Value(ip: string): bigint {
  return ip.split('.').reduce((acc, octet) => (acc << 8n) | BigInt(Number(octet)), 0n);
}

/** A valid IPv6 text (isIP said so) as a number: "::" expanded, a dotted IPv4 tail as its two groups. */
function v6Value(ip: string): bigint {
  let text = ip;
  const lastColon = text.lastIndexOf(':');
  if (text.includes('.', lastColon)) {
    const v4 = v4Value(text.slice(lastColon + 1));
    text = `${text.slice(0, lastColon + 1)}${(v4 >> 16n).toString(16)}:${(v4 & 0xffffn).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const before = head === '' ? [] : head.split(':');
  const after = tail === undefined || tail === '' ? [] : tail.split(':');
  const groups = tail === undefined ? before : [...before, ...new Array<string>(8 - before.length - after.length).fill('0'), ...after];
  return groups.reduce((acc, g) => (acc << 16n) | BigInt(parseInt(g, 16)), 0n);
}

function formatIp(family: 4 | 6, value: bigint): string {
  if (family === 4) return [24n, 16n, 8n, 0n].map((s) => String((value >> s) & 0xffn)).join('.');
  const groups = [112n, 96n, 80n, 64n, 48n, 32n, 16n, 0n].map((s) => ((value >> s) & 0xffffn).toString(16));
  // The longest run of zero groups (two or more) becomes "::" (RFC 5952).
  let best = { at: -1, len: 1 };
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] === '0') j++;
    if (j - i > best.len) best = { at: i, len: j - i };
    i = j === i ? i + 1 : j;
  }
  if (best.at < 0) return groups.join(':');
  return `${groups.slice(0, best.at).join(':')}::${groups.slice(best.at + best.len).join(':')}`;
}
