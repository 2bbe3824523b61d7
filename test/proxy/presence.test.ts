/**
 * Agent presence as the Proxy writes it (src/proxy/tunnel.ts) and as the cluster reads it (presenceCounts in
 * src/auth/records.ts, src/proxy/cluster.ts): heartbeats do not rewrite it, it is refreshed every
 * PRESENCE_REFRESH_BEATS heartbeat intervals, and a record counts only while the Proxy that wrote it is live and
 * from that Proxy's current run. A real Auth Service and Proxy in this process, a real agent.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { TunnelAgent } from '../../src/agent/tunnel.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import type { Presence } from '../../src/auth/records.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { PRESENCE_REFRESH_BEATS } from '../../src/proxy/tunnel.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole, type ProxyRole } from '../../src/roles/proxy.js';
import { echoAgentOptions } from '../helpers/tunnelagent.js';
import { waitUntil } from '../helpers/wait.js';

setRootLogger(createLogger({ level: 'silent' }));

const CLUSTER = 'presence.example';
const PROXY_ID = '00000000-0000-4000-8000-0000000000b1';
let dir: string;
const authLife = new Lifecycle();
const proxyLife = new Lifecycle();
let auth: AuthRole;
let proxy: ProxyRole;
let agent: TunnelAgent | undefined;
let echo: net.Server;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-presence-'));
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s)); // a relay that breaks resets it (an RST, not a FIN)
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const port = await getPort({ host: '127.0.0.1' });
  // Short heartbeats, so that a refresh comes within the test (15 intervals).
  const yaml = ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'data')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', '  keep_alive_interval: 100ms', '  keep_alive_count_max: 20', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: 127.0.0.1:${port}`, ''].join('\n');
  const config = parseConfig(yaml, 'presence test');
  const limits = new ConnectionLimits(limitSettings(config));
  authLife.onStop('backend', () => limits.close());
  auth = await startAuthRole({ config, limits, lifecycle: authLife });
  proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer: new Dialer({ env: {} }), lifecycle: proxyLife, proxyId: PROXY_ID });
});

afterAll(async () => {
  agent?.stop();
  await proxyLife.stop().catch(() => undefined);
  await authLife.stop().catch(() => undefined);
  echo?.close();
  await rm(dir, { recursive: true, force: true });
});

async function joinHost(nodename: string): Promise<HostIdentity> {
  const keys = generateKeyPair();
  const bundle = await auth.auth.joinLocal({ roles: ['db'], nodename, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  const agentDir = join(dir, nodename);
  saveHostIdentity(agentDir, keys.privateKeyPem, bundle, { roles: ['db'], nodename, server: proxy.addresses.web!, joinedVia: 'proxy' });
  return loadHostIdentity(agentDir)!;
}

/** What `gwctl get nodes` says of the agent. */
const online = async (hostId: string) => {
  const nodes = await auth.auth.getResources(auth.auth.adminIdentity(), 'node', hostId, false);
  return (nodes[0]?.spec as { status?: string } | undefined)?.status === 'online';
};
const inView = (hostId: string) => proxy.cluster.agents().some((p) => p.hostId === hostId);

describe('agent presence', () => {
  it('is written when the tunnel comes up, not on every heartbeat, and refreshed after PRESENCE_REFRESH_BEATS intervals', async () => {
    const identity = await joinHost('busy-agent');
    const writes: Presence[] = [];
    const unwatch = auth.auth.watchCluster({ presence: (e) => void (e.type === 'put' && e.presence.hostId === identity.hostId && writes.push(e.presence)), proxies: () => undefined, resync: () => undefined });
    try {
      agent = new TunnelAgent(echoAgentOptions(identity, echo));
      agent.start();
      await waitUntil('the first presence', () => writes.length === 1);
      const connectedAt = writes[0]!.connectedAt;
      // Heartbeats arrive (the Proxy's record of the agent's last heartbeat moves) without a presence write.
      const seen = new Set<number>();
      await waitUntil('three heartbeats at the Proxy', () => {
        const a = proxy.tunnels.get(identity.hostId);
        if (a) seen.add(a.lastHeartbeat.getTime());
        return seen.size >= 4;
      });
      // Fewer heartbeats than a refresh takes have passed since the first write: still one write.
      expect(seen.size).toBeLessThan(PRESENCE_REFRESH_BEATS);
      expect(writes).toHaveLength(1);
      await waitUntil('a refresh', () => writes.length >= 2, 30_000);
      expect(writes[1]).toMatchObject({ hostId: identity.hostId, proxyId: PROXY_ID, connectedAt });
      expect(writes[1]!.lastHeartbeat > writes[0]!.lastHeartbeat).toBe(true);
      expect(await online(identity.hostId)).toBe(true);
      expect(inView(identity.hostId)).toBe(true);
    } finally {
      unwatch();
      agent?.stop();
      agent = undefined;
    }
    await waitUntil('the presence cleared when the tunnel closed', async () => !(await online(identity.hostId)));
  });

  it('hostile: an agent reporting over its tunnel a kind it may not report is not recorded; its sessions are, via this Proxy (issue 23)', async () => {
    const identity = await joinHost('reporting-agent');
    const events = async () => (await auth.auth.listEvents(auth.auth.adminIdentity(), 500)).map((e) => e.event).filter((e) => (e.reported_by as { host_id?: string } | undefined)?.host_id === identity.hostId);
    agent = new TunnelAgent(echoAgentOptions(identity, echo));
    try {
      agent.start();
      await waitUntil('the tunnel', () => proxy.tunnels.get(identity.hostId) !== undefined);
      // Sent in this order over one control channel, relayed in order: once the last is recorded, the others were handled.
      agent.sendEvent({ event: 'user.login', user: 'alice', source: '203.0.113.7', method: 'local' });
      agent.sendEvent({ event: 'lock.create', name: 'forged' });
      agent.sendEvent({ event: 'db.session.start', user: 'alice', db: 'pg', by: { kind: 'admin', name: 'admin' } });
      await waitUntil('the session event recorded', async () => (await events()).length > 0);
      const recorded = await events();
      expect(recorded).toEqual([expect.objectContaining({ event: 'db.session.start', reported_by: { host_id: identity.hostId, nodename: 'reporting-agent', via: PROXY_ID } })]);
      expect(recorded[0]!.by).toBeUndefined();
    } finally {
      agent.stop();
      agent = undefined;
    }
  });

  it('does not count a record of an earlier run of a live Proxy, nor one of a Proxy that has no record (hostile: stale or forged presence)', async () => {
    const stale = await joinHost('stale-agent');
    const orphan = await joinHost('orphan-agent');
    const record = (hostId: string, proxyId: string, connectedAt: string): Presence => ({ hostId, nodename: 'x', proxyId, services: ['db'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] }, connectedAt, lastHeartbeat: connectedAt });
    // This Proxy is live, but the record's tunnel predates its start (a restart under the same ID: the record of
    // the previous run has not expired yet).
    await auth.auth.setPresence(record(stale.hostId, PROXY_ID, '2000-01-01T00:00:00.000Z'), 600_000);
    // A Proxy that never wrote its record (or whose record expired: it died).
    await auth.auth.setPresence(record(orphan.hostId, 'dead-proxy', new Date().toISOString()), 600_000);
    await waitUntil('the view has both records', () => {
      const ids = new Set((proxy.cluster as unknown as { presence: Map<string, unknown> }).presence.keys());
      return ids.has(stale.hostId) && ids.has(orphan.hostId);
    });
    expect(inView(stale.hostId)).toBe(false);
    expect(inView(orphan.hostId)).toBe(false);
    expect(proxy.cluster.locations(stale.hostId)).toEqual([]);
    expect(proxy.cluster.presenceOf(stale.hostId, PROXY_ID)).toBeUndefined();
    expect(await online(stale.hostId)).toBe(false);
    expect(await online(orphan.hostId)).toBe(false);
  });
});
