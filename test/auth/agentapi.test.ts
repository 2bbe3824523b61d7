/**
 * What an agent may write in its own presence (src/auth/agentapi.ts), function by function: the listener hosts
 * the Proxy will dial (its socket address, a wildcard, or a public address it joined with; never loopback,
 * link-local, unspecified or multicast), the resource kinds its roles serve, and a connected_at its clock can
 * honestly have. The routes themselves, with real certificates, are in test/agent/direct.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { connectedAtOf, directAddrs, refusedDialHost, resourcesOf } from '../../src/auth/agentapi.js';
import type { NodeRecord } from '../../src/auth/records.js';

const node = (over: Partial<NodeRecord> = {}): NodeRecord => ({
  hostId: '7d4a5c3e-0000-4000-8000-00000000a001',
  nodename: 'n1',
  roles: ['node', 'kube', 'desktop'],
  publicAddrs: ['agent.example.com', '198.51.100.20:3022'],
  joinedAt: '2026-01-01T00:00:00.000Z',
  ...over,
});
const SOURCE = '192.0.2.7';

describe('refusedDialHost', () => {
  it.each(['127.0.0.1', '127.9.9.9', 'localhost', 'db.localhost', '::1', '::ffff:127.0.0.1', '169.254.169.254', '::ffff:169.254.169.254', 'fe80::1', 'fe80::1%eth0', 'febf::1', '0.0.0.0', '0.1.2.3', '::', '224.0.0.1', '239.255.255.250', '255.255.255.255', 'ff02::1'])('refuses %s', (host) => {
    expect(refusedDialHost(host)).toEqual(expect.any(String));
  });
  it.each(['192.0.2.7', '10.0.0.5', 'agent.example.com', '2001:db8::1', 'fec0::1'])('leaves %s to the origin check', (host) => {
    expect(refusedDialHost(host)).toBeUndefined();
  });
});

describe('directAddrs', () => {
  it('a wildcard becomes the socket address; the socket address and public addresses are accepted', () => {
    expect(directAddrs({ ssh: '0.0.0.0:3022', kube: `${SOURCE}:3026`, desktop: 'agent.example.com:3028' }, node(), SOURCE)).toEqual({ ssh: `${SOURCE}:3022`, kube: `${SOURCE}:3026`, desktop: 'agent.example.com:3028' });
    expect(directAddrs({ ssh: ':3022' }, node(), `::ffff:${SOURCE}`)).toEqual({ ssh: `${SOURCE}:3022` });
    expect(directAddrs({ ssh: '198.51.100.20:4022' }, node(), SOURCE)).toEqual({ ssh: '198.51.100.20:4022' });
  });

  it('hostile: metadata, loopback, link-local, the backend on another host, or a wildcard from a loopback socket are refused with the reason', () => {
    for (const addr of ['169.254.169.254:80', '127.0.0.1:3025', '[fe80::1]:22', '[::ffff:169.254.169.254]:80', '10.0.0.5:5432', 'postgres.internal:5432', '239.1.1.1:22']) {
      expect(() => directAddrs({ ssh: addr }, node(), SOURCE), addr).toThrow(expect.objectContaining({ code: 'GW_ERR_DIRECT_ADDR_REFUSED', hint: expect.stringContaining('wildcard') }));
    }
    expect(() => directAddrs({ ssh: '0.0.0.0:3022' }, node(), '127.0.0.1')).toThrow(expect.objectContaining({ code: 'GW_ERR_DIRECT_ADDR_REFUSED', message: expect.stringContaining('loopback') }));
    // A loopback address is refused even when the agent joined with it as a public address.
    expect(() => directAddrs({ ssh: '127.0.0.1:3022' }, node({ publicAddrs: ['127.0.0.1'] }), '127.0.0.1')).toThrow(expect.objectContaining({ code: 'GW_ERR_DIRECT_ADDR_REFUSED' }));
    expect(() => directAddrs({ kube: `${SOURCE}:3026` }, node({ roles: ['node'] }), SOURCE)).toThrow(expect.objectContaining({ code: 'GW_ERR_ACCESS_DENIED' }));
  });
});

describe('resourcesOf', () => {
  const all = { databases: [{ name: 'main' }], apps: [{ name: 'grafana' }], desktops: [{ name: 'win' }], kube_clusters: [{ name: 'prod' }], node_labels: { env: 'prod' }, node_host_cert: 'ssh-cert' };
  it('keeps the kinds the roles serve and never databases or apps', () => {
    expect(resourcesOf(all, node())).toEqual({ databases: [], apps: [], desktops: [{ name: 'win' }], kube_clusters: [{ name: 'prod' }], node_labels: { env: 'prod' }, node_host_cert: 'ssh-cert' });
  });
  it('hostile: an ssh-only agent cannot claim desktops or Kubernetes clusters; a desktop agent cannot claim node labels', () => {
    expect(resourcesOf(all, node({ roles: ['node'] }))).toEqual({ databases: [], apps: [], desktops: [], kube_clusters: [], node_labels: { env: 'prod' }, node_host_cert: 'ssh-cert' });
    expect(resourcesOf(all, node({ roles: ['desktop'] }))).toEqual({ databases: [], apps: [], desktops: [{ name: 'win' }], kube_clusters: [] });
  });
});

describe('connectedAtOf', () => {
  const now = Date.parse('2026-06-01T12:00:00.000Z');
  it('accepts now, a few seconds of skew either way, and any time after the join', () => {
    for (const at of ['2026-06-01T12:00:30.000Z', '2026-06-01T11:59:30.000Z', '2026-01-01T00:00:00.000Z', '2025-12-31T23:59:30.000Z']) {
      expect(connectedAtOf({ connected_at: at }, node(), now)).toBe(at);
    }
  });
  it('hostile: more than a minute ahead (9999-…) or before the join is refused with GW_ERR_DIRECT_CLOCK', () => {
    for (const at of ['9999-12-31T00:00:00.000Z', '2026-06-01T12:01:01.000Z', '2025-12-31T23:58:59.000Z']) {
      expect(() => connectedAtOf({ connected_at: at }, node(), now), at).toThrow(expect.objectContaining({ code: 'GW_ERR_DIRECT_CLOCK' }));
    }
    expect(() => connectedAtOf({ connected_at: 'soon' }, node(), now)).toThrow(expect.objectContaining({ code: 'GW_ERR_API_BAD_REQUEST' }));
  });
});
