/**
 * Traces through the whole path, real processes: Proxy A and Proxy B (each `gateway start` with auth + proxy) on
 * one PostgreSQL with tunnel_strategy proxy_peering, an agent (SSH Service and an HTTP app) whose only tunnel is
 * to B, and a user logged in through A, so every connection goes client → A → peering → B → tunnel → agent. Every
 * process exports to the stand-in collector of test/helpers/otlp.ts (no OpenTelemetry Collector or Jaeger is
 * packaged in Debian): the daemons through gateway.tracing, gwsh through OTEL_EXPORTER_OTLP_ENDPOINT.
 *
 * Covered: OpenSSH's ssh through `gwsh proxy ssh` (its ProxyCommand) continuing the TRACEPARENT of its
 * environment, and curl's HTTP request to the app with a traceparent header: the collector gets one span from
 * each process with the trace id, parents forming the chain gwsh → A → A's route (via peer, with the Dialer's
 * plan) → B → agent, and the route decisions as attributes. Hostile: a malformed traceparent starts a new trace;
 * a tracestate over 512 bytes is not carried; with a collector that never answers, gwsh still connects and exits
 * and connections through the daemons still go through (and the daemons stop: afterAll).
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, startGatewayExpectingFailure, type RunResult, type RunningGateway } from '../helpers/gateway.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from '../helpers/otlp.js';
import { curl } from '../helpers/curl.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';
import { sessionLogin } from '../helpers/sessionlogin.js';
import { rootSuite } from '../helpers/root.js';

/** The OS account sessions log in as (see test/helpers/sessionlogin.ts: not root's own dotfiles). */
const LOGIN = sessionLogin();

let dir: string;
let pg: PostgresServer;
let collector: OtlpReceiver;
let hanging: OtlpReceiver;
let a: RunningGateway;
let b: RunningGateway;
let agent: RunningGateway;
let app: http.Server;
let pki: TestPki;
let kubeApi: HttpTestServer;
let webA: number;
let peerB: number;
let sshConfig: string;
let userEnv: Record<string, string>;

const TRACE = '0af7651916cd43dd8448eb211c80319c';
const PARENT = 'b7ad6b7169203331';

const proxyYaml = (name: string, web: number, peer: number) =>
  [
    'gateway:',
    `  nodename: ${name}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: debug }',
    `  storage: { type: postgres, conn_string: "${pg.url()}" }`,
    `  tracing: { otlp_endpoint: "${collector.url}", sample_ratio: 1 }`,
    'auth_service:',
    '  cluster_name: trace.example',
    '  listen_addr: 127.0.0.1:0',
    '  tunnel_strategy: { type: proxy_peering, agent_connection_count: 1 }',
    'proxy_service:',
    `  web_listen_addr: 127.0.0.1:${web}`,
    // trace.test too: curl takes no wildcard of one label (*.localhost), the app is web.trace.test.
    `  public_addr: ["localhost:${web}", "trace.test:${web}"]`,
    `  peer_listen_addr: 127.0.0.1:${peer}`,
    '',
  ].join('\n');

/** A program with exactly the environment given (PATH and HOME added), asynchronously, with a deadline. */
function run(command: string, args: string[], env: Record<string, string>): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env: { PATH: process.env.PATH ?? '', HOME: dir, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${command} did not finish in 60 s (a hang)\n${stderr.slice(-2000)}`));
    }, 60_000);
    child.once('close', (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

const ssh = (env: Record<string, string>) => run('ssh', ['-F', sshConfig, '-o', 'BatchMode=yes', `${LOGIN}@agent-t`, 'echo', 'traced'], { ...userEnv, ...env });

/** The spans of one trace, once every name in `names` has arrived. */
async function traceOf(traceId: string, names: string[]): Promise<Map<string, ReceivedSpan>> {
  let found = new Map<string, ReceivedSpan>();
  await waitUntil(`spans ${names.join(', ')} of trace ${traceId}`, () => {
    found = new Map(collector.spans.filter((s) => s.traceId === traceId).map((s) => [s.name, s]));
    return names.every((n) => found.has(n));
  }, 30_000, 200);
  return found;
}

/** The chain of parents, each span a child of the one before; and which process sent each. */
function expectChain(spans: Map<string, ReceivedSpan>, names: string[], nodes: string[]): void {
  for (let i = 1; i < names.length; i++) expect(spans.get(names[i]!)!.parentSpanId, `${names[i]} is a child of ${names[i - 1]}`).toBe(spans.get(names[i - 1]!)!.spanId);
  expect(names.map((n) => spans.get(n)!.resource['gateway.nodename'] ?? spans.get(n)!.resource['service.name'])).toEqual(nodes);
}

rootSuite(['dbUsers'])('traces from gwsh and an HTTP request through Proxy, peering and tunnel to the agent', () => {
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-e2e-trace-'));
    collector = await startOtlpReceiver();
    hanging = await startOtlpReceiver('hang');
    pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }) });
    app = http.createServer((req, res) => res.end(`app saw traceparent ${req.headers.traceparent ?? 'none'}\n`));
    await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
    // A stand-in Kubernetes API server: it answers with the traceparent its request carried.
    pki = await makeTestPki();
    const apiCert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
    kubeApi = await startHttpsServer({ cert: apiCert.certPem, key: apiCert.keyPem }, (req, res) => res.end(`api server saw traceparent ${req.headers.traceparent ?? 'none'}\n`));
    await writeFile(join(dir, 'kube-ca.pem'), pki.caPem);
    webA = await getPort({ host: '127.0.0.1' });
    const [webB, peerA] = [await getPort({ host: '127.0.0.1' }), await getPort({ host: '127.0.0.1' })];
    peerB = await getPort({ host: '127.0.0.1' });
    a = await startGateway(proxyYaml('proxy-a', webA, peerA));
    b = await startGateway(proxyYaml('proxy-b', webB, peerB));
    const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', b.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
    const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
    const token = (JSON.parse((await admin(['tokens', 'add', '--type=node,app,kube', '--format', 'json'])).stdout) as { token: string }).token;
    await admin(['users', 'add', 'alice', '--roles=access', `--logins=${LOGIN}`, '--kubernetes-groups=viewers'], 'correct horse battery\n');
    const appPort = (app.address() as net.AddressInfo).port;
    agent = await startGateway(
      [
        'gateway:',
        '  nodename: agent-t',
        '  data_dir: DATA_DIR',
        '  log: { format: json, severity: debug }',
        `  tracing: { otlp_endpoint: "${collector.url}" }`,
        'ssh_service:',
        '  enabled: yes',
        'app_service:',
        '  enabled: yes',
        '  apps:',
        `    - { name: web, uri: "http://127.0.0.1:${appPort}", public_addr: web.trace.test }`,
        'kube_service:',
        '  enabled: yes',
        '  clusters:',
        `    - { name: tk, api_server: "https://127.0.0.1:${kubeApi.port}", ca_file: ${join(dir, 'kube-ca.pem')} }`,
        '',
      ].join('\n'),
      { args: ['--token', token, '--ca-pin', pin, '--proxy', `localhost:${webB}`] },
    );
    await agent.waitForLog('reverse tunnel ready');
    // The classic route (GWSH_E2E=off): its chain through A's route and B's peering hop is what is traced here; an
    // end-to-end stream goes over peering raw, with no proxy.access or proxy.peer span (docs/tunnels.md).
    userEnv = { GWSH_HOME: join(dir, 'alice'), GWSH_E2E: 'off', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url.replace(/\/v1\/traces$/, '') };
    expect((await runCli('gwsh', ['login', `--proxy=localhost:${webA}`, '--user=alice', `--ca-pin=${pin}`], { env: { HOME: dir, ...userEnv }, input: 'correct horse battery\n' })).status).toBe(0);
    const config = await runCli('gwsh', ['config'], { env: { HOME: dir, ...userEnv } });
    sshConfig = join(dir, 'ssh_config');
    await writeFile(sshConfig, config.stdout);
    // A learns from the shared backend that B holds the agent's tunnel.
    await waitUntil('ssh reaches the agent through A', async () => (await ssh({})).stdout === 'traced\n', 60_000, 500);
  }, 180_000);

  afterAll(async () => {
    await agent?.stop();
    await a?.stop();
    await b?.stop();
    app?.close();
    await kubeApi?.close();
    await pki?.cleanup();
    await pg?.stop();
    await collector?.close();
    await hanging?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('ssh through gwsh: one trace from TRACEPARENT, a span per hop, the route decisions as attributes', async () => {
    const r = await ssh({ TRACEPARENT: `00-${TRACE}-${PARENT}-01`, TRACESTATE: 'vendor=abc' });
    expect(r.stdout).toBe('traced\n');
    const names = ['gwsh.connect', 'proxy.access', 'proxy.route', 'proxy.peer', 'agent.dial'];
    const spans = await traceOf(TRACE, names);
    expect(spans.get('gwsh.connect')!.parentSpanId).toBe(PARENT);
    expectChain(spans, names, ['gwsh', 'proxy-a', 'proxy-a', 'proxy-b', 'agent-t']);
    expect(spans.get('gwsh.connect')!.attributes).toMatchObject({ 'gateway.route': 'gateway-proxy-ssh', 'gateway.resource': 'agent-t', 'gateway.dial.via': 'direct', 'gateway.dial.reason': expect.any(String) });
    expect(spans.get('proxy.access')!.attributes).toMatchObject({ 'gateway.route': 'gateway-proxy-ssh', 'gateway.route.reason': 'ALPN gateway-proxy-ssh', 'gateway.service': 'ssh', 'gateway.resource': 'agent-t' });
    expect(spans.get('proxy.route')!.attributes).toMatchObject({
      'gateway.router.via': 'peer',
      'gateway.router.reason': expect.stringContaining('holds a tunnel'),
      'gateway.dial.via': 'direct',
      'gateway.dial.target': `127.0.0.1:${peerB}`,
    });
    expect(spans.get('proxy.peer')!.attributes).toMatchObject({ 'gateway.router.via': 'local', 'gateway.service': 'ssh' });
    expect(spans.get('agent.dial')!.attributes).toMatchObject({ 'gateway.service': 'ssh' });
    expect(spans.get('agent.dial')!.kind).toBe(2);
    // The tracestate went all the way: route header, peering request, tunnel.
    expect(names.map((n) => spans.get(n)!.traceState)).toEqual(names.map(() => 'vendor=abc'));
  });

  it('an HTTP request to the app with a traceparent header: the same chain from the Proxy on', async () => {
    const trace = 'a'.repeat(31) + '1';
    const home = userEnv.GWSH_HOME!;
    const r = await curl(['--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), '--resolve', `web.trace.test:${webA}:127.0.0.1`, '-H', `traceparent: 00-${trace}-${PARENT}-01`, `https://web.trace.test:${webA}/`]);
    expect(r.stdout, r.stderr).toContain('app saw traceparent');
    const names = ['proxy.app', 'proxy.route', 'proxy.peer', 'agent.dial'];
    const spans = await traceOf(trace, names);
    expect(spans.get('proxy.app')!.parentSpanId).toBe(PARENT);
    expectChain(spans, names, ['proxy-a', 'proxy-a', 'proxy-b', 'agent-t']);
    expect(spans.get('proxy.app')!.attributes).toMatchObject({ 'gateway.route': 'web', 'gateway.service': 'app', 'gateway.resource': 'web' });
    // The app's request carries the Proxy's span as its parent, so the app's own trace continues the chain.
    expect(r.stdout).toBe(`app saw traceparent 00-${trace}-${spans.get('proxy.app')!.spanId}-01\n`);
    expect(spans.get('agent.dial')!.attributes).toMatchObject({ 'gateway.service': 'app', 'gateway.resource': 'web' });
  });

  it('a Kubernetes request with a traceparent header: proxy.kube with the route decision, the same chain, the API server a child', async () => {
    const trace = 'c'.repeat(31) + '3';
    const home = userEnv.GWSH_HOME!;
    const kubeHost = 'kube-gateway-proxy-alpn.trace.test';
    const r = await curl(['--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), '--resolve', `${kubeHost}:${webA}:127.0.0.1`, '-H', `traceparent: 00-${trace}-${PARENT}-01`, `https://${kubeHost}:${webA}/k8s/tk/api`]);
    expect(r.stdout, r.stderr).toContain('api server saw traceparent');
    const names = ['proxy.kube', 'proxy.route', 'proxy.peer', 'agent.dial'];
    const spans = await traceOf(trace, names);
    expect(spans.get('proxy.kube')!.parentSpanId).toBe(PARENT);
    expectChain(spans, names, ['proxy-a', 'proxy-a', 'proxy-b', 'agent-t']);
    expect(spans.get('proxy.kube')!.attributes).toMatchObject({ 'gateway.route': 'kube', 'gateway.route.reason': expect.stringContaining('/k8s/tk'), 'gateway.service': 'kube', 'gateway.resource': 'tk' });
    // The agent's dial to the API server, decided by its Dialer; the API server's request a child of the Proxy's span.
    expect(spans.get('agent.dial')!.attributes).toMatchObject({ 'gateway.service': 'kube', 'gateway.resource': 'tk', 'gateway.dial.via': 'direct' });
    expect(r.stdout).toBe(`api server saw traceparent 00-${trace}-${spans.get('proxy.kube')!.spanId}-01\n`);
  });

  it('a malformed traceparent starts a new trace; a tracestate over 512 bytes is not carried', async () => {
    const before = collector.spans.length;
    const r = await ssh({ TRACEPARENT: `00-${'0'.repeat(32)}-${PARENT}-01`, TRACESTATE: `k=${'v'.repeat(600)}` });
    expect(r.stdout).toBe('traced\n');
    await waitUntil('a new root span from gwsh', () => collector.spans.slice(before).some((s) => s.name === 'gwsh.connect'), 30_000, 200);
    const root = collector.spans.slice(before).find((s) => s.name === 'gwsh.connect')!;
    expect(root.parentSpanId).toBe('');
    expect(root.traceId).not.toBe('0'.repeat(32));
    await traceOf(root.traceId, ['proxy.access', 'agent.dial']);

    // A traceparent header not of version 00 at the Proxy: a new trace there too.
    const home = userEnv.GWSH_HOME!;
    const mark = collector.spans.length;
    const seen = await curl(['--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), '--resolve', `web.trace.test:${webA}:127.0.0.1`, '-H', `traceparent: 01-${TRACE}-${PARENT}-01`, `https://web.trace.test:${webA}/`]);
    await waitUntil('the app hop', () => collector.spans.slice(mark).some((s) => s.name === 'proxy.app'), 30_000, 200);
    const app = collector.spans.slice(mark).find((s) => s.name === 'proxy.app')!;
    expect(app.parentSpanId).toBe('');
    expect(app.traceId).not.toBe(TRACE);
    // Nor does the app get the malformed header: it gets the new trace's.
    expect(seen.stdout).toBe(`app saw traceparent 00-${app.traceId}-${app.spanId}-01\n`);

    // A good traceparent with a tracestate over 512 bytes: the trace is continued, the tracestate dropped.
    const trace = 'b'.repeat(31) + '2';
    await curl(['--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), '--resolve', `web.trace.test:${webA}:127.0.0.1`, '-H', `traceparent: 00-${trace}-${PARENT}-01`, '-H', `tracestate: k=${'v'.repeat(600)}`, `https://web.trace.test:${webA}/`]);
    const spans = await traceOf(trace, ['proxy.app', 'agent.dial']);
    expect(spans.get('proxy.app')!.parentSpanId).toBe(PARENT);
    expect([spans.get('proxy.app')!.traceState, spans.get('agent.dial')!.traceState]).toEqual(['', '']);
  });

  it('a collector that never answers slows no connection: gwsh connects and exits, the daemons carry on', async () => {
    const r = await ssh({ OTEL_EXPORTER_OTLP_ENDPOINT: hanging.url.replace(/\/v1\/traces$/, '') });
    expect(r.stdout).toBe('traced\n');
    expect(r.status).toBe(0);
    // It did try: the export reached the collector that never answered, and gwsh stopped waiting for it.
    expect(hanging.requests()).toBeGreaterThan(0);

    // Now the daemons' collector stops answering too (the last case of the suite: it stays so).
    collector.mode = 'hang';
    const before = collector.requests();
    const home = userEnv.GWSH_HOME!;
    for (let i = 0; i < 5; i++) {
      expect((await ssh({ OTEL_TRACES_EXPORTER: 'none' })).stdout).toBe('traced\n');
      const app = await curl(['--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), '--resolve', `web.trace.test:${webA}:127.0.0.1`, `https://web.trace.test:${webA}/`]);
      expect(app.stdout).toContain('app saw traceparent 00-');
    }
    // The daemons did export into it (and are left waiting for an answer that never comes).
    await waitUntil('the daemons export to the collector that hangs', () => collector.requests() > before, 30_000, 200);
  });
});

describe('tracing settings the daemon cannot use', () => {
  it('stop `gateway start` with GW_ERR_TRACE_SETTINGS naming the variable, before any role starts', async () => {
    const yaml = ['gateway:', '  nodename: t', '  data_dir: DATA_DIR', 'auth_service:', '  listen_addr: 127.0.0.1:0', ''].join('\n');
    const cases: Array<[Record<string, string>, string]> = [
      [{ OTEL_TRACES_EXPORTER: 'zipkin' }, 'OTEL_TRACES_EXPORTER=zipkin'],
      [{ OTEL_EXPORTER_OTLP_ENDPOINT: 'grpc://collector:4317' }, 'http:// or https://'],
    ];
    for (const [env, named] of cases) {
      const r = await startGatewayExpectingFailure(yaml, [], env);
      expect(r.status, r.stderr).toBe(1);
      expect(r.stderr).toContain('GW_ERR_TRACE_SETTINGS');
      expect(r.stderr).toContain(named);
    }
  });
});
