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
import * as nodePty from 'node-pty';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { startKubeApiServer, type Binding, type KubeApiServer } from './kubeapiserver.js';
import { startEchoServer, type EchoServer } from './servers.js';
import { waitUntil } from './wait.js';

const KUBECTL = fileURLToPath(new URL('../../.cache/kubetools/kubectl', import.meta.url));

/** The agent's service account may impersonate alice and bob and the group viewers; alice may read pods and exec. */
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
  { groups: ['viewers'], namespace: 'default', rules: [{ verbs: ['list'], apiGroups: [''], resources: ['pods'] }] },
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
