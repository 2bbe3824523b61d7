/**
 * gateway-kube-updater --diag-addr (src/cli/gateway-kube-updater.ts): the updater has no agent beside it to export
 * its state, so it serves its own /healthz, /readyz and /metrics. Run as the chart runs it (the built CLI, a
 * kubeconfig), against an API server that is not there: its first reconciliation fails, and /metrics says so
 * (last result failed, reason error), in a body promtool accepts, with neither the API server's address nor the
 * token in it. A bad --diag-addr is a usage error before anything starts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseExposition, sampleValue } from '../helpers/metrics.js';
import { promtoolCheckMetrics } from '../helpers/prometheus.js';
import { waitUntil } from '../helpers/wait.js';

const BIN = fileURLToPath(new URL('../../dist/cli/gateway-kube-updater.js', import.meta.url));
const TOKEN = 'updater-secret-token-4711';

async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

let dir: string;
let child: ChildProcess | undefined;
let output = '';
let diag: string;
let apiPort: number;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-kube-updater-diag-'));
  apiPort = await freePort();
  await writeFile(
    join(dir, 'kubeconfig'),
    [
      'apiVersion: v1', 'kind: Config', 'current-context: c',
      'clusters: [{name: k, cluster: {server: "https://127.0.0.1:' + apiPort + '", insecure-skip-tls-verify: true}}]',
      `users: [{name: u, user: {token: ${TOKEN}}}]`,
      'contexts: [{name: c, context: {cluster: k, user: u, namespace: gw}}]', '',
    ].join('\n'),
  );
  diag = `127.0.0.1:${await freePort()}`;
  child = spawn(process.execPath, [BIN, '--agent-name', 'gateway-agent', '--namespace', 'gw', '--version-url', `https://127.0.0.1:${apiPort}/v1/webapi/automaticupgrades/channel/default`, '--kubeconfig', join(dir, 'kubeconfig'), '--diag-addr', diag], {
    env: { PATH: process.env.PATH ?? '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
}, 30_000);

afterAll(async () => {
  if (child && child.exitCode === null) {
    const exited = new Promise((r) => child!.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
  await rm(dir, { recursive: true, force: true });
});

async function get(path: string): Promise<{ status: number; body: string }> {
  const r = await fetch(`http://${diag}${path}`);
  return { status: r.status, body: await r.text() };
}

describe('gateway-kube-updater --diag-addr', () => {
  it("serves its last reconciliation's result: failed (reason error) while the API server is not there", async () => {
    await waitUntil(`the updater's diagnostics listener (output so far: ${output})`, async () => (await get('/healthz').catch(() => undefined))?.status === 200);
    expect((await get('/readyz')).status).toBe(200);
    let body = '';
    await waitUntil('a reconciliation recorded', async () => {
      body = (await get('/metrics')).body;
      return body.includes('gateway_kube_updater_last_result{result="failed"} 1');
    });
    const samples = parseExposition(body);
    expect(sampleValue(samples, 'gateway_kube_updater_last_result', { result: 'upgraded' })).toBe(0);
    expect(sampleValue(samples, 'gateway_kube_updater_last_run_timestamp_seconds', { result: 'failed', reason: 'error' })).toBeGreaterThan(0);
    expect(promtoolCheckMetrics(body)).toMatchObject({ status: 0 });
    expect(body).not.toContain(String(apiPort));
    expect(body).not.toContain(TOKEN);
  });

  it.each([
    ['--group with a capital', ['--agent-name', 'a', '--group', 'Prod'], '--group: "Prod" is not a rollout group name'],
  ])('%s is a usage error, before anything starts', async (_name, args, message) => {
    const r = await new Promise<{ status: number | null; stderr: string }>((resolve) => {
      const c = spawn(process.execPath, [BIN, ...args, '--namespace', 'gw', '--version-url', 'https://127.0.0.1:1/x'], { env: { PATH: process.env.PATH ?? '' } });
      let stderr = '';
      c.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      c.once('close', (status) => resolve({ status, stderr }));
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain(message);
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
  });

  it('a bad --diag-addr is a usage error, before anything starts', async () => {
    const r = await new Promise<{ status: number | null; stderr: string }>((resolve) => {
      const c = spawn(process.execPath, [BIN, '--agent-name', 'a', '--namespace', 'gw', '--version-url', 'https://127.0.0.1:1/x', '--diag-addr', '300.1.1.1:3000'], { env: { PATH: process.env.PATH ?? '' } });
      let stderr = '';
      c.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      c.once('close', (status) => resolve({ status, stderr }));
    });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain('--diag-addr: "300.1.1.1:3000"');
    expect(r.stderr).toContain('over 255');
    expect(r.stderr).toContain('code: GW_ERR_USAGE');
  });
});
