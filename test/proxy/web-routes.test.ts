/**
 * The Proxy's web routes (src/proxy/web.ts, terminal.ts, webapps.ts) in one process: the real Auth, Proxy and
 * agent starters (an SSH Service and two apps, one HTTP and one TCP), the agent's upgrader on the channel "beta"
 * (its endpoint file under GATEWAY_UPGRADE_ROOT, as the daemon's environment gives it). What the end-to-end test
 * (test/e2e/web-terminal.test.ts) does not: an agent newer than its channel's target is not out of date, the
 * window that is open now, the refusals of malformed and hostile requests by their codes, and the parsers.
 */
import { randomUUID } from 'node:crypto';
import https from 'node:https';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IncomingMessage } from 'node:http';
import { parseManifest } from '../../src/auth/resources/index.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAgentRole } from '../../src/roles/agent.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { daemonEnvironment } from '../../src/roles/environment.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { launchPageAddr } from '../../src/proxy/webapps.js';
import { terminalRequest } from '../../src/proxy/terminal.js';
import { createWebRoutes, isOutdated } from '../../src/proxy/web.js';
import type { Identity } from '../../src/auth/pki.js';
import type { RolloutStatus } from '../../src/wire/autoupdate.js';
import { GatewayError } from '../../src/errors.js';
import { createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { checkOrigin } from '../../src/proxy/webcredentials.js';
import WebSocket from 'ws';
import { joinCluster } from '../../src/agent/identity.js';
import { connectRemoteAuth } from '../../src/roles/auth.js';
import { startTracing, stopTracing } from '../../src/trace.js';
import { startOtlpReceiver } from '../helpers/otlp.js';
import { rootTest } from '../helpers/root.js';
import { waitUntil } from '../helpers/wait.js';

const PASSWORD = 'correct horse battery';
const ADMIN = { kind: 'admin' as const, name: 'admin', cluster: 'webroutes.example', roles: [] };

let dir: string;
let upgradeRoot: string;
let lifecycle: Lifecycle;
let auth: AuthRole;
let web: string;
let ca: string;

interface Answer {
  status: number;
  json: Record<string, any>;
}

function call(method: string, path: string, headers: Record<string, string> = {}, at = web, body?: unknown): Promise<Answer> {
  const i = at.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const req = https.request({ host: at.slice(0, i), port: Number(at.slice(i + 1)), method, path, ca, agent: false, headers: { host: 'localhost', ...headers } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, json: text ? (JSON.parse(text) as Record<string, any>) : {} }));
    });
    req.on('error', reject);
    req.end(body === undefined || typeof body === 'string' ? body : JSON.stringify(body));
  });
}

/** A launch nonce, as an app host's /x-gateway-auth gives the page (the launch route binds the token to it). */
const STATE = 's'.repeat(43);

async function session(user: string): Promise<Record<string, string>> {
  const s = await auth.auth.webLogin(user, PASSWORD, '127.0.0.1');
  return { cookie: `__Host-gw_session=${s.id}`, authorization: `Bearer ${s.bearer}` };
}

beforeAll(async () => {
  setRootLogger(createLogger({ level: 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-webroutes-'));
  upgradeRoot = join(dir, 'upgrade-root');
  await mkdir(join(upgradeRoot, 'etc', 'gateway-upgrade.d'), { recursive: true });
  await writeFile(join(upgradeRoot, 'etc', 'gateway-upgrade.d', 'endpoint'), 'localhost:443/v1/webapi/automaticupgrades/channel/beta\n');
  const config = parseConfig(
    [
      'gateway:',
      '  nodename: localhost',
      `  data_dir: ${join(dir, 'data')}`,
      'auth_service:',
      '  cluster_name: webroutes.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      '  web_listen_addr: 127.0.0.1:0',
      '  automatic_upgrades_channels:',
      '    beta: { static_version: v0.0.1 }',
      'ssh_service:',
      '  enabled: yes',
      '  labels: { env: dev }',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      '    - { name: wiki, uri: "http://127.0.0.1:9", public_addr: wiki.localhost, labels: {env: dev} }',
      '    - { name: raw, uri: "tcp://127.0.0.1:9", labels: {env: dev} }',
      '',
    ].join('\n'),
    'web routes test',
  );
  lifecycle = new Lifecycle();
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  const dialer = new Dialer({ env: {} });
  auth = await startAuthRole({ config, limits, lifecycle });
  ca = auth.auth.host.tls.certPem;
  const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: randomUUID() });
  web = proxy.addresses.web!;
  await startAgentRole({
    config,
    services: ['auth_service', 'proxy_service', 'ssh_service', 'app_service'],
    localAuth: auth.auth,
    localProxy: web,
    dialer,
    environment: daemonEnvironment({ GATEWAY_UPGRADE_ROOT: upgradeRoot }),
    lifecycle,
  });
  await waitUntil('the agent in the cluster view', () => proxy.cluster.agents().length === 1);
  await auth.auth.addUser(auth.auth.adminIdentity(), 'olga', ['editor', 'access'], PASSWORD, ['root']);
  await auth.auth.addUser(auth.auth.adminIdentity(), 'alice', ['access'], PASSWORD, ['root']);
  // Every day from the current hour: the window is open now.
  const hour = new Date().getUTCHours();
  await auth.auth.createResources(ADMIN, parseManifest(`kind: cluster_maintenance_config\nversion: v1\nspec:\n  agent_upgrades:\n    utc_start_hour: ${hour}\n    weekdays: ["*"]\n`, 'm.yaml'), true);
}, 60_000);

afterAll(async () => {
  await lifecycle?.stop().catch(() => undefined);
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('/webapi/agents', () => {
  it('an agent newer than its channel target is not out of date; the window open now is reported', async () => {
    const answer = await call('GET', '/webapi/agents', await session('olga'));
    expect(answer.status, JSON.stringify(answer.json)).toBe(200);
    expect(answer.json.agents).toHaveLength(1);
    const agent = answer.json.agents[0];
    expect(agent).toMatchObject({ nodename: 'localhost', channel: 'beta', target_version: 'v0.0.1', outdated: false, online: true });
    // The window may close between the two readings of the clock only at the hour's end: then it is the next one.
    if (agent.in_window_now) expect(Date.parse(agent.next_window.start)).toBeLessThanOrEqual(Date.now());
    expect(Date.parse(agent.next_window.end) - Date.parse(agent.next_window.start)).toBe(3600_000);
  });
});

describe('a Proxy in its own process (RemoteProxyAuth)', () => {
  // The shell runs as root on the in-process agent's SSH Service.
  rootTest(['setuid'])('lists agents with their software and opens a terminal: sessions, certificates and the window over /v1/proxy/', async () => {
    const own = new Lifecycle();
    try {
      const { token } = await auth.auth.addToken(auth.auth.adminIdentity(), { roles: ['proxy'] });
      await joinCluster({ dataDir: join(dir, 'proxy2'), server: auth.address, joinedVia: 'auth', token, caPin: auth.auth.caPin(), roles: ['proxy'], nodename: 'localhost', publicAddrs: [], dialer: new Dialer({ env: {} }) });
      const proxyConfig = parseConfig(
        ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'proxy2')}`, `  auth_server: ${auth.address}`, 'auth_service:', '  enabled: no', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', '  automatic_upgrades_channels:', '    beta: { static_version: v99.0.0 }', ''].join('\n'),
        'split proxy',
      );
      const limits = new ConnectionLimits(limitSettings(proxyConfig));
      own.onStop('backend', () => limits.close());
      const dialer = new Dialer({ env: {} });
      const remote = await connectRemoteAuth({ config: proxyConfig, dialer, lifecycle: own });
      const split = await startProxyRole({ config: proxyConfig, auth: remote.auth, api: remote.api, limits, dialer, lifecycle: own, proxyId: remote.identity.hostId });
      const splitWeb = split.addresses.web!;
      const agentConfig = parseConfig(['gateway:', '  nodename: split-node', `  data_dir: ${join(dir, 'agent2')}`, 'ssh_service:', '  enabled: yes', ''].join('\n'), 'split agent');
      await startAgentRole({ config: agentConfig, services: ['ssh_service'], localAuth: auth.auth, localProxy: splitWeb, dialer, environment: daemonEnvironment({ GATEWAY_UPGRADE_ROOT: upgradeRoot }), lifecycle: own });
      await waitUntil('the agent at the split Proxy', () => split.tunnels.list().some((a) => a.nodename === 'split-node'));

      const olga = await session('olga');
      const agents = await call('GET', '/webapi/agents', olga, splitWeb);
      expect(agents.status, JSON.stringify(agents.json)).toBe(200);
      // Its own version server says v99.0.0 for beta; the version and channel crossed /v1/proxy/presence.
      expect((agents.json.agents as Array<Record<string, unknown>>).find((a) => a.nodename === 'split-node')).toMatchObject({ channel: 'beta', target_version: 'v99.0.0', outdated: true });
      expect(agents.json.maintenance).toMatchObject({ agent_upgrades: { weekdays: expect.any(Array) } });

      const s = await auth.auth.webLogin('olga', PASSWORD, '127.0.0.1');
      const ws = new WebSocket(`wss://${splitWeb}/webapi/terminal?node=split-node&login=root`, ['gateway-terminal', `bearer.${s.bearer}`], { ca, ...({ servername: 'localhost' } as object), headers: { cookie: `__Host-gw_session=${s.id}` } });
      let output = '';
      ws.on('message', (data: Buffer, binary: boolean) => (binary ? (output += data.toString()) : undefined));
      await new Promise<void>((resolve, reject) => ws.once('open', () => resolve()).once('error', reject));
      ws.send(Buffer.from('echo split-$((20+1))\n'), { binary: true });
      await waitUntil('the echo through the split Proxy', () => output.includes('split-21'));
      ws.close();
    } finally {
      await own.stop().catch(() => undefined);
    }
    // Stopped, the agent is still listed (its node record), offline, with nothing it reported.
    await waitUntil('the stopped agent offline', async () => {
      const agents = (await call('GET', '/webapi/agents', await session('olga'))).json.agents as Array<Record<string, unknown>>;
      return agents.some((a) => a.nodename === 'split-node' && a.online === false);
    });
    const rows = (await call('GET', '/webapi/agents', await session('olga'))).json.agents as Array<Record<string, unknown>>;
    expect(rows.find((a) => a.nodename === 'split-node')).toMatchObject({ online: false, version: null, outdated: false, services: [] });
    // A Proxy's own node record is not an agent.
    expect(rows.map((a) => a.nodename)).toEqual(['localhost', 'split-node']);
  }, 60_000);
});

describe('the terminal, traced', () => {
  // The shell runs as root on the in-process agent's SSH Service.
  rootTest(['setuid'])("continues the browser's traceparent (proxy.web_terminal, then the router and the agent), else starts a trace", async () => {
    const receiver = await startOtlpReceiver();
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: {}, serviceName: 'test' });
    const open = async (headers: Record<string, string>) => {
      const s = await auth.auth.webLogin('olga', PASSWORD, '127.0.0.1');
      const ws = new WebSocket(`wss://${web}/webapi/terminal?node=localhost&login=root`, ['gateway-terminal', `bearer.${s.bearer}`], { ca, ...({ servername: 'localhost' } as object), headers: { cookie: `__Host-gw_session=${s.id}`, ...headers } });
      let output = '';
      ws.on('message', (data: Buffer, binary: boolean) => (binary ? (output += data.toString()) : undefined));
      await new Promise<void>((resolve, reject) => ws.once('open', () => resolve()).once('error', reject));
      ws.send(Buffer.from('echo traced-$((20+2))\n'), { binary: true });
      await waitUntil('the echo', () => output.includes('traced-22'));
      ws.close();
    };
    const trace = 'f'.repeat(31) + '5';
    try {
      await open({ traceparent: `00-${trace}-${'a'.repeat(16)}-01` });
      await open({});
    } finally {
      await stopTracing();
      await receiver.close();
    }
    const of = (traceId: string, name: string) => receiver.spans.find((x) => x.traceId === traceId && x.name === name);
    const terminal = of(trace, 'proxy.web_terminal');
    expect(terminal).toMatchObject({ parentSpanId: 'a'.repeat(16), attributes: { 'gateway.route': 'web-terminal', 'gateway.service': 'ssh', 'gateway.resource': 'localhost' } });
    expect(of(trace, 'proxy.route')?.parentSpanId).toBe(terminal!.spanId);
    expect(of(trace, 'agent.dial')?.parentSpanId).toBe(of(trace, 'proxy.route')!.spanId);
    // Without a header: a trace of its own, rooted at the Proxy.
    const root = receiver.spans.find((x) => x.name === 'proxy.web_terminal' && x.traceId !== trace);
    expect(root?.parentSpanId).toBe('');
    expect(of(root!.traceId, 'agent.dial')).toBeDefined();
  }, 60_000);
});

describe('/webapi/autoupdate/status', () => {
  const ROLLOUT: RolloutStatus = {
    managed: true,
    mode: 'enabled',
    strategy: 'halt-on-error',
    start_version: '17.0.0',
    target_version: '17.0.1',
    groups: [{ name: 'dev', state: 'halted', reason: 'canary dev-1 failed: db orders did not answer', canaries: [{ host_id: 'h1', nodename: 'dev-1', state: 'failed' }], versions: { '17.0.0': 3 }, stale: [] }],
  };
  let reader: Record<string, string>;

  beforeAll(async () => {
    // A role that reads every resource: the rollout's rule (autoupdate_agent_rollout) is among them.
    await auth.auth.createResources(ADMIN, parseManifest('kind: role\nversion: v7\nmetadata: { name: reads-all }\nspec:\n  allow:\n    rules: [{ resources: ["*"], verbs: [read] }]\n', 'r.yaml'), true);
    await auth.auth.addUser(auth.auth.adminIdentity(), 'rita', ['reads-all'], PASSWORD, ['root']);
    reader = await session('rita');
  });

  it('a user whose roles may not read autoupdate_agent_rollout is refused, by its code, before anything is asked', async () => {
    const answer = await call('GET', '/webapi/autoupdate/status', await session('olga'));
    expect([answer.status, answer.json.error.code]).toEqual([403, 'GW_ERR_ACCESS_DENIED']);
    expect(answer.json.error.message).toContain('"read" on "autoupdate_agent_rollout"');
    expect((await call('GET', '/webapi/autoupdate/status')).status).toBe(401);
    expect((await call('POST', '/webapi/autoupdate/status', reader)).json.error.code).toBe('GW_ERR_API_METHOD_NOT_ALLOWED');
  });

  it('a Proxy with no rollout wired answers managed: false (the page shows the channels)', async () => {
    const answer = await call('GET', '/webapi/autoupdate/status', reader);
    expect(answer.status, JSON.stringify(answer.json)).toBe(200);
    expect(answer.json).toEqual({ managed: false, groups: [] });
  });

  it("forwards the Auth Service's status for the user's identity, and its refusal by its code", async () => {
    const asked: Identity[] = [];
    let fail = false;
    const routes = createWebRoutes({
      auth: auth.auth,
      agents: { agents: () => [], dial: () => Promise.reject(new Error('no agent')) },
      presence: () => [],
      targetVersion: () => Promise.resolve('v1.0.0'),
      nextWindow: () => undefined,
      limits: limitSettings(parseConfig('gateway:\n  nodename: x\n', 'limits')),
      rolloutStatus: (identity) => {
        asked.push(identity);
        return fail ? Promise.reject(new GatewayError('GW_ERR_ACCESS_DENIED', 'the Auth Service refused', { hint: 'x' })) : Promise.resolve(ROLLOUT);
      },
    });
    const server: Server = createServer((req, res) => void (routes.handle(req, res) || res.writeHead(404).end()));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const port = (server.address() as AddressInfo).port;
      const get = (headers: Record<string, string>) =>
        new Promise<Answer>((resolve, reject) => {
          const req = httpRequest({ host: '127.0.0.1', port, path: '/webapi/autoupdate/status', headers }, (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, json: text ? (JSON.parse(text) as Record<string, any>) : {} }));
          });
          req.on('error', reject);
          req.end();
        });
      const ok = await get(reader);
      expect(ok.status, JSON.stringify(ok.json)).toBe(200);
      expect(ok.json).toEqual(ROLLOUT);
      expect(asked.map((i) => i.name)).toEqual(['rita']);
      // Refused users never reach the Auth Service.
      expect((await get(await session('olga'))).status).toBe(403);
      expect(asked).toHaveLength(1);
      fail = true;
      const refused = await get(reader);
      expect([refused.status, refused.json.error.code]).toEqual([403, 'GW_ERR_ACCESS_DENIED']);
    } finally {
      routes.close();
      await new Promise((r) => server.close(r));
    }
  });
});

describe('hostile and malformed requests', () => {
  it('are refused by their codes', async () => {
    const olga = await session('olga');
    // A route asked with another method: 405, as the Auth API's router and the version server answer it.
    for (const [method, path] of [['POST', '/webapi/resources'], ['GET', '/webapi/apps/wiki/launch']] as const) {
      const wrong = await call(method, path, olga);
      expect([wrong.status, wrong.json.error.code], `${method} ${path}`).toEqual([405, 'GW_ERR_API_METHOD_NOT_ALLOWED']);
    }
    const unknown = await call('POST', '/webapi/apps/nope/launch', olga, web, { state: STATE });
    expect([unknown.status, unknown.json.error.code]).toEqual([404, 'GW_ERR_RESOURCE_NOT_FOUND']);
    // A TCP app has no page to open; an app at another host than the one named is not this one.
    expect((await call('POST', '/webapi/apps/raw/launch', olga, web, { state: STATE })).json.error.code).toBe('GW_ERR_RESOURCE_NOT_FOUND');
    expect((await call('POST', '/webapi/apps/wiki/launch', olga, web, { state: STATE, addr: 'wiki.evil.example' })).json.error.code).toBe('GW_ERR_RESOURCE_NOT_FOUND');
    // Without the app host's nonce, or with a body that is not JSON.
    expect((await call('POST', '/webapi/apps/wiki/launch', olga, web, { state: 'short' })).json.error.code).toBe('GW_ERR_WEB_APP_LAUNCH_UNBOUND');
    expect((await call('POST', '/webapi/apps/wiki/launch', olga, web, '{')).json.error.code).toBe('GW_ERR_API_BAD_REQUEST');
    // A cookie header over the 8 KiB read (under Node's header limit): no session is read from it.
    const huge = await call('GET', '/webapi/resources', { cookie: `${olga.cookie!}; a=${'x'.repeat(9_000)}`, authorization: olga.authorization! });
    expect(huge.status).toBe(401);
    expect(huge.json.error.code).toMatch(/^GW_ERR_WEB_SESSION_(MISSING|INVALID)$/);
    // A session id of the wrong form, and a bearer of the wrong form.
    expect((await call('GET', '/webapi/resources', { cookie: '__Host-gw_session=../../etc', authorization: olga.authorization! })).status).toBe(401);
    expect((await call('GET', '/webapi/resources', { cookie: olga.cookie!, authorization: 'Bearer ' })).status).toBe(401);
    // The terminal's path without a WebSocket upgrade is not the API's.
    expect((await call('GET', '/webapi/terminal?node=localhost&login=root', olga)).status).not.toBe(200);
  });

  it('the launch of an app refuses another origin and a user whose roles do not allow it', async () => {
    const olga = await session('olga');
    const cross = await call('POST', '/webapi/apps/wiki/launch', { ...olga, origin: 'https://localhost.evil.example' }, web, { state: STATE });
    expect([cross.status, cross.json.error.code]).toEqual([403, 'GW_ERR_WEB_CSRF']);
    const ok = await call('POST', '/webapi/apps/wiki/launch', { ...olga, origin: 'https://localhost' }, web, { state: STATE, addr: 'wiki.localhost' });
    expect(ok.status, JSON.stringify(ok.json)).toBe(200);
    expect(ok.json.url).toBe(`https://wiki.localhost/x-gateway-auth?token=${new URL(ok.json.url as string).searchParams.get('token')}&state=${STATE}`);
  });
});

describe('the parsers', () => {
  it('isOutdated compares versions, and unknown ones are never out of date', () => {
    expect(isOutdated('1.2.3', 'v1.2.4')).toBe(true);
    expect(isOutdated('v1.2.4', 'v1.2.4')).toBe(false);
    expect(isOutdated('2.0.0', 'v1.9.9')).toBe(false);
    expect(isOutdated('17.0.0-dev', 'v17.0.0')).toBe(true); // a pre-release comes before its release
    expect(isOutdated('17.0.0-dev', 'v17.0.0-dev')).toBe(false);
    expect(isOutdated(undefined, 'v1.0.0')).toBe(false);
    expect(isOutdated('garbage', 'v1.0.0')).toBe(false);
    expect(isOutdated('1.0.0', undefined)).toBe(false);
  });

  it('terminalRequest checks names and the window size', () => {
    expect(terminalRequest('/webapi/terminal?node=web-1&login=root&cols=120&rows=40')).toEqual({ node: 'web-1', login: 'root', cols: 120, rows: 40 });
    expect(terminalRequest('/webapi/terminal?node=web-1&login=root')).toEqual({ node: 'web-1', login: 'root', cols: 80, rows: 24 });
    for (const bad of ['node=&login=root', 'node=a&login=', 'node=../x&login=root', 'node=a&login=root&cols=0', 'node=a&login=root&rows=100000', 'node=a&login=root&cols=1.5', `node=${'a'.repeat(200)}&login=root`]) {
      expect(() => terminalRequest(`/webapi/terminal?${bad}`), bad).toThrow(expect.objectContaining({ code: 'GW_ERR_API_BAD_REQUEST' }));
    }
  });

  it('launchPageAddr picks a configured web address only, the one the page named when it is configured', () => {
    const configured = ['127.0.0.1:3080', 'Proxy.example.com:443'];
    expect(launchPageAddr(configured, null)).toBe('127.0.0.1:3080');
    expect(launchPageAddr(configured, 'proxy.example.com')).toBe('proxy.example.com');
    expect(launchPageAddr(configured, 'proxy.example.com:443')).toBe('proxy.example.com');
    for (const hostile of ['evil.example', 'proxy.example.com.evil.example', 'proxy.example.com:444', '127.0.0.1:3080/x', '']) expect(launchPageAddr(configured, hostile), hostile).toBe('127.0.0.1:3080');
    expect(() => launchPageAddr([], 'evil.example')).toThrow(expect.objectContaining({ code: 'GW_ERR_INTERNAL' }));
  });

  it('checkOrigin accepts the page own origin (default port or not) and refuses any other', () => {
    const req = (headers: Record<string, string>) => ({ headers, method: 'POST' }) as unknown as IncomingMessage;
    expect(() => checkOrigin(req({ host: 'proxy.example' }))).not.toThrow();
    expect(() => checkOrigin(req({ host: 'proxy.example', origin: 'https://proxy.example' }))).not.toThrow();
    expect(() => checkOrigin(req({ host: 'proxy.example:443', origin: 'https://proxy.example' }))).not.toThrow();
    expect(() => checkOrigin(req({ host: 'proxy.example:3080', origin: 'https://proxy.example:3080' }))).not.toThrow();
    for (const origin of ['https://evil.example', 'http://proxy.example', 'https://proxy.example:8443', 'null', 'https://proxy.example.evil.example']) {
      expect(() => checkOrigin(req({ host: 'proxy.example', origin })), origin).toThrow(expect.objectContaining({ code: 'GW_ERR_WEB_CSRF' }));
    }
  });
});
