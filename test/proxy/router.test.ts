/**
 * The router's decisions (src/proxy/router.ts) over a real ClusterView fed by an in-memory directory: which
 * agents are seen, the order of the ways to reach one with their reasons, the next holder after a failing one,
 * the direct branch for agents joined directly, and the error that names the agent when nothing is left.
 * Streams are real socket pairs; the peers and the direct dialer are functions that record what they were asked.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ClusterWatchHandlers, ProxyDirectory } from '../../src/auth/proxyauth.js';
import type { Presence, ProxyRecord } from '../../src/auth/records.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ClusterView, DIRECT_PROXY_ID } from '../../src/proxy/cluster.js';
import { Router, type LocalTunnels } from '../../src/proxy/router.js';
import type { ConnectedAgent } from '../../src/proxy/tunnel.js';
import type { DialRequest } from '../../src/tunnel/protocol.js';

setRootLogger(createLogger({ level: 'silent' }));

const NONE = { databases: [], apps: [], desktops: [], kube_clusters: [] };
const DIAL: DialRequest = { service: 'app', resource: 'x', client_src: '192.0.2.1:1', client_dst: '192.0.2.2:443' };

function proxy(id: string, peer_addr?: string): ProxyRecord {
  return { id, nodename: id, version: '1', public_addr: `${id}:443`, ...(peer_addr ? { peer_addr } : {}), channels_digest: 'd', channels: {}, started_at: '', last_heartbeat: '' };
}

function presence(hostId: string, proxyId: string, connectedAt = '2026-01-01T00:00:00.000Z', extra: Partial<Presence> = {}): Presence {
  return { hostId, nodename: `node-${hostId}`, proxyId, services: ['app'], resources: { ...NONE, apps: [{ name: `app-${hostId}`, kind: 'tcp', labels: {} }] }, connectedAt, lastHeartbeat: connectedAt, ...extra };
}

let server: net.Server;
let port: number;
const sockets: net.Socket[] = [];

beforeAll(async () => {
  server = net.createServer((s) => sockets.push(s));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as net.AddressInfo).port;
});

afterAll(() => {
  for (const s of sockets) s.destroy();
  server.close();
});

const stream = (): Promise<Duplex> => new Promise((resolve) => {
  const s = net.connect(port, '127.0.0.1', () => resolve(s));
  sockets.push(s);
});

async function view(proxies: ProxyRecord[], presences: Presence[]): Promise<ClusterView> {
  const directory: ProxyDirectory = {
    heartbeatProxy: async () => undefined,
    removeProxy: async () => undefined,
    listProxies: async () => proxies,
    listPresence: async () => presences,
    tunnelStrategy: async () => ({ type: 'proxy_peering', agent_connection_count: 1 }),
    watchCluster: (_h: ClusterWatchHandlers) => () => undefined,
  };
  const v = new ClusterView({ directory, self: { id: 'self', nodename: 'self', version: '1', public_addr: 'self:443' }, channels: {}, heartbeatMs: 60_000, ttlMs: 180_000 });
  await v.start();
  return v;
}

function localTunnels(agents: Array<Partial<ConnectedAgent> & { hostId: string }> = []): LocalTunnels & { dials: string[] } {
  const dials: string[] = [];
  const list = agents.map((a) => ({ nodename: a.hostId, services: ['app'], resources: NONE, connectedAt: new Date(0), ...a }) as ConnectedAgent);
  return {
    dials,
    list: () => list,
    get: (id) => list.find((a) => a.hostId === id),
    dial: async (id) => {
      dials.push(id);
      return stream();
    },
  };
}

describe('Router', () => {
  it('keeps its list of agents while nothing changes (heartbeats renew presences) and builds it again when something does', async () => {
    let handlers: ClusterWatchHandlers | undefined;
    const directory: ProxyDirectory = {
      heartbeatProxy: async () => undefined,
      removeProxy: async () => undefined,
      listProxies: async () => [proxy('p1')],
      listPresence: async () => [presence('h1', 'p1')],
      tunnelStrategy: async () => ({ type: 'agent_mesh' }),
      watchCluster: (h) => {
        handlers = h;
        return () => undefined;
      },
    };
    const cluster = new ClusterView({ directory, self: { id: 'self', nodename: 'self', version: '1', public_addr: 'self:443' }, channels: {}, heartbeatMs: 60_000, ttlMs: 180_000 });
    await cluster.start();
    const tunnels = Object.assign(localTunnels([{ hostId: 'local' }]), { version: 0 });
    const r = new Router({ tunnels, cluster });
    const first = r.agents();
    expect(first.map((a) => a.hostId).sort()).toEqual(['h1', 'local']);
    // A heartbeat: the same connection, renewed.
    handlers!.presence({ type: 'put', presence: presence('h1', 'p1', '2026-01-01T00:00:00.000Z', { lastHeartbeat: '2026-01-01T00:00:20.000Z' }) });
    expect(r.agents()).toBe(first);
    // A new agent, a reconnect (new resources come with a new connection), a removal, a local tunnel: each is seen.
    handlers!.presence({ type: 'put', presence: presence('h2', 'p1') });
    const second = r.agents();
    expect(second.map((a) => a.hostId).sort()).toEqual(['h1', 'h2', 'local']);
    handlers!.presence({ type: 'put', presence: presence('h1', 'p1', '2026-01-02T00:00:00.000Z', { resources: { ...NONE, apps: [{ name: 'renamed', kind: 'tcp', labels: {} }] } }) });
    expect(r.agents().find((a) => a.hostId === 'h1')?.resources.apps[0]?.name).toBe('renamed');
    handlers!.presence({ type: 'delete', hostId: 'h2', proxyId: 'p1' });
    expect(r.agents().map((a) => a.hostId).sort()).toEqual(['h1', 'local']);
    tunnels.version++;
    (tunnels.list() as ConnectedAgent[]).push({ hostId: 'local-2', nodename: 'local-2', services: ['app'], resources: NONE, connectedAt: new Date(0) } as unknown as ConnectedAgent);
    expect(r.agents().map((a) => a.hostId).sort()).toEqual(['h1', 'local', 'local-2']);
    await cluster.close();
  });

  it('sees local agents and those other live Proxies hold; a local tunnel stands for its agent', async () => {
    const cluster = await view([proxy('p1', 'p1:3021'), proxy('gone-later')], [presence('h1', 'p1'), presence('h2', 'p1'), presence('h3', 'not-live'), presence('h4', DIRECT_PROXY_ID)]);
    const r = new Router({ tunnels: localTunnels([{ hostId: 'h2', nodename: 'local-h2' }]), cluster });
    const seen = r.agents().map((a) => `${a.hostId}:${a.nodename}`).sort();
    expect(seen).toEqual(['h1:node-h1', 'h2:local-h2', 'h4:node-h4']);
    await cluster.close();
  });

  it('plans local first, then each peer holding the agent, then direct, each with a reason', async () => {
    const cluster = await view([proxy('p1', 'p1:3021'), proxy('p2', 'p2:3021'), proxy('p3')], [presence('h', 'p1'), presence('h', 'p2'), presence('h', 'p3'), presence('h', DIRECT_PROXY_ID)]);
    const r = new Router({ tunnels: localTunnels([{ hostId: 'h' }]), cluster, peers: { dial: () => stream() }, direct: () => stream() });
    const plan = r.plan('h');
    expect(plan.map((d) => (d.via === 'peer' ? `peer ${d.proxyId}` : d.via))).toEqual(['local', 'peer p1', 'peer p2', 'direct', 'none']);
    expect(plan.at(-1)!.reason).toContain('Proxy p3 holds a tunnel but publishes no peering address');
    await cluster.close();
  });

  it("end-to-end streams: lists the peers whose presence offers them (with the capability), in plan order; else why none", async () => {
    const e2e = { v: 1 as const, pool: 2, peered: true as const };
    const cluster = await view(
      [proxy('p1', 'p1:3021'), proxy('p2', 'p2:3021'), proxy('p3')],
      [presence('h', 'p1'), presence('h', 'p2', undefined, { e2e }), presence('h', 'p3', undefined, { e2e }), presence('old', 'p1'), presence('d', DIRECT_PROXY_ID)],
    );
    const r = new Router({ tunnels: localTunnels([{ hostId: 'local' }]), cluster, peers: { dial: () => stream() }, direct: () => stream() });
    expect(r.e2ePeers('h').peers).toEqual([{ proxyId: 'p2', peerAddr: 'p2:3021', capability: e2e }]);
    // A peer that does not say it (an earlier version) is no way for end-to-end streams; nor is a direct join.
    const none = r.e2ePeers('old');
    expect(none.peers).toEqual([]);
    expect(none.reason).toContain('its tunnel to Proxy p1 offers no end-to-end streams');
    expect(r.e2ePeers('d').peers).toEqual([]);
    expect(r.e2ePeers('d').reason).toContain('joined directly');
    // Peering off on this Proxy: no peer step at all.
    const off = new Router({ tunnels: localTunnels(), cluster });
    expect(off.e2ePeers('h').peers).toEqual([]);
    expect(off.e2ePeers('h').reason).toContain('peering is off on this Proxy');
    await cluster.close();
  });

  it('a failing holder is skipped for the next one; the stream comes from the one that answered', async () => {
    const cluster = await view([proxy('p1', 'p1:3021'), proxy('p2', 'p2:3021')], [presence('h', 'p1'), presence('h', 'p2')]);
    const asked: string[] = [];
    const peers = {
      dial: async (p: ProxyRecord) => {
        asked.push(p.id);
        if (p.id === 'p1') throw new GatewayError('GW_ERR_PEER_UNREACHABLE', 'p1 is down');
        return stream();
      },
    };
    const r = new Router({ tunnels: localTunnels(), cluster, peers });
    const s = await r.dial('h', DIAL);
    expect(asked).toEqual(['p1', 'p2']);
    s.destroy();
    await cluster.close();
  });

  it('the agent answering that the resource failed ends the search (another way would get the same answer)', async () => {
    const cluster = await view([proxy('p1', 'p1:3021'), proxy('p2', 'p2:3021')], [presence('h', 'p1'), presence('h', 'p2')]);
    const asked: string[] = [];
    const peers = {
      dial: async (p: ProxyRecord): Promise<Duplex> => {
        asked.push(p.id);
        throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', 'connection refused by the resource');
      },
    };
    await expect(new Router({ tunnels: localTunnels(), cluster, peers }).dial('h', DIAL)).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_DIAL_FAILED' });
    expect(asked).toEqual(['p1']);
    await cluster.close();
  });

  it('an agent joined directly is reached by the direct dialer with its presence', async () => {
    const cluster = await view([], [presence('d', DIRECT_PROXY_ID, undefined, { nodename: 'direct-node' })]);
    const got: Presence[] = [];
    const r = new Router({ tunnels: localTunnels(), cluster, direct: async (p) => (got.push(p), stream()) });
    (await r.dial('d', DIAL)).destroy();
    expect(got.map((p) => p.nodename)).toEqual(['direct-node']);
    await cluster.close();
  });

  it('nothing left: GW_ERR_TUNNEL_NOT_FOUND naming the agent and every reason; all failed: the last error, the others listed', async () => {
    const cluster = await view([proxy('p1', 'p1:3021'), proxy('p2', 'p2:3021')], [presence('h', 'p1'), presence('h', 'p2')]);
    const none = new Router({ tunnels: localTunnels(), cluster });
    await expect(none.dial('h', DIAL)).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_NOT_FOUND', message: expect.stringContaining('agent "node-h" (h) is not reachable from this Proxy: no tunnel to this Proxy; Proxy p1 holds a tunnel but peering is off') });
    const down = { dial: async (p: ProxyRecord): Promise<Duplex> => { throw new GatewayError('GW_ERR_PEER_UNREACHABLE', `${p.id} is down`); } };
    await expect(new Router({ tunnels: localTunnels(), cluster, peers: down }).dial('h', DIAL)).rejects.toMatchObject({
      code: 'GW_ERR_PEER_UNREACHABLE',
      message: expect.stringMatching(/^p2 is down \(also tried: peer p1: p1 is down\)$/),
    });
    await cluster.close();
  });
});
