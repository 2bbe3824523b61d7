/**
 * An agent with the upgrader installed exports the cluster's maintenance windows for it: at start, and again
 * as soon as an admin changes cluster_maintenance_config (the Proxy tells connected agents over the tunnel's
 * control channel). Real daemons on loopback; the upgrader's directory sits under GATEWAY_UPGRADE_ROOT.
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let scheduleFile: string;

const admin = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });

async function scheduleLines(): Promise<string[]> {
  try {
    return (await readFile(scheduleFile, 'utf8')).split('\n').filter((l) => l.trim() !== '' && !l.startsWith('#'));
  } catch {
    return [];
  }
}

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-sched-'));
  const upgradeRoot = join(dir, 'root');
  await mkdir(join(upgradeRoot, 'etc', 'gateway-upgrade.d'), { recursive: true });
  scheduleFile = join(upgradeRoot, 'etc', 'gateway-upgrade.d', 'schedule');
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: sched.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: localhost:${port}`, ''].join('\n'),
  );
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(['gateway:', '  nodename: node-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n'), {
    args: ['--token', token, '--ca-pin', pin, '--proxy', `localhost:${port}`],
    env: { GATEWAY_UPGRADE_ROOT: upgradeRoot },
  });
  await agent.waitForLog('reverse tunnel ready');
}, 60_000);

afterAll(async () => {
  await agent?.stop();
  await cluster?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('the agent exports the maintenance schedule for its upgrader', () => {
  it('writes the file with no window while the cluster has none', async () => {
    await until(async () => (await readFile(scheduleFile, 'utf8').catch(() => '')).startsWith('#'), 'the schedule file');
    expect(await scheduleLines()).toEqual([]);
  });

  it('rewrites it as soon as cluster_maintenance_config changes: one-hour windows at the UTC hour', async () => {
    const manifest = join(dir, 'maintenance.yaml');
    await writeFile(manifest, 'kind: cluster_maintenance_config\nspec:\n  agent_upgrades:\n    utc_start_hour: 4\n    weekdays: ["*"]\n');
    expect((await admin(['create', manifest])).stdout).toContain('maintenance window has been updated');
    await until(async () => (await scheduleLines()).length > 0, 'windows in the schedule file');
    const windows = (await scheduleLines()).map((l) => l.split(' ').map(Number) as [number, number]);
    for (const [start, stop] of windows) {
      expect(stop - start).toBe(3600);
      expect(new Date(start * 1000).getUTCHours()).toBe(4);
    }
    expect(windows.length).toBeGreaterThanOrEqual(7);
  });
});
