/**
 * An agent's rollout group and health as the Proxy keeps them (issue 28; src/proxy/tunnel.ts, src/wire/autoupdate.ts
 * checkAgentHealth): the hello's upgrade_group and the `health` messages reach the presence record the Proxy writes,
 * a changed health is written within a heartbeat interval or so, and a hostile agent's health (10 000 checks, a
 * detail of almost a MiB, a measured_at in the future, wrong types) is ignored, logged once, nothing stored, the
 * tunnel kept. A real Auth Service and Proxy in this process, a real TunnelAgent.
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
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole, type ProxyRole } from '../../src/roles/proxy.js';
import type { AgentHealth } from '../../src/wire/autoupdate.js';
import { captureLogRecords } from '../helpers/logs.js';
import { echoAgentOptions } from '../helpers/tunnelagent.js';
import { waitUntil } from '../helpers/wait.js';

const logs = captureLogRecords<{ msg: string; hostId?: string; why?: string }>();

const CLUSTER = 'rollout-presence.example';
const PROXY_ID = '00000000-0000-4000-8000-0000000000c1';
let dir: string;
const authLife = new Lifecycle();
const proxyLife = new Lifecycle();
let auth: AuthRole;
let proxy: ProxyRole;
let echo: net.Server;
const agents: TunnelAgent[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-rollout-presence-'));
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const port = await getPort({ host: '127.0.0.1' });
  const yaml = ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'data')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', '  keep_alive_interval: 100ms', '  keep_alive_count_max: 50', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: 127.0.0.1:${port}`, ''].join('\n');
  const config = parseConfig(yaml, 'rollout presence test');
  const limits = new ConnectionLimits(limitSettings(config));
  authLife.onStop('backend', () => limits.close());
  auth = await startAuthRole({ config, limits, lifecycle: authLife });
  proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer: new Dialer({ env: {} }), lifecycle: proxyLife, proxyId: PROXY_ID });
});

afterAll(async () => {
  for (const a of agents) a.stop();
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

/** Every presence write of hostId from now on. */
function watchWrites(hostId: string): { writes: Presence[]; stop: () => void } {
  const writes: Presence[] = [];
  const stop = auth.auth.watchCluster({ presence: (e) => void (e.type === 'put' && e.presence.hostId === hostId && writes.push(e.presence)), proxies: () => undefined, resync: () => undefined });
  return { writes, stop };
}

const healthy = (marker: string): AgentHealth => ({ ok: true, checks: [{ name: 'tunnel', ok: true, detail: marker }, { name: 'db pg', ok: true }], measured_at: new Date().toISOString() });

describe('rollout group and health in the presence', () => {
  it("the hello's group and the agent's health are written, and a changed health is written again", async () => {
    const identity = await joinHost('group-agent');
    const w = watchWrites(identity.hostId);
    let current = healthy('first');
    const agent = new TunnelAgent(echoAgentOptions(identity, echo, { upgradeGroup: 'canary-eu', health: () => current }));
    agents.push(agent);
    try {
      agent.start();
      await waitUntil('a presence with the group and the first health', () => w.writes.some((p) => p.upgradeGroup === 'canary-eu' && p.health?.checks[0]?.detail === 'first'));
      const connectedAt = w.writes.at(-1)!.connectedAt;
      current = { ok: false, checks: [{ name: 'tunnel', ok: true, detail: 'second' }, { name: 'db pg', ok: false, detail: 'connect ECONNREFUSED' }], measured_at: new Date().toISOString() };
      agent.sendHealth(current);
      await waitUntil('the changed health written', () => w.writes.some((p) => p.health?.checks[0]?.detail === 'second'));
      const last = w.writes.at(-1)!;
      expect(last).toMatchObject({ upgradeGroup: 'canary-eu', connectedAt, health: { ok: false, checks: [{ name: 'tunnel', ok: true, detail: 'second' }, { name: 'db pg', ok: false, detail: 'connect ECONNREFUSED' }] } });
      // The Auth Service's view (what the rollout reads) has both.
      const seen = proxy.cluster.agents().find((p) => p.hostId === identity.hostId) as Presence | undefined;
      await waitUntil('the cluster view', () => (proxy.cluster.agents().find((p) => p.hostId === identity.hostId) as Presence | undefined)?.health?.ok === false);
      expect(seen?.upgradeGroup).toBe('canary-eu');
    } finally {
      w.stop();
      agent.stop();
    }
  });

  it('hostile: a group that is not a name is not kept', async () => {
    const identity = await joinHost('badgroup-agent');
    const w = watchWrites(identity.hostId);
    const agent = new TunnelAgent(echoAgentOptions(identity, echo, { upgradeGroup: 'Prod Group; rm -rf /', health: () => healthy('x') }));
    agents.push(agent);
    try {
      agent.start();
      await waitUntil('a presence with the health', () => w.writes.some((p) => p.health !== undefined));
      expect(w.writes.every((p) => p.upgradeGroup === undefined)).toBe(true);
    } finally {
      w.stop();
      agent.stop();
    }
  });

  it('hostile: 10 000 checks, a detail of almost a MiB, a future measured_at, wrong types: ignored, logged once, nothing stored, the tunnel kept', async () => {
    const identity = await joinHost('hostile-agent');
    const w = watchWrites(identity.hostId);
    const agent = new TunnelAgent(echoAgentOptions(identity, echo, { upgradeGroup: 'prod', health: () => healthy('good-1') }));
    agents.push(agent);
    try {
      agent.start();
      await waitUntil('the first health', () => w.writes.some((p) => p.health?.checks[0]?.detail === 'good-1'));
      const tunnel = proxy.tunnels.get(identity.hostId)!;
      const now = new Date().toISOString();
      const bad: unknown[] = [
        { ok: true, checks: Array.from({ length: 10_000 }, (_, i) => ({ name: `c${i}`, ok: true })), measured_at: now },
        // Under the control line's cap (a longer line drops the tunnel, as any message over it does).
        { ok: true, checks: [{ name: 'tunnel', ok: true, detail: 'x'.repeat(1024 * 1024 - 4096) }], measured_at: now },
        { ok: true, checks: [{ name: 'tunnel', ok: true }], measured_at: new Date(Date.now() + 24 * 3_600_000).toISOString() },
        { ok: 'yes', checks: [], measured_at: now },
        { ok: true, checks: 'all', measured_at: now },
        { ok: true, checks: [{ name: 7, ok: true }], measured_at: now },
        { ok: true, checks: [{ name: 'n'.repeat(65), ok: true }], measured_at: now },
        { ok: true, checks: [{ name: 'tunnel', ok: true, detail: 'line\u001b[2Jbreak' }], measured_at: now },
        { ok: true, checks: [], measured_at: 'yesterday' },
        { ok: true, checks: [], measured_at: now, upgrader: { result: 'up-to-date', at: now, code: 'rm -rf' } },
        'not an object',
      ];
      for (const h of bad) agent.sendHealth(h as AgentHealth);
      // Sent after the bad ones over the same control channel: once it is written, every bad one was handled.
      agent.sendHealth(healthy('good-2'));
      await waitUntil('the good health after the bad ones', () => w.writes.some((p) => p.health?.checks[0]?.detail === 'good-2'));
      // From the first health on (a write before it has none), only the good ones.
      const first = w.writes.findIndex((p) => p.health !== undefined);
      for (const p of w.writes.slice(first)) expect(['good-1', 'good-2']).toContain(p.health?.checks[0]?.detail);
      expect(w.writes.every((p) => (p.health?.checks.length ?? 0) <= 2)).toBe(true);
      // The same tunnel: never dropped.
      expect(proxy.tunnels.get(identity.hostId)).toBe(tunnel);
      const refused = logs.filter((l) => l.hostId === identity.hostId && /bad health message/.test(l.msg));
      expect(refused).toHaveLength(1);
      expect(refused[0]!.why).toMatch(/10000 checks/);
    } finally {
      w.stop();
      agent.stop();
    }
  });
});
