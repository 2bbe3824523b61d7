/**
 * The stand-in Kubernetes API server (test/helpers/kubeapiserver.ts) driven by the real kubectl 1.33 directly,
 * no gateway in between: it must refuse what a real API server refuses (no or a wrong credential, impersonation
 * RBAC does not allow, an exec or a port-forward or a log the impersonated user may not have, oversized input)
 * with the real server's statuses and messages (kubectl prints them), and serve what kubectl needs for `get`,
 * `exec` (-i, -it, exit codes) over WebSocket and SPDY, `port-forward` over SPDY-in-WebSocket and SPDY, and
 * `logs -f`. What the stand-in is not (no etcd, a handful of resources, RBAC passed by the test) is said at the
 * top of the helper. kubectl comes from scripts/install-kubetools.sh (.cache/kubetools/).
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import transport from 'spdy-transport';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { kubectlPty } from './kubectlpty.js';
import { startKubeApiServer, type Binding, type KubeApiServer } from './kubeapiserver.js';
import { startEchoServer, type EchoServer } from './servers.js';
import { waitUntil } from './wait.js';

const KUBECTL = fileURLToPath(new URL('../../.cache/kubetools/kubectl', import.meta.url));

/**
 * The agent's service account may impersonate alice, bob, carol and the group viewers; alice may read pods, their
 * logs, exec and port-forward; viewers may read pods only; carol has `get` but not `create` on pods/exec.
 */
const BINDINGS: Binding[] = [
  { users: ['admin'], rules: [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'] }] },
  { users: ['system:serviceaccount:gw:agent'], rules: [
    { verbs: ['impersonate'], apiGroups: [''], resources: ['users'], resourceNames: ['alice', 'bob', 'carol'] },
    { verbs: ['impersonate'], apiGroups: [''], resources: ['groups'], resourceNames: ['viewers'] },
  ] },
  { users: ['alice'], namespace: 'default', rules: [
    { verbs: ['get', 'list'], apiGroups: [''], resources: ['pods', 'pods/log'] },
    { verbs: ['create', 'get'], apiGroups: [''], resources: ['pods/exec', 'pods/portforward'] },
  ] },
  { groups: ['viewers'], namespace: 'default', rules: [{ verbs: ['get', 'list'], apiGroups: [''], resources: ['pods'] }] },
  // carol may `get` pods/exec (a WebSocket's GET) but not `create` it.
  { users: ['carol'], namespace: 'default', rules: [{ verbs: ['get'], apiGroups: [''], resources: ['pods', 'pods/exec'] }] },
];

let api: KubeApiServer;
let echo: EchoServer;
let home: string;
let admin: string;
let agent: string;
let wrong: string;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function kubectl(kubeconfig: string, args: string[], opts: { input?: string; env?: Record<string, string> } = {}): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(KUBECTL, ['--kubeconfig', kubeconfig, ...args], { env: { PATH: process.env.PATH ?? '', HOME: home, ...opts.env }, timeout: 30_000 });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.stdin.on('error', () => undefined);
    child.stdin.end(opts.input ?? '');
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** A raw HTTPS request to the stand-in (for what kubectl will not send). */
function request(path: string, opts: { headers?: Record<string, string>; method?: string; body?: Buffer } = {}): Promise<{ status: number; json: Record<string, unknown> | undefined }> {
  return new Promise((resolve, reject) => {
    const req = https.request(`${api.url}${path}`, { ca: api.caPem, method: opts.method ?? 'GET', headers: opts.headers }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, json: body.startsWith('{') ? (JSON.parse(body) as Record<string, unknown>) : undefined }));
    });
    req.on('error', reject);
    req.end(opts.body);
  });
}

const AGENT = { authorization: 'Bearer agent-token' };

beforeAll(async () => {
  if (!existsSync(KUBECTL)) throw new Error(`${KUBECTL} is missing: run scripts/install-kubetools.sh (scripts/install-test-deps.sh runs it)`);
  home = await mkdtemp(join(tmpdir(), 'gw-kubectl-home-'));
  echo = await startEchoServer();
  api = await startKubeApiServer({
    tokens: { 'admin-token': { user: 'admin' }, 'agent-token': { user: 'system:serviceaccount:gw:agent', groups: ['system:serviceaccounts'] } },
    bindings: BINDINGS,
    pods: [{ name: 'web', ports: { 80: echo.port } }, { name: 'db' }],
    streamWaitMs: 2_000,
    idleMs: 5_000,
    headersTimeoutMs: 2_000,
  });
  admin = await api.kubeconfig({ token: 'admin-token' }, 'admin');
  agent = await api.kubeconfig({ token: 'agent-token' }, 'agent');
  wrong = await api.kubeconfig({ token: 'not-a-token' }, 'wrong');
}, 60_000);

afterAll(async () => {
  await api?.close();
  await echo?.close();
  if (home) await rm(home, { recursive: true, force: true });
});

describe('authentication', () => {
  it('no credential and a wrong token get 401 with the Status the real server sends; kubectl says so', async () => {
    const none = await request('/api/v1/namespaces/default/pods');
    expect(none).toEqual({ status: 401, json: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'Unauthorized', reason: 'Unauthorized', code: 401 } });
    expect((await request('/api', { headers: { authorization: 'Bearer nope' } })).status).toBe(401);
    const r = await kubectl(wrong, ['get', 'pods']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('error: You must be logged in to the server (the server has asked for the client to provide credentials)');
  });

  it('a client certificate from the CA is the user CN in the groups O; one from another CA is refused', async () => {
    const cert = await api.clientCert('dave', ['viewers']);
    const kc = await api.kubeconfig({ cert }, 'dave');
    const r = await kubectl(kc, ['get', 'pods', '-o', 'name']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('pod/web\npod/db\n');
    expect(api.seen.at(-1)).toMatchObject({ user: { name: 'dave', groups: ['viewers', 'system:authenticated'] }, code: 200 });
    const { makeTestPki } = await import('./tls.js');
    const other = await makeTestPki();
    try {
      const foreign = await other.clientCert({ cn: 'admin' });
      expect((await kubectl(await api.kubeconfig({ cert: foreign }, 'foreign'), ['get', 'pods'])).stderr).toContain('You must be logged in to the server');
    } finally {
      await other.cleanup();
    }
  });

  it('listens where the test says, with a certificate for the names it adds (and a PKI it shares)', async () => {
    const other = await startKubeApiServer({ pki: api.pki, host: '127.0.0.7', serverNames: ['k8s-api.gw.test'], tokens: { t: { user: 'admin' } } });
    try {
      expect(other.url).toMatch(/^https:\/\/127\.0\.0\.7:\d+$/);
      const status = await new Promise<number>((resolve, reject) => {
        https.get(`${other.url}/version`, { ca: other.caPem, servername: 'k8s-api.gw.test', headers: { authorization: 'Bearer t' } }, (res) => { res.resume(); resolve(res.statusCode ?? 0); }).on('error', reject);
      });
      expect(status).toBe(200);
    } finally {
      await other.close();
    }
    expect(existsSync(api.pki.caCertPath)).toBe(true); // a shared PKI is the caller's to clean up
  });
});

describe('impersonation against RBAC', () => {
  it('the agent impersonating alice is authorized as alice', async () => {
    const r = await kubectl(agent, ['--as', 'alice', 'get', 'pods']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE\nweb\s+1\/1\s+Running\s+0\s+1d\ndb\s+/);
    expect(api.seen.at(-1)).toMatchObject({ user: { name: 'alice', groups: ['system:authenticated'] }, impersonatedBy: { name: 'system:serviceaccount:gw:agent' } });
  });

  it('a user the rules do not name is refused with the real message, before anything else', async () => {
    const r = await kubectl(agent, ['--as', 'mallory', 'get', 'pods']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe('Error from server (Forbidden): users "mallory" is forbidden: User "system:serviceaccount:gw:agent" cannot impersonate resource "users" in API group "" at the cluster scope');
  });

  it('each group is checked: viewers is allowed, admins is not', async () => {
    const ok = await kubectl(agent, ['--as', 'bob', '--as-group', 'viewers', 'get', 'pods', '-o', 'name']);
    expect(ok.stderr).toBe('');
    expect(api.seen.at(-1)).toMatchObject({ user: { name: 'bob', groups: ['viewers', 'system:authenticated'] } });
    const no = await kubectl(agent, ['--as', 'bob', '--as-group', 'viewers', '--as-group', 'admins', 'get', 'pods']);
    expect(no.stderr.trim()).toBe('Error from server (Forbidden): groups "admins" is forbidden: User "system:serviceaccount:gw:agent" cannot impersonate resource "groups" in API group "" at the cluster scope');
  });

  it('the impersonated user is then authorized on its own: bob without viewers may not list pods', async () => {
    const r = await kubectl(agent, ['--as', 'bob', 'get', 'pods']);
    expect(r.stderr.trim()).toBe('Error from server (Forbidden): pods is forbidden: User "bob" cannot list resource "pods" in API group "" in the namespace "default"');
  });

  it('a uid, an extra and a service account are checked as their own resources; groups without a user are refused', async () => {
    const uid = await request('/api', { headers: { ...AGENT, 'Impersonate-User': 'alice', 'Impersonate-Uid': '1234' } });
    expect(uid.status).toBe(403);
    expect(uid.json?.message).toBe('uids.authentication.k8s.io "1234" is forbidden: User "system:serviceaccount:gw:agent" cannot impersonate resource "uids" in API group "authentication.k8s.io" at the cluster scope');
    const extra = await request('/api', { headers: { ...AGENT, 'Impersonate-User': 'alice', 'Impersonate-Extra-Scopes': 'view' } });
    expect(extra.json?.message).toBe('userextras.authentication.k8s.io "view" is forbidden: User "system:serviceaccount:gw:agent" cannot impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the cluster scope');
    const badKey = await request('/api', { headers: { ...AGENT, 'Impersonate-User': 'alice', 'Impersonate-Extra-%zz': 'x' } });
    expect(badKey.json?.message).toContain('cannot impersonate resource "userextras/%zz"'); // kept as sent, as the real filter does
    const sa = await request('/api', { headers: { ...AGENT, 'Impersonate-User': 'system:serviceaccount:kube-system:admin' } });
    expect(sa.json?.message).toBe('serviceaccounts "admin" is forbidden: User "system:serviceaccount:gw:agent" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "kube-system"');
    const lone = await request('/api', { headers: { ...AGENT, 'Impersonate-Group': 'viewers' } });
    expect(lone.status).toBe(500);
    expect(String(lone.json?.message)).toContain('without impersonating a user');
  });

  it('setBindings replaces the rules: without the agent binding alice is no longer reachable', async () => {
    api.setBindings(BINDINGS.filter((b) => !(b.users ?? []).includes('system:serviceaccount:gw:agent')));
    try {
      expect((await kubectl(agent, ['--as', 'alice', 'get', 'pods'])).stderr).toContain('users "alice" is forbidden');
    } finally {
      api.setBindings(BINDINGS);
    }
  });
});


const TRANSPORTS: Array<[string, Record<string, string>, string]> = [
  ['WebSocket (v5.channel.k8s.io)', {}, 'GET'],
  ['SPDY/3.1', { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'false' }, 'POST'],
];

describe.each(TRANSPORTS)('kubectl exec over %s', (_name, env, method) => {
  it('runs the command: stdout and stderr apart, the exit code carried back', async () => {
    const r = await kubectl(agent, ['--as', 'alice', 'exec', 'web', '--', 'sh', '-c', 'echo out; echo err >&2; exit 3'], { env });
    expect(r.stdout).toBe('out\n');
    expect(r.stderr).toBe('err\ncommand terminated with exit code 3\n');
    expect(r.code).toBe(3);
    expect(api.seen.at(-1)).toMatchObject({ method, path: '/api/v1/namespaces/default/pods/web/exec', user: { name: 'alice' }, code: 200 });
  });

  it('-i: stdin reaches the process and its end ends it (cat echoes and exits 0)', async () => {
    const r = await kubectl(agent, ['--as', 'alice', 'exec', '-i', 'web', '--', 'cat'], { env, input: 'hello through the stand-in\n' });
    expect(r).toEqual({ code: 0, stdout: 'hello through the stand-in\n', stderr: '' });
  });

  it('-it: a real terminal (tty says so), typed input read by the shell, the exit code of the shell', async () => {
    // stty size after the typed line: kubectl sends its terminal's size when the session opens, on the same
    // connection before anything typed, so by then the size has reached the terminal (before, it may not have).
    const r = await kubectlPty(['--as', 'alice', 'exec', '-it', 'web', '--', 'sh', '-c', 'tty; read x; echo "got $x"; stty size; exit 5'], { kubectl: KUBECTL, kubeconfig: agent, home, env, typed: 'typed\r', until: /\/dev\/pts\/\d+\r?\n/ });
    expect(r.output).toMatch(/\/dev\/pts\/\d+/);
    expect(r.output).toContain('30 100'); // rows cols of kubectl's own pty
    expect(r.output).toContain('got typed');
    expect(r.code).toBe(5);
  });

  it('kubectl killed mid-command: the process goes too', async () => {
    const child = spawn(KUBECTL, ['--kubeconfig', admin, 'exec', 'web', '--', 'sh', '-c', 'echo $$; exec sleep 600'], { env: { PATH: process.env.PATH ?? '', HOME: home, ...env } });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await waitUntil('the pid printed', () => /^\d+\n/.test(out), 20_000);
    const pid = Number(out.trim());
    child.kill('SIGKILL');
    await waitUntil(`exec process ${pid} gone`, () => { try { process.kill(pid, 0); return false; } catch { return true; } }, 20_000);
  });

  it('a command that cannot start is the runtime error, exit 1', async () => {
    const r = await kubectl(admin, ['exec', 'web', '--', 'no-such-command-here'], { env });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('error: Internal error occurred: error executing command in container: failed to exec in container: exec: "no-such-command-here"');
  });

  it('an impersonated user without pods/exec create is refused (403, the real message), nothing runs', async () => {
    const r = await kubectl(agent, ['--as', 'bob', '--as-group', 'viewers', 'exec', 'web', '--', 'touch', 'ran'], { env });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('Error from server (Forbidden): pods "web" is forbidden: User "bob" cannot create resource "pods/exec" in API group "" in the namespace "default"');
    expect(existsSync(join(api.workDir, 'web', 'ran'))).toBe(false);
  });
});

describe('exec verbs', () => {
  it("`get` on pods/exec is not enough for a WebSocket's GET: create is required too (as 1.35 requires)", async () => {
    const r = await kubectl(agent, ['--as', 'carol', 'exec', 'web', '--', 'true']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('Error from server (Forbidden): pods "web" is forbidden: User "carol" cannot create resource "pods/exec" in API group "" in the namespace "default"');
  });
});

/** kubectl port-forward until it says it forwards; returns the local port and a stop function. */
async function portForward(kubeconfig: string, target: string, env: Record<string, string>): Promise<{ port: number; stop: () => void; output: () => string }> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((r) => server.close(() => r()));
  const child = spawn(KUBECTL, ['--kubeconfig', kubeconfig, '--as', 'alice', 'port-forward', '--address', '127.0.0.1', `pod/${target}`, `${port}:80`], { env: { PATH: process.env.PATH ?? '', HOME: home, ...env } });
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  await waitUntil(`kubectl port-forward listening (${output})`, () => output.includes('Forwarding from'), 20_000);
  return { port, stop: () => child.kill(), output: () => output };
}

function roundTrip(port: number, bytes: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const s = net.connect(port, '127.0.0.1', () => s.end(bytes));
    s.on('data', (d: Buffer) => chunks.push(d));
    s.on('end', () => resolve(Buffer.concat(chunks)));
    s.on('error', reject);
  });
}

describe.each([
  ['SPDY in a WebSocket (SPDY/3.1+portforward.k8s.io)', {}, 'GET'],
  ['plain SPDY/3.1', { KUBECTL_PORT_FORWARD_WEBSOCKETS: 'false' }, 'POST'],
] as Array<[string, Record<string, string>, string]>)('kubectl port-forward over %s', (_name, env, method) => {
  it("carries bytes to the pod's port and back, one stream pair per connection", async () => {
    const pf = await portForward(agent, 'web', env);
    try {
      const big = Buffer.alloc(256 * 1024, 7);
      expect((await roundTrip(pf.port, Buffer.from('ping\n'))).toString()).toBe('ping\n');
      expect((await roundTrip(pf.port, big)).equals(big)).toBe(true);
      expect(api.seen.filter((s) => s.path.endsWith('/portforward')).at(-1)).toMatchObject({ method, user: { name: 'alice' }, code: 200 });
    } finally {
      pf.stop();
    }
  });

  it('a port nothing listens on: the error stream says so and kubectl prints it', async () => {
    const pf = await portForward(agent, 'db', env);
    try {
      await roundTrip(pf.port, Buffer.from('x')).catch(() => Buffer.alloc(0));
      await waitUntil('kubectl printed the error stream', () => pf.output().includes('error forwarding port 80 to pod db'), 20_000);
    } finally {
      pf.stop();
    }
  });
});

describe('kubectl logs -f', () => {
  it('streams lines until kubectl goes', async () => {
    const child = spawn(KUBECTL, ['--kubeconfig', agent, '--as', 'alice', 'logs', '-f', 'web'], { env: { PATH: process.env.PATH ?? '', HOME: home } });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await waitUntil('three log lines', () => out.split('\n').length > 3, 20_000);
    expect(api.openLogStreams()).toBe(1);
    child.kill();
    expect(out).toMatch(/^web\/main line 1\nweb\/main line 2\nweb\/main line 3\n/);
    await waitUntil('the stream stopped writing once kubectl went', () => api.openLogStreams() === 0, 20_000);
    expect(api.seen.filter((s) => s.path.endsWith('/log')).at(-1)).toMatchObject({ user: { name: 'alice' }, code: 200 });
  });

  it('pods/log needs its own verb: viewers may read pods but not their logs', async () => {
    const r = await kubectl(agent, ['--as', 'bob', '--as-group', 'viewers', 'logs', '-f', 'web']);
    expect(r.code).toBe(1);
    expect(r.stderr.trim()).toBe('Error from server (Forbidden): pods "web" is forbidden: User "bob" cannot get resource "pods/log" in API group "" in the namespace "default"');
  });
});

describe('hostile clients', () => {
  const execPath = (cmd: string[]) => `/api/v1/namespaces/default/pods/web/exec?${cmd.map((c) => `command=${encodeURIComponent(c)}`).join('&')}&stdin=true&stdout=true&stderr=true`;
  const wsExec = (cmd: string[], protocol = 'v5.channel.k8s.io') =>
    new WebSocket(`wss://127.0.0.1:${api.port}${execPath(cmd)}`, [protocol], { ca: api.caPem, headers: { authorization: 'Bearer admin-token' } });

  it('headers that never end (a slow client) get 408 at the deadline, the connection closed', async () => {
    const s = tls.connect({ host: '127.0.0.1', port: api.port, ca: api.caPem, servername: 'localhost' }, () => s.write('GET /api HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n'));
    let answer = '';
    s.on('data', (d: Buffer) => (answer += d.toString()));
    await new Promise<void>((resolve) => s.on('close', () => resolve()));
    expect(answer).toMatch(/^HTTP\/1.1 408 /);
  });

  it('a header over the cap gets 431, a body over 3 MiB gets 413 (after authentication: without it, 401)', async () => {
    const huge = await request('/api', { headers: { authorization: 'Bearer admin-token', 'x-pad': 'a'.repeat(64 * 1024) } });
    expect(huge.status).toBe(431);
    const body = Buffer.alloc(4 * 1024 * 1024, 0x7b);
    const big = await request('/api/v1/namespaces/default/pods', { method: 'POST', headers: { authorization: 'Bearer admin-token', 'content-type': 'application/json' }, body });
    expect(big).toEqual({ status: 413, json: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'the server has received too large of a request body', reason: 'RequestEntityTooLarge', code: 413 } });
    expect((await request('/api/v1/namespaces/default/pods', { method: 'POST', body })).status).toBe(401);
    expect((await kubectl(admin, ['get', 'pods', '-o', 'name'])).stdout).toBe('pod/web\npod/db\n');
  });

  it('a WebSocket message over 1 MiB closes the exec (1009) and kills its process; a client that goes kills it too', async () => {
    const ws = wsExec(['sh', '-c', 'echo $$; exec sleep 600']);
    const pid = await new Promise<number>((resolve, reject) => {
      ws.on('message', (d: Buffer) => { if (d[0] === 1) resolve(Number(d.subarray(1).toString().trim())); });
      ws.on('error', reject);
    });
    const closed = new Promise<number>((resolve) => ws.on('close', (code) => resolve(code)));
    ws.send(Buffer.concat([Buffer.from([0]), Buffer.alloc(2 * 1024 * 1024)]));
    expect(await closed).toBe(1009); // "message too big"
    await waitUntil(`exec process ${pid} gone`, () => { try { process.kill(pid, 0); return false; } catch { return true; } }, 20_000);
  });

  it('a WebSocket without a channel protocol the server speaks is refused before anything runs', async () => {
    const ws = wsExec(['touch', 'ran-ws'], 'base64.channel.k8s.io');
    const status = await new Promise<number>((resolve) => ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0)));
    expect(status).toBe(400);
    expect(existsSync(join(api.workDir, 'web', 'ran-ws'))).toBe(false);
  });

  function spdyUpgrade(path: string, protocol: string): Promise<tls.TLSSocket> {
    return new Promise((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: api.port, ca: api.caPem, servername: 'localhost' }, () => {
        s.write(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer admin-token\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${protocol}\r\nContent-Length: 0\r\n\r\n`);
      });
      let head = '';
      const onData = (d: Buffer) => {
        head += d.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        s.off('data', onData);
        if (head.startsWith('HTTP/1.1 101')) resolve(s);
        else reject(new Error(head));
      };
      s.on('data', onData);
      s.on('error', reject);
    });
  }

  it('a SPDY exec whose streams never come is closed after the wait (2 s here, 30 s as the kubelet)', async () => {
    const s = await spdyUpgrade(execPath(['touch', 'ran-spdy']), 'v4.channel.k8s.io');
    await new Promise<void>((resolve) => s.on('close', () => resolve()));
    expect(existsSync(join(api.workDir, 'web', 'ran-spdy'))).toBe(false);
  });

  it('not SPDY after the 101 (a control frame of SPDY version 9): that connection is closed, the server goes on', async () => {
    const s = await spdyUpgrade('/api/v1/namespaces/default/pods/web/portforward', 'portforward.k8s.io');
    s.on('error', () => undefined);
    s.write(Buffer.from([0x80, 0x09, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0a, ...Buffer.alloc(10)]));
    await new Promise<void>((resolve) => s.on('close', () => resolve()));
    expect((await kubectl(admin, ['get', 'pods', '-o', 'name'])).stdout).toBe('pod/web\npod/db\n');
  });

  it('a frame announced and never finished (a slow or lying peer) is closed when the connection idles (idleMs)', async () => {
    const s = await spdyUpgrade('/api/v1/namespaces/default/pods/web/portforward', 'portforward.k8s.io');
    s.on('error', () => undefined);
    s.write(Buffer.from('GET / HTTP/1.1\r\n')); // read as a DATA frame of 2 MiB, of which 16 bytes came
    await new Promise<void>((resolve) => s.on('close', () => resolve()));
  });

  it('a port-forward data stream whose error stream never comes is reset after the wait; a whole pair then works', async () => {
    const s = await spdyUpgrade('/api/v1/namespaces/default/pods/web/portforward', 'portforward.k8s.io');
    const client = transport.connection.create(s, { protocol: 'spdy', isServer: false });
    client.on('error', () => undefined);
    client.start(3.1);
    const open = (type: string, id: string) => client.request({ method: 'POST', path: '/', headers: { streamtype: type, port: '80', requestid: id } });
    const lone = open('data', '1');
    lone.on('error', () => undefined);
    await new Promise<void>((resolve) => lone.on('close', () => resolve()));
    const error = open('error', '2');
    const data = open('data', '2');
    let echoed = '';
    error.end(); // kubectl closes its side of the error stream at once (and spdy-transport sends the stream then)
    data.on('data', (d: Buffer) => (echoed += d.toString()));
    data.write('paired\n');
    await waitUntil('the pair echoed', () => echoed === 'paired\n', 20_000);
    error.destroy();
    s.destroy();
  });

  it('a SPDY upgrade with a stream protocol the server does not speak is refused', async () => {
    await expect(spdyUpgrade(execPath(['true']), 'v1.channel.k8s.io')).rejects.toThrow(/^HTTP\/1.1 403 /);
  });

  it('exec into a container the pod does not have: 400, nothing runs', async () => {
    const r = await kubectl(admin, ['exec', 'web', '-c', 'sidecar', '--', 'touch', 'ran-c']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('container sidecar is not valid for pod web');
    expect(existsSync(join(api.workDir, 'web', 'ran-c'))).toBe(false);
  });
});
