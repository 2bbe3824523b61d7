/**
 * Kubernetes through `gwsh proxy kube`, end to end (issue 29; docs/kubernetes.md "End to end: gwsh proxy kube"): the
 * real kubectl talks plain HTTP to gwsh on loopback, gwsh carries each of its connections as an end-to-end stream
 * (TLS with the agent, the Proxy splicing bytes it cannot read) to the agent, which reads the HTTP itself, sets
 * Impersonate-User/-Group from the grant (dropping the client's) and adds its own credential. The API server is the
 * stand-in (test/helpers/kubeapiserver.ts: what it is not is said at its top), whose RBAC lets the agent's service
 * account do anything, impersonating anyone included: only the gateway's impersonation stands between kubectl and
 * system:admin, and the stand-in's record of whom it served shows whose impersonation reached it.
 *
 * Shown: get, exec -i over WebSocket with an exit code, exec -it under a pseudo-terminal (a TTY, typed input, the
 * exit code), port-forward over SPDY in a WebSocket and over plain SPDY (KUBECTL_PORT_FORWARD_WEBSOCKETS=false, which
 * kubectl 1.33 honours: the stand-in saw a POST); the Proxy logs the streams as routed end to
 * end and its kube route (which reads HTTP) logs none of these requests; the Proxy runs with the recorder of
 * test/helpers/compromised-proxy.cjs, and an exec's input and path appear nowhere in what it held (while on the
 * classic route they do: the recorder works). Hostile: kubectl's own Impersonate-User
 * system:admin is not honoured (refused, nothing reaches the API server); a user whose roles allow no Kubernetes
 * user or group is refused at the grant with the classic route's code; --e2e require against an agent that takes no
 * end-to-end streams (e2e_pool: 0, as an earlier version) fails with GW_ERR_E2E_UNAVAILABLE, and auto takes the
 * classic route there (the Proxy's kube route then logs the request), as --e2e off does everywhere; a request outside
 * the grant's cluster is refused at the agent; both ends audit the sessions. A lock on the user while an exec is
 * open closes it (the Proxy cuts it and tells the agent, which closes its end if still open): kubectl exits
 * non-zero, the command in the pod is gone (its file holds what it read before the lock only); the next request is
 * refused with GW_ERR_ACCESS_LOCKED, nothing of it reaching the API server; after the unlock the next is served; both
 * ends audit the stream's end.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startKubeApiServer, type KubeApiServer } from '../helpers/kubeapiserver.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { kubectlPty } from '../helpers/kubectlpty.js';
import { waitUntil } from '../helpers/wait.js';

const KUBECTL = fileURLToPath(new URL('../../.cache/kubetools/kubectl', import.meta.url));
const PROXY_NAME = 'proxy.gwe2e.test';
const PASSWORD = 'correct horse battery';
const NOKUBE = 'nora';
/** The Proxy records every chunk its sockets hand its code (test/helpers/compromised-proxy.cjs, as e2e-streams.test.ts). */
const PRELOAD = new URL('../helpers/compromised-proxy.cjs', import.meta.url).pathname;
const SA = { user: 'system:serviceaccount:gw:agent', groups: ['system:serviceaccounts', 'system:serviceaccounts:gw'] };

let dir: string;
let squid: Squid;
let api: KubeApiServer;
let cluster: RunningGateway;
let agent: RunningGateway;
let oldAgent: RunningGateway;
let webPort: number;
let echo: net.Server;
const children: ChildProcess[] = [];

const home = (user: string) => join(dir, user);
const recordDir = () => join(dir, 'record');
/** Whether any byte sequence the Proxy held (plaintext of what it terminates, raw bytes of what it relays) has marker. */
async function proxyHeld(marker: string, kind: 'tls' | 'raw' | 'any' = 'any'): Promise<boolean> {
  for (const name of await readdir(recordDir())) {
    if (kind !== 'any' && !name.endsWith(`-${kind}.bin`)) continue;
    if ((await readFile(join(recordDir(), name))).includes(marker)) return true;
  }
  return false;
}

beforeAll(async () => {
  if (!existsSync(KUBECTL)) throw new Error(`${KUBECTL} is missing: run scripts/install-kubetools.sh (scripts/install-test-deps.sh runs it)`);
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-kube-e2e-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `127.0.0.1 ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
  api = await startKubeApiServer({
    pods: [{ name: 'web', ports: { 80: (echo.address() as net.AddressInfo).port } }],
    tokens: { 'agent-sa-token': SA },
    bindings: [
      // The agent's service account may do anything, impersonate anyone included: a request that reached the API
      // server with the client's impersonation (system:admin) would be served, so a refusal below is the gateway's.
      { users: [SA.user], rules: [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'] }] },
      { users: ['alice-k8s'], namespace: 'default', rules: [
        { verbs: ['get', 'list'], apiGroups: [''], resources: ['pods'] },
        { verbs: ['get', 'create'], apiGroups: [''], resources: ['pods/exec', 'pods/portforward'] },
      ] },
    ],
  });
  webPort = await getPort({ host: '127.0.0.1' });
  await mkdir(recordDir());
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: kube-e2e.example',
      '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n'),
    { env: { NODE_OPTIONS: `--require ${PRELOAD}`, GW_TEST_RECORD: recordDir() } },
  );
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  await writeFile(join(dir, 'role.yaml'), ['kind: role', 'version: v7', 'metadata: {name: k8s-dev}', 'spec:', '  allow:', '    kubernetes_labels: {env: dev}',
    "    kubernetes_users: ['{{internal.kubernetes_users}}']", "    kubernetes_groups: ['{{internal.kubernetes_groups}}']", ''].join('\n'));
  expect((await admin(['create', join(dir, 'role.yaml')])).status).toBe(0);
  expect((await admin(['users', 'add', 'alice', '--roles=k8s-dev', '--kubernetes-users=alice-k8s', '--kubernetes-groups=devs'], `${PASSWORD}\n`)).status).toBe(0);
  expect((await admin(['users', 'add', NOKUBE, '--roles=k8s-dev'], `${PASSWORD}\n`)).status).toBe(0);
  const caFile = join(dir, 'k8s-ca.pem');
  await writeFile(caFile, api.caPem);
  const kubeconfig = await api.kubeconfig({ token: 'agent-sa-token' }, 'agent');
  const start = async (nodename: string, name: string, extra: string[]) => {
    const token = (JSON.parse((await admin(['tokens', 'add', '--type=kube', '--format', 'json'])).stdout) as { token: string }).token;
    const started = await startGateway(
      ['gateway:', `  nodename: ${nodename}`, '  data_dir: DATA_DIR', '  log: { format: json }', ...extra, 'kube_service:', '  enabled: yes', '  clusters:',
        `    - { name: ${name}, api_server: "${api.url}", ca_file: ${caFile}, credentials: kubeconfig, kubeconfig: ${kubeconfig}, labels: {env: dev} }`, ''].join('\n'),
      { args: ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${webPort}`], env: { HTTPS_PROXY: squid.url } },
    );
    await started.waitForLog('reverse tunnel ready', 20_000).catch((err: Error) => { throw new Error(`${err.message}\n${started.logs()}`); });
    return started;
  };
  agent = await start('agent-kube', 'dev', []);
  // An agent that offers no end-to-end streams: what the Proxy sees of an agent of an earlier version.
  oldAgent = await start('agent-old', 'old', ['  e2e_pool: 0']);
  for (const user of ['alice', NOKUBE]) {
    const login = await runCli('gwsh', ['login', `--proxy=127.0.0.1:${webPort}`, `--user=${user}`, `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: home(user) }, input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
  }
}, 120_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  await oldAgent?.stop();
  await agent?.stop();
  await cluster?.stop();
  await api?.close();
  await squid?.stop();
  await new Promise((r) => (echo ? echo.close(r) : r(undefined)));
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** `gwsh --debug proxy kube CLUSTER --kubeconfig FILE`, listening: its output so far and the kubeconfig it wrote. */
async function proxyKube(user: string, kubeCluster: string, mode: string, tag = ''): Promise<{ kubeconfig: string; output: () => string; child: ChildProcess }> {
  const kubeconfig = join(home(user), `kubeconfig-${kubeCluster}-${mode}${tag}.yaml`);
  const child = spawn(process.execPath, [BIN('gwsh'), '--debug', 'proxy', 'kube', kubeCluster, '--port', '0', '--e2e', mode, '--kubeconfig', kubeconfig], {
    env: { PATH: process.env.PATH ?? '', HOME: home(user), GWSH_HOME: home(user) },
  });
  children.push(child);
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
  await waitUntil(`gwsh proxy kube to listen (${output})`, () => /now the current context/.test(output) || child.exitCode !== null, 20_000);
  expect(child.exitCode, output).toBeNull();
  return { kubeconfig, output: () => output, child };
}

function kubectl(kubeconfig: string, args: string[], opts: { env?: Record<string, string>; input?: string } = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(KUBECTL, ['--kubeconfig', kubeconfig, '--request-timeout=20s', ...args], { env: { PATH: process.env.PATH ?? '', HOME: dir, ...opts.env }, timeout: 60_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin!.end(opts.input ?? '');
  });
}


/** `kubectl port-forward pod/web LOCAL:80` until it forwards; its output and the child. */
async function portForward(kubeconfig: string, env: Record<string, string> = {}): Promise<{ port: number; child: ChildProcess; output: () => string }> {
  const port = await getPort({ host: '127.0.0.1' });
  const child = spawn(KUBECTL, ['--kubeconfig', kubeconfig, 'port-forward', '--address', '127.0.0.1', 'pod/web', `${port}:80`], { env: { PATH: process.env.PATH ?? '', HOME: dir, ...env } });
  children.push(child);
  let output = '';
  child.stdout!.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
  await waitUntil(`kubectl port-forward listening (${output})`, () => output.includes('Forwarding from') || child.exitCode !== null, 30_000);
  return { port, child, output: () => output };
}

function roundTrip(port: number, bytes: Buffer): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = net.connect(port, '127.0.0.1', () => s.end(bytes));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('end', () => resolve(Buffer.concat(chunks)));
    s.on('error', reject);
  });
}

const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });
const kubeEvents = async (user = 'alice') =>
  (JSON.parse((await gwctl(['get', 'events', '-f', 'json'])).stdout) as Array<{ spec: Record<string, unknown> }>)
    .map((e) => e.spec)
    .filter((e) => e.e2e === true && e.resource === 'dev' && e.user === user);
/** Whether a process is still there (the stand-in runs exec's command on this machine). */
const alive = (pid: number) => { try { process.kill(pid, 0); return true; } catch { return false; } };

const last = (suffix: string) => api.seen.filter((s) => s.path.endsWith(suffix)).at(-1);
/** The Proxy's kube route's request lines (it logs each request it reads: src/proxy/webapps.ts). */
const kubeRouteLines = () => cluster.logs().split('\n').filter((l) => /"msg":"kubernetes (request|upgrade request)"/.test(l));
const routedLines = () => cluster.logs().split('\n').filter((l) => l.includes('"msg":"end-to-end stream routed"') && l.includes('"resource":"dev"'));

describe('gwsh proxy kube: kubectl end to end with the agent', () => {
  let alice: Awaited<ReturnType<typeof proxyKube>>;

  beforeAll(async () => {
    alice = await proxyKube('alice', 'dev', 'auto');
  }, 30_000);

  it('get pods: the grant\'s impersonation reached the API server; the Proxy routed streams and read no request', async () => {
    const before = kubeRouteLines().length;
    const r = await kubectl(alice.kubeconfig, ['get', 'pods']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^web\s+1\/1\s+Running/m);
    expect(last('/pods')).toMatchObject({ method: 'GET', code: 200, user: { name: 'alice-k8s', groups: ['devs', 'system:authenticated'] }, impersonatedBy: { name: SA.user } });
    expect(alice.output()).toMatch(/dev: end-to-end to agent [0-9a-f-]+/);
    expect(alice.output()).not.toContain('classic route');
    await waitUntil('the Proxy to log the routed streams', () => routedLines().length > 0);
    expect(kubeRouteLines().length).toBe(before);
  });

  it('exec -i over WebSocket (and SPDY): stdin through, output back, the exit code carried; the Proxy held none of it', async () => {
    const marker = `exec-secret-${randomBytes(12).toString('hex')}`;
    const r = await kubectl(alice.kubeconfig, ['exec', '-i', 'web', '--', 'cat'], { input: `${marker}\n` });
    expect(r).toEqual({ code: 0, stdout: `${marker}\n`, stderr: '' });
    expect(await proxyHeld(marker)).toBe(false);
    // Nor the request: its path (the pod and command) is inside the end-to-end TLS too.
    expect(await proxyHeld('/pods/web/exec')).toBe(false);
    expect(last('/pods/web/exec')).toMatchObject({ method: 'GET', code: 200, user: { name: 'alice-k8s' } });
    const failing = await kubectl(alice.kubeconfig, ['exec', 'web', '--', 'sh', '-c', 'echo out; exit 3']);
    expect(failing).toMatchObject({ code: 3, stdout: 'out\n' });
    // And over SPDY/3.1 (kubectl's other transport: a POST upgrade), as the grant's user too.
    const spdy = await kubectl(alice.kubeconfig, ['exec', '-i', 'web', '--', 'cat'], { input: 'over spdy\n', env: { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'false' } });
    expect(spdy).toEqual({ code: 0, stdout: 'over spdy\n', stderr: '' });
    expect(last('/pods/web/exec')).toMatchObject({ method: 'POST', code: 200, user: { name: 'alice-k8s' } });
  });

  it("port-forward: bytes round-trip to the pod's port", async () => {
    const pf = await portForward(alice.kubeconfig);
    try {
      const bytes = Buffer.alloc(128 * 1024, 9);
      expect((await roundTrip(pf.port, bytes)).equals(bytes), pf.output()).toBe(true);
      expect(last('/pods/web/portforward')).toMatchObject({ code: 200, user: { name: 'alice-k8s' } });
    } finally {
      pf.child.kill();
    }
  });

  it('exec -it: a real terminal, typed input read, the exit code back; routed end to end, the Proxy read no request', async () => {
    const before = { route: kubeRouteLines().length, routed: routedLines().length };
    const typed = `tty-secret-${randomBytes(12).toString('hex')}`;
    const r = await kubectlPty(['--request-timeout=20s', 'exec', '-it', 'web', '--', 'sh', '-c', 'tty; read x; echo "got $x"; exit 5'], { kubectl: KUBECTL, kubeconfig: alice.kubeconfig, home: dir, typed: `${typed}\r`, until: /\/dev\/pts\/\d+\r?\n/, timeoutMs: 60_000 });
    expect(r.output).toMatch(/\/dev\/pts\/\d+/);
    expect(r.output).toContain(`got ${typed}`);
    expect(r.code, r.output).toBe(5);
    // The WebSocket exec (GET) reached the API server as the grant's user, over a stream the Proxy routed end to end.
    expect(last('/pods/web/exec')).toMatchObject({ method: 'GET', code: 200, user: { name: 'alice-k8s' }, impersonatedBy: { name: SA.user } });
    await waitUntil('the Proxy to log the exec\'s stream as routed', () => routedLines().length > before.routed);
    // Hostile: the Proxy's kube route read no request, and what was typed is nowhere in what the Proxy held.
    expect(kubeRouteLines().length).toBe(before.route);
    expect(await proxyHeld(typed)).toBe(false);
  });

  it('port-forward over plain SPDY (KUBECTL_PORT_FORWARD_WEBSOCKETS=false): bytes round-trip end to end', async () => {
    const before = { route: kubeRouteLines().length, routed: routedLines().length };
    const pf = await portForward(alice.kubeconfig, { KUBECTL_PORT_FORWARD_WEBSOCKETS: 'false' });
    try {
      const marker = Buffer.from(`pf-secret-${randomBytes(12).toString('hex')}\n`);
      const bytes = Buffer.concat([marker, randomBytes(256 * 1024), marker]);
      expect((await roundTrip(pf.port, bytes)).equals(bytes), pf.output()).toBe(true);
      // kubectl 1.33 honours the variable: a POST with Upgrade: SPDY/3.1 (the WebSocket tunnel would be a GET).
      expect(last('/pods/web/portforward')).toMatchObject({ method: 'POST', code: 200, user: { name: 'alice-k8s' }, impersonatedBy: { name: SA.user } });
      expect(routedLines().length).toBeGreaterThan(before.routed);
      expect(kubeRouteLines().length).toBe(before.route);
      expect(await proxyHeld(marker.toString().trim())).toBe(false);
    } finally {
      pf.child.kill();
    }
  });

  it("hostile: kubectl's own Impersonate-User system:admin is not honoured: refused at the agent, nothing reaches the API server", async () => {
    const before = api.seen.length;
    const r = await kubectl(alice.kubeconfig, ['--as', 'system:admin', 'get', '--raw', '/k8s/dev/api/v1/namespaces/default/pods']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/Error from server \(Forbidden\): GW_ERR_KUBE_NO_IMPERSONATION: your roles do not allow acting as the Kubernetes user "system:admin"/);
    const groups = await kubectl(alice.kubeconfig, ['--as', 'alice-k8s', '--as-group', 'system:masters', 'get', '--raw', '/k8s/dev/api/v1/namespaces/default/pods']);
    expect(groups.stderr).toMatch(/GW_ERR_KUBE_NO_IMPERSONATION: your roles do not allow acting in the Kubernetes group\(s\) system:masters/);
    expect(api.seen.length).toBe(before);
    // A raw Impersonate-Uid / -Extra the client adds is dropped: the API server serves the grant's user.
    const raw = await new Promise<string>((resolve, reject) => {
      const port = Number(/127\.0\.0\.1:(\d+)/.exec(alice.output())![1]);
      const s = net.connect(port, '127.0.0.1', () =>
        s.write('GET /k8s/dev/api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\nImpersonate-Uid: 0\r\nImpersonate-Extra-Scopes: all\r\nConnection: close\r\n\r\n'),
      );
      let out = '';
      s.on('data', (d: Buffer) => (out += d.toString()));
      s.on('end', () => resolve(out));
      s.on('error', reject);
    });
    expect(raw).toMatch(/^HTTP\/1\.1 200/);
    expect(api.seen.at(-1)).toMatchObject({ code: 200, user: { name: 'alice-k8s' }, impersonatedBy: { name: SA.user } });
    expect(api.seen.at(-1)!.user).not.toHaveProperty('uid');
    expect(api.seen.at(-1)!.user).not.toHaveProperty('extra');
  });

  it("hostile: a request outside the grant's cluster (another cluster's prefix, none) is refused at the agent, nothing sent", async () => {
    const before = api.seen.length;
    const port = Number(/127\.0\.0\.1:(\d+)/.exec(alice.output())![1]);
    for (const path of ['/k8s/old/api/v1/namespaces/default/pods', '/api/v1/namespaces/default/pods', '/k8s/%E0%A4%A/api']) {
      const answer = await new Promise<string>((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1', () => s.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
        let out = '';
        s.on('data', (d: Buffer) => (out += d.toString()));
        s.on('end', () => resolve(out));
        s.on('error', reject);
      });
      expect(answer, path).toMatch(/^HTTP\/1\.1 404/);
      expect(answer, path).toContain('GW_ERR_API_NOT_FOUND');
    }
    expect(api.seen.length).toBe(before);
  });

  it('both ends audit the kube sessions: the Proxy its route and bytes, the agent the grant it checked', async () => {
    await waitUntil('an end-to-end kube session ended at both ends', async () => {
      const ends = (await kubeEvents()).filter((e) => e.event === 'kube.session.end');
      return ends.some((e) => typeof e.grant === 'string') && ends.some((e) => e.grant === undefined);
    }, 30_000);
    const starts = (await kubeEvents()).filter((e) => e.event === 'kube.session.start');
    expect(starts.some((e) => typeof e.grant === 'string' && e.node === 'agent-kube')).toBe(true);
    expect(starts.some((e) => e.grant === undefined && e.node === 'agent-kube')).toBe(true);
  }, 60_000);
});

describe('gwsh proxy kube: refusals and the classic route', () => {
  it('a user whose roles allow no Kubernetes user or group is refused at the grant, with the classic route\'s code', async () => {
    const before = api.seen.length;
    const nora = await proxyKube(NOKUBE, 'dev', 'auto');
    const r = await kubectl(nora.kubeconfig, ['get', '--raw', '/k8s/dev/api/v1/namespaces/default/pods']);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/Error from server \(Forbidden\): GW_ERR_KUBE_NO_IMPERSONATION: your roles allow no Kubernetes user or group/);
    expect(nora.output()).toContain('code: GW_ERR_KUBE_NO_IMPERSONATION');
    expect(api.seen.length).toBe(before);
    nora.child.kill();
  });

  it('--e2e require against an agent that takes no end-to-end streams: GW_ERR_E2E_UNAVAILABLE, nothing sent', async () => {
    const before = api.seen.length;
    const required = await proxyKube('alice', 'old', 'require');
    const r = await kubectl(required.kubeconfig, ['get', '--raw', '/k8s/old/api/v1/namespaces/default/pods']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('GW_ERR_E2E_UNAVAILABLE');
    expect(required.output()).toMatch(/code: GW_ERR_E2E_UNAVAILABLE/);
    expect(api.seen.length).toBe(before);
    required.child.kill();
  });

  it('auto against that agent: the classic route (the Proxy reads the request and impersonates), said with --debug', async () => {
    const before = kubeRouteLines().length;
    const auto = await proxyKube('alice', 'old', 'auto');
    const r = await kubectl(auto.kubeconfig, ['get', 'pods']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^web\s+1\/1\s+Running/m);
    // The recorder sees what the Proxy decrypts: on this route the exec's bytes (its absence above means something).
    const marker = `classic-exec-${randomBytes(12).toString('hex')}`;
    expect(await kubectl(auto.kubeconfig, ['exec', '-i', 'web', '--', 'cat'], { input: `${marker}\n` })).toMatchObject({ code: 0, stdout: `${marker}\n` });
    expect(await proxyHeld(marker, 'tls')).toBe(true);
    expect(last('/pods')).toMatchObject({ code: 200, user: { name: 'alice-k8s' }, impersonatedBy: { name: SA.user } });
    expect(auto.output()).toMatch(/old: the classic route \(the Proxy sees the stream\): .*does not offer end-to-end streams/);
    expect(kubeRouteLines().length).toBeGreaterThan(before);
    auto.child.kill();
  });

  it('off: the classic route without asking for a grant, also where end to end was possible', async () => {
    const before = kubeRouteLines().length;
    const routed = routedLines().length;
    const off = await proxyKube('alice', 'dev', 'off');
    const r = await kubectl(off.kubeconfig, ['get', 'pods']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^web\s+1\/1\s+Running/m);
    expect(last('/pods')).toMatchObject({ code: 200, user: { name: 'alice-k8s' } });
    expect(off.output()).toContain('(end-to-end: off)');
    expect(kubeRouteLines().length).toBeGreaterThan(before);
    expect(routedLines().length).toBe(routed);
    off.child.kill();
  });
});

describe('gwsh proxy kube: a lock on the user', () => {
  it('closes an open end-to-end exec at the agent, refuses the next request while locked, and the unlock restores', async () => {
    const lockee = await proxyKube('alice', 'dev', 'auto', '-lock');
    const routed = routedLines().length;
    // The command writes each line it reads to a file and says its pid: what runs in the pod is watched from here.
    const file = `lock-${randomBytes(6).toString('hex')}`;
    const exec = spawn(KUBECTL, ['--kubeconfig', lockee.kubeconfig, 'exec', '-i', 'web', '--', 'sh', '-c', `echo $$; while read l; do echo "$l" >> ${file}; echo "wrote $l"; done`], {
      env: { PATH: process.env.PATH ?? '', HOME: dir },
    });
    children.push(exec);
    let out = '';
    exec.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    exec.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    exec.stdin!.on('error', () => undefined);
    await waitUntil(`the exec to start (${out})`, () => /^\d+\n/.test(out) || exec.exitCode !== null, 30_000);
    const pid = Number(/^(\d+)\n/.exec(out)![1]);
    exec.stdin!.write('before\n');
    await waitUntil(`the line before the lock written (${out})`, () => out.includes('wrote before'), 20_000);
    await waitUntil('the exec\'s stream routed end to end', () => routedLines().length > routed);
    expect(last('/pods/web/exec')).toMatchObject({ code: 200, user: { name: 'alice-k8s' } });

    const routedAtLock = routedLines().length;
    const lock = await gwctl(['lock', '--user', 'alice', '--message', 'kube incident']);
    expect(lock.status, lock.stderr).toBe(0);
    try {
      // kubectl's stream is cut: it exits non-zero, and the command in the pod went with it.
      await waitUntil(`kubectl exec to end after the lock (${out})`, () => exec.exitCode !== null || exec.signalCode !== null, 30_000);
      expect(exec.exitCode ?? 0, out).toBeGreaterThan(0);
      await waitUntil('the agent or the Proxy to log the stream closed by the lock', () =>
        agent.logs().includes('end-to-end stream closed: the user is locked') || cluster.logs().includes('end-to-end stream closed: identity revoked'), 20_000);
      await waitUntil(`exec process ${pid} gone`, () => !alive(pid), 20_000);
      // Hostile: nothing runs after the lock; the file holds what was written before it only.
      expect(await readFile(join(api.workDir, 'web', file), 'utf8')).toBe('before\n');
      // The next kubectl request is refused while locked, and nothing of it reaches the API server.
      const seen = api.seen.length;
      const refused = await kubectl(lockee.kubeconfig, ['get', 'pods']);
      expect(refused.code, refused.stderr).not.toBe(0);
      expect(refused.stderr).toMatch(/Error from server \(Forbidden\): GW_ERR_ACCESS_LOCKED: user "alice" is locked .*kube incident/);
      expect(api.seen.length).toBe(seen);
    } finally {
      // Whatever failed above, what follows runs with alice unlocked.
      expect((await gwctl(['unlock', '--user', 'alice'])).status).toBe(0);
    }
    const after = await kubectl(lockee.kubeconfig, ['get', 'pods']);
    expect(after.stderr).toBe('');
    expect(after.stdout).toMatch(/^web\s+1\/1\s+Running/m);
    expect(last('/pods')).toMatchObject({ code: 200, user: { name: 'alice-k8s' } });

    // Audit: that stream's kube.session.end is recorded, by the Proxy (the revocation as its error) and by the agent
    // (each grant routed for the exec before the lock, its end with the grant id).
    const grants = routedLines().slice(routed, routedAtLock).map((l) => (JSON.parse(l) as { grant: string }).grant);
    await waitUntil('the ends of the exec\'s streams recorded at both ends', async () => {
      const ends = (await kubeEvents()).filter((e) => e.event === 'kube.session.end');
      return ends.some((e) => e.grant === undefined && /identity revoked/.test(String(e.error))) && grants.every((g) => ends.some((e) => e.grant === g));
    }, 30_000);
    lockee.child.kill();
  }, 120_000);
});
