/**
 * Where a PAC file comes from, as the environment names it (the rules are in docs/dialing.md, "PAC and WPAD"):
 *  - a proxy variable holding pac+http://..., pac+https://... or pac+file:///path (the npm proxy-agent's form);
 *  - GATEWAY_WPAD=1 with no proxy variable set for the target: WPAD, http://wpad.<domain>/wpad.dat for the
 *    search domains of /etc/resolv.conf (wpadCandidates), most specific first.
 * Pure: select.ts decides with it on every dial, pac.ts fetches what it names.
 */
import { GatewayError } from '../errors.js';
import { redactUserinfo } from '../redact.js';

export interface PacSpec {
  /** 'url': a pac+ URL; 'wpad': discovery from the search domains. */
  kind: 'url' | 'wpad';
  /** The URL fetched (http:, https: or file:), for kind 'url'. */
  url?: string;
  /** What may be shown: the pac+ value with any password as "***", or "WPAD". */
  display: string;
  /** The variable that named it. */
  source: string;
}

export const WPAD_VARIABLE = 'GATEWAY_WPAD';
/** At most this many search domains are read, and this many wpad URLs tried. */
export const MAX_WPAD_DOMAINS = 8;
export const MAX_WPAD_CANDIDATES = 24;

export function isPacValue(value: string): boolean {
  return /^pac\+/i.test(value.trim());
}

/** Parses a pac+ value of a proxy variable. Throws GW_ERR_DIAL_PROXY_ENV naming the variable. */
export function parsePacValue(value: string, source: string): PacSpec {
  const raw = value.trim();
  const url = raw.slice('pac+'.length);
  const bad = (why: string) =>
    new GatewayError('GW_ERR_DIAL_PROXY_ENV', `${source}="${redactUserinfo(raw)}" is not a usable PAC URL: ${why}`, {
      details: { variable: source },
      hint: 'Name the PAC file as pac+http://host/proxy.pac, pac+https://host/proxy.pac or pac+file:///etc/proxy.pac.',
    });
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw bad('not a URL');
  }
  const scheme = parsed.protocol.slice(0, -1).toLowerCase();
  if (scheme !== 'http' && scheme !== 'https' && scheme !== 'file') throw bad(`scheme "${scheme}" is not http, https or file`);
  if (scheme === 'file' && (parsed.host !== '' || parsed.pathname === '/')) throw bad('a pac+file URL names an absolute path on this host: pac+file:///etc/proxy.pac');
  if (scheme !== 'file' && parsed.hostname === '') throw bad('the host is missing');
  return { kind: 'url', url, display: redactUserinfo(raw), source };
}

/** The WPAD spec when GATEWAY_WPAD asks for it ("1", "true" or "yes"), else undefined. */
export function wpadSpec(env: Record<string, string | undefined>): PacSpec | undefined {
  const v = env[WPAD_VARIABLE]?.trim().toLowerCase();
  return v === '1' || v === 'true' || v === 'yes' ? { kind: 'wpad', display: 'WPAD', source: WPAD_VARIABLE } : undefined;
}

/**
 * The wpad.dat URLs for a resolv.conf: its search list (the last "search" or "domain" line wins, as in glibc),
 * each domain and then its parents down to two labels (corp.example.com, then example.com; never wpad.com),
 * most specific first, without repeats.
 */
export function wpadCandidates(resolvConf: string): string[] {
  let domains: string[] = [];
  for (const line of resolvConf.split('\n')) {
    const m = /^\s*(search|domain)\s+(.*)$/.exec(line);
    if (m) domains = m[2]!.split(/\s+/).filter((d) => d !== '');
  }
  const out: string[] = [];
  for (const domain of domains.slice(0, MAX_WPAD_DOMAINS)) {
    const labels = domain.toLowerCase().replace(/\.$/, '').split('.');
    if (labels.some((l) => !/^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/.test(l))) continue;
    for (let i = 0; labels.length - i >= 2; i++) {
      const url = `http://wpad.${labels.slice(i).join('.')}/wpad.dat`;
      if (!out.includes(url)) out.push(url);
    }
  }
  return out.slice(0, MAX_WPAD_CANDIDATES);
}
