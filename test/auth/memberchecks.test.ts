/**
 * What a Proxy may write about an agent (src/auth/memberchecks.ts), at unit level: host IDs that are not host IDs,
 * hosts that are not agents, resources beyond the agent's join roles or malformed, and times a tunnel cannot have.
 * The routes that use these run against a real Auth API in proxyapi.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { agentNode, checkHostId, checkPresenceProof, PRESENCE_SKEW_MS, proxyPresence, servedResources } from '../../src/auth/memberchecks.js';
import { generateKeyPair, signPresenceProof } from '../../src/auth/pki.js';
import type { NodeRecord } from '../../src/auth/records.js';

const NOW = Date.parse('2030-01-01T12:00:00.000Z');
const node = (roles: NodeRecord['roles']): NodeRecord => ({ hostId: 'f00d-1', nodename: 'joined-name', roles, publicAddrs: [], joinedAt: '2030-01-01T00:00:00.000Z' });
const at = (ms: number) => new Date(ms).toISOString();

describe('checkHostId', () => {
  it('takes host IDs and refuses paths, empty and non-strings', () => {
    expect(checkHostId('7d4a5c3e-0000-4000-8000-0000000dd001')).toBe('7d4a5c3e-0000-4000-8000-0000000dd001');
    for (const bad of ['a/b/../c', '../nodes/x', '', '.hidden', 'x'.repeat(129), 'a b', 7, null, undefined, { toString: () => 'x' }]) {
      expect(() => checkHostId(bad), String(bad)).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' }));
    }
    expect(() => checkHostId('a/b', 'GW_ERR_MEMBER_EVENT_REFUSED')).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' }));
  });
});

describe('agentNode', () => {
  it('refuses a host that never joined, and one that joined as a Proxy only', () => {
    expect(() => agentNode('x', undefined)).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' }));
    expect(() => agentNode('x', node(['proxy']))).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' }));
    expect(agentNode('x', node(['proxy', 'node'])).roles).toEqual(['proxy', 'node']);
  });
});

describe('servedResources', () => {
  const all = {
    databases: [{ name: 'pg', protocol: 'postgres', labels: { env: 'prod' } }],
    apps: [{ name: 'grafana', kind: 'http', labels: {}, public_addr: 'grafana.example.com' }],
    desktops: [{ name: 'win', labels: {} }],
    kube_clusters: [{ name: 'prod', labels: {} }],
    node_labels: { env: 'prod' },
    node_host_cert: 'ssh-ed25519-cert-v01@openssh.com AAAA',
  };

  it('keeps only the kinds the join roles serve', () => {
    expect(servedResources(all, node(['db']))).toEqual({ databases: all.databases, apps: [], desktops: [], kube_clusters: [] });
    expect(servedResources(all, node(['node']))).toEqual({ databases: [], apps: [], desktops: [], kube_clusters: [], node_labels: all.node_labels, node_host_cert: all.node_host_cert });
    expect(servedResources(all, node(['app', 'kube', 'desktop']))).toEqual({ databases: [], apps: all.apps, desktops: all.desktops, kube_clusters: all.kube_clusters });
  });

  it('hostile: drops malformed items and unknown fields, keeps the well-formed ones', () => {
    const r = servedResources(
      {
        databases: [
          { name: 'ok', protocol: 'mysql', labels: {}, extra: 'dropped' },
          { name: 'bad-protocol', protocol: 'oracle', labels: {} },
          { name: '', protocol: 'postgres', labels: {} },
          { name: 'bad-labels', protocol: 'postgres', labels: { n: 7 } },
          { name: 'too-many-labels', protocol: 'postgres', labels: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, 'v'])) },
          'not an object',
          null,
        ],
        apps: [{ name: 'a', kind: 'gopher', labels: {} }, { name: 'b', kind: 'tcp', public_addr: 7 }],
      },
      node(['db', 'app']),
    );
    expect(r.databases).toEqual([{ name: 'ok', protocol: 'mysql', labels: {} }]);
    expect(r.apps).toEqual([]);
    expect(servedResources('not an object', node(['db']))).toEqual({ databases: [], apps: [], desktops: [], kube_clusters: [] });
  });
});

describe('proxyPresence', () => {
  const sent = (extra: Record<string, unknown> = {}) => ({
    hostId: 'f00d-1', nodename: 'forged-name', proxyId: 'ignored', services: ['ssh', 'db', 'db', 'bogus'],
    resources: { databases: [{ name: 'pg', protocol: 'postgres', labels: {} }], apps: [], desktops: [], kube_clusters: [] },
    connectedAt: at(NOW - 1000), lastHeartbeat: at(NOW), version: '1.2.3', channel: 'stable', direct: { ssh: '10.0.0.1:22' }, ...extra,
  });

  it('rebuilds the record: the joined nodename, the caller as proxyId, services the roles serve, no direct listener', () => {
    const p = proxyPresence(sent(), node(['db']), 'proxy-1', NOW);
    expect(p).toEqual({ hostId: 'f00d-1', nodename: 'joined-name', proxyId: 'proxy-1', services: ['db'], resources: { databases: [{ name: 'pg', protocol: 'postgres', labels: {} }], apps: [], desktops: [], kube_clusters: [] }, connectedAt: at(NOW - 1000), lastHeartbeat: at(NOW), version: '1.2.3', channel: 'stable' });
  });

  it('hostile: refuses times the tunnel cannot have (ahead of this clock, before the join, not a time)', () => {
    for (const extra of [{ connectedAt: at(NOW + PRESENCE_SKEW_MS + 1000) }, { lastHeartbeat: at(NOW + PRESENCE_SKEW_MS + 1000) }, { connectedAt: '2029-12-31T23:00:00.000Z' }, { connectedAt: 'yesterday' }, { lastHeartbeat: 7 }]) {
      expect(() => proxyPresence(sent(extra), node(['db']), 'proxy-1', NOW), JSON.stringify(extra)).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' }));
    }
  });

  it('drops software fields that are not short printable strings', () => {
    const p = proxyPresence(sent({ version: 'x\n', channel: 'c'.repeat(200) }), node(['db']), 'proxy-1', NOW);
    expect(p.version).toBeUndefined();
    expect(p.channel).toBeUndefined();
  });

  it("keeps a rollout group and an agent's health only when they pass the Proxy's own checks (issue 28)", () => {
    const health = { ok: true, checks: [{ name: 'tunnel', ok: true }], measured_at: at(NOW - 500) };
    expect(proxyPresence(sent({ upgradeGroup: 'prod', health }), node(['db']), 'proxy-1', NOW)).toMatchObject({ upgradeGroup: 'prod', health });
    const bad = proxyPresence(
      sent({ upgradeGroup: 'Prod Group', health: { ...health, checks: Array.from({ length: 10_000 }, (_, i) => ({ name: `c${i}`, ok: true })) } }),
      node(['db']),
      'proxy-1',
      NOW,
    );
    expect(bad.upgradeGroup).toBeUndefined();
    expect(bad.health).toBeUndefined();
    expect(proxyPresence(sent({ health: { ...health, measured_at: at(NOW + 3_600_000) } }), node(['db']), 'proxy-1', NOW).health).toBeUndefined();
  });

  it("keeps the tunnel's end-to-end capability (other Proxies grant over peering by it) only as e2eCapabilityOf reads it", () => {
    expect(proxyPresence(sent({ e2e: { v: 1, pool: 2, kube: true, peered: true } }), node(['db']), 'proxy-1', NOW).e2e).toEqual({ v: 1, pool: 2, kube: true, peered: true });
    expect(proxyPresence(sent({ e2e: { v: 1, pool: 1000, extra: 'x'.repeat(10_000) } }), node(['db']), 'proxy-1', NOW).e2e).toEqual({ v: 1, pool: 8 });
    for (const bad of [{ v: 2, pool: 2 }, { v: 1, pool: 0 }, 'yes', null, [1]]) {
      expect(proxyPresence(sent({ e2e: bad }), node(['db']), 'proxy-1', NOW), JSON.stringify(bad)).not.toHaveProperty('e2e');
    }
  });
});

describe("checkPresenceProof (the agent's signature of its presence through one Proxy)", () => {
  const keys = generateKeyPair();
  const signer = { ...node(['node']), sshPublicKey: keys.sshPublicKey };
  const services = ['ssh'];
  const resources = { databases: [], apps: [], desktops: [], kube_clusters: [], node_labels: { env: 'prod', team: 'a' } };
  const signed = (claim: { proxyId?: string; resources?: unknown }, now = NOW, key = keys.privateKeyPem) =>
    signPresenceProof(key, signer.hostId, 'members.example', { proxyId: claim.proxyId ?? 'proxy-1', services, resources: claim.resources ?? resources }, now);
  const check = (value: Record<string, unknown>, n: NodeRecord = signer) => checkPresenceProof({ services, resources, ...value }, n, 'proxy-1', 'members.example', NOW);

  it('holds for the Proxy, services and resources the agent signed, whatever the key order; the SSH host certificate is not covered', () => {
    expect(check({ proof: signed({}) })).toBe(true);
    expect(check({ proof: signed({}), resources: { node_labels: { team: 'a', env: 'prod' }, kube_clusters: [], desktops: [], apps: [], databases: [], node_host_cert: 'renewed' } })).toBe(true);
  });

  it('without a proof: taken from an agent that never signed, refused from one that has', () => {
    expect(check({})).toBe(false);
    expect(() => check({}, { ...signer, signsPresence: true })).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' }));
  });

  it('hostile: a proof for another Proxy, other labels, another key, or too old is refused', () => {
    const cases: Array<[string, Record<string, unknown>]> = [
      ['another Proxy', { proof: signed({ proxyId: 'proxy-2' }) }],
      ['forged labels', { proof: signed({}), resources: { ...resources, node_labels: { env: 'dev', team: 'a' } } }],
      ['a resource added', { proof: signed({}), resources: { ...resources, databases: [{ name: 'payroll', protocol: 'postgres', labels: {} }] } }],
      ['another key', { proof: signed({}, NOW, generateKeyPair().privateKeyPem) }],
      ['too old', { proof: signed({}, NOW - 10 * 60_000) }],
      ['garbage', { proof: { time: 'x', signature: 7 } }],
    ];
    for (const [what, value] of cases) expect(() => check(value), what).toThrow(expect.objectContaining({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' }));
  });
});
