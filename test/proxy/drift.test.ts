/**
 * The channel drift report (src/auth/drift.ts, re-exported by src/proxy/drift.ts): a pure function of the Proxy
 * records. The Proxies' logs and GET /v1/status are tested with real Proxies in test/roles/drift.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { ProxyRecord } from '../../src/auth/records.js';
import { channelSummary } from '../../src/proxy/cluster.js';
import { CHANNEL_NOT_SET, describeDrift, driftReport } from '../../src/proxy/drift.js';

function record(id: string, nodename: string, channels: Record<string, { static_version?: string; forward_url?: string }>): ProxyRecord {
  const full = Object.fromEntries(Object.entries(channels).map(([k, c]) => [k, { static_version: c.static_version, forward_url: c.forward_url }]));
  const summary = channelSummary(full);
  return { id, nodename, version: '17.0.1', public_addr: `${nodename}:443`, channels: summary.channels, channels_digest: summary.digest, started_at: '', last_heartbeat: '' };
}

describe('driftReport', () => {
  it('no Proxy, one Proxy, or Proxies with the same channels: they agree, with an empty key', () => {
    expect(driftReport([])).toEqual({ agree: true, groups: [], channels: [], key: '' });
    const a = record('a', 'proxy-a', { stable: { static_version: 'v1.0.0' } });
    expect(driftReport([a])).toMatchObject({ agree: true, channels: [], key: '' });
    // Written in another order: the canonical summary makes the digests equal.
    const b = record('b', 'proxy-b', { stable: { static_version: 'v1.0.0' } });
    expect(driftReport([b, a])).toMatchObject({ agree: true, channels: [], key: '', groups: [{ proxies: [{ id: 'a', nodename: 'proxy-a' }, { id: 'b', nodename: 'proxy-b' }] }] });
  });

  it('names the channels that differ with each value and the Proxies serving it; equal channels are left out', () => {
    const a = record('a', 'proxy-a', { stable: { static_version: 'v1.0.0' }, edge: { forward_url: 'https://up.example/edge' }, same: { static_version: 'v3.0.0' } });
    const b = record('b', 'proxy-b', { stable: { static_version: 'v1.0.1' }, same: { static_version: 'v3.0.0' } });
    const c = record('c', 'proxy-c', { stable: { static_version: 'v1.0.0' }, edge: { forward_url: 'https://up.example/edge' }, same: { static_version: 'v3.0.0' } });
    const report = driftReport([c, b, a]);
    expect(report.agree).toBe(false);
    // The largest group first.
    expect(report.groups.map((g) => g.proxies.map((p) => p.id))).toEqual([['a', 'c'], ['b']]);
    expect(report.channels).toEqual([
      { channel: 'edge', values: [{ value: CHANNEL_NOT_SET, proxies: [{ id: 'b', nodename: 'proxy-b' }] }, { value: 'forward https://up.example/edge', proxies: [{ id: 'a', nodename: 'proxy-a' }, { id: 'c', nodename: 'proxy-c' }] }] },
      { channel: 'stable', values: [{ value: 'static v1.0.0', proxies: [{ id: 'a', nodename: 'proxy-a' }, { id: 'c', nodename: 'proxy-c' }] }, { value: 'static v1.0.1', proxies: [{ id: 'b', nodename: 'proxy-b' }] }] },
    ]);
    expect(describeDrift(report)).toEqual([
      'edge: "(not set)" on proxy-b (b); "forward https://up.example/edge" on proxy-a (a), proxy-c (c)',
      'stable: "static v1.0.0" on proxy-a (a), proxy-c (c); "static v1.0.1" on proxy-b (b)',
    ]);
  });

  it('the key changes when the set of drifting Proxies changes, and not with record order or heartbeat times', () => {
    const a = record('a', 'proxy-a', { stable: { static_version: 'v1.0.0' } });
    const b = record('b', 'proxy-b', { stable: { static_version: 'v2.0.0' } });
    const c = record('c', 'proxy-c', { stable: { static_version: 'v2.0.0' } });
    const key = driftReport([a, b]).key;
    expect(driftReport([b, { ...a, last_heartbeat: 'later' }]).key).toBe(key);
    expect(driftReport([a, b, c]).key).not.toBe(key);
  });

  it('hostile records: a repeated id counts once (the last wins), a record without channels is "(not set)" everywhere, odd names stay data', () => {
    const a = record('a', 'proxy-a', { stable: { static_version: 'v1.0.0' } });
    const stale = record('b', 'proxy-b', { stable: { static_version: 'v9.9.9' } });
    const fresh = record('b', 'proxy-b', { stable: { static_version: 'v1.0.0' } });
    expect(driftReport([a, stale, fresh]).agree).toBe(true);
    const bare = { ...record('z', 'proxy "z"\n', {}), channels: undefined as unknown as Record<string, string>, channels_digest: 'x' };
    const report = driftReport([a, bare]);
    expect(report.channels).toEqual([{ channel: 'stable', values: [{ value: CHANNEL_NOT_SET, proxies: [{ id: 'z', nodename: 'proxy "z"\n' }] }, { value: 'static v1.0.0', proxies: [{ id: 'a', nodename: 'proxy-a' }] }] }]);
    // A channel called __proto__ is an ordinary name.
    const proto = { ...a, id: 'p', channels: JSON.parse('{"__proto__": "static v1.0.0"}') as Record<string, string>, channels_digest: 'y' };
    expect(driftReport([a, proto]).channels.map((c) => c.channel)).toEqual(['__proto__', 'stable']);
  });
});
