/**
 * An agent with the upgrader installed exports the cluster's maintenance windows for it: at start, and again
 * as soon as an admin changes cluster_maintenance_config (the Proxy tells connected agents over the tunnel's
 * control channel). Real daemons on loopback; the upgrader's directory sits under GATEWAY_UPGRADE_ROOT. A
 * Kubernetes agent writes its host id beside its schedule, and the Kubernetes updater's instruction source, asking
 * this real Proxy while no rollout is set, gets an unmanaged answer (so the channel decides, as the seed's).
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { instructionSource, instructionUrl } from '../../src/upgrade/kube/instruction.js';
import { waitUntil } from '../helpers/wait.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let scheduleFile: string;
let proxyPort: number;
let pin: string;

const admin = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });

async function scheduleLines(): Promise<string[]> {
  try {
    return (await readFile(scheduleFile, 'utf8')).split('\n').filter((l) => l.trim() !== '' && !l.startsWith('#'));
  } catch {
    return [];
  }
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-sched-'));
  const upgradeRoot = join(dir, 'root');
  await mkdir(join(upgradeRoot, 'etc', 'gateway-upgrade.d'), { recursive: true });
  scheduleFile = join(upgradeRoot, 'etc', 'gateway-upgrade.d', 'schedule');
  const port = (proxyPort = await getPort({ host: '127.0.0.1' }));
  // The Auth API on a port of its own too: with 127.0.0.1:0 the kernel once gave it the very port get-port had
  // just found free for the web listener (get-port does not hold a port), and the daemon failed with EADDRINUSE.
  const authPort = await getPort({ host: '127.0.0.1', exclude: [port] });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: sched.example', `  listen_addr: 127.0.0.1:${authPort}`, 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: localhost:${port}`, ''].join('\n'),
  );
  pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
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
    await waitUntil('the schedule file', async () => (await readFile(scheduleFile, 'utf8').catch(() => '')).startsWith('#'));
    expect(await scheduleLines()).toEqual([]);
  });

  it('rewrites it as soon as cluster_maintenance_config changes: one-hour windows at the UTC hour', async () => {
    const manifest = join(dir, 'maintenance.yaml');
    await writeFile(manifest, 'kind: cluster_maintenance_config\nspec:\n  agent_upgrades:\n    utc_start_hour: 4\n    weekdays: ["*"]\n');
    expect((await admin(['create', manifest])).stdout).toContain('maintenance window has been updated');
    await waitUntil('windows in the schedule file', async () => (await scheduleLines()).length > 0);
    const windows = (await scheduleLines()).map((l) => l.split(' ').map(Number) as [number, number]);
    for (const [start, stop] of windows) {
      expect(stop - start).toBe(3600);
      expect(new Date(start * 1000).getUTCHours()).toBe(4);
    }
    expect(windows.length).toBeGreaterThanOrEqual(7);
  });
});

describe('a Kubernetes agent (docs/kubernetes-updater.md: the schedule Secret writer is wired)', () => {
  it('with POD_NAMESPACE and GATEWAY_KUBE_SCHEDULE_SECRET, as the chart sets them, it patches the windows and its host id into the Secret', async () => {
    // A stand-in Kubernetes API server that records the agent's requests and answers a merge patch with the Secret.
    const requests: Array<{ method: string; path: string; type: string; body: string }> = [];
    const kube = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        requests.push({ method: req.method ?? '', path: req.url ?? '', type: req.headers['content-type'] ?? '', body });
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'agent-shared-state', namespace: 'gateway' }, data: {} }));
      });
    });
    await new Promise<void>((resolve) => kube.listen(0, '127.0.0.1', resolve));
    const kubeconfig = join(dir, 'kubeconfig');
    await writeFile(
      kubeconfig,
      [
        'apiVersion: v1',
        'kind: Config',
        // Plain HTTP on loopback: client-node allows it only with TLS verification off, which it does not use then.
        `clusters: [{name: c, cluster: {server: "http://127.0.0.1:${(kube.address() as AddressInfo).port}", insecure-skip-tls-verify: true}}]`,
        'users: [{name: u, user: {token: not-a-secret}}]',
        'contexts: [{name: x, context: {cluster: c, user: u, namespace: gateway}}]',
        'current-context: x',
        '',
      ].join('\n'),
    );
    const token = (JSON.parse((await admin(['tokens', 'add', '--type=kube', '--format', 'json'])).stdout) as { token: string }).token;
    const kubeAgent = await startGateway(['gateway:', '  nodename: kube-agent', '  data_dir: DATA_DIR', '  log: { format: json }', 'kube_service:', '  enabled: yes', ''].join('\n'), {
      args: ['--token', token, '--ca-pin', pin, '--proxy', `localhost:${proxyPort}`],
      env: { POD_NAMESPACE: 'gateway', GATEWAY_KUBE_SCHEDULE_SECRET: 'agent-shared-state', KUBECONFIG: kubeconfig, GATEWAY_UPGRADE_ROOT: join(dir, 'no-upgrader') },
    });
    try {
      await waitUntil('a PATCH of the schedule Secret', async () => requests.some((r) => r.method === 'PATCH'));
      const patch = requests.find((r) => r.method === 'PATCH')!;
      expect(patch.path).toBe('/api/v1/namespaces/gateway/secrets/agent-shared-state');
      expect(patch.type).toBe('application/merge-patch+json');
      const data = (JSON.parse(patch.body) as { data: Record<string, string> }).data;
      const exported = JSON.parse(Buffer.from(data['agent-maintenance-schedule']!, 'base64').toString('utf8')) as { windows: Array<{ start: string }> };
      // The cluster_maintenance_config of the test above: every day at 04:00 UTC.
      expect(exported.windows.length).toBeGreaterThanOrEqual(7);
      for (const w of exported.windows) expect(new Date(w.start).getUTCHours()).toBe(4);
      // Its host id in the same patch: the updater asks the managed rollout for this agent with it.
      expect(Buffer.from(data['agent-host-id'] ?? '', 'base64').toString('utf8')).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    } finally {
      await kubeAgent.stop();
      await new Promise<void>((resolve) => kube.close(() => resolve()));
    }
  });
});

describe("the Kubernetes updater asks this cluster's Proxy for a managed rollout (docs/kubernetes-updater.md)", () => {
  it('with no rollout resources the answer is unmanaged (404 from a Proxy without the endpoint, else managed:false): the channel decides', async () => {
    const ask = instructionSource({ url: instructionUrl(`localhost:${proxyPort}`), group: 'kube-agent', dialer: new Dialer({ env: {} }), rejectUnauthorized: false });
    const answer = await ask('0b6f3c1e-8a2d-4f5b-9c7e-1d2e3f4a5b6c');
    expect(answer).toHaveProperty('unmanaged');
  });
});
