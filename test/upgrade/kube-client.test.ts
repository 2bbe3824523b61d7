/**
 * The Kubernetes updater's real client calls (@kubernetes/client-node) against a recorded API exchange.
 *
 * No Kubernetes API server can run on this machine (nor on CI's): a local HTTP server replays the exchange in
 * fixtures/kube/updater-exchange.json — GET of the agent StatefulSet, GET of the schedule Secret, the watch stream,
 * the PATCH — and checks each request the client sends (method, path, query, headers, and the PATCH body). The
 * version comes from the gateway's real VersionServer. What this cannot show: that a real API server applies the
 * strategic merge patch as expected, and RBAC (the chart's Role is checked in kube-chart.test.ts by its text only).
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { KubeConfig } from '@kubernetes/client-node';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger } from '../../src/log.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { ClientNodeKubeApi, kubeScheduleWriter, loadKubeConfig, type WatchEventType } from '../../src/upgrade/kube/client.js';
import { KubeUpdater, channelVersionSource } from '../../src/upgrade/kube/controller.js';
import type { AgentWorkload } from '../../src/upgrade/kube/decide.js';
import { startHttpsServer } from '../helpers/servers.js';
import { makeTestPki } from '../helpers/tls.js';

interface RecordedRequest {
  method: string;
  path: string;
  query?: Record<string, string>;
  headers?: Record<string, string>;
  body?: unknown;
}
interface Exchange {
  name: string;
  request: RecordedRequest;
  response: { status: number; body?: unknown; stream?: unknown[] };
}
interface Received {
  method: string;
  path: string;
  query: Record<string, string>;
  headers: http.IncomingHttpHeaders;
  body: string;
}

const RECORDED = JSON.parse(readFileSync(new URL('../../fixtures/kube/updater-exchange.json', import.meta.url), 'utf8')) as { exchanges: Exchange[] };
const exchange = (name: string) => RECORDED.exchanges.find((e) => e.name === name)!;
const TOKEN = 'replay-token-not-a-secret';

/** Replays the exchanges in use; requests nobody recorded are answered 599 and kept in `unmatched`. */
class ReplayServer {
  readonly server: http.Server;
  active: Exchange[] = [];
  received: Received[] = [];
  unmatched: Received[] = [];
  private watches: http.ServerResponse[] = [];
  private streamQueue: unknown[] = [];

  constructor() {
    this.server = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => this.answer(req, res, body));
    });
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  use(...names: string[]): void {
    this.active = names.map(exchange);
    this.received = [];
    this.unmatched = [];
  }

  private matches(e: RecordedRequest, r: Received): boolean {
    if (e.method !== r.method || e.path !== r.path) return false;
    if (JSON.stringify(sorted(e.query ?? {})) !== JSON.stringify(sorted(r.query))) return false;
    return true;
  }

  private answer(req: http.IncomingMessage, res: http.ServerResponse, body: string): void {
    const url = new URL(req.url ?? '/', 'http://replay');
    const r: Received = { method: req.method ?? '', path: url.pathname, query: Object.fromEntries(url.searchParams), headers: req.headers, body };
    this.received.push(r);
    const e = this.active.find((x) => this.matches(x.request, r));
    if (!e) {
      this.unmatched.push(r);
      res.writeHead(599, { 'content-type': 'text/plain' }).end(`not in the recorded exchange: ${r.method} ${req.url}`);
      return;
    }
    if (e.response.stream) {
      res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
      res.flushHeaders(); // as an API server does: the headers go out before the first event
      this.streamQueue = [...e.response.stream];
      this.watches.push(res);
      return;
    }
    const text = JSON.stringify(e.response.body);
    res.writeHead(e.response.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }).end(text);
  }

  /** Sends the next recorded watch event on the open watch. */
  nextEvent(): void {
    const event = this.streamQueue.shift();
    if (event === undefined) throw new Error('no recorded watch event left');
    this.watches.at(-1)!.write(`${JSON.stringify(event)}\n`);
  }

  /** The server ends the watch (as API servers do every few minutes). */
  endWatch(): void {
    this.watches.pop()?.end();
  }

  async close(): Promise<void> {
    for (const w of this.watches) w.end();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

function sorted(o: Record<string, string>): Array<[string, string]> {
  return Object.entries(o).sort(([a], [b]) => a.localeCompare(b));
}

function kubeConfigFor(server: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'replay', server, skipTLSVerify: true }],
    users: [{ name: 'updater', token: TOKEN }],
    contexts: [{ name: 'replay', cluster: 'replay', user: 'updater', namespace: 'gateway' }],
    currentContext: 'replay',
  });
  return kc;
}

async function eventually(what: string, check: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

let replay: ReplayServer;
let api: ClientNodeKubeApi;
let versions: http.Server;
let versionBase: string;
const REF = { kind: 'StatefulSet' as const, namespace: 'gateway', name: 'gateway-agent' };

beforeAll(async () => {
  replay = new ReplayServer();
  api = new ClientNodeKubeApi(kubeConfigFor(await replay.listen()));
  const vs = new VersionServer({ ownVersion: '17.0.0-dev', dialer: new Dialer({ env: {} }), channels: { 'stable/v17': { static_version: 'v17.0.2' }, pinned: { static_version: 'v17.0.1' } } });
  versions = http.createServer((req, res) => {
    if (!vs.handle(req, res)) res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => versions.listen(0, '127.0.0.1', resolve));
  versionBase = `http://127.0.0.1:${(versions.address() as AddressInfo).port}/v1/webapi/automaticupgrades/channel`;
});

afterEach(() => {
  expect(replay.unmatched.map((r) => `${r.method} ${r.path}?${new URLSearchParams(r.query).toString()}`)).toEqual([]);
});

afterAll(async () => {
  await replay?.close();
  await new Promise<void>((resolve) => versions?.close(() => resolve()));
});

describe('the client calls, one by one', () => {
  it('GET the StatefulSet: its containers, annotations and resourceVersion, with the bearer token', async () => {
    replay.use('get-statefulset');
    const { workload, resourceVersion } = await api.getWorkload(REF);
    expect(resourceVersion).toBe('4711');
    expect(workload).toEqual({
      kind: 'StatefulSet',
      namespace: 'gateway',
      name: 'gateway-agent',
      annotations: { 'meta.helm.sh/release-name': 'gateway-agent', 'meta.helm.sh/release-namespace': 'gateway' },
      containers: [{ name: 'gateway', image: 'registry.example.com/gateway/gateway:17.0.1' }],
    });
    expect(replay.received[0]!.headers.authorization).toBe(`Bearer ${TOKEN}`);
  });

  it('PATCH: a strategic merge patch that sets only the agent container image', async () => {
    replay.use('patch-statefulset');
    await api.setImage(REF, 'gateway', 'registry.example.com/gateway/gateway:17.0.2');
    const [patch] = replay.received;
    const recorded = exchange('patch-statefulset').request;
    expect(patch!.headers['content-type']).toBe(recorded.headers!['content-type']);
    expect(JSON.parse(patch!.body)).toEqual(recorded.body);
  });

  it('the schedule Secret: decoded; a missing Secret is undefined, not an error', async () => {
    replay.use('get-schedule-secret');
    const text = await api.readSecretKey('gateway', 'gateway-agent-shared-state', 'agent-maintenance-schedule');
    expect(JSON.parse(text!)).toMatchObject({ version: 'v1', windows: [{ start: '2026-01-05T02:00:00Z' }, { start: '2026-01-06T02:00:00Z' }] });
    expect(await api.readSecretKey('gateway', 'gateway-agent-shared-state', 'other-key')).toBeUndefined();
    replay.use('get-schedule-secret-not-found');
    expect(await api.readSecretKey('gateway', 'gateway-agent-shared-state', 'agent-maintenance-schedule')).toBeUndefined();
  });

  it("the agent's schedule export: a merge patch of the Secret, created when missing", async () => {
    const recorded = (exchange('patch-schedule-secret').request.body as { data: Record<string, string> }).data['agent-maintenance-schedule']!;
    const json = Buffer.from(recorded, 'base64').toString('utf8');
    replay.use('patch-schedule-secret');
    await kubeScheduleWriter({ namespace: 'gateway', secretName: 'gateway-agent-shared-state', api })(json);
    expect(replay.received.map((r) => `${r.method} ${r.path}`)).toEqual(['PATCH /api/v1/namespaces/gateway/secrets/gateway-agent-shared-state']);
    expect(replay.received[0]!.headers['content-type']).toBe('application/merge-patch+json');
    expect(JSON.parse(replay.received[0]!.body)).toEqual(exchange('patch-schedule-secret').request.body);
    replay.use('patch-schedule-secret-not-found', 'create-schedule-secret');
    await api.writeSecretKey('gateway', 'gateway-agent-shared-state', 'agent-maintenance-schedule', json);
    expect(replay.received.map((r) => `${r.method} ${r.path}`)).toEqual(['PATCH /api/v1/namespaces/gateway/secrets/gateway-agent-shared-state', 'POST /api/v1/namespaces/gateway/secrets']);
    expect(JSON.parse(replay.received[1]!.body)).toEqual(exchange('create-schedule-secret').request.body);
  });

  it('a refusal by the API server is GW_ERR_KUBE_API naming the call, the status and the RBAC hint', async () => {
    replay.use('get-statefulset-forbidden');
    const err = await api.getWorkload(REF).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'GW_ERR_KUBE_API', details: { status: 403 } });
    expect((err as Error).message).toContain('get StatefulSet gateway/gateway-agent: HTTP 403: statefulsets.apps "gateway-agent" is forbidden');
    expect((err as { hint: string }).hint).toContain('Role');
  });

  it('the watch: a field selector on the name, from the resourceVersion, with bookmarks; events arrive decoded', async () => {
    replay.use('watch-statefulset');
    const events: Array<{ type: WatchEventType; workload: AgentWorkload | undefined; rv: string | undefined }> = [];
    let done: Error | undefined | null = null;
    const handle = await api.watchWorkload(REF, '4711', (type, workload, rv) => events.push({ type, workload, rv }), (err) => (done = err));
    replay.nextEvent();
    replay.nextEvent();
    replay.nextEvent();
    await eventually('three events', () => events.length === 3);
    expect(events.map((e) => [e.type, e.rv])).toEqual([
      ['MODIFIED', '4712'],
      ['BOOKMARK', '4720'],
      ['MODIFIED', '4731'],
    ]);
    expect(events[0]!.workload!.containers[0]!.image).toBe('registry.example.com/gateway/gateway:17.0.2');
    expect(events[2]!.workload!.annotations['debug.gateway.dev/trigger-event']).toBe('1');
    replay.endWatch();
    await eventually('the watch ends', () => done !== null);
    expect(done).toBeUndefined(); // a normal end, not an error
    handle.stop();
  });

  it('the kubeconfig: a file is used; none at all (not in a pod) is GW_ERR_KUBE_CONFIG', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'gw-kubeconfig-'));
    try {
      const file = join(dir, 'config');
      await writeFile(
        file,
        ['apiVersion: v1', 'kind: Config', 'clusters: [{name: c, cluster: {server: "https://kube.example.test:6443"}}]', 'users: [{name: u, user: {token: t}}]', 'contexts: [{name: x, context: {cluster: c, user: u}}]', 'current-context: x', ''].join('\n'),
      );
      expect(loadKubeConfig({ env: { KUBECONFIG: file }, home: dir }).getCurrentCluster()?.server).toBe('https://kube.example.test:6443');
      expect(() => loadKubeConfig({ env: {}, home: dir })).toThrow(expect.objectContaining({ code: 'GW_ERR_KUBE_CONFIG' }));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('one reconciliation through the real client, replaying the exchange', () => {
  function logs() {
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, cb) {
        for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l) as Record<string, unknown>);
        cb();
      },
    });
    return { lines, log: createLogger({ level: 'debug', format: 'json', destination: sink }) };
  }

  it('in the window: GET, Secret, channel stable/v17 (v17.0.2), PATCH of the image; then the trigger event reconciles again', async () => {
    replay.use('get-statefulset', 'get-schedule-secret', 'patch-statefulset', 'watch-statefulset');
    const { lines, log } = logs();
    const updater = new KubeUpdater({
      api,
      target: REF,
      channel: channelVersionSource({ baseUrl: `${versionBase}/stable/v17`, dialer: new Dialer({ env: {} }) }),
      scheduleSecret: { name: 'gateway-agent-shared-state' },
      clock: () => new Date('2026-01-05T02:30:00Z'),
      debounceMs: 60_000, // only the trigger annotation may cause a run within this test
      log,
    });
    try {
      const decision = await updater.start();
      expect(decision).toMatchObject({ action: 'update', current: 'v17.0.1', next: 'v17.0.2', image: 'registry.example.com/gateway/gateway:17.0.2' });
      await eventually('the watch is open', () => replay.received.some((r) => r.query.watch === 'true'));
      expect(replay.received.map((r) => `${r.method} ${r.path}`)).toEqual([
        'GET /apis/apps/v1/namespaces/gateway/statefulsets/gateway-agent',
        'GET /api/v1/namespaces/gateway/secrets/gateway-agent-shared-state',
        'PATCH /apis/apps/v1/namespaces/gateway/statefulsets/gateway-agent',
        'GET /apis/apps/v1/namespaces/gateway/statefulsets',
      ]);
      expect(JSON.parse(replay.received[2]!.body)).toEqual(exchange('patch-statefulset').request.body);

      // The API server reports our own change (debounced), a bookmark, then someone sets the trigger annotation:
      // that one is reconciled at once. The recorded GET still answers 17.0.1, so it decides to update again.
      replay.nextEvent();
      replay.nextEvent();
      expect(updater.decisions).toHaveLength(1);
      replay.nextEvent();
      await eventually('a second decision', () => updater.decisions.length === 2);
      expect(lines.some((l) => l.msg === 'trigger-event annotation changed; reconciling now')).toBe(true);
    } finally {
      updater.stop();
    }
  });

  it('nothing to do: the log line says already up to date, with error "no new version (current: v17.0.1, next: v17.0.1)"', async () => {
    replay.use('get-statefulset', 'get-schedule-secret');
    const { lines, log } = logs();
    const updater = new KubeUpdater({
      api,
      target: REF,
      channel: channelVersionSource({ baseUrl: `${versionBase}/pinned`, dialer: new Dialer({ env: {} }) }),
      scheduleSecret: { name: 'gateway-agent-shared-state' },
      clock: () => new Date('2026-01-05T02:30:00Z'),
      log,
    });
    expect(await updater.reconcile()).toMatchObject({ action: 'skip', reason: 'no-new-version' });
    expect(lines).toContainEqual(expect.objectContaining({ msg: 'the agent is already up to date', error: 'no new version (current: v17.0.1, next: v17.0.1)' }));
    expect(replay.received.some((r) => r.method === 'PATCH')).toBe(false);
  });

  it('a 410 Gone on the watch: the updater forgets the resourceVersion and starts again from a fresh GET', async () => {
    replay.use('get-statefulset', 'get-schedule-secret', 'watch-gone');
    const { log } = logs();
    const updater = new KubeUpdater({
      api,
      target: REF,
      channel: channelVersionSource({ baseUrl: `${versionBase}/pinned`, dialer: new Dialer({ env: {} }) }),
      scheduleSecret: { name: 'gateway-agent-shared-state' },
      clock: () => new Date('2026-01-05T02:30:00Z'),
      watchRetryMs: 10,
      log,
    });
    try {
      await updater.start();
      await eventually('the watch is open', () => replay.received.filter((r) => r.query.watch === 'true').length === 1);
      replay.nextEvent(); // ERROR 410
      replay.endWatch();
      // Re-opened after a fresh GET: the recorded GET answers resourceVersion 4711 again.
      await eventually('watching again', () => replay.received.filter((r) => r.query.watch === 'true').length === 2, 10_000);
      const gets = replay.received.filter((r) => r.method === 'GET' && r.path.endsWith('/statefulsets/gateway-agent'));
      expect(gets.length).toBe(2);
    } finally {
      updater.stop();
    }
  });
});

describe("the updater's version source over https", () => {
  it('a Proxy certificate it does not trust is GW_ERR_CLIENT_UNTRUSTED with the --ca-file hint, and that CA fixes it', async () => {
    const pki = await makeTestPki();
    const cert = await pki.serverCert({ names: ['proxy.gw.test'], ips: ['127.0.0.1'] });
    const vs = new VersionServer({ ownVersion: '17.0.2', channels: {}, dialer: new Dialer({ env: {} }) });
    const server = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      if (!vs.handle(req, res)) res.writeHead(404).end();
    });
    try {
      const baseUrl = `https://127.0.0.1:${server.port}/v1/webapi/automaticupgrades/channel/default`;
      let err: unknown;
      await channelVersionSource({ baseUrl, dialer: new Dialer({ env: {} }) })().catch((e: unknown) => (err = e));
      expect(err).toMatchObject({ code: 'GW_ERR_CLIENT_UNTRUSTED', hint: expect.stringContaining('--ca-file') });
      // What --ca-file gives channelVersionSource (src/cli/gateway-kube-updater.ts): the CA's PEM.
      expect(await channelVersionSource({ baseUrl, dialer: new Dialer({ env: {} }), ca: pki.caPem })()).toMatchObject({ version: 'v17.0.2' });
    } finally {
      await server.close();
      await pki.cleanup();
    }
  });
});
