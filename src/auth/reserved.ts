/**
 * Names that belong to the cluster's own members, which no agent's join may put in its host certificate: every
 * host certificate chains to the same host CA, so a node certificate naming the Proxy's public name would pass a
 * client's chain-and-name check (docs/security.md, "Who each cluster member is, and how each party checks it").
 *
 *   exact   a Proxy's or Auth Service's public address host and node name, a Proxy's peering host, the cluster name
 *   under   every name below a Proxy's public DNS name: the Proxy answers for <app>.<public name> (HTTP apps,
 *           kube-gateway-proxy-alpn.<public name>) and its own certificate holds *.<public name>
 *
 * A requested wildcard (*.example.com) is refused when it would cover a reserved name. Loopback names and
 * unspecified addresses are never reserved (every machine has them; clients never reach a Proxy by them from
 * elsewhere). Where the names come from (the Auth Service's configuration, live Proxy records) is joining.ts's;
 * this module only compares. Pure, bounded by the lists it is given.
 */
import { isIP } from 'node:net';
import { isLoopbackHost, normalizeHost } from '../addr.js';

/** A reserved name and whose it is, as the refusal says it. */
export interface MemberName {
  name: string;
  /** Whose it is, e.g. 'the public address of Proxy 3f1c... (proxy-a)'. */
  owner: string;
  /** Names below it are reserved too (a Proxy's public DNS name). */
  under?: boolean;
}

/** Lowercase, no trailing dot, no brackets; an IPv6 address in its canonical (compressed) form. */
export function canonicalName(host: string): string {
  const h = normalizeHost(host);
  if (isIP(h) !== 6) return h;
  try {
    return new URL(`http://[${h}]/`).hostname.slice(1, -1);
  } catch {
    return h;
  }
}

/** Whether a name may be reserved at all: not empty, not a wildcard listen host, not loopback. */
function reservable(name: string): boolean {
  return name !== '' && name !== '0.0.0.0' && name !== '::' && !isLoopbackHost(name);
}

/** The member names in canonical form, reservable ones only, without repeats. */
export function memberNames(list: readonly MemberName[]): MemberName[] {
  const seen = new Map<string, MemberName>();
  for (const m of list) {
    const name = canonicalName(m.name);
    if (!reservable(name)) continue;
    const under = m.under === true && isIP(name) === 0;
    const key = `${name}\0${under}`;
    if (!seen.has(key)) seen.set(key, { name, owner: m.owner, ...(under ? { under } : {}) });
  }
  return [...seen.values()];
}

/** Whether the requested name (canonical) is, falls under, or as a wildcard covers, the member's name. */
function collides(requested: string, m: MemberName): boolean {
  if (requested === m.name) return true;
  if (m.under && requested.endsWith(`.${m.name}`)) return true;
  if (requested.startsWith('*.')) {
    const base = requested.slice(2);
    // *.example.com covers proxy.example.com (and, for a Proxy's public name, every app under it).
    if (m.name.endsWith(`.${base}`)) return true;
  }
  return false;
}

/** The member whose name `requested` would take, or undefined when it belongs to none. */
export function reservedBy(requested: string, members: readonly MemberName[]): MemberName | undefined {
  const name = canonicalName(requested);
  return members.find((m) => collides(name, m));
}
