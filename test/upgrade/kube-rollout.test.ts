/**
 * The Kubernetes updater under a managed rollout (issue 28; docs/kubernetes-updater.md, "Managed rollouts"): the
 * instruction's parser, decide()'s managed rules as tables, and the controller end to end with its real pieces.
 *
 * The controller runs with the real @kubernetes/client-node client (ClientNodeKubeApi) and asks a real HTTPS server
 * for the instruction through the real instructionSource (test PKI, the Dialer). Its API server is, first, a small
 * stateful apps/v1 stand-in below (plain HTTP: GET and strategic-merge PATCH of one Deployment, GET of the
 * shared-state Secret), for the hostile answers; then the project's stand-in API server (test/helpers/kubeapiserver.ts,
 * the closest real thing this machine runs: no Kubernetes API server can run here) over HTTPS with a service-account
 * token, storing the agent StatefulSet and its Secret, and authorizing every call by the Role the chart renders
 * (helm template), so the chart's RBAC is shown to cover the managed rollout's calls (the host id read included).
 * The Proxy's real endpoint is the ROLL part's (src/proxy/); this server answers what the contract
 * (src/wire/autoupdate.ts) allows, and what a lying, oversized, malformed or slow peer would send instead.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import type { AddressInfo } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger } from '../../src/log.js';
import { enableMetrics } from '../../src/metrics/define.js';
import { registry } from '../../src/metrics/registry.js';
import { ClientNodeKubeApi, loadKubeConfig } from '../../src/upgrade/kube/client.js';
import { KubeUpdater, type ChannelAnswer } from '../../src/upgrade/kube/controller.js';
import {
  MANAGED_RESYNC_MS,
  RESYNC_INTERVAL_MS,
  decide,
  nextReconcileDelay,
  resultOf,
  type AgentWorkload,
  type Decision,
  type DecisionInput,
  type InstructionInput,
} from '../../src/upgrade/kube/decide.js';
import { instructionSource, instructionUrl } from '../../src/upgrade/kube/instruction.js';
import { formatKubeSchedule } from '../../src/upgrade/schedule.js';
import { AGENT_INSTRUCTION_MAX_BYTES, parseAgentInstruction, type AgentInstruction } from '../../src/wire/autoupdate.js';
import { startKubeApiServer, type KubeApiServer, type PolicyRule } from '../helpers/kubeapiserver.js';
import { parseExposition, sampleValue } from '../helpers/metrics.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const IN_WINDOW = new Date('2026-01-05T02:30:00Z');
const WINDOWS = [{ start: new Date('2026-01-05T02:00:00Z'), stop: new Date('2026-01-05T03:00:00Z') }];
const HOST_ID = '0b6f3c1e-8a2d-4f5b-9c7e-1d2e3f4a5b6c';

// --- the parser ----------------------------------------------------------------------------------------------------

const GOOD: AgentInstruction = {
  managed: true,
  version: '17.0.2',
  update: true,
  reason: 'canary of group dev',
  group: 'dev',
  canary: true,
  critical: false,
  rollout_id: 'r-2026-01-05.1',
  issued_at: '2026-01-05T02:30:00Z',
};

describe('parseAgentInstruction', () => {
  it('takes every field of the contract, and ignores fields it does not know', () => {
    expect(parseAgentInstruction(JSON.stringify(GOOD))).toEqual({ ok: true, instruction: GOOD });
    expect(parseAgentInstruction(JSON.stringify({ managed: false, update: false, reason: 'no rollout', future_field: [1] }))).toEqual({ ok: true, instruction: { managed: false, update: false, reason: 'no rollout' } });
  });

  it.each<[string, string]>([
    ['not JSON', '{"managed": tru'],
    ['a JSON array', '[]'],
    ['null', 'null'],
    ['managed missing', JSON.stringify({ update: false, reason: '' })],
    ['managed a string', JSON.stringify({ ...GOOD, managed: 'true' })],
    ['update missing', JSON.stringify({ managed: true, reason: '' })],
    ['reason missing', JSON.stringify({ managed: true, update: false })],
    ['reason too long', JSON.stringify({ ...GOOD, reason: 'x'.repeat(513) })],
    ['a version with a leading v', JSON.stringify({ ...GOOD, version: 'v17.0.2' })],
    ['a version that is no version', JSON.stringify({ ...GOOD, version: 'latest' })],
    ['a version with a shell in it', JSON.stringify({ ...GOOD, version: '17.0.2;rm -rf /' })],
    ['a group with capitals', JSON.stringify({ ...GOOD, group: 'Dev' })],
    ['canary a number', JSON.stringify({ ...GOOD, canary: 1 })],
    ['critical a string', JSON.stringify({ ...GOOD, critical: 'yes' })],
    ['a rollout id with spaces', JSON.stringify({ ...GOOD, rollout_id: 'a b' })],
    ['issued_at not a time', JSON.stringify({ ...GOOD, issued_at: 'yesterday' })],
    ['managed:false asking for an update', JSON.stringify({ managed: false, update: true, reason: 'lie', version: '17.0.2' })],
    ['update without a version', JSON.stringify({ managed: true, update: true, reason: 'to what?' })],
    ['over the size limit', JSON.stringify({ ...GOOD, pad: 'x'.repeat(AGENT_INSTRUCTION_MAX_BYTES) })],
  ])('refuses %s, saying why', (_name, text) => {
    expect(parseAgentInstruction(text)).toMatchObject({ ok: false, why: expect.any(String) });
  });
});

// --- decide() under a rollout --------------------------------------------------------------------------------------

function workload(tag = '17.0.1', annotations: Record<string, string> = {}): AgentWorkload {
  return { kind: 'Deployment', namespace: 'gw', name: 'agent', annotations, containers: [{ name: 'gateway', image: `registry.example.com/gateway/gateway:${tag}` }] };
}
const managed = (over: Partial<AgentInstruction>): InstructionInput => ({ instruction: { managed: true, update: false, reason: 'r', ...over } });
function input(instruction: InstructionInput | undefined, over: Partial<DecisionInput> = {}): DecisionInput {
  // The channel offers a newer version inside an open window: whatever the rollout decides, the channel would update.
  return { workload: workload(), container: 'gateway', target: { version: 'v17.0.9', critical: true }, schedule: { windows: WINDOWS }, now: IN_WINDOW, ...(instruction ? { instruction } : {}), ...over };
}
const summary = (d: Decision) => ({ action: d.action, reason: d.reason, ...(d.action === 'update' ? { image: d.image } : {}), message: d.message });

describe('decide under a managed rollout', () => {
  it.each<[string, InstructionInput | undefined, Partial<DecisionInput>, ReturnType<typeof summary>]>([
    [
      'no instruction asked: the channel, as the seed',
      undefined,
      {},
      { action: 'update', reason: 'critical', image: 'registry.example.com/gateway/gateway:17.0.9', message: 'critical update v17.0.1 -> v17.0.9: applied without waiting for a maintenance window' },
    ],
    [
      '404 / managed:false: the channel, exactly as without',
      { unmanaged: 'the Proxy does not serve managed rollouts (404)' },
      {},
      { action: 'update', reason: 'critical', image: 'registry.example.com/gateway/gateway:17.0.9', message: 'critical update v17.0.1 -> v17.0.9: applied without waiting for a maintenance window' },
    ],
    [
      'update to a newer version: the instruction, not the channel',
      managed({ update: true, version: '17.0.2', group: 'dev', canary: true, rollout_id: 'r1', reason: 'canary of group dev' }),
      {},
      { action: 'update', reason: 'rollout', image: 'registry.example.com/gateway/gateway:17.0.2', message: 'rollout v17.0.1 -> v17.0.2 (canary of group dev, rollout r1): canary of group dev' },
    ],
    [
      'update outside every window: the rollout placed the windows already',
      managed({ update: true, version: '17.0.2', group: 'dev', reason: 'group dev is active' }),
      { now: new Date('2026-01-05T12:00:00Z'), schedule: { error: 'none exported' } },
      { action: 'update', reason: 'rollout', image: 'registry.example.com/gateway/gateway:17.0.2', message: 'rollout v17.0.1 -> v17.0.2 (group dev): group dev is active' },
    ],
    [
      'update to a lower version: a rollback',
      managed({ update: true, version: '17.0.0', group: 'dev', reason: 'rollback: canary failed its health check' }),
      {},
      { action: 'update', reason: 'rollback', image: 'registry.example.com/gateway/gateway:17.0.0', message: 'rollback v17.0.1 -> v17.0.0 (group dev): rollback: canary failed its health check' },
    ],
    ['update:false: waiting, with the rollout\'s reason', managed({ version: '17.0.2', reason: 'group prod waits for dev' }), {}, { action: 'skip', reason: 'rollout-waiting', message: 'waiting: group prod waits for dev' }],
    ['no version set yet', managed({ reason: 'no target version is set' }), {}, { action: 'skip', reason: 'rollout-waiting', message: 'waiting: no target version is set' }],
    ['already on the version', managed({ update: true, version: '17.0.1', reason: 'done' }), {}, { action: 'skip', reason: 'no-new-version', message: 'no new version (current: v17.0.1, next: v17.0.1): done' }],
    [
      'unreadable: nothing, and never the channel',
      { error: 'https://proxy/v1/webapi/autoupdate/agent answered HTTP 500', code: 'GW_ERR_AUTOUPDATE_INSTRUCTION' },
      {},
      {
        action: 'skip',
        reason: 'instruction-unreadable',
        message: 'the rollout instruction is unreadable (GW_ERR_AUTOUPDATE_INSTRUCTION): https://proxy/v1/webapi/autoupdate/agent answered HTTP 500; nothing changes, and the channel is not asked instead',
      },
    ],
    [
      'two majors up: refused',
      managed({ update: true, version: '19.0.0', group: 'dev', reason: 'r' }),
      {},
      { action: 'skip', reason: 'unsafe-version', message: 'the rollout names v19.0.0, more than one major version from v17.0.1: refused, an agent moves one major version at a time (r)' },
    ],
    ['two majors down: refused', managed({ update: true, version: '15.4.0', reason: 'r' }), {}, { action: 'skip', reason: 'unsafe-version', message: 'the rollout names v15.4.0, more than one major version from v17.0.1: refused, an agent moves one major version at a time (r)' }],
    ['one major up: taken', managed({ update: true, version: '18.0.0', group: 'dev', reason: 'r' }), {}, { action: 'update', reason: 'rollout', image: 'registry.example.com/gateway/gateway:18.0.0', message: 'rollout v17.0.1 -> v18.0.0 (group dev): r' }],
    ['suspended wins over the rollout', managed({ update: true, version: '17.0.2' }), { workload: workload('17.0.1', { 'gateway.dev/skipreconcile': 'true' }) }, { action: 'skip', reason: 'suspended', message: 'reconciliation suspended: gateway.dev/skipreconcile is "true"' }],
  ])('%s', (_name, instruction, over, expected) => {
    expect(summary(decide(input(instruction, over)))).toEqual(expected);
  });

  it('results in the closed set: a rollback is rolled-back, waiting is waiting, unreadable is failed; a managed run looks again in 5 minutes', () => {
    const ok = { dryRun: false, threw: false };
    const rollback = decide(input(managed({ update: true, version: '17.0.0' })));
    expect(resultOf(rollback, ok)).toBe('rolled-back');
    expect(resultOf(rollback, { dryRun: true, threw: false })).toBe('waiting');
    expect(resultOf(decide(input(managed({ update: true, version: '17.0.2' }))), ok)).toBe('upgraded');
    expect(resultOf(decide(input(managed({ version: '17.0.2' }))), ok)).toBe('waiting');
    expect(resultOf(decide(input(managed({ update: true, version: '19.0.0' }))), ok)).toBe('failed');
    const unreadable = decide(input({ error: 'x', code: 'GW_ERR_AUTOUPDATE_INSTRUCTION' }));
    expect(resultOf(unreadable, ok)).toBe('failed');
    expect(nextReconcileDelay(unreadable, IN_WINDOW)).toBe(MANAGED_RESYNC_MS);
    expect(nextReconcileDelay(decide(input(managed({ version: '17.0.2' }))), IN_WINDOW)).toBe(MANAGED_RESYNC_MS);
    expect(nextReconcileDelay(decide(input({ unmanaged: '404' })), IN_WINDOW)).toBe(RESYNC_INTERVAL_MS);
  });

  it('the instruction URL is on the Proxy, from --proxy-addr or the origin of --version-url', () => {
    expect(instructionUrl('proxy.example.com:443')).toBe('https://proxy.example.com:443/v1/webapi/autoupdate/agent');
    expect(instructionUrl('https://proxy.example.com:3080/v1/webapi/automaticupgrades/channel/default')).toBe('https://proxy.example.com:3080/v1/webapi/autoupdate/agent');
  });
});

// --- the controller: real client, a stateful apps/v1 stand-in, a real HTTPS instruction server ---------------------

/** One Deployment and the shared-state Secret, as an API server keeps them; PATCHes applied, every request recorded. */
class AppsStandIn {
  image = 'registry.example.com/gateway/gateway:17.0.1';
  rv = 10;
  secret: Record<string, string> = {};
  patches: unknown[] = [];
  requests: string[] = [];
  readonly server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => this.answer(req, res, body));
  });

  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  private deployment(): object {
    return {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'agent', namespace: 'gw', resourceVersion: String(this.rv), annotations: {} },
      spec: { replicas: 1, template: { spec: { containers: [{ name: 'gateway', image: this.image }] } } },
    };
  }

  private answer(req: http.IncomingMessage, res: http.ServerResponse, body: string): void {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    this.requests.push(`${req.method} ${path}`);
    const json = (status: number, o: object) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(o));
    if (path === '/apis/apps/v1/namespaces/gw/deployments/agent' && req.method === 'GET') return void json(200, this.deployment());
    if (path === '/apis/apps/v1/namespaces/gw/deployments/agent' && req.method === 'PATCH') {
      expect(req.headers['content-type']).toBe('application/strategic-merge-patch+json');
      const patch = JSON.parse(body) as { spec: { template: { spec: { containers: Array<{ name: string; image: string }> } } } };
      this.patches.push(patch);
      const c = patch.spec.template.spec.containers.find((x) => x.name === 'gateway');
      if (c) this.image = c.image;
      this.rv++;
      return void json(200, this.deployment());
    }
    if (path === '/api/v1/namespaces/gw/secrets/agent-shared-state' && req.method === 'GET') {
      const data = Object.fromEntries(Object.entries(this.secret).map(([k, v]) => [k, Buffer.from(v).toString('base64')]));
      return void json(200, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'agent-shared-state', namespace: 'gw' }, data });
    }
    json(404, { kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404, message: `${path} not found` });
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;
const instructionAnswer =
  (o: unknown, status = 200): Handler =>
  (_req, res) =>
    res.writeHead(status, { 'content-type': 'application/json' }).end(typeof o === 'string' ? o : JSON.stringify(o));

let pki: TestPki;
let proxy: HttpTestServer;
let handler: Handler;
const asked: URLSearchParams[] = [];
let apps: AppsStandIn;
let appsUrl: string;

beforeAll(async () => {
  enableMetrics();
  pki = await makeTestPki();
  const cert = await pki.serverCert({ names: ['proxy.gw.test'], ips: ['127.0.0.1'] });
  proxy = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    const url = new URL(req.url ?? '/', 'https://x');
    if (url.pathname !== '/v1/webapi/autoupdate/agent') return void res.writeHead(404).end();
    asked.push(url.searchParams);
    handler(req, res);
  });
});

afterAll(async () => {
  enableMetrics(false);
  await proxy.close();
  await pki.cleanup();
});

afterEach(async () => {
  await apps?.close();
});

async function setup(options: { secret?: Record<string, string>; deadlineMs?: number; image?: string } = {}) {
  apps = new AppsStandIn();
  apps.secret = options.secret ?? { 'agent-host-id': HOST_ID, 'agent-maintenance-schedule': JSON.stringify(formatKubeSchedule(WINDOWS, IN_WINDOW)) };
  if (options.image) apps.image = options.image;
  appsUrl = await apps.listen();
  asked.length = 0;
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server: appsUrl, skipTLSVerify: true }],
    users: [{ name: 'u', token: 'not-a-secret' }],
    contexts: [{ name: 'c', cluster: 'c', user: 'u', namespace: 'gw' }],
    currentContext: 'c',
  });
  const channel = { calls: 0 };
  const lines: string[] = [];
  const log = createLogger({ level: 'debug', format: 'json', destination: { write: (l: string) => void lines.push(l) } as unknown as NodeJS.WritableStream });
  const updater = new KubeUpdater({
    api: new ClientNodeKubeApi(kc),
    target: { kind: 'Deployment', namespace: 'gw', name: 'agent' },
    channel: async (): Promise<ChannelAnswer> => {
      channel.calls++;
      return { version: 'v17.0.9', critical: true };
    },
    instruction: instructionSource({
      url: instructionUrl(proxy.url),
      group: 'dev',
      dialer: new Dialer({ env: {} }),
      ca: pki.caPem,
      ...(options.deadlineMs ? { deadlineMs: options.deadlineMs } : {}),
      log,
    }),
    scheduleSecret: { name: 'agent-shared-state' },
    clock: () => IN_WINDOW,
    timers: { set: () => ({ cancel: () => {} }) },
    log,
  });
  return { updater, channel, lines };
}

const scrape = async () => parseExposition(await registry.metrics());

describe('the updater follows the rollout', () => {
  it('update: the canary gets the instruction\'s version; asked with the exported host id and its group; the channel is not asked', async () => {
    handler = instructionAnswer({ ...GOOD, version: '17.0.2' });
    const { updater, channel } = await setup();
    const d = await updater.reconcile('manual');
    expect(d).toMatchObject({ action: 'update', reason: 'rollout', next: 'v17.0.2', rollout: { group: 'dev', canary: true, rollout_id: 'r-2026-01-05.1' } });
    expect(apps.image).toBe('registry.example.com/gateway/gateway:17.0.2');
    expect(apps.patches).toEqual([{ spec: { template: { spec: { containers: [{ name: 'gateway', image: 'registry.example.com/gateway/gateway:17.0.2' }] } } } }]);
    expect(asked.map((q) => Object.fromEntries(q))).toEqual([{ host_id: HOST_ID, group: 'dev' }]);
    expect(channel.calls).toBe(0);
    const samples = await scrape();
    expect(sampleValue(samples, 'gateway_kube_updater_last_result', { result: 'upgraded' })).toBe(1);
    expect(sampleValue(samples, 'gateway_kube_updater_rollout_managed', { canary: 'true' })).toBe(1);
  });

  it('wait: nothing patched, the rollout\'s reason is its last result', async () => {
    handler = instructionAnswer({ managed: true, version: '17.0.2', update: false, reason: 'group prod waits for dev', group: 'prod' });
    const { updater, channel } = await setup();
    const d = await updater.reconcile('manual');
    expect(d).toMatchObject({ action: 'skip', reason: 'rollout-waiting', message: 'waiting: group prod waits for dev' });
    expect(apps.patches).toEqual([]);
    expect(channel.calls).toBe(0);
    const samples = await scrape();
    expect(sampleValue(samples, 'gateway_kube_updater_last_result', { result: 'waiting' })).toBe(1);
    expect(samples.filter((s) => s.name === 'gateway_kube_updater_last_run_timestamp_seconds').map((s) => s.labels)).toEqual([{ result: 'waiting', reason: 'rollout-waiting' }]);
  });

  it('rollback: a lower version is patched in, and the result is rolled-back', async () => {
    handler = instructionAnswer({ managed: true, version: '17.0.1', update: true, reason: 'rollback: canary failed', group: 'dev', canary: true });
    const { updater } = await setup({ image: 'registry.example.com/gateway/gateway:17.0.2' });
    expect(await updater.reconcile('manual')).toMatchObject({ action: 'update', reason: 'rollback', current: 'v17.0.2', next: 'v17.0.1' });
    expect(apps.image).toBe('registry.example.com/gateway/gateway:17.0.1');
    expect(sampleValue(await scrape(), 'gateway_kube_updater_last_result', { result: 'rolled-back' })).toBe(1);
  });

  it.each<[string, Handler]>([
    ['404 (a Proxy before managed rollouts)', instructionAnswer({ message: 'not found' }, 404)],
    ['managed:false', instructionAnswer({ managed: false, update: false, reason: 'no autoupdate_version' })],
  ])('%s: the channel and the windows decide, as the seed', async (_name, h) => {
    handler = h;
    const { updater, channel } = await setup();
    expect(await updater.reconcile('manual')).toMatchObject({ action: 'update', reason: 'critical', next: 'v17.0.9' });
    expect(channel.calls).toBe(1);
    expect(apps.image).toBe('registry.example.com/gateway/gateway:17.0.9');
    expect(sampleValue(await scrape(), 'gateway_kube_updater_rollout_managed', { canary: 'false' })).toBe(0);
  });

  it('without an exported host id (or a malformed one) it asks with its group only', async () => {
    handler = instructionAnswer({ managed: true, update: false, reason: 'group dev has not started', group: 'dev' });
    let { updater } = await setup({ secret: {} });
    await updater.reconcile('manual');
    await apps.close();
    ({ updater } = await setup({ secret: { 'agent-host-id': '../../etc/passwd&group=prod' } }));
    await updater.reconcile('manual');
    expect(asked.map((q) => Object.fromEntries(q))).toEqual([{ group: 'dev' }]);
  });
});

describe('hostile instruction answers: nothing patched, the channel not asked, GW_ERR_AUTOUPDATE_INSTRUCTION', () => {
  const drip: Handler = (_req, res) => {
    // Headers at once, then one byte every 100 ms, forever: the Dialer's idle timeout never fires, the deadline does.
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{');
    const t = setInterval(() => res.write(' '), 100);
    res.once('close', () => clearInterval(t));
  };
  it.each<[string, Handler, RegExp]>([
    ['oversized', instructionAnswer({ ...GOOD, pad: 'x'.repeat(AGENT_INSTRUCTION_MAX_BYTES * 4) }), /GW_ERR_HTTP_TOO_LARGE: .*answered more than 16384 bytes/],
    ['malformed JSON', instructionAnswer('{"managed": true, "update": tr'), /not JSON/],
    ['a lie: managed:false with update:true', instructionAnswer({ managed: false, update: true, version: '17.0.2', reason: 'lie' }), /managed is false but update is true/],
    ['update without a version', instructionAnswer({ managed: true, update: true, reason: 'to what?' }), /no version is named/],
    ['an image reference for a version', instructionAnswer({ ...GOOD, version: 'evil.example.com/gateway:17.0.2' }), /version is not a version number/],
    ['a 500', instructionAnswer({ error: 'boom' }, 500), /answered HTTP 500/],
    ['a 302 to elsewhere', (_req, res) => res.writeHead(302, { location: 'https://evil.example.com/' }).end(), /answered HTTP 302/],
    ['slow: a byte at a time past the deadline', drip, /no answer within 1500 ms/],
    ['silent: headers never come', () => {}, /no answer within 1500 ms/],
  ])('%s', async (_name, h, message) => {
    handler = h;
    const { updater, channel, lines } = await setup({ deadlineMs: 1500 });
    const d = await updater.reconcile('manual');
    expect(d).toMatchObject({ action: 'skip', reason: 'instruction-unreadable' });
    expect(d!.message).toMatch(message);
    expect(apps.patches).toEqual([]);
    expect(apps.requests.filter((r) => r.startsWith('PATCH'))).toEqual([]);
    expect(channel.calls).toBe(0);
    const warned = lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.reason === 'instruction-unreadable');
    expect(warned).toMatchObject({ code: 'GW_ERR_AUTOUPDATE_INSTRUCTION' });
    const samples = await scrape();
    expect(sampleValue(samples, 'gateway_kube_updater_last_result', { result: 'failed' })).toBe(1);
    expect(samples.filter((s) => s.name === 'gateway_kube_updater_last_run_timestamp_seconds').map((s) => s.labels)).toEqual([{ result: 'failed', reason: 'instruction-unreadable' }]);
  });
});

// --- against the project's stand-in API server, authorized by the chart's own Role ----------------------------------

const CHART = fileURLToPath(new URL('../../deploy/gateway-kube-agent/', import.meta.url));
const HELM = fileURLToPath(new URL('../../.cache/kubetools/helm', import.meta.url));
const STS = '/apis/apps/v1/namespaces/gw/statefulsets/agent';
const SECRET = '/api/v1/namespaces/gw/secrets/agent-shared-state';
const SA = 'system:serviceaccount:gw:agent-updater';

/** The updater's Role as `helm template` renders it for release "agent" in namespace gw. */
function chartRole(): PolicyRule[] {
  if (!existsSync(HELM)) throw new Error(`${HELM} is missing: run scripts/install-kubetools.sh (scripts/install-test-deps.sh runs it)`);
  const values = ['proxyAddr=proxy.example.com:443', 'caPin=sha256:00', 'kubeClusterName=prod', 'authToken=t', 'updater.enabled=true'].flatMap((v) => ['--set', v]);
  // helm's arguments in a variable: the test-deps scan would read "template" as a program.
  const args = ['template', 'agent', CHART, '--namespace', 'gw', ...values];
  const r = spawnSync(HELM, args, {
    encoding: 'utf8',
    timeout: 60_000,
    env: { PATH: process.env.PATH ?? '', HOME: '/nonexistent', HELM_CACHE_HOME: '/tmp/helm-cache-test', HELM_CONFIG_HOME: '/tmp/helm-config-test', HELM_DATA_HOME: '/tmp/helm-data-test' },
  });
  expect(r.status, r.stderr).toBe(0);
  const role = parseAllDocuments(r.stdout)
    .map((d) => d.toJS() as { kind?: string; metadata?: { name?: string }; rules?: PolicyRule[] } | null)
    .find((o) => o?.kind === 'Role' && o.metadata?.name === 'agent-updater');
  return role!.rules!;
}

describe("the stand-in API server, the updater's service account and the chart's Role", () => {
  let kube: KubeApiServer;
  let rules: PolicyRule[];
  const b64 = (s: string) => Buffer.from(s).toString('base64');

  beforeAll(async () => {
    rules = chartRole();
    kube = await startKubeApiServer({
      tokens: { 'updater-token': { user: SA, groups: ['system:serviceaccounts', 'system:serviceaccounts:gw', 'system:authenticated'] } },
      bindings: [{ users: [SA], namespace: 'gw', rules }],
      pods: [],
      objects: {
        [STS]: {
          apiVersion: 'apps/v1',
          kind: 'StatefulSet',
          metadata: { name: 'agent', namespace: 'gw', resourceVersion: '7', annotations: {} },
          spec: { replicas: 1, template: { spec: { containers: [{ name: 'gateway', image: 'registry.example.com/gateway/gateway:17.0.1', args: ['start'] }, { name: 'sidecar', image: 'busybox:1.36' }] } } },
        },
        [SECRET]: { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'agent-shared-state', namespace: 'gw' }, data: { 'agent-host-id': b64(HOST_ID), 'agent-maintenance-schedule': b64(JSON.stringify(formatKubeSchedule(WINDOWS, IN_WINDOW))) } },
      },
    });
  });
  afterAll(async () => {
    await kube?.close();
  });

  async function updaterOnStandIn(): Promise<{ updater: KubeUpdater; channel: { calls: number } }> {
    const kubeconfig = await kube.kubeconfig({ token: 'updater-token' }, 'updater');
    const channel = { calls: 0 };
    const updater = new KubeUpdater({
      api: new ClientNodeKubeApi(loadKubeConfig({ kubeconfig })),
      target: { kind: 'StatefulSet', namespace: 'gw', name: 'agent' },
      channel: async (): Promise<ChannelAnswer> => {
        channel.calls++;
        return { version: 'v17.0.9', critical: true };
      },
      instruction: instructionSource({ url: instructionUrl(proxy.url), group: 'agent', dialer: new Dialer({ env: {} }), ca: pki.caPem }),
      scheduleSecret: { name: 'agent-shared-state' },
      clock: () => IN_WINDOW,
      timers: { set: () => ({ cancel: () => {} }) },
      log: createLogger({ level: 'silent' }),
    });
    return { updater, channel };
  }
  const image = () => (kube.objects.get(STS) as { spec: { template: { spec: { containers: Array<{ name: string; image: string; args?: string[] }> } } } }).spec.template.spec.containers;

  it('a canary is updated and then rolled back; every call allowed by the Role, the other container and fields kept', async () => {
    const { updater, channel } = await updaterOnStandIn();
    asked.length = 0;
    handler = instructionAnswer({ managed: true, version: '17.0.2', update: true, reason: 'canary of group agent', group: 'agent', canary: true });
    expect(await updater.reconcile('manual')).toMatchObject({ action: 'update', reason: 'rollout' });
    expect(image()).toEqual([{ name: 'gateway', image: 'registry.example.com/gateway/gateway:17.0.2', args: ['start'] }, { name: 'sidecar', image: 'busybox:1.36' }]);
    handler = instructionAnswer({ managed: true, version: '17.0.1', update: true, reason: 'rollback: canary failed', group: 'agent', canary: true });
    expect(await updater.reconcile('manual')).toMatchObject({ action: 'update', reason: 'rollback', current: 'v17.0.2', next: 'v17.0.1' });
    expect(image()[0]!.image).toBe('registry.example.com/gateway/gateway:17.0.1');
    expect(asked.map((q) => Object.fromEntries(q))).toEqual([{ host_id: HOST_ID, group: 'agent' }, { host_id: HOST_ID, group: 'agent' }]);
    expect(channel.calls).toBe(0);
    const calls = kube.seen.filter((r) => r.user?.name === SA);
    expect(calls.map((r) => `${r.method} ${r.path} ${r.code}`)).toEqual([
      `GET ${STS} 200`, `GET ${SECRET} 200`, `PATCH ${STS} 200`,
      `GET ${STS} 200`, `GET ${SECRET} 200`, `PATCH ${STS} 200`,
    ]);
  });

  it('without get on the Secret the host id is unknown: asked with the group only; without patch nothing changes (GW_ERR_KUBE_API, 403)', async () => {
    const noSecret = rules.filter((r) => !(r.resources ?? []).includes('secrets'));
    const noPatch = rules.map((r) => ({ ...r, verbs: r.verbs.filter((v) => v !== 'patch') }));
    handler = instructionAnswer({ managed: true, version: '17.0.3', update: true, reason: 'group agent is active', group: 'agent' });
    try {
      kube.setBindings([{ users: [SA], namespace: 'gw', rules: noSecret }]);
      let { updater } = await updaterOnStandIn();
      asked.length = 0;
      await updater.reconcile('manual');
      expect(asked.map((q) => Object.fromEntries(q))).toEqual([{ group: 'agent' }]);
      expect(image()[0]!.image).toBe('registry.example.com/gateway/gateway:17.0.3');
      kube.setBindings([{ users: [SA], namespace: 'gw', rules: noPatch }]);
      handler = instructionAnswer({ managed: true, version: '17.0.4', update: true, reason: 'group agent is active', group: 'agent' });
      ({ updater } = await updaterOnStandIn());
      // The run fails (the PATCH refused): the metric says failed, the object is as it was.
      expect(await updater.reconcile('manual')).toMatchObject({ action: 'update', next: 'v17.0.4' });
      expect(kube.seen.at(-1)).toMatchObject({ method: 'PATCH', path: STS, code: 403 });
      expect(image()[0]!.image).toBe('registry.example.com/gateway/gateway:17.0.3');
      expect(sampleValue(await scrape(), 'gateway_kube_updater_last_result', { result: 'failed' })).toBe(1);
    } finally {
      kube.setBindings([{ users: [SA], namespace: 'gw', rules }]);
    }
  });
});
