/**
 * Kubernetes through gwsh and the Proxy's kube route, with connection upgrades (kubectl exec, attach and
 * port-forward: WebSocket "v5.channel.k8s.io" or SPDY/3.1): `gwsh kube ls` and `gwsh kube login` writing a
 * kubeconfig; the upgrade relayed by the Proxy (src/net/upgrade.ts) and by the agent's credential front
 * (src/agent/kubeapi.ts). Real daemons on loopback. The real kubectl through that kubeconfig, against the shared
 * stand-in API server (test/helpers/kubeapiserver.ts: RBAC, SPDY, port-forward, logs -f), is
 * test/e2e/kube-standin.test.ts.
 *
 * This file keeps its own small HTTPS server because its tests need one that lies, which the shared stand-in
 * (an honest API server) does not: it checks the bearer token when one is sent (cluster "dev" goes through the
 * agent's kubeconfig credential, cluster "raw" has none), records what it saw, answers GET of one pod and
 * /version, and serves exec over a real WebSocket server (the `ws` package) speaking v5.channel.k8s.io, echoing
 * stdin to stdout. A SPDY/3.1 upgrade gets a 101 with X-Stream-Protocol-Version and then echoes raw bytes: the
 * test checks the relay, not SPDY framing.
 *
 * Hostile paths of the stand-in (under /api/v1/namespaces/default/pods/<name>/exec): silent never answers the
 * upgrade; other switches to h2c; noupgrade answers 101 without an Upgrade header; claims answers 200 with
 * Upgrade and Connection: upgrade (an announcement, not a switch); refuse answers 403.
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import type http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.3';
const KUBE_SNI = 'kube-gateway-proxy-alpn.gateway.cluster.local';
const PASSWORD = 'correct horse battery';
const AGENT_TOKEN = 'agent-sa-token-1';

let dir: string;
let pki: TestPki;
let cluster: RunningGateway;
let agent: RunningGateway;
let webPort: number;
let api: https.Server;
let apiPort: number;
const users: Record<string, Record<string, string>> = {};
/** What the stand-in API server saw of each request and upgrade. */
const seen: Array<{ path: string; upgrade?: string; authorization?: string; user?: string; groups?: string; version?: string }> = [];
const held = new Set<Duplex>();

const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });

/** The stand-in's answer to a plain request: a pod, /version, else what it saw. */
function plain(req: http.IncomingMessage, res: http.ServerResponse): void {
  if (req.headers.authorization !== undefined && req.headers.authorization !== `Bearer ${AGENT_TOKEN}`) {
    res.writeHead(401, { 'content-type': 'application/json' });
    return void res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Unauthorized', code: 401 }));
  }
  seen.push({ path: req.url ?? '', ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}), user: req.headers['impersonate-user'] as string });
  res.writeHead(200, { 'content-type': 'application/json' });
  const path = (req.url ?? '').split('?')[0] ?? '';
  if (path === '/version') return void res.end(JSON.stringify({ major: '1', minor: '33', gitVersion: 'v1.33.0-standin', platform: 'linux/amd64' }));
  // Discovery, as kubectl reads it before it maps "pods" to a resource (the legacy form: no aggregated discovery).
  if (path === '/api') return void res.end(JSON.stringify({ kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [] }));
  if (path === '/apis') return void res.end(JSON.stringify({ kind: 'APIGroupList', apiVersion: 'v1', groups: [] }));
  if (path === '/api/v1') {
    const pods = { name: 'pods', singularName: 'pod', namespaced: true, kind: 'Pod', verbs: ['get', 'list'], shortNames: ['po'] };
    return void res.end(JSON.stringify({ kind: 'APIResourceList', apiVersion: 'v1', groupVersion: 'v1', resources: [pods, { name: 'pods/exec', singularName: '', namespaced: true, kind: 'PodExecOptions', verbs: ['create', 'get'] }] }));
  }
  const pod = /^\/api\/v1\/namespaces\/default\/pods\/([a-z-]+)$/.exec(path);
  if (pod) {
    return void res.end(
      JSON.stringify({ kind: 'Pod', apiVersion: 'v1', metadata: { name: pod[1], namespace: 'default' }, spec: { containers: [{ name: 'main', image: 'standin' }] }, status: { phase: 'Running' } }),
    );
  }
  res.end(JSON.stringify({ path, user: req.headers['impersonate-user'] ?? null }));
}

/** The v5.channel.k8s.io exec of the stand-in: stdin (channel 0) echoed on stdout (1); without stdin, the command's words. */
function exec(ws: WebSocket, req: http.IncomingMessage): void {
  const query = new URL(req.url ?? '/', 'https://x').searchParams;
  const status = () => ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify({ metadata: {}, status: 'Success' }))]), () => ws.close(1000));
  if (query.get('stdin') !== 'true') {
    ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(`${query.getAll('command').join(' ')}\n`)]));
    return status();
  }
  ws.on('message', (data: Buffer) => {
    if (data[0] === 0) ws.send(Buffer.concat([Buffer.from([1]), data.subarray(1)]));
    else if (data[0] === 255 && data[1] === 0) status(); // v5: the client closed stdin
  });
}

function onUpgrade(wss: WebSocketServer, req: http.IncomingMessage, socket: Duplex, head: Buffer): void {
  socket.on('error', () => undefined);
  held.add(socket);
  socket.once('close', () => held.delete(socket));
  const path = req.url ?? '/';
  seen.push({
    path,
    upgrade: req.headers.upgrade ?? '',
    ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}),
    user: req.headers['impersonate-user'] as string,
    groups: req.headers['impersonate-group'] as string,
    version: req.headers['x-stream-protocol-version'] as string,
  });
  const pod = /\/pods\/([a-z-]+)\//.exec(path)?.[1];
  if (req.headers.authorization !== undefined && req.headers.authorization !== `Bearer ${AGENT_TOKEN}`) return void socket.end('HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n');
  if (pod === 'silent') return;
  if (pod === 'other') return void socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n');
  if (pod === 'noupgrade') return void socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\r\nbytes of no protocol');
  if (pod === 'claims') return void socket.end('HTTP/1.1 200 OK\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\ncontent-length: 9\r\n\r\nnot a 101');
  if (pod === 'refuse') return void socket.end('HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{"code":403000}');
  if ((req.headers.upgrade ?? '').toLowerCase() === 'spdy/3.1') {
    socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n');
    if (head.length > 0) socket.write(head);
    socket.pipe(socket);
    return;
  }
  wss.handleUpgrade(req, socket, head, (ws) => exec(ws, req));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-kubeup-'));
  pki = await makeTestPki();
  const apiCert = await pki.serverCert({ names: ['k8s-api.gw.test'], ips: ['127.0.0.1'] });
  const wss = new WebSocketServer({ noServer: true, handleProtocols: (p) => (p.has('v5.channel.k8s.io') ? 'v5.channel.k8s.io' : false) });
  api = https.createServer({ cert: apiCert.certPem, key: apiCert.keyPem }, plain);
  api.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => onUpgrade(wss, req, socket, head));
  api.on('connection', (s: net.Socket) => {
    held.add(s);
    s.once('close', () => held.delete(s));
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
  apiPort = (api.address() as net.AddressInfo).port;

  webPort = await getPort({ host: PROXY_IP });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      '  limits: { header_timeout: 3s, idle_timeout: 6s }',
      'auth_service:',
      '  cluster_name: kube.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      `  public_addr: ${PROXY_IP}:${webPort}`,
      '',
    ].join('\n'),
  );
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  await writeFile(
    join(dir, 'roles.yaml'),
    [
      'kind: role',
      'version: v7',
      'metadata: {name: kube-dev}',
      'spec:',
      '  allow:',
      '    kubernetes_labels: {env: dev}',
      '    kubernetes_groups: [developers]',
      '---',
      'kind: role',
      'version: v7',
      'metadata: {name: kube-nobody}',
      'spec:',
      '  allow:',
      '    kubernetes_labels: {env: dev}',
      '',
    ].join('\n'),
  );
  const created = await admin(['create', join(dir, 'roles.yaml')]);
  expect(created.status, created.stderr).toBe(0);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=kube', '--format', 'json'])).stdout) as { token: string }).token;
  await writeFile(join(dir, 'api-ca.pem'), pki.caPem);
  await writeFile(
    join(dir, 'agent-kubeconfig'),
    ['apiVersion: v1', 'kind: Config', 'current-context: sa', 'contexts: [{name: sa, context: {cluster: c, user: agent}}]', 'clusters: [{name: c, cluster: {server: "https://unused"}}]', `users: [{name: agent, user: {token: ${AGENT_TOKEN}}}]`, ''].join('\n'),
  );
  const apiUrl = `https://127.0.0.1:${apiPort}`;
  agent = await startGateway(
    [
      'gateway:',
      '  nodename: agent-kube',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'kube_service:',
      '  enabled: yes',
      '  clusters:',
      `    - { name: dev, api_server: "${apiUrl}", ca_file: ${join(dir, 'api-ca.pem')}, credentials: kubeconfig, kubeconfig: ${join(dir, 'agent-kubeconfig')}, labels: {env: dev} }`,
      `    - { name: raw, api_server: "${apiUrl}", ca_file: ${join(dir, 'api-ca.pem')}, labels: {env: dev} }`,
      `    - { name: prod, api_server: "${apiUrl}", ca_file: ${join(dir, 'api-ca.pem')}, labels: {env: prod} }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_IP}:${webPort}`] },
  );
  await agent.waitForLog('reverse tunnel ready');
  for (const [user, role] of [['alice', 'kube-dev'], ['carol', 'kube-dev'], ['bob', 'kube-nobody']] as const) {
    const added = await admin(['users', 'add', user, `--roles=${role}`], `${PASSWORD}\n`);
    expect(added.status, added.stderr).toBe(0);
    users[user] = { HOME: join(dir, `${user}-home`), GWSH_HOME: join(dir, user) };
    const login = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${webPort}`, `--user=${user}`, `--ca-pin=${pin}`], { env: users[user]!, input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
  }
}, 90_000);

afterAll(async () => {
  for (const s of held) s.destroy();
  await agent?.stop();
  await cluster?.stop();
  api?.close();
  await pki?.cleanup();
  await rm(dir, { recursive: true, force: true });
});

async function tlsOf(user: string): Promise<{ cert: string; key: string; ca: string }> {
  const home = users[user]!.GWSH_HOME!;
  return { cert: await readFile(join(home, 'cert.pem'), 'utf8'), key: await readFile(join(home, 'key.pem'), 'utf8'), ca: await readFile(join(home, 'host-ca.pem'), 'utf8') };
}

const EXEC = (pod: string, cluster = 'dev') => `/k8s/${cluster}/api/v1/namespaces/default/pods/${pod}/exec?command=cat&stdin=true&stdout=true`;

/** kubectl's exec WebSocket to the kube route, by the Proxy's IP with the kube route's SNI. */
async function execSocket(user: string, path: string, headers: Record<string, string> = {}): Promise<WebSocket> {
  const t = await tlsOf(user);
  // ws hands its options to tls.connect: servername is the kube route's SNI (the address is the Proxy's IP).
  const options = { servername: KUBE_SNI, headers: { host: `${KUBE_SNI}:${webPort}`, ...headers }, ...t, maxPayload: 64 * 1024 * 1024 };
  return new WebSocket(`wss://${PROXY_IP}:${webPort}${path}`, ['v5.channel.k8s.io'], options as WebSocket.ClientOptions);
}

function opened(ws: WebSocket): Promise<void> {
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`refused: ${res.statusCode}`)));
  });
}

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

const closedOf = (ws: WebSocket) => new Promise<number>((resolve) => (ws.readyState === WebSocket.CLOSED ? resolve(1006) : ws.once('close', (code: number) => resolve(code))));

/** Sends data on stdin (channel 0) and reads it back from stdout (channel 1). */
function stdinEcho(ws: WebSocket, data: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const got: Buffer[] = [];
    let n = 0;
    ws.on('message', (m: Buffer) => {
      if (m[0] !== 1) return;
      got.push(m.subarray(1));
      n += m.length - 1;
      if (n >= data.length) resolve(Buffer.concat(got));
    });
    ws.once('close', () => reject(new Error(`closed after ${n} of ${data.length} bytes`)));
    for (let i = 0; i < data.length; i += 256 * 1024) ws.send(Buffer.concat([Buffer.from([0]), data.subarray(i, i + 256 * 1024)]));
  });
}

/** A raw HTTP/1.1 upgrade on the kube route: the answer's head, then what follows it. */
function rawUpgrade(user: string, path: string, headers: string[]): Promise<{ head: string; socket: tls.TLSSocket; rest: Buffer }> {
  return tlsOf(user).then(
    (t) =>
      new Promise((resolve, reject) => {
        const socket = tls.connect({ host: PROXY_IP, port: webPort, servername: KUBE_SNI, ...t, ALPNProtocols: ['http/1.1'] }, () => {
          socket.write([`POST ${path} HTTP/1.1`, `Host: ${KUBE_SNI}:${webPort}`, 'Connection: Upgrade', ...headers, '', ''].join('\r\n'));
        });
        let buf = Buffer.alloc(0);
        const onData = (c: Buffer) => {
          buf = Buffer.concat([buf, c]);
          const end = buf.indexOf('\r\n\r\n');
          if (end < 0) return;
          socket.off('data', onData);
          resolve({ head: buf.subarray(0, end).toString(), socket, rest: buf.subarray(end + 4) });
        };
        socket.on('data', onData);
        socket.once('error', reject);
      }),
  );
}

describe('gwsh kube', () => {
  it('kube ls lists the clusters her roles reach (not prod)', async () => {
    const r = await runCli('gwsh', ['kube', 'ls', '-f', 'json'], { env: users.alice! });
    expect(r.status, r.stderr).toBe(0);
    expect((JSON.parse(r.stdout) as Array<{ name: string }>).map((c) => c.name)).toEqual(['dev', 'raw']);
  });

  it('kube login merges a context into an existing kubeconfig (others and their comments kept) and makes it current', async () => {
    const file = join(dir, 'alice-kubeconfig');
    await writeFile(file, ['# my clusters', 'apiVersion: v1', 'kind: Config', 'current-context: home', 'clusters:', '- name: home', '  cluster: {server: "https://home.example:6443"}', 'users:', '- name: me', '  user: {token: keep-me}', 'contexts:', '- name: home', '  context: {cluster: home, user: me}', ''].join('\n'));
    const r = await runCli('gwsh', ['kube', 'login', 'dev', '--kubeconfig', file, '-f', 'json'], { env: users.alice! });
    expect(r.status, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toMatchObject({ context: 'kube.example-dev', server: `https://${PROXY_IP}:${webPort}/k8s/dev`, tls_server_name: KUBE_SNI });
    const text = await readFile(file, 'utf8');
    expect(text).toContain('# my clusters');
    expect(text).toContain('keep-me');
    expect(text).toMatch(/current-context: kube\.example-dev/);
    // Again: the same entries replaced, not added twice.
    expect((await runCli('gwsh', ['kube', 'login', 'dev', '--kubeconfig', file], { env: users.alice! })).status).toBe(0);
    expect((await readFile(file, 'utf8')).match(/name: kube\.example-dev/g)).toHaveLength(3);
  });

  it('kube login writes $KUBECONFIG when no --kubeconfig is given', async () => {
    const file = join(dir, 'from-env');
    const r = await runCli('gwsh', ['kube', 'login', 'raw'], { env: { ...users.alice!, KUBECONFIG: `${file}:${join(dir, 'second')}` } });
    expect(r.status, r.stderr).toBe(0);
    expect(await readFile(file, 'utf8')).toMatch(/current-context: kube\.example-raw/);
    expect(existsSync(join(dir, 'second'))).toBe(false);
  });

  it('refused, the file untouched: an unknown (or forbidden) cluster, a kubeconfig that is not YAML, one that cannot be written; not logged in', async () => {
    const file = join(dir, 'bad-kubeconfig');
    const bad = 'clusters: [unclosed\n  token: secret-in-a-broken-file\n';
    await writeFile(file, bad);
    for (const [cluster, code] of [['prod', 'GW_ERR_KUBE_CLUSTER_NOT_FOUND'], ['nope', 'GW_ERR_KUBE_CLUSTER_NOT_FOUND'], ['dev', 'GW_ERR_CLIENT_KUBECONFIG']] as const) {
      const r = await runCli('gwsh', ['kube', 'login', cluster, '--kubeconfig', file], { env: users.alice! });
      expect(r.status).toBe(1);
      expect(r.stderr).toContain(code);
      expect(r.stderr).toContain('hint:');
      expect(r.stderr).not.toContain('secret-in-a-broken-file');
      expect(await readFile(file, 'utf8')).toBe(bad);
    }
    const unwritable = await runCli('gwsh', ['kube', 'login', 'dev', '--kubeconfig', join(file, 'below-a-file')], { env: users.alice! });
    expect(unwritable.stderr).toContain('GW_ERR_CLIENT_KUBECONFIG_WRITE');
    const nobody = await runCli('gwsh', ['kube', 'login', 'dev', '--kubeconfig', join(dir, 'never')], { env: { HOME: dir, GWSH_HOME: join(dir, 'nobody') } });
    expect(nobody.stderr).toContain('GW_ERR_CLIENT_NOT_LOGGED_IN');
    expect(existsSync(join(dir, 'never'))).toBe(false);
  });
});

describe('upgrades through the kube route', () => {
  for (const name of ['dev', 'raw']) {
    it(`WebSocket exec on cluster ${name}: 8 MiB through stdin and back byte-exact; the API server sees the impersonation${name === 'dev' ? " and the agent's token" : ''}, never alice's own`, async () => {
      const ws = await execSocket('alice', EXEC('echo', name));
      await opened(ws);
      expect(ws.protocol).toBe('v5.channel.k8s.io');
      const data = Buffer.alloc(8 * 1024 * 1024, 'k');
      data.write('start', 0);
      expect((await stdinEcho(ws, data)).equals(data)).toBe(true);
      ws.close(1000);
      await closedOf(ws);
      const saw = seen.filter((s) => s.upgrade === 'websocket' && s.path.startsWith('/api/v1/namespaces/default/pods/echo/exec')).at(-1)!;
      expect(saw).toMatchObject({ user: 'alice', groups: 'developers' });
      expect(saw.authorization).toBe(name === 'dev' ? `Bearer ${AGENT_TOKEN}` : undefined);
    });
  }

  it('SPDY/3.1 (kubectl port-forward, exec with websockets off): the 101 and X-Stream-Protocol-Version pass both ways, then the bytes', async () => {
    const { head, socket, rest } = await rawUpgrade('alice', '/k8s/dev/api/v1/namespaces/default/pods/echo/portforward', ['Upgrade: SPDY/3.1', 'X-Stream-Protocol-Version: portforward.k8s.io', 'Content-Length: 0']);
    expect(head).toMatch(/^HTTP\/1\.1 101 /);
    expect(head).toMatch(/x-stream-protocol-version: v4\.channel\.k8s\.io/i);
    expect(head).toMatch(/upgrade: SPDY\/3\.1/i);
    const echoed = new Promise<string>((resolve) => {
      let got = rest.toString();
      socket.on('data', (c: Buffer) => {
        got += c.toString();
        if (got.includes('spdy frames')) resolve(got);
      });
    });
    socket.write('spdy frames');
    expect(await echoed).toBe('spdy frames');
    socket.destroy();
    expect(seen.filter((s) => s.path.endsWith('/portforward')).at(-1)).toMatchObject({ upgrade: 'SPDY/3.1', version: 'portforward.k8s.io', user: 'alice' });
  });

  it('is one audited kube session with its end event, its bytes and what it upgraded to', async () => {
    await waitUntil('the kube.session.end of the exec', async () => {
      const r = await admin(['get', 'events', '--format', 'json']);
      const all = (JSON.parse(r.stdout) as Array<{ spec: Record<string, unknown> }>).map((e) => e.spec);
      const end = all.find((e) => e.event === 'kube.session.end' && e.user === 'alice' && e.upgrade === 'websocket' && Number(e.bytes_in) > 8 * 1024 * 1024);
      return end !== undefined && Number(end.bytes_out) > 8 * 1024 * 1024 && String(end.upgrade_path).endsWith('/pods/echo/exec');
    }, 30_000);
  });

  it('a user whose roles allow no kubernetes_users or groups is refused before the agent is dialled', async () => {
    const before = seen.length;
    const r = await refusal(await execSocket('bob', EXEC('echo')));
    expect(r.status).toBe(403);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_KUBE_NO_IMPERSONATION' } });
    // As a Kubernetes Status, so that kubectl prints the code and reason (docs/proxy.md).
    expect(JSON.parse(r.body)).toMatchObject({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Forbidden', code: 403, message: expect.stringMatching(/^GW_ERR_KUBE_NO_IMPERSONATION: /) });
    expect(seen.length).toBe(before);
  });

  it("hostile: the user's own Impersonate-* headers on an upgrade are refused as on a plain request", async () => {
    const before = seen.length;
    for (const header of [{ 'Impersonate-User': 'admin' }, { 'Impersonate-Group': 'system:masters' }] as Array<Record<string, string>>) {
      const r = await refusal(await execSocket('alice', EXEC('echo'), header));
      expect(r.status).toBe(403);
      expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_KUBE_NO_IMPERSONATION' } });
    }
    expect(seen.length).toBe(before);
  });

  it('an upgrade the API server refuses (403) reaches kubectl as the API server answered it', async () => {
    const r = await refusal(await execSocket('alice', EXEC('refuse')));
    expect(r).toEqual({ status: 403, body: '{"code":403000}' });
  });

  it('hostile: a 200 that announces an Upgrade is no switch: relayed as a plain answer, nothing upgraded', async () => {
    const r = await refusal(await execSocket('alice', EXEC('claims')));
    expect(r).toEqual({ status: 200, body: 'not a 101' });
  });

  it('hostile: an API server that switches to another protocol than asked: GW_ERR_KUBE_UPGRADE_UNASKED', async () => {
    const r = await refusal(await execSocket('alice', EXEC('other')));
    expect(r.status).toBe(502);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_KUBE_UPGRADE_UNASKED' } });
  });

  it('hostile: a 101 without an Upgrade header, then bytes of no protocol: GW_ERR_KUBE_UPGRADE_UNASKED, none of its bytes reach the client', async () => {
    const r = await refusal(await execSocket('alice', EXEC('noupgrade')));
    expect(r.status).toBe(502);
    expect(r.body).not.toContain('bytes of no protocol');
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_KUBE_UPGRADE_UNASKED' } });
  });

  it('hostile: an API server that never answers the upgrade: GW_ERR_KUBE_UPGRADE_TIMEOUT at header_timeout (3 s here)', async () => {
    const r = await refusal(await execSocket('alice', EXEC('silent')));
    expect(r.status).toBe(504);
    expect(JSON.parse(r.body)).toMatchObject({ error: { code: 'GW_ERR_KUBE_UPGRADE_TIMEOUT' } });
  });

  it('an upgraded connection that moves no bytes for idle_timeout (6 s here) is closed; a plain request keeps none (watches)', async () => {
    const ws = await execSocket('alice', EXEC('idle'));
    await opened(ws);
    expect(await closedOf(ws)).toBe(1006);
  });

  it('a lock on the user ends the open exec at once, and a new one is refused', async () => {
    const ws = await execSocket('carol', EXEC('echo'));
    await opened(ws);
    const closed = closedOf(ws);
    const lock = await admin(['lock', '--user', 'carol', '--message', 'incident 9']);
    expect(lock.status, lock.stderr).toBe(0);
    expect(await closed).toBe(1006);
    const again = await refusal(await execSocket('carol', EXEC('echo')));
    expect(JSON.parse(again.body)).toMatchObject({ error: { code: 'GW_ERR_ACCESS_LOCKED' } });
  });
});
