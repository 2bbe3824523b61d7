/**
 * Channel drift, the Proxy's side: every Proxy watches the live Proxies (ClusterView's 'proxies' event) and logs a
 * warning when their automatic_upgrades_channels differ, naming the Proxies and the channels with each side's
 * value; once per change of the drift (not every heartbeat), and "channels agree again" when it is resolved.
 * The report itself is the pure driftReport (src/auth/drift.ts, shared with GET /v1/status). docs/version-server.md.
 */
import type { EventEmitter } from 'node:events';
import { describeDrift, driftReport, proxyName, type DriftReport } from '../auth/drift.js';
import type { ProxyRecord } from '../auth/records.js';
import { logger, type Logger } from '../log.js';

export { CHANNEL_NOT_SET, describeDrift, driftReport, type ChannelDifference, type DriftReport, type ProxyRef } from '../auth/drift.js';

/** What the watcher needs of ClusterView. */
export interface ProxyList extends EventEmitter {
  readonly selfId: string;
  proxies(): ProxyRecord[];
}

/**
 * Checks now and on every 'proxies' event; returns the function that stops watching. `log` defaults to the
 * 'channel-drift' component logger (read when this is called, so a test's root logger applies).
 */
export function watchChannelDrift(cluster: ProxyList, log: Logger = logger('channel-drift')): () => void {
  let last = '';
  const check = (): void => {
    const report = driftReport(cluster.proxies());
    if (report.key === last) return;
    const before = last;
    last = report.key;
    if (report.agree) {
      if (before !== '') log.info({ proxy: cluster.selfId, proxies: cluster.proxies().map((p) => proxyName(p)) }, 'channels agree again: every Proxy serves the same automatic_upgrades_channels');
      return;
    }
    log.warn(driftFields(cluster.selfId, report), driftMessage(report));
  };
  cluster.on('proxies', check);
  check();
  return () => cluster.off('proxies', check);
}

function driftFields(selfId: string, report: DriftReport): Record<string, unknown> {
  return {
    proxy: selfId,
    proxies: report.groups.flatMap((g) => g.proxies.map((p) => ({ ...p, channels_digest: g.digest }))),
    channels: Object.fromEntries(report.channels.map((c) => [c.channel, Object.fromEntries(c.values.flatMap((v) => v.proxies.map((p) => [proxyName(p), v.value])))])),
    hint: 'Give every Proxy the same proxy_service.automatic_upgrades_channels and reload them (SIGHUP): agents that reach different Proxies flip between versions.',
  };
}

function driftMessage(report: DriftReport): string {
  const names = report.groups.map((g) => g.proxies.map(proxyName).join(', ')).join(' vs ');
  const lines = describeDrift(report);
  return `Proxies serve different automatic_upgrades_channels (${names}): ${lines.length > 0 ? lines.join(' | ') : 'same names and values, different digests (different versions?)'}`;
}
