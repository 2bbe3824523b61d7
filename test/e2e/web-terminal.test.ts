/**
 * The Proxy's web routes end to end with the real binaries (src/proxy/web.ts, terminal.ts, webapps.ts): a
 * cluster (auth + proxy, TLS routing on one port) and an agent (SSH Service + an HTTP app) whose upgrader follows
 * the channel "stable", for which the Proxy serves a newer static version. Users sign in as the browser does
 * (POST /webapi/sessions: the cookie and the bearer) and then:
 *
 *   - list resources (only what their roles allow, with labels) and agents (version, channel, outdated, window);
 *   - open the terminal WebSocket (ws as the client): a command's output comes back, a resize changes `stty size`,
 *     the exit status arrives, the SSH Service's audit events name the user; a lock closes an open terminal;
 *   - launch the HTTP app: the app's host sets a nonce and sends the browser to the launch page; the token, bound
 *     to the nonce, works once, only on its app's host, sets the app cookie, and the app's requests go through.
 *
 * Refusals by their codes: no cookie, no or a wrong bearer, another Origin, a user without the node, a login not
 * allowed. Hostile: a WebSocket message over 64 KiB, a page that never reads a flood of output (the Proxy's memory
 * stays bounded: output waits on the WebSocket's buffer), 100 terminals opened at once (the session's cap refuses
 * the excess with its code; the Proxy keeps serving). Nothing asserts how fast anything happens.
 */
import { spawnSync } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import tls from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { rootTest } from '../helpers/root.js';
import { sessionLogin } from '../helpers/sessionlogin.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { waitUntil } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.3';
/** The Proxy's public address is its IP: agents dial what discovery names. */
const PROXY_NAME = PROXY_IP;
const APP_HOST = 'grafana.web.test';
const OTHER_APP_HOST = 'admin.web.test';
const PASSWORD = 'correct horse battery';
const NODE = 'web-node';
/** The OS account terminals log in as (see test/helpers/sessionlogin.ts: not root's own dotfiles). */
const LOGIN = sessionLogin();

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let app: HttpTestServer;
let webPort: number;
let ca: string;
const appRequests: Array<{ path: string; cookie: string | undefined; user: string | undefined }> = [];

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: Record<string, any>;
}

/** One HTTPS request to the Proxy's web port, addressed to `host` (the Proxy, or an app's public address). */
function call(method: string, path: string, options: { host?: string; headers?: Record<string, string>; body?: unknown } = {}): Promise<Answer> {
  const host = options.host ?? PROXY_NAME;
  const text = options.body === undefined ? undefined : JSON.stringify(options.body);
  return new Promise((resolve, reject) => {
    const req = https.request(
      { host: PROXY_IP, port: webPort, method, path, ca, servername: '', agent: false, headers: { host: `${host}:${webPort}`, ...(text ? { 'content-type': 'application/json' } : {}), ...(options.headers ?? {}) } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks).toString();
          let json: Record<string, any> = {};
          try {
            json = JSON.parse(body) as Record<string, any>;
          } catch {
            json = {};
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text: body, json });
        });
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

interface Session {
  id: string;
  bearer: string;
}

async function webLogin(user: string): Promise<Session> {
  const answer = await call('POST', '/webapi/sessions', { body: { user, password: PASSWORD } });
  expect(answer.status, answer.text).toBe(200);
  const id = /__Host-gw_session=([A-Za-z0-9_-]+);/.exec(String(answer.headers['set-cookie']))![1]!;
  return { id, bearer: answer.json.token as string };
}

const creds = (s: Session, extra: Record<string, string> = {}) => ({ cookie: `__Host-gw_session=${s.id}`, authorization: `Bearer ${s.bearer}`, ...extra });
const ORIGIN = () => `https://${PROXY_NAME}:${webPort}`;

/** A terminal WebSocket as the page opens it; resolves once open, or with the HTTP refusal. */
function openTerminal(s: Session | undefined, query: string, options: { origin?: string; bearer?: string | null } = {}): Promise<Term> {
  const protocols = ['gateway-terminal', ...(options.bearer === null ? [] : [`bearer.${options.bearer ?? s?.bearer ?? ''}`])];
  const ws = new WebSocket(`wss://${PROXY_IP}:${webPort}/webapi/terminal?${query}`, protocols, {
    ca,
    // ws's types omit tls.connect's servername, which it passes on: '' sends no SNI (an IP address is the host).
    ...({ servername: '' } as object),
    headers: { host: `${PROXY_NAME}:${webPort}`, ...(s ? { cookie: `__Host-gw_session=${s.id}` } : {}) },
    origin: options.origin ?? ORIGIN(),
  });
  const term = new Term(ws);
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve(term));
    ws.once('unexpected-response', (_req, res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        term.refused = { status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Record<string, any> };
        resolve(term);
      });
    });
    ws.once('error', (err) => (term.refused ? undefined : reject(err)));
  });
}

class Term {
  output = '';
  messages: Array<Record<string, any>> = [];
  closed: Promise<{ code: number; reason: string }>;
  refused: { status: number; body: Record<string, any> } | undefined;

  constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer, binary: boolean) => {
      if (binary) this.output += data.toString();
      else this.messages.push(JSON.parse(data.toString()) as Record<string, any>);
    });
    ws.on('error', () => undefined);
    this.closed = new Promise((resolve) => ws.once('close', (code, reason) => resolve({ code, reason: reason.toString() })));
  }

  type(text: string): void {
    this.ws.send(Buffer.from(text), { binary: true });
  }

  async waitFor(pattern: RegExp, what: string): Promise<RegExpExecArray> {
    await waitUntil(what, () => pattern.test(this.output) || this.ws.readyState === WebSocket.CLOSED, 30_000).catch(() => undefined);
    const m = pattern.exec(this.output);
    if (!m) throw new Error(`${what}: not in the output (${JSON.stringify(this.output.slice(-500))}; messages ${JSON.stringify(this.messages)})`);
    return m;
  }
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-web-'));
  app = await startHttpServer((req, res) => {
    appRequests.push({ path: req.url ?? '', cookie: req.headers.cookie, user: req.headers['x-gateway-user'] as string | undefined });
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`app says hi to ${String(req.headers['x-gateway-user'])}\n`);
  });
  webPort = await getPort({ host: PROXY_IP });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: web.example',
      '  listen_addr: 127.0.0.1:0',
      '  keep_alive_interval: 1s',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      `  public_addr: ${PROXY_NAME}:${webPort}`,
      '  automatic_upgrades_channels:',
      '    stable: { static_version: v99.1.0 }',
      '',
    ].join('\n'),
  );
  ca = readFileSync(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8');
  const pin = /CA pin:\s+(\S+)/.exec((await gwctl(['status'])).stdout)![1]!;
  await writeFile(
    join(dir, 'roles.yaml'),
    ['kind: role', 'version: v7', 'metadata: {name: prod-only}', 'spec:', '  allow:', `    logins: [${LOGIN}]`, '    node_labels: {env: prod}', '    app_labels: {env: prod}', ''].join('\n'),
  );
  expect((await gwctl(['create', join(dir, 'roles.yaml')])).status).toBe(0);
  for (const [user, roles] of [['alice', 'access'], ['lena', 'access'], ['bob', 'prod-only'], ['olga', 'editor,access']] as const) {
    expect((await gwctl(['users', 'add', user, `--roles=${roles}`, `--logins=${LOGIN}`], `${PASSWORD}\n`)).status).toBe(0);
  }
  await writeFile(join(dir, 'maintenance.yaml'), ['kind: cluster_maintenance_config', 'version: v1', 'spec:', '  agent_upgrades:', '    utc_start_hour: 3', '    weekdays: ["*"]', ''].join('\n'));
  expect((await gwctl(['create', join(dir, 'maintenance.yaml')])).status).toBe(0);
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=node,app', '--format', 'json'])).stdout) as { token: string }).token;
  // The agent's upgrader follows the channel "stable" (its endpoint file under GATEWAY_UPGRADE_ROOT).
  const upgradeRoot = join(dir, 'upgrade-root');
  await mkdir(join(upgradeRoot, 'etc', 'gateway-upgrade.d'), { recursive: true });
  await writeFile(join(upgradeRoot, 'etc', 'gateway-upgrade.d', 'endpoint'), `${PROXY_NAME}:${webPort}/v1/webapi/automaticupgrades/channel/stable\n`);
  agent = await startGateway(
    [
      'gateway:',
      `  nodename: ${NODE}`,
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'ssh_service:',
      '  enabled: yes',
      '  labels: { env: dev, team: web }',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: grafana, uri: "${app.url}", public_addr: ${APP_HOST}, labels: {env: dev} }`,
      `    - { name: admin, uri: "${app.url}", public_addr: ${OTHER_APP_HOST}, labels: {env: dev} }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_IP}:${webPort}`], env: { GATEWAY_UPGRADE_ROOT: upgradeRoot } },
  );
  await agent.waitForLog('reverse tunnel ready', 20_000).catch((err: Error) => {
    throw new Error(`${err.message}\nagent:\n${agent.logs().slice(-3000)}\nproxy:\n${cluster.logs().slice(-3000)}`);
  });
}, 120_000);

afterAll(async () => {
  if (process.env.WEB_TERMINAL_DEBUG) process.stderr.write(`proxy:\n${cluster?.logs().slice(-6000)}\n`);
  await agent?.stop();
  await cluster?.stop();
  await app?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('resources and agents', () => {
  it('lists only what the roles allow, with labels; refuses without the session, the bearer, or with another bearer', async () => {
    const alice = await webLogin('alice');
    const bob = await webLogin('bob');
    const mine = await call('GET', '/webapi/resources', { headers: creds(alice) });
    expect(mine.status, mine.text).toBe(200);
    expect(mine.json.nodes).toEqual([expect.objectContaining({ name: NODE, labels: { env: 'dev', team: 'web' }, online: true })]);
    expect(mine.json.apps).toEqual(expect.arrayContaining([expect.objectContaining({ name: 'grafana', public_addr: APP_HOST, labels: { env: 'dev' }, launch: true })]));
    const bobs = await call('GET', '/webapi/resources', { headers: creds(bob) });
    expect(bobs.status).toBe(200);
    expect(bobs.json.nodes).toEqual([]);
    expect(bobs.json.apps).toEqual([]);

    expect((await call('GET', '/webapi/resources')).json.error.code).toBe('GW_ERR_WEB_SESSION_MISSING');
    const noBearer = await call('GET', '/webapi/resources', { headers: { cookie: `__Host-gw_session=${alice.id}` } });
    expect([noBearer.status, noBearer.json.error.code]).toEqual([401, 'GW_ERR_WEB_SESSION_INVALID']);
    const crossed = await call('GET', '/webapi/resources', { headers: { cookie: `__Host-gw_session=${alice.id}`, authorization: `Bearer ${bob.bearer}` } });
    expect([crossed.status, crossed.json.error.code]).toEqual([401, 'GW_ERR_WEB_SESSION_INVALID']);
    expect(JSON.stringify(crossed.headers)).not.toMatch(/access-control-allow/i);
  });

  it('shows each agent with its version, channel, target and whether it is out of date; only to node readers', async () => {
    const olga = await webLogin('olga');
    const answer = await call('GET', '/webapi/agents', { headers: creds(olga) });
    expect(answer.status, answer.text).toBe(200);
    const node = (answer.json.agents as Array<Record<string, any>>).find((a) => a.nodename === NODE)!;
    expect(node).toMatchObject({ channel: 'stable', target_version: 'v99.1.0', outdated: true, online: true, services: expect.arrayContaining(['ssh', 'app']) });
    expect(node.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(node.next_window.start).toMatch(/T03:00:00\.000Z$/);
    expect(typeof node.in_window_now).toBe('boolean');
    expect(answer.json.maintenance).toEqual({ agent_upgrades: expect.objectContaining({ utc_start_hour: 3 }) });

    const alice = await webLogin('alice');
    const refused = await call('GET', '/webapi/agents', { headers: creds(alice) });
    expect([refused.status, refused.json.error.code]).toEqual([403, 'GW_ERR_ACCESS_DENIED']);
  });
});

describe('the terminal', () => {
  rootTest(['setuid'])('runs a command, resizes, reports the exit status; the SSH Service audits it', async () => {
    const alice = await webLogin('alice');
    const term = await openTerminal(alice, `node=${NODE}&login=${LOGIN}&cols=100&rows=30`);
    expect(term.refused).toBeUndefined();
    const n = randomInt(1_000_000);
    term.type(`echo hello-$((${n}+1))\n`);
    await term.waitFor(new RegExp(`hello-${n + 1}`), 'the echo');
    term.ws.send(JSON.stringify({ type: 'resize', cols: 120, rows: 50 }));
    term.type('stty size\n');
    await term.waitFor(/50 120/, 'stty size after the resize');
    term.type('exit 3\n');
    const closed = await term.closed;
    expect(closed.code).toBe(1000);
    expect(term.messages).toContainEqual({ type: 'exit', code: 3 });
    await waitUntil('the session audit events', async () => {
      const events = (await gwctl(['get', 'events', '--format', 'json'])).stdout;
      return events.includes('session.end') && events.includes('"alice"');
    });
    const events = JSON.parse((await gwctl(['get', 'events', '--format', 'json'])).stdout) as Array<{ spec: Record<string, unknown> }>;
    expect(events.map((e) => e.spec)).toContainEqual(expect.objectContaining({ event: 'session.start', user: 'alice', login: LOGIN, kind: 'shell' }));
  }, 60_000);

  it('refuses: no cookie, no bearer, another bearer, another Origin, a node the roles do not allow, a login not allowed', async () => {
    const alice = await webLogin('alice');
    const bob = await webLogin('bob');
    const q = `node=${NODE}&login=${LOGIN}`;
    expect((await openTerminal(undefined, q, { bearer: alice.bearer })).refused).toMatchObject({ status: 401, body: { error: { code: 'GW_ERR_WEB_SESSION_MISSING' } } });
    expect((await openTerminal(alice, q, { bearer: null })).refused).toMatchObject({ status: 401, body: { error: { code: 'GW_ERR_WEB_SESSION_INVALID' } } });
    expect((await openTerminal(alice, q, { bearer: bob.bearer })).refused).toMatchObject({ status: 401, body: { error: { code: 'GW_ERR_WEB_SESSION_INVALID' } } });
    expect((await openTerminal(alice, q, { origin: 'https://evil.example' })).refused).toMatchObject({ status: 403, body: { error: { code: 'GW_ERR_WEB_CSRF' } } });
    const denied = await openTerminal(bob, q);
    expect(denied.refused).toBeUndefined();
    expect((await denied.closed).code).toBe(1008);
    expect(denied.messages[0]).toMatchObject({ type: 'error', code: 'GW_ERR_ACCESS_DENIED' });
    const badLogin = await openTerminal(alice, `node=${NODE}&login=postgres`);
    await badLogin.closed;
    expect(badLogin.messages[0]).toMatchObject({ type: 'error', code: 'GW_ERR_ACCESS_DENIED', message: expect.stringContaining('postgres') });
    expect((await openTerminal(alice, `node=../etc&login=${LOGIN}`)).refused).toMatchObject({ status: 400 });
  });

  rootTest(['setuid'])('a lock on the user closes an open terminal, with the lock named', async () => {
    const lena = await webLogin('lena');
    const term = await openTerminal(lena, `node=${NODE}&login=${LOGIN}`);
    term.type('echo ready-$((1+1))\n');
    await term.waitFor(/ready-2/, 'the shell');
    const lock = await gwctl(['lock', '--user', 'lena', '--message', 'incident 7', '--format', 'json']);
    expect(lock.status, lock.stderr).toBe(0);
    const closed = await term.closed;
    expect(closed.code).not.toBe(1000);
    expect(term.messages).toContainEqual(expect.objectContaining({ type: 'error', code: 'GW_ERR_ACCESS_LOCKED' }));
    expect((await gwctl(['unlock', '--user', 'lena'])).status).toBe(0);
  }, 60_000);

  rootTest(['setuid'])('signing out of the web session closes its open terminals', async () => {
    const alice = await webLogin('alice');
    const term = await openTerminal(alice, `node=${NODE}&login=${LOGIN}`);
    term.type('echo still-$((5+5))\n');
    await term.waitFor(/still-10/, 'the shell');
    expect((await call('DELETE', '/webapi/sessions', { headers: creds(alice, { origin: ORIGIN() }) })).status).toBe(200);
    const closed = await term.closed;
    expect(closed.code).toBe(1011);
    expect(term.messages).toContainEqual(expect.objectContaining({ type: 'error', code: expect.stringMatching(/^GW_ERR_WEB_SESSION_/) }));
  }, 60_000);

  rootTest(['setuid'])('hostile: a message over 64 KiB closes the socket (1009)', async () => {
    const alice = await webLogin('alice');
    const term = await openTerminal(alice, `node=${NODE}&login=${LOGIN}`);
    term.type('echo up-$((2+2))\n');
    await term.waitFor(/up-4/, 'the shell');
    term.ws.send(Buffer.alloc(65 * 1024, 0x61), { binary: true });
    expect((await term.closed).code).toBe(1009);
  }, 60_000);

  rootTest(['setuid'])('hostile: a page that never reads a flood of output does not grow the Proxy', async () => {
    const alice = await webLogin('alice');
    const rss = () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${cluster.process.pid}/status`, 'utf8'))![1]) * 1024;
    // A raw WebSocket handshake on TLS: after it nothing is ever read from the socket.
    const socket = tls.connect({ host: PROXY_IP, port: webPort, ca, ALPNProtocols: ['http/1.1'] });
    await new Promise<void>((resolve, reject) => socket.once('secureConnect', resolve).once('error', reject));
    const key = Buffer.from('0123456789abcdef').toString('base64');
    socket.write(
      [
        `GET /webapi/terminal?node=${NODE}&login=${LOGIN} HTTP/1.1`,
        `Host: ${PROXY_NAME}:${webPort}`,
        'Upgrade: websocket',
        'Connection: Upgrade',
        `Sec-WebSocket-Key: ${key}`,
        'Sec-WebSocket-Version: 13',
        `Sec-WebSocket-Protocol: gateway-terminal, bearer.${alice.bearer}`,
        `Cookie: __Host-gw_session=${alice.id}`,
        `Origin: ${ORIGIN()}`,
        '',
        '',
      ].join('\r\n'),
    );
    let head = '';
    await new Promise<void>((resolve) => {
      const onData = (c: Buffer) => {
        head += c.toString('latin1');
        if (head.includes('\r\n\r\n')) {
          socket.off('data', onData);
          socket.pause();
          resolve();
        }
      };
      socket.on('data', onData);
    });
    expect(head).toMatch(/^HTTP\/1\.1 101/);
    const before = rss();
    // A masked client frame: the command that floods (about 1 GiB of output).
    const command = Buffer.from('head -c 1000000000 /dev/zero | tr "\\0" x\n');
    const mask = Buffer.from([1, 2, 3, 4]);
    const frame = Buffer.concat([Buffer.from([0x82, 0x80 | command.length]), mask, Buffer.from(command.map((b, i) => b ^ mask[i % 4]!))]);
    socket.write(frame);
    // Let the flood run into the bounds: the Proxy's memory must stay near where it was.
    await new Promise((r) => setTimeout(r, 5_000));
    const during = rss();
    expect(during - before).toBeLessThan(64 * 1024 * 1024);
    // And the flood is real: its producer is still there, held by the SSH window (its output was not all taken).
    expect(spawnSync('pgrep', ['-f', '^head -c 1000000000 /dev/zero']).status).toBe(0);
    socket.destroy();
    // The Proxy serves on.
    expect((await call('GET', '/webapi/resources', { headers: creds(alice) })).status).toBe(200);
  }, 60_000);

  rootTest(['setuid'])('hostile: 100 terminals opened at once: the session cap refuses the excess by its code, the rest work, then a new one opens', async () => {
    const alice = await webLogin('alice');
    const terms = await Promise.all(Array.from({ length: 100 }, () => openTerminal(alice, `node=${NODE}&login=${LOGIN}`)));
    const refused = terms.filter((t) => t.refused);
    const opened = terms.filter((t) => !t.refused);
    expect(opened.length).toBeGreaterThan(0);
    expect(opened.length).toBeLessThanOrEqual(32);
    for (const t of refused) expect(t.refused).toMatchObject({ status: 429, body: { error: { code: 'GW_ERR_WEB_TERMINAL_LIMIT' } } });
    // Every open terminal runs a command before it is closed: its shell has finished starting (a login shell killed
    // inside the machine's own profile, such as pyenv's rehash lock in root's ~/.bashrc, can leave that profile
    // broken for every later shell of the user).
    opened.forEach((t, i) => t.type(`echo many-$((${i}+6))\n`));
    await Promise.all(opened.map((t, i) => t.waitFor(new RegExp(`many-${i + 6}\\b`), `open terminal ${i}`)));
    for (const t of opened) t.ws.close();
    await Promise.all(opened.map((t) => t.closed));
    const again = await openTerminal(alice, `node=${NODE}&login=${LOGIN}`);
    expect(again.refused).toBeUndefined();
    again.type('echo again-$((4+4))\n');
    await again.waitFor(/again-8/, 'a new terminal after the others closed');
    again.ws.close();
  }, 120_000);
});

describe('app launch', () => {
  it('a launch starts on the app host (a nonce), its token is bound to it, works once, only on its app host, sets the Strict app cookie, and the app request goes through', async () => {
    const alice = await webLogin('alice');
    // The start: the app's host sets its nonce and sends the browser to the Web UI's launch page, at the Proxy's
    // configured address (an address the configuration does not list is never used).
    const start = await call('GET', `/x-gateway-auth?app=grafana&web=${encodeURIComponent('evil.example:443')}`, { host: APP_HOST });
    expect(start.status, start.text).toBe(302);
    const posted = await call('POST', `/x-gateway-auth?app=grafana`, { host: APP_HOST });
    expect([posted.status, posted.headers['x-gateway-error']]).toEqual([405, 'GW_ERR_API_METHOD_NOT_ALLOWED']);
    const next = new URL(String(start.headers.location));
    expect(`${next.origin}${next.pathname}`).toBe(`${ORIGIN()}/web/launch`);
    expect([next.searchParams.get('app'), next.searchParams.get('addr')]).toEqual(['grafana', `${APP_HOST}:${webPort}`]);
    const state = next.searchParams.get('state')!;
    const set = String(start.headers['set-cookie']);
    expect(set).toMatch(new RegExp(`^__Host-gw_launch_[0-9a-f]{16}=${state}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=300$`));
    const nonce = set.split(';')[0]!;
    const launchOf = async (s: string) => {
      const answer = await call('POST', '/webapi/apps/grafana/launch', { headers: creds(alice, { origin: ORIGIN() }), body: { state: s, addr: `${APP_HOST}:${webPort}` } });
      expect(answer.status, answer.text).toBe(200);
      return new URL(answer.json.url as string);
    };
    expect((await call('POST', '/webapi/apps/grafana/launch', { headers: creds(alice, { origin: 'https://evil.example' }), body: { state } })).json.error.code).toBe('GW_ERR_WEB_CSRF');
    expect((await call('POST', '/webapi/apps/grafana/launch', { headers: creds(alice, { origin: ORIGIN() }), body: {} })).json.error.code).toBe('GW_ERR_WEB_APP_LAUNCH_UNBOUND');
    const url = await launchOf(state);
    expect(url.host).toBe(`${APP_HOST}:${webPort}`);
    expect(url.pathname).toBe('/x-gateway-auth');
    expect(url.searchParams.get('state')).toBe(state);

    // On another app's host the token is refused: that host's nonce cookie has another name (and were it there, the
    // token is for another app).
    const elsewhere = await call('GET', `${url.pathname}${url.search}`, { host: OTHER_APP_HOST, headers: { cookie: nonce } });
    expect([elsewhere.status, elsewhere.headers['x-gateway-error']]).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    const url2 = await launchOf(state);
    const redeemed = await call('GET', `${url2.pathname}${url2.search}`, { host: APP_HOST, headers: { cookie: nonce } });
    expect(redeemed.status, redeemed.text).toBe(200);
    const [cleared, cookie = ''] = redeemed.headers['set-cookie'] as string[];
    expect(cleared).toBe(`${nonce.split('=')[0]}=; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=0`);
    expect(cookie).toMatch(/^__Host-gw_app=[A-Za-z0-9_-]+; Path=\/; HttpOnly; Secure; SameSite=Strict; Max-Age=\d+$/);
    expect(redeemed.text).toContain('<meta http-equiv="refresh" content="0;url=/">');
    const again = await call('GET', `${url2.pathname}${url2.search}`, { host: APP_HOST, headers: { cookie: nonce } });
    expect([again.status, again.headers['x-gateway-error']]).toEqual([401, 'GW_ERR_WEB_SESSION_INVALID']);

    const appCookie = cookie.split(';')[0]!;
    const page = await call('GET', '/dashboards?x=1', { host: APP_HOST, headers: { cookie: `${appCookie}; theme=dark` } });
    expect(page.status, page.text).toBe(200);
    expect(page.text).toBe('app says hi to alice\n');
    const seen = appRequests.at(-1)!;
    expect(seen).toMatchObject({ path: '/dashboards?x=1', cookie: 'theme=dark', user: 'alice' });
    // The app cookie is for its app only.
    expect((await call('GET', '/', { host: OTHER_APP_HOST, headers: { cookie: appCookie } })).status).toBe(401);
    // Without any credential: refused with the way in named.
    expect((await call('GET', '/', { host: APP_HOST })).json.error.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
    // Signing out of the web session ends the app session too.
    expect((await call('DELETE', '/webapi/sessions', { headers: creds(alice, { origin: ORIGIN() }) })).status).toBe(200);
    expect((await call('GET', '/', { host: APP_HOST, headers: { cookie: appCookie } })).status).toBe(401);
  });
});
