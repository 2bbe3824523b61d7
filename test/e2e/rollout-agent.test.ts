/**
 * An agent's side of a managed rollout, end to end (issue 28; docs/upgrades.md "Managed rollouts: the agent's
 * side"): real daemons, an Auth Service with its Proxy and an agent whose only way out is a real squid (the
 * Proxy's name exists only in squid's hosts file). The agent's group (gateway.upgrade_group) and its own health
 * (its tunnel, its PostgreSQL-speaking resource answering or not, its upgrader's last run) reach the presence the
 * Proxy writes, as `gwctl get nodes -f json` shows it; a resource that stops answering turns the health not ok; an
 * upgrader that never ran is stale after gateway.upgrade_stale_after: a warning, the metric, an `upgrader` check
 * that does not make the health fail. Then the built gateway-upgrade asks the real Proxy for its instruction.
 */
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { waitUntil } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.5';
const PROXY_NAME = 'proxy.rollout.test';

let dir: string;
let squid: Squid;
let cluster: RunningGateway;
let agent: RunningGateway;
let db: net.Server;
let dbPort: number;
let diagPort: number;
let upgradeRoot: string;
let webPort: number;

const admin = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });

interface NodeSpec {
  hostname: string;
  status: string;
  version?: string;
  upgrade_group?: string;
  health?: { ok: boolean; checks: Array<{ name: string; ok: boolean; detail?: string }>; measured_at: string };
}
async function node(name: string): Promise<NodeSpec | undefined> {
  const r = await admin(['get', 'nodes', '-f', 'json']);
  const all = JSON.parse(r.stdout) as Array<{ spec: NodeSpec }> | { spec: NodeSpec };
  return (Array.isArray(all) ? all : [all]).map((n) => n.spec).find((s) => s.hostname === name);
}

function listenDb(port: number): Promise<net.Server> {
  const s = net.createServer((c) => c.destroy());
  return new Promise((resolve) => s.listen(port, '127.0.0.1', () => resolve(s)));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-rollout-'));
  await chmod(dir, 0o755); // squid reads its hosts file there
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  webPort = await getPort({ host: PROXY_IP });
  const authPort = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: rollout.example', `  listen_addr: 127.0.0.1:${authPort}`, '  keep_alive_interval: 1s', 'proxy_service:', `  web_listen_addr: ${PROXY_IP}:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n'),
  );
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node,db', '--format', 'json'])).stdout) as { token: string }).token;
  dbPort = await getPort({ host: '127.0.0.1' });
  db = await listenDb(dbPort);
  diagPort = await getPort({ host: '127.0.0.1' });
  // The upgrader is installed (its directory exists) and has never run: stale after 3 s.
  upgradeRoot = join(dir, 'root');
  await mkdir(join(upgradeRoot, 'etc', 'gateway-upgrade.d'), { recursive: true });
  agent = await startGateway(
    [
      'gateway:',
      '  nodename: node-canary',
      '  data_dir: DATA_DIR',
      '  upgrade_group: canary-eu',
      '  upgrade_stale_after: 3s',
      `  diag_addr: 127.0.0.1:${diagPort}`,
      '  log: { format: json }',
      // The agent measures its health every heartbeat interval (as it heartbeats).
      'auth_service:',
      '  enabled: no',
      '  keep_alive_interval: 1s',
      'ssh_service:',
      '  enabled: yes',
      'db_service:',
      '  enabled: yes',
      '  databases:',
      `    - { name: pg, protocol: postgres, uri: "127.0.0.1:${dbPort}" }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squid.url, NO_PROXY: '127.0.0.1', GATEWAY_UPGRADE_ROOT: upgradeRoot } },
  );
  await agent.waitForLog('reverse tunnel ready');
}, 90_000);

afterAll(async () => {
  await agent?.stop();
  await cluster?.stop();
  db?.close();
  await squid?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe("the agent's group and health in its presence", () => {
  it('the group from its config and its health (tunnel, resource) are in `gwctl get nodes`; the tunnel went through squid', async () => {
    await waitUntil('the health in the presence', async () => (await node('node-canary'))?.health?.checks.some((c) => c.name === 'db pg' && c.ok) === true, 30_000);
    const spec = (await node('node-canary'))!;
    expect(spec).toMatchObject({ status: 'online', upgrade_group: 'canary-eu', health: { ok: true } });
    expect(spec.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(spec.health!.checks.find((c) => c.name === 'tunnel')).toMatchObject({ ok: true });
    expect((await squid.readAccessLog()).some((l) => l.includes(`CONNECT ${PROXY_NAME}:`))).toBe(true);
  });

  it('a resource that stops answering turns the health not ok, and back', async () => {
    await new Promise<void>((resolve) => db.close(() => resolve()));
    await waitUntil('the health not ok', async () => (await node('node-canary'))?.health?.ok === false, 30_000);
    expect((await node('node-canary'))!.health!.checks.find((c) => c.name === 'db pg')).toMatchObject({ ok: false });
    db = await listenDb(dbPort);
    await waitUntil('the health ok again', async () => (await node('node-canary'))?.health?.ok === true, 30_000);
  });

  it('an upgrader that never ran is stale: one warning naming the timer, the metric, an upgrader check that does not fail the health', async () => {
    await waitUntil('the upgrader check failing', async () => (await node('node-canary'))?.health?.checks.some((c) => c.name === 'upgrader' && !c.ok) === true, 30_000);
    const spec = (await node('node-canary'))!;
    expect(spec.health!.ok).toBe(true);
    expect(spec.health!.checks.find((c) => c.name === 'upgrader')!.detail).toContain('gateway-upgrade.timer');
    await agent.waitForLog('the upgrader is stale');
    const metrics = await (await fetch(`http://127.0.0.1:${diagPort}/metrics`)).text();
    expect(metrics).toMatch(/^gateway_agent_upgrade_stale 1$/m);
  });
});

describe('gateway-upgrade asks the real Proxy', () => {
  it("with the agent's host ID: a Proxy with no rollout keeps the channel's behaviour", async () => {
    const etc = join(upgradeRoot, 'etc', 'gateway-upgrade.d');
    await writeFile(join(etc, 'endpoint'), `${PROXY_NAME}:${webPort}/v1/webapi/automaticupgrades/channel/default\n`);
    const r = await runCli('gateway-upgrade', ['dry-run', '-f', 'json'], {
      env: {
        GATEWAY_UPGRADE_ROOT: upgradeRoot,
        GATEWAY_UPGRADE_DATA_DIR: agent.dataDir,
        GATEWAY_UPGRADE_VERSION_COMMAND: 'echo Gateway v0.0.1',
        GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball',
        HTTPS_PROXY: squid.url,
      },
      timeoutMs: 60_000,
    });
    expect(r.status, r.stderr).toBe(0);
    const report = JSON.parse(r.stdout) as { installed_version: string; target_version: string | null; rollout: { managed: boolean } | null };
    expect(report.installed_version).toBe('0.0.1');
    // Before the rollout's endpoint exists the Proxy answers 404; after, managed:false while no autoupdate_config is set.
    expect(report.rollout === null || report.rollout.managed === false).toBe(true);
    expect(report.target_version).not.toBeNull();
    const text = await runCli('gateway-upgrade', ['dry-run'], {
      env: { GATEWAY_UPGRADE_ROOT: upgradeRoot, GATEWAY_UPGRADE_DATA_DIR: agent.dataDir, GATEWAY_UPGRADE_VERSION_COMMAND: 'echo Gateway v0.0.1', GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball', HTTPS_PROXY: squid.url },
      timeoutMs: 60_000,
    });
    expect(text.stdout).toContain('an upgrade is available (0.0.1 -> ');
    expect(text.stdout).toMatch(/rollout: none, the channel decides: /);
  });
});
