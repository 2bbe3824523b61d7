/**
 * Connection upgrades through HTTP apps (src/proxy/appupgrade.ts): a real WebSocket app (the `ws` server, as
 * Node apps serve WebSockets) behind an agent, reached under its public address on the Proxy's web port with the
 * user's certificate by a `ws` client and by curl, and through `gwsh proxy app` (which carries the TCP bytes, so
 * the same client speaks the upgrade itself). Real daemons on loopback.
 *
 * The app's paths: /echo echoes every message; /silent never answers an upgrade; /other answers 101 to another
 * protocol than the one asked for; /refuse answers 403; /unasked answers 101 to a request that asked for no
 * upgrade; /sink stops reading until told (back-pressure), and pings meanwhile.
 *
 * Hostile: no certificate, a role without the app, a lock while the connection is open, an app that never
 * answers (header_timeout: 3 s here), a connection left silent (idle_timeout: 6 s here), an app that switches
 * unasked, a client that floods an app that does not read.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { curl } from '../helpers/curl.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { waitUntil } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';
const APP_HOST = `ws.${PROXY_NAME}`;
const PROD_HOST = `wsprod.${PROXY_NAME}`;
const PASSWORD = 'correct horse battery';

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let webPort: number;
let app: http.Server;
const sockets = new Set<Duplex>();
/** The /sink connections' sockets, paused, and the bytes they were handed once resumed. */
const sinks: Array<{ ws: WebSocket; bytes: number; messages: number }> = [];
const children: import('node:child_process').ChildProcess[] = [];
const users: Record<string, Record<string, string>> = {};

const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-appws-'));
  const wss = new WebSocketServer({ noServer: true, maxPayload: 32 * 1024 * 1024 });
  app = http.createServer((req, res) => {
    if (req.url === '/unasked') {
      // A broken app: switches protocols on a plain request.
      res.socket!.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw bytes of the app');
      return;
    }
    res.end(JSON.stringify({ path: req.url, user: req.headers['x-gateway-user'] }));
  });
  app.on('connection', (s: net.Socket) => {
    s.on('error', () => undefined);
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  app.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    const path = req.url ?? '/';
    socket.on('error', () => undefined); // the Proxy drops what it gave up on
    if (path === '/silent') return; // never answers
    if (path === '/refuse') return void socket.end('HTTP/1.1 403 Forbidden\r\ncontent-type: text/plain\r\ncontent-length: 12\r\n\r\nnot for you\n');
    if (path === '/other') return void socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n');
    wss.handleUpgrade(req, socket, head, (ws) => {
      if (path === '/sink') {
        ws.pause();
        // Pings from the app keep the connection from being idle while it does not read.
        const pings = setInterval(() => ws.ping(), 1000);
        ws.once('close', () => clearInterval(pings));
        const sink = { ws, bytes: 0, messages: 0 };
        sinks.push(sink);
        ws.on('message', (data: Buffer) => {
          sink.bytes += data.length;
          sink.messages += 1;
        });
        return;
      }
      ws.send(JSON.stringify({ user: req.headers['x-gateway-user'], cookie: req.headers.cookie ?? null }));
      ws.on('message', (data: Buffer, binary: boolean) => ws.send(data, { binary }));
    });
  });
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  const appPort = (app.address() as net.AddressInfo).port;

  webPort = await getPort({ host: PROXY_IP });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      '  limits: { header_timeout: 3s, idle_timeout: 6s }',
      'auth_service:',
      '  cluster_name: ws.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      // Agents and gwsh reach the first address (no resolver here knows the names); the second gives the web
      // certificate *.proxy.gw.test, the apps' names.
      `  public_addr: [${PROXY_IP}:${webPort}, ${PROXY_NAME}:${webPort}]`,
      '',
    ].join('\n'),
  );
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  await writeFile(join(dir, 'roles.yaml'), ['kind: role', 'version: v7', 'metadata: {name: dev-apps}', 'spec:', '  allow:', '    app_labels: {env: dev}', ''].join('\n'));
  expect((await admin(['create', join(dir, 'roles.yaml')])).status).toBe(0);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    [
      'gateway:',
      '  nodename: agent-ws',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: ws-app, uri: "http://127.0.0.1:${appPort}", public_addr: ${APP_HOST}, labels: {env: dev} }`,
      `    - { name: ws-prod, uri: "http://127.0.0.1:${appPort}", public_addr: ${PROD_HOST}, labels: {env: prod} }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_IP}:${webPort}`] },
  );
  await agent.waitForLog('reverse tunnel ready');
  // alice for most tests; carol is locked in one (a lock on alice would end the others' connections).
  for (const user of ['alice', 'carol']) {
    await admin(['users', 'add', user, '--roles=dev-apps'], `${PASSWORD}\n`);
    users[user] = { HOME: dir, GWSH_HOME: join(dir, user) };
    const login = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${webPort}`, `--user=${user}`, `--ca-pin=${pin}`], { env: users[user]!, input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
  }
}, 90_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGTERM');
  for (const s of sockets) s.destroy();
  await agent?.stop();
  await cluster?.stop();
  app?.close();
  await rm(dir, { recursive: true, force: true });
});

/** The user's certificate, key and the cluster's host CA, as a TLS client presents them. */
async function tlsOf(user: string): Promise<{ cert: string; key: string; ca: string }> {
  const home = users[user]!.GWSH_HOME!;
  return { cert: await readFile(join(home, 'cert.pem'), 'utf8'), key: await readFile(join(home, 'key.pem'), 'utf8'), ca: await readFile(join(home, 'host-ca.pem'), 'utf8') };
}

/** A WebSocket to the app's public address on the Proxy's web port (by its IP, with the app's Host and SNI). */
function appSocket(path: string, options: { host?: string; user?: string | null; tls?: { cert: string; key: string; ca: string } } = {}): WebSocket {
  const host = options.host ?? APP_HOST;
  return new WebSocket(`wss://${PROXY_IP}:${webPort}${path}`, {
    // Node's TLS client takes its SNI from the Host header.
    headers: { host: `${host}:${webPort}` },
    ca: options.tls?.ca,
    ...(options.tls && options.user !== null ? { cert: options.tls.cert, key: options.tls.key } : {}),
    maxPayload: 32 * 1024 * 1024,
  });
}

/** The refusal of an upgrade: its HTTP status and the error code of its JSON body (or the body). */
function refusal(ws: WebSocket): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    ws.once('open', () => reject(new Error('the upgrade was not refused')));
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
  });
}

function opened(ws: WebSocket): Promise<{ user: string; cookie: string | null }> {
  return new Promise((resolve, reject) => {
    ws.once('message', (data: Buffer) => resolve(JSON.parse(data.toString()) as { user: string; cookie: string | null }));
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`refused: ${res.statusCode}`)));
  });
}

/** Sends each message and collects as many answers. */
async function echoes(ws: WebSocket, messages: Array<Buffer | string>): Promise<Array<{ data: Buffer; binary: boolean }>> {
  const got: Array<{ data: Buffer; binary: boolean }> = [];
  const done = new Promise<void>((resolve, reject) => {
    ws.on('message', (data: Buffer, binary: boolean) => {
      got.push({ data, binary });
      if (got.length === messages.length) resolve();
    });
    ws.once('close', () => reject(new Error(`closed after ${got.length} of ${messages.length} echoes`)));
  });
  for (const m of messages) ws.send(m);
  await done;
  return got;
}

const closedOf = (ws: WebSocket) => new Promise<number>((resolve) => (ws.readyState === WebSocket.CLOSED ? resolve(1006) : ws.once('close', (code: number) => resolve(code))));

describe('WebSocket through an HTTP app, with the user certificate', () => {
  it('echoes large binary and text messages byte-exact both ways; the app sees the user and none of the gateway cookies', async () => {
    const ws = appSocket('/echo', { tls: await tlsOf('alice') });
    const hello = await opened(ws);
    expect(hello.user).toBe('alice');
    const big = randomBytes(8 * 1024 * 1024);
    const text = 'é€'.repeat(300_000);
    const got = await echoes(ws, [big, text, Buffer.alloc(0)]);
    expect(got[0]!.binary).toBe(true);
    expect(got[0]!.data.equals(big)).toBe(true);
    expect(got[1]!.binary).toBe(false);
    expect(got[1]!.data.toString('utf8')).toBe(text);
    expect(got[2]!.data.length).toBe(0);
    ws.close(1000);
    expect(await closedOf(ws)).toBe(1000);
  });

  it('is audited as an app session of alice with its bytes', async () => {
    await waitUntil('the app session to be recorded', async () => {
      const r = await admin(['get', 'events', '--format', 'json']);
      const all = (JSON.parse(r.stdout) as Array<{ spec: Record<string, unknown> }>).map((e) => e.spec);
      const end = all.find((e) => e.event === 'app.session.end' && e.user === 'alice' && e.resource === 'ws-app' && Number(e.bytes_in) > 8 * 1024 * 1024);
      return end !== undefined && Number(end.bytes_out) > 8 * 1024 * 1024;
    });
  });

  it('curl --include with Upgrade headers gets the app\'s 101 and its accept key', async () => {
    const home = users.alice!.GWSH_HOME!;
    const r = await curl([
      '--http1.1',
      '--include',
      '--max-time',
      '5',
      '--cert',
      join(home, 'cert.pem'),
      '--key',
      join(home, 'key.pem'),
      '--cacert',
      join(home, 'host-ca.pem'),
      '--resolve',
      `${APP_HOST}:${webPort}:${PROXY_IP}`,
      '-H',
      'Connection: Upgrade',
      '-H',
      'Upgrade: websocket',
      '-H',
      'Sec-WebSocket-Version: 13',
      '-H',
      'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==',
      `https://${APP_HOST}:${webPort}/echo`,
    ]);
    // curl waits on the upgraded connection until --max-time (28): the head is what counts.
    expect(r.stdout).toMatch(/^HTTP\/1\.1 101 /);
    expect(r.stdout).toMatch(/sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=/i);
    expect(r.stdout).toMatch(/upgrade: websocket/i);
  });

  it('through gwsh proxy app: the local client speaks the upgrade itself, the bytes pass', async () => {
    const proxy = await startGwshProxy(['app', 'ws-app'], users.alice!, children);
    const ws = new WebSocket(`ws://127.0.0.1:${proxy.port}/echo`);
    await opened(ws);
    const big = randomBytes(2 * 1024 * 1024);
    expect((await echoes(ws, [big]))[0]!.data.equals(big)).toBe(true);
    ws.close();
  });

  it("an HTTP/2 request for the app on a connection opened for the Proxy's name gets 421, so a browser opens the app's own (Chromium's WebSockets need it)", async () => {
    const home = users.alice!.GWSH_HOME!;
    const tls = ['--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem')];
    const pooled = await curl(['--http2', '-s', '-o', '/dev/null', '-w', '%{http_code}', ...tls, '--resolve', `${PROXY_NAME}:${webPort}:${PROXY_IP}`, '-H', `Host: ${APP_HOST}:${webPort}`, `https://${PROXY_NAME}:${webPort}/echo`]);
    expect(pooled.stdout).toBe('421');
    const own = await curl(['--http2', '-s', '-o', '/dev/null', '-w', '%{http_code}', ...tls, '--resolve', `${APP_HOST}:${webPort}:${PROXY_IP}`, `https://${APP_HOST}:${webPort}/echo`]);
    expect(own.stdout).toBe('200');
  });

  it('an upgrade the app refuses (403) reaches the client as the app answered it', async () => {
    const r = await refusal(appSocket('/refuse', { tls: await tlsOf('alice') }));
    expect(r).toEqual({ status: 403, body: 'not for you\n' });
  });
});

describe('hostile upgrades', () => {
  it('without a certificate or session: refused with GW_ERR_AUTH_UNAUTHENTICATED, the app never asked', async () => {
    const before = sockets.size;
    const r = await refusal(appSocket('/echo', { tls: await tlsOf('alice'), user: null }));
    expect(r.status).toBe(401);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_AUTH_UNAUTHENTICATED' } });
    expect(sockets.size).toBe(before);
  });

  it("an app the user's roles do not allow: GW_ERR_ACCESS_DENIED", async () => {
    const r = await refusal(appSocket('/echo', { host: PROD_HOST, tls: await tlsOf('alice') }));
    expect(r.status).toBe(403);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_ACCESS_DENIED' } });
  });

  it('a lock on the user ends the open upgraded connection, and a new upgrade is refused', async () => {
    const ws = appSocket('/echo', { tls: await tlsOf('carol') });
    await opened(ws);
    const closed = closedOf(ws);
    const lock = await admin(['lock', '--user', 'carol', '--message', 'incident 7']);
    expect(lock.status, lock.stderr).toBe(0);
    expect(await closed).toBe(1006);
    const again = await refusal(appSocket('/echo', { tls: await tlsOf('carol') }));
    expect(JSON.parse(again.body)).toMatchObject({ error: { code: 'GW_ERR_ACCESS_LOCKED' } });
  });

  it('an upgraded connection that moves no bytes either way for idle_timeout (6 s here) is closed', async () => {
    const ws = appSocket('/echo', { tls: await tlsOf('alice') });
    await opened(ws);
    expect(await closedOf(ws)).toBe(1006);
  });

  it('an app that never answers the upgrade: GW_ERR_APP_UPGRADE_TIMEOUT at the deadline, its connection dropped', async () => {
    const r = await refusal(appSocket('/silent', { tls: await tlsOf('alice') }));
    expect(r.status).toBe(504);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_APP_UPGRADE_TIMEOUT' } });
  });

  it('an app that switches to another protocol than the one asked for: GW_ERR_APP_UPGRADE_UNASKED', async () => {
    const r = await refusal(appSocket('/other', { tls: await tlsOf('alice') }));
    expect(r.status).toBe(502);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_APP_UPGRADE_UNASKED' } });
  });

  it('an app that answers 101 to a plain request: GW_ERR_APP_UPGRADE_UNASKED, none of its bytes reach the client', async () => {
    const home = users.alice!.GWSH_HOME!;
    const r = await curl(['--http1.1', '--max-time', '10', '--cert', join(home, 'cert.pem'), '--key', join(home, 'key.pem'), '--cacert', join(home, 'host-ca.pem'), '--resolve', `${APP_HOST}:${webPort}:${PROXY_IP}`, `https://${APP_HOST}:${webPort}/unasked`]);
    expect(JSON.parse(r.stdout)).toMatchObject({ error: { code: 'GW_ERR_APP_UPGRADE_UNASKED' } });
    expect(r.stdout).not.toContain('raw bytes of the app');
  });

  it('a client that floods an app that does not read is held back (back-pressure), and every byte arrives once the app reads', async () => {
    const ws = appSocket('/sink', { tls: await tlsOf('alice') });
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    await waitUntil('the sink to be connected', () => sinks.length === 1);
    const chunk = randomBytes(1024 * 1024);
    const COUNT = 128;
    for (let i = 0; i < COUNT; i += 1) ws.send(chunk);
    // Wait until the client can hand no more to the network: what the Proxy, the tunnel, the agent and the
    // sockets' buffers between them hold is then all they took.
    let last = -1;
    await waitUntil('the flood to stall', () => {
      const now = ws.bufferedAmount;
      // Not going down any more (the client's pongs to the app's pings queue behind the flood: a few bytes up).
      const stalled = last >= 0 && now >= last;
      last = now;
      return stalled;
    }, 60_000, 1000);
    expect(sinks[0]!.bytes).toBe(0);
    // Without back-pressure the Proxy would read it all: at most a few socket buffers' worth left the client.
    expect(ws.bufferedAmount).toBeGreaterThan((COUNT / 2) * chunk.length);
    sinks[0]!.ws.resume();
    await waitUntil('every message to reach the app', () => sinks[0]!.messages === COUNT, 60_000);
    expect(sinks[0]!.bytes).toBe(COUNT * chunk.length);
    ws.close();
  });
});
