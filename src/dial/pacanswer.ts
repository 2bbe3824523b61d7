/**
 * The answer of a PAC file's FindProxyForURL: "PROXY a:3128; HTTPS b:443; SOCKS5 c:1080; DIRECT", a list of
 * entries tried in order. A pure, bounded parser (like src/mux/): the answer may not exceed MAX_PAC_ANSWER
 * characters nor MAX_PAC_ENTRIES entries, and an entry that cannot be read is an error naming it (a PAC that
 * answers nonsense is a broken PAC, never a silent direct dial). An empty answer means DIRECT, as in browsers.
 *
 * The entry keywords (case-insensitive) and what each becomes, in the Dialer's own terms:
 *   DIRECT            a direct dial
 *   PROXY h:p         an http:// proxy (CONNECT)          HTTP h:p is the same
 *   HTTPS h:p         an https:// proxy (TLS, then CONNECT)
 *   SOCKS5 h:p        a socks5h:// proxy (names resolved by the proxy, as browsers do for a PAC's SOCKS5)
 *                     SOCKS h:p is the same (as the npm proxy-agent reads it)
 *   SOCKS4 h:p        a socks4:// proxy
 * A proxy entry needs host:port (IPv6 in brackets); the port is required, as every browser requires it.
 */
import { AddrError, formatHostPort, parseAddr } from '../addr.js';
import { GatewayError } from '../errors.js';

export const MAX_PAC_ANSWER = 4096;
export const MAX_PAC_ENTRIES = 16;

export type PacProxyProtocol = 'http' | 'https' | 'socks5h' | 'socks4';

export type PacEntry =
  | { kind: 'direct'; text: 'DIRECT' }
  | { kind: 'proxy'; protocol: PacProxyProtocol; host: string; port: number; /** As the PAC wrote it, normalised: "PROXY a:3128". */ text: string };

const KEYWORDS: Record<string, PacProxyProtocol> = {
  PROXY: 'http',
  HTTP: 'http',
  HTTPS: 'https',
  SOCKS: 'socks5h',
  SOCKS5: 'socks5h',
  SOCKS4: 'socks4',
};

function bad(why: string): GatewayError {
  return new GatewayError('GW_ERR_DIAL_PAC_ANSWER', why);
}

function parseEntry(raw: string): PacEntry {
  const parts = raw.split(/\s+/);
  const keyword = parts[0]!.toUpperCase();
  if (keyword === 'DIRECT') {
    if (parts.length !== 1) throw bad(`entry "${raw}": DIRECT takes no address`);
    return { kind: 'direct', text: 'DIRECT' };
  }
  const protocol = KEYWORDS[keyword];
  if (protocol === undefined) throw bad(`entry "${raw}": "${parts[0]}" is not DIRECT, PROXY, HTTP, HTTPS, SOCKS, SOCKS4 or SOCKS5`);
  if (parts.length !== 2) throw bad(`entry "${raw}": ${keyword} takes one host:port`);
  let addr;
  try {
    addr = parseAddr(parts[1]!);
  } catch (err) {
    throw bad(`entry "${raw}": ${err instanceof AddrError ? err.message : String(err)}`);
  }
  if (addr.port === undefined) throw bad(`entry "${raw}": the port is missing (${keyword} host:port)`);
  return { kind: 'proxy', protocol, host: addr.host, port: addr.port, text: `${keyword} ${formatHostPort(addr.host, addr.port)}` };
}

/** Parses FindProxyForURL's answer into its entries, in order. Throws GW_ERR_DIAL_PAC_ANSWER. */
export function parsePacAnswer(answer: unknown): PacEntry[] {
  if (answer === null || answer === undefined) return [{ kind: 'direct', text: 'DIRECT' }];
  if (typeof answer !== 'string') throw bad(`FindProxyForURL returned a ${typeof answer}, not a string`);
  if (answer.length > MAX_PAC_ANSWER) throw bad(`FindProxyForURL's answer is longer than ${MAX_PAC_ANSWER} characters`);
  const raws = answer
    .split(';')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  if (raws.length === 0) return [{ kind: 'direct', text: 'DIRECT' }];
  if (raws.length > MAX_PAC_ENTRIES) throw bad(`FindProxyForURL's answer has ${raws.length} entries; at most ${MAX_PAC_ENTRIES} are tried`);
  return raws.map(parseEntry);
}
