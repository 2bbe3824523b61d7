/**
 * Channel drift: Proxies of one cluster that serve different proxy_service.automatic_upgrades_channels. An agent
 * asks whichever Proxy it reaches (often through a load balancer) which version to run, so Proxies that disagree
 * make agents flip between versions. Each Proxy publishes its channels and their digest in its record
 * (ProxyRecord.channels, .channels_digest, src/proxy/cluster.ts); this pure function says which channel names
 * differ, on which Proxies, with which values. Every Proxy logs it (src/proxy/drift.ts) and GET /v1/status shows
 * it (clusterStatus below, for `gwctl status`). It lives here, below the Proxy, because both use it.
 */
import type { Identity } from './pki.js';
import type { ProxyRecord } from './records.js';

/** What a Proxy answers for a channel it does not define (the version server's 404). */
export const CHANNEL_NOT_SET = '(not set)';

export interface ProxyRef {
  id: string;
  nodename: string;
}

/** One channel whose value is not the same on every Proxy: each distinct value with the Proxies that serve it. */
export interface ChannelDifference {
  channel: string;
  values: Array<{ value: string; proxies: ProxyRef[] }>;
}

export interface DriftReport {
  /** True when every live Proxy publishes the same digest (or there is one Proxy or none). */
  agree: boolean;
  /** The Proxies grouped by digest, the largest group first (ties by digest), Proxies by id. */
  groups: Array<{ digest: string; proxies: ProxyRef[] }>;
  /** The channels that differ, by name; empty when they agree. */
  channels: ChannelDifference[];
  /** A stable text of the groups: equal keys mean the same drift (what a watcher compares to log once per change). */
  key: string;
}

const ref = (p: ProxyRecord): ProxyRef => ({ id: p.id, nodename: p.nodename });

/** The drift report of a list of Proxy records (any order; a repeated id counts once, the last one wins). */
export function driftReport(records: readonly ProxyRecord[]): DriftReport {
  const byId = new Map<string, ProxyRecord>();
  for (const r of records) byId.set(r.id, r);
  const proxies = [...byId.values()].sort((a, b) => a.id.localeCompare(b.id));
  const byDigest = new Map<string, ProxyRecord[]>();
  for (const p of proxies) byDigest.set(p.channels_digest, [...(byDigest.get(p.channels_digest) ?? []), p]);
  const groups = [...byDigest.entries()]
    .sort(([da, a], [db, b]) => b.length - a.length || da.localeCompare(db))
    .map(([digest, members]) => ({ digest, proxies: members.map(ref) }));
  const agree = groups.length <= 1;
  const key = agree ? '' : JSON.stringify(groups.map((g) => [g.digest, g.proxies.map((p) => p.id)]));
  return { agree, groups, channels: agree ? [] : differences(proxies), key };
}

/** Every channel name some Proxy defines whose value (or absence) is not the same on all of them. */
function differences(proxies: readonly ProxyRecord[]): ChannelDifference[] {
  const names = [...new Set(proxies.flatMap((p) => Object.keys(p.channels ?? {})))].sort();
  const out: ChannelDifference[] = [];
  for (const channel of names) {
    const byValue = new Map<string, ProxyRef[]>();
    for (const p of proxies) {
      const value = Object.hasOwn(p.channels ?? {}, channel) ? p.channels[channel]! : CHANNEL_NOT_SET;
      byValue.set(value, [...(byValue.get(value) ?? []), ref(p)]);
    }
    if (byValue.size > 1) out.push({ channel, values: [...byValue.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([value, refs]) => ({ value, proxies: refs })) });
  }
  return out;
}

/** "nodename (id)". */
export function proxyName(p: ProxyRef): string {
  return `${p.nodename} (${p.id})`;
}

/** One line per differing channel: `stable/cloud: "static v1.2.3" on a (id1); "static v1.2.4" on b (id2)`. */
export function describeDrift(report: DriftReport): string[] {
  return report.channels.map((c) => `${c.channel}: ${c.values.map((v) => `${JSON.stringify(v.value)} on ${v.proxies.map(proxyName).join(', ')}`).join('; ')}`);
}

/** What clusterStatus needs of the Auth Service. */
export interface StatusSource {
  status(caller: Identity): Record<string, unknown>;
  listProxies(): Promise<ProxyRecord[]>;
  authorize(caller: Identity, resource: string, verb: 'list'): Promise<void>;
}

/**
 * GET /v1/status: the service's status and, for a caller who may list Proxies, the live Proxies and the channel
 * drift between them (a caller who may not gets the status alone, as before).
 */
export async function clusterStatus(auth: StatusSource, caller: Identity): Promise<Record<string, unknown>> {
  const base = auth.status(caller);
  const allowed = await auth.authorize(caller, 'proxy', 'list').then(() => true, () => false);
  if (!allowed) return base;
  const proxies = (await auth.listProxies()).sort((a, b) => a.id.localeCompare(b.id));
  const report = driftReport(proxies);
  return {
    ...base,
    proxies: proxies.map((p) => ({ id: p.id, nodename: p.nodename, version: p.version, public_addr: p.public_addr, channels_digest: p.channels_digest })),
    channel_drift: { agree: report.agree, groups: report.groups, channels: report.channels },
  };
}
