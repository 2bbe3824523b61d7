/**
 * Which IP family a dial's TCP connection uses, as `gateway dial-plan` explains it. The Dialer connects to the
 * proxy when one is chosen, else to the target (select.ts decides which). An IP literal fixes the family. A name
 * is resolved at every dial, never kept across dials, so a reconnect follows a changed DNS record; when it has
 * addresses of both families they are raced (Happy Eyeballs, as Node's autoSelectFamily does it: one address,
 * then the other family's after HAPPY_EYEBALLS_ATTEMPT_MS, the first to connect wins). Through a proxy the
 * target's name goes in the CONNECT line (or a socks5h:// request) as written and the proxy resolves it; socks5://
 * resolves it here. Pure: no lookup is made here.
 */
import { isIP } from 'node:net';
import { formatHostPort } from '../addr.js';
import type { ProxyDecision } from './select.js';

/** How long one address may take to connect before the next family's is tried too (Node's default is 250). */
export const HAPPY_EYEBALLS_ATTEMPT_MS = 250;

export type Family = 'ipv4' | 'ipv6' | 'either';

export interface FamilyPlan {
  /** The host the TCP connection goes to: the proxy's, or the target's for a direct dial. */
  host: string;
  port: number;
  family: Family;
  /** One sentence: why this family. */
  reason: string;
}

export function familyPlan(decision: ProxyDecision): FamilyPlan {
  const to = decision.proxy ?? decision.target;
  const what = decision.proxy ? 'the proxy' : 'the target';
  const where = formatHostPort(to.host, to.port);
  const literal = isIP(to.host);
  if (literal !== 0) {
    const family = literal === 6 ? 'ipv6' : 'ipv4';
    return { host: to.host, port: to.port, family, reason: `${what} ${where} is an ${family === 'ipv6' ? 'IPv6' : 'IPv4'} address` };
  }
  const target = formatHostPort(decision.target.host, decision.target.port);
  // socks5:// sends the SOCKS server an address this host resolved (socks.ts); every other proxy gets the name.
  const resolver = !decision.proxy
    ? ''
    : decision.proxy.protocol === 'socks5' && isIP(decision.target.host) === 0
      ? `; ${target} is resolved here and sent to the SOCKS server as an address`
      : `; the proxy resolves ${target} itself`;
  return {
    host: to.host,
    port: to.port,
    family: 'either',
    reason: `${what} ${where} is a name, resolved at each dial; IPv6 and IPv4 addresses are raced (Happy Eyeballs)${resolver}`,
  };
}

/** "IPv6", "IPv4" or "IPv6 or IPv4": how dial-plan's text names a family. */
export function familyLabel(family: Family): string {
  return family === 'ipv6' ? 'IPv6' : family === 'ipv4' ? 'IPv4' : 'IPv6 or IPv4';
}
