/**
 * The agent's Kubernetes Service against an API server that checks (test/helpers/kubeapiserver.ts, the stand-in:
 * what it is not is said at its top): the agent authenticates with its kubeconfig's token as the service account
 * system:serviceaccount:gw:agent, which RBAC lets impersonate some users and groups only; each user's role gives
 * them a Kubernetes user (kubernetes_users from the user's trait). So what a user may do is decided twice, as in
 * a real cluster: the gateway's role picks whom the agent impersonates, the API server's RBAC decides whether the
 * agent may impersonate them and what they may then do. Requests go through the Proxy's kube route with the
 * user's certificate, as plain HTTPS (curl) and as the real kubectl (a kubeconfig pointing at the Proxy, the
 * route's SNI as tls-server-name).
 *
 * Then the whole path a user takes: `gwsh login`, `gwsh kube login dev` writing $KUBECONFIG in a temp dir, and the
 * real kubectl with that file: get, exec -i and -it (WebSocket v5 and SPDY), port-forward (SPDY tunnelled in a
 * WebSocket, and plain SPDY) to a TCP server this test runs, logs -f.
 *
 * What is NOT the real API server (from test/helpers/kubeapiserver.ts): no etcd (writes answer 405), no scheduler,
 * no kubelet or container runtime (exec runs the command on this machine in a temp directory), a handful of
 * resources (pods and their exec / log / portforward), no aggregated discovery, OpenAPI, watch or admission, RBAC
 * rules passed by the test rather than read from Role and Binding objects, no anonymous user.
 */
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import * as nodePty from 'node-pty';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { curl } from '../helpers/curl.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startKubeApiServer, type KubeApiServer } from '../helpers/kubeapiserver.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { waitUntil } from '../helpers/wait.js';

const KUBECTL = fileURLToPath(new URL('../../.cache/kubetools/kubectl', import.meta.url));
const PROXY_NAME = 'proxy.gw.test';
const KUBE_HOST = `kube-gateway-proxy-alpn.${PROXY_NAME}`;
const PASSWORD = 'correct horse battery';
/** The Kubernetes user each gateway user's trait names. */
const USERS: Record<string, string> = { alice: 'alice-k8s', erin: 'erin-k8s', mallory: 'root-k8s' };
/** A user of the same role whose trait names no Kubernetes user or group: the role allows no impersonation. */
const NOKUBE = 'nora';

let dir: string;
let squid: Squid;
let api: KubeApiServer;
let cluster: RunningGateway;
let agent: RunningGateway;
let webPort: number;
/** The pod's port 80 (port-forward's target): an echo server this test runs. */
let echo: net.Server;

const home = (user: string) => join(dir, user);
const userCert = (user: string) => ['--cert', join(home(user), 'cert.pem'), '--key', join(home(user), 'key.pem'), '--cacert', join(home(user), 'host-ca.pem')];
const viaProxy = (user: string, path: string, cluster = 'dev') =>
  curl([...userCert(user), '--resolve', `${KUBE_HOST}:${webPort}:127.0.0.1`, `https://${KUBE_HOST}:${webPort}/k8s/${cluster}${path}`]);
const SA = { user: 'system:serviceaccount:gw:agent', groups: ['system:serviceaccounts', 'system:serviceaccounts:gw'] };

beforeAll(async () => {
  if (!existsSync(KUBECTL)) throw new Error(`${KUBECTL} is missing: run scripts/install-kubetools.sh (scripts/install-test-deps.sh runs it)`);
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-kube-standin-'));
  await chmod(dir, 0o755);
  // The agent dials the public address the cluster announces: only squid knows that name (as in apps-kube.test.ts).
  await writeFile(join(dir, 'hosts'), `127.0.0.1 ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
  api = await startKubeApiServer({
    pods: [{ name: 'web', ports: { 80: (echo.address() as net.AddressInfo).port } }, { name: 'db' }],
    tokens: { 'agent-sa-token': SA, 'projected-token-1': SA },
    bindings: [
      // The chart's ClusterRole, narrowed to named users so that the test shows the API server's refusal too.
      { users: ['system:serviceaccount:gw:agent'], rules: [
        { verbs: ['impersonate'], apiGroups: [''], resources: ['users'], resourceNames: ['alice-k8s', 'erin-k8s'] },
        { verbs: ['impersonate'], apiGroups: [''], resources: ['groups'], resourceNames: ['devs'] },
      ] },
      { users: ['alice-k8s'], namespace: 'default', rules: [
        { verbs: ['get', 'list'], apiGroups: [''], resources: ['pods', 'pods/log'] },
        { verbs: ['get', 'create'], apiGroups: [''], resources: ['pods/exec', 'pods/portforward'] },
      ] },
      // erin may read one pod (kubectl exec does first), not list them, and not exec.
      { users: ['erin-k8s'], namespace: 'default', rules: [{ verbs: ['get'], apiGroups: [''], resources: ['pods'] }] },
    ],
  });
  webPort = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: kube.example',
      '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n'),
  );
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  await writeFile(join(dir, 'role.yaml'), ['kind: role', 'version: v7', 'metadata: {name: k8s-dev}', 'spec:', '  allow:', '    kubernetes_labels: {env: dev}',
    "    kubernetes_users: ['{{internal.kubernetes_users}}']", "    kubernetes_groups: ['{{internal.kubernetes_groups}}']", ''].join('\n'));
  expect((await admin(['create', join(dir, 'role.yaml')])).status).toBe(0);
  for (const [user, k8sUser] of Object.entries(USERS)) {
    expect((await admin(['users', 'add', user, '--roles=k8s-dev', `--kubernetes-users=${k8sUser}`, '--kubernetes-groups=devs'], `${PASSWORD}\n`)).status).toBe(0);
  }
  expect((await admin(['users', 'add', NOKUBE, '--roles=k8s-dev'], `${PASSWORD}\n`)).status).toBe(0);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=kube', '--format', 'json'])).stdout) as { token: string }).token;
  const caFile = join(dir, 'k8s-ca.pem');
  await writeFile(caFile, api.caPem);
  const kubeconfig = await api.kubeconfig({ token: 'agent-sa-token' }, 'agent');
  // A second cluster entry reaches the same API server as a pod does: the projected token, ca.crt and namespace.
  const saDir = join(dir, 'serviceaccount');
  await mkdir(saDir);
  await writeFile(join(saDir, 'token'), 'projected-token-1');
  await writeFile(join(saDir, 'ca.crt'), api.caPem);
  await writeFile(join(saDir, 'namespace'), 'gw');
  agent = await startGateway(
    ['gateway:', '  nodename: agent-kube', '  data_dir: DATA_DIR', '  log: { format: json }', 'kube_service:', '  enabled: yes', '  clusters:',
      `    - { name: dev, api_server: "${api.url}", ca_file: ${caFile}, credentials: kubeconfig, kubeconfig: ${kubeconfig}, labels: {env: dev} }`,
      `    - { name: pod, api_server: "${api.url}", credentials: in_cluster, service_account_dir: ${saDir}, labels: {env: dev} }`, ''].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${webPort}`], env: { HTTPS_PROXY: squid.url } },
  );
  await agent.waitForLog('reverse tunnel ready').catch((err: Error) => { throw new Error(`${err.message}\n${agent.logs()}`); });
  for (const user of [...Object.keys(USERS), NOKUBE]) {
    const login = await runCli('gwsh', ['login', `--proxy=127.0.0.1:${webPort}`, `--user=${user}`, `--ca-pin=${pin}`], { env: { HOME: dir, GWSH_HOME: home(user) }, input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
  }
}, 120_000);

afterAll(async () => {
  await agent?.stop();
  await cluster?.stop();
  await api?.close();
  await squid?.stop();
  await new Promise((r) => (echo ? echo.close(r) : r(undefined)));
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("a role's kubernetes_users reach the API server's RBAC decision", () => {
  it('alice-k8s may list pods: the API server saw the agent impersonating her, in the group the role gives', async () => {
    const r = await viaProxy('alice', '/api/v1/namespaces/default/pods');
    expect(r.stderr).toBe('');
    expect((JSON.parse(r.stdout) as { items: Array<{ metadata: { name: string } }> }).items.map((p) => p.metadata.name)).toEqual(['web', 'db']);
    expect(api.seen.at(-1)).toMatchObject({
      path: '/api/v1/namespaces/default/pods', code: 200,
      user: { name: 'alice-k8s', groups: ['devs', 'system:authenticated'] },
      impersonatedBy: { name: 'system:serviceaccount:gw:agent' },
    });
  });

  it('erin-k8s may be impersonated but may not list pods: the API server refuses as erin-k8s (403 passed back)', async () => {
    const r = await viaProxy('erin', '/api/v1/namespaces/default/pods');
    expect(JSON.parse(r.stdout)).toMatchObject({ kind: 'Status', code: 403, message: 'pods is forbidden: User "erin-k8s" cannot list resource "pods" in API group "" in the namespace "default"' });
  });

  it('root-k8s is named by the role but not allowed to the agent by RBAC: the impersonation itself is refused', async () => {
    const r = await viaProxy('mallory', '/api/v1/namespaces/default/pods');
    expect(JSON.parse(r.stdout)).toMatchObject({ code: 403, message: 'users "root-k8s" is forbidden: User "system:serviceaccount:gw:agent" cannot impersonate resource "users" in API group "" at the cluster scope' });
  });

  it("in_cluster: the projected token rotated by the kubelet (the old one refused from then on) is read again", async () => {
    const pods = async () => JSON.parse((await viaProxy('alice', '/api/v1/namespaces/default/pods', 'pod')).stdout) as { kind: string; code?: number };
    expect(await pods()).toMatchObject({ kind: 'PodList' });
    expect(api.seen.at(-1)).toMatchObject({ user: { name: 'alice-k8s' }, impersonatedBy: { name: 'system:serviceaccount:gw:agent' } });
    // The kubelet writes the new token by a rename (an atomic swap), and the API server stops taking the old one.
    await writeFile(join(dir, 'serviceaccount', 'token.new'), 'projected-token-2');
    await rename(join(dir, 'serviceaccount', 'token.new'), join(dir, 'serviceaccount', 'token'));
    api.setTokens({ 'agent-sa-token': SA, 'projected-token-2': SA });
    const old = await curl(['--cacert', join(dir, 'k8s-ca.pem'), '-H', 'Authorization: Bearer projected-token-1', '-w', '%{http_code}', '-o', '/dev/null', `${api.url}/api`]);
    expect(old.stdout).toBe('401'); // an agent that kept the old token would get this
    expect(await pods()).toMatchObject({ kind: 'PodList' });
    expect(api.seen.at(-1)).toMatchObject({ code: 200, impersonatedBy: { name: 'system:serviceaccount:gw:agent' } });
  });

  // A kubeconfig written by hand (not by gwsh): Go's crypto/x509 parses the gateway's certificates since the
  // identity extension's OID fits Go's arcs (docs/pki.md); before, kubectl refused them ("malformed extension OID").
  it('the real kubectl through the Proxy (its route by SNI): alice gets her pods, erin the refusal', async () => {
    for (const [user, expected] of [['alice', /^web\s+1\/1\s+Running/m], ['erin', /Error from server \(Forbidden\): pods is forbidden: User "erin-k8s" cannot list/]] as const) {
      const kubeconfig = join(home(user), 'kubeconfig');
      await writeFile(kubeconfig, [
        'apiVersion: v1', 'kind: Config', 'clusters:', '- name: gw', '  cluster:', `    server: https://127.0.0.1:${webPort}/k8s/dev`, `    tls-server-name: ${KUBE_HOST}`,
        `    certificate-authority: ${join(home(user), 'host-ca.pem')}`, 'users:', `- name: ${user}`, '  user:', `    client-certificate: ${join(home(user), 'cert.pem')}`,
        `    client-key: ${join(home(user), 'key.pem')}`, 'contexts:', '- name: gw', '  context: {cluster: gw, user: ' + user + ', namespace: default}', 'current-context: gw', '',
      ].join('\n'), { mode: 0o600 });
      const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
        const child = spawn(KUBECTL, ['--kubeconfig', kubeconfig, 'get', 'pods'], { env: { PATH: process.env.PATH ?? '', HOME: home(user) }, timeout: 30_000 });
        let out = '';
        child.stdout.on('data', (d: Buffer) => (out += d.toString()));
        child.stderr.on('data', (d: Buffer) => (out += d.toString()));
        child.on('close', (code) => resolve({ code, out }));
      });
      expect(r.out, user).toMatch(expected);
      expect(r.code, r.out).toBe(user === 'alice' ? 0 : 1);
    }
  });
});

/**
 * The user's own path: `gwsh kube login dev` writes $KUBECONFIG (a temp file per user), then the real kubectl
 * with nothing else: the Proxy's kube route (SNI from the kubeconfig's tls-server-name), the tunnel, the agent's
 * credentials and impersonation, the stand-in's RBAC decision. `method` in the stand-in's `seen` says which
 * transport kubectl really used: GET is a WebSocket upgrade, POST is SPDY (kubectl falls back from a refused
 * WebSocket to SPDY silently, so only this shows that the WebSocket path was taken).
 */
describe('the real kubectl through gwsh kube login', () => {
  const kubeconfigOf = (user: string) => join(home(user), 'kubeconfig.yaml');
  const envOf = (user: string, env: Record<string, string> = {}) =>
    ({ PATH: process.env.PATH ?? '', HOME: home(user), KUBECONFIG: kubeconfigOf(user), ...env });
  const kubectl = (user: string, args: string[], opts: { env?: Record<string, string>; input?: string } = {}) =>
    new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
      const child = execFile(KUBECTL, ['--request-timeout=20s', ...args], { env: envOf(user, opts.env), timeout: 60_000 }, (err, stdout, stderr) =>
        resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
      );
      child.stdin!.end(opts.input ?? '');
    });
  const last = (suffix: string) => api.seen.filter((s) => s.path.endsWith(suffix)).at(-1);

  beforeAll(async () => {
    for (const user of ['alice', 'erin', NOKUBE]) {
      const r = await runCli('gwsh', ['kube', 'login', 'dev', '-f', 'json'], { env: { HOME: home(user), GWSH_HOME: home(user), KUBECONFIG: kubeconfigOf(user) } });
      expect(r.status, r.stderr).toBe(0);
      // Logged in by IP address to a Proxy whose public address is a name: the SNI is that name's, which the
      // Proxy's certificate covers (its wildcard), not gateway.cluster.local, which it does not.
      expect(JSON.parse(r.stdout)).toMatchObject({ kubeconfig: kubeconfigOf(user), server: `https://127.0.0.1:${webPort}/k8s/dev`, tls_server_name: KUBE_HOST });
    }
  }, 60_000);

  it('kubectl get pods, get --raw and version: alice sees her pods, as herself', async () => {
    const r = await kubectl('alice', ['get', 'pods']);
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/^web\s+1\/1\s+Running/m);
    expect(last('/pods')).toMatchObject({ method: 'GET', code: 200, user: { name: 'alice-k8s' }, impersonatedBy: { name: SA.user } });
    // --raw takes the path as it is, without the server URL's own: the /k8s/<cluster> prefix is written out.
    const raw = await kubectl('alice', ['get', '--raw', '/k8s/dev/api/v1/namespaces/default/pods/db']);
    expect(raw.code, raw.stderr).toBe(0);
    expect(JSON.parse(raw.stdout)).toMatchObject({ kind: 'Pod', metadata: { name: 'db' } });
    const version = await kubectl('alice', ['version', '-o', 'json']);
    expect(version.code, version.stderr).toBe(0);
    expect((JSON.parse(version.stdout) as { serverVersion: { gitVersion: string } }).serverVersion.gitVersion).toBe('v1.33.0-standin');
  });

  describe.each([
    ['WebSocket (v5.channel.k8s.io)', {}, 'GET'],
    ['SPDY/3.1', { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'false' }, 'POST'],
  ] as Array<[string, Record<string, string>, string]>)('kubectl exec over %s', (_name, env, method) => {
    it('-i: stdin through, output back; the exit code carried', async () => {
      const r = await kubectl('alice', ['exec', '-i', 'web', '--', 'cat'], { env, input: 'typed into kubectl\n' });
      expect(r).toEqual({ code: 0, stdout: 'typed into kubectl\n', stderr: '' });
      expect(last('/pods/web/exec')).toMatchObject({ method, code: 200, user: { name: 'alice-k8s' } });
      const failing = await kubectl('alice', ['exec', 'web', '--', 'sh', '-c', 'echo out; echo err >&2; exit 3'], { env });
      expect(failing).toEqual({ code: 3, stdout: 'out\n', stderr: 'err\ncommand terminated with exit code 3\n' });
    });

    it('-it under a pseudo-terminal: a real terminal, typed input read, the shell\'s exit code', async () => {
      const r = await new Promise<{ output: string; code: number }>((resolve) => {
        // kubectl's arguments in a variable: test/test-deps.test.ts reads a spawn's first literal argument as a program.
        const execArgs = ['exec', '-it', 'web', '--', 'sh', '-c', 'tty; read x; echo "got $x"; exit 5'];
        const pty = nodePty.spawn(KUBECTL, execArgs, { cols: 100, rows: 30, env: { ...envOf('alice', env), TERM: 'xterm' } });
        let output = '';
        let typed = false;
        pty.onData((d) => {
          output += d;
          if (!typed && /\/dev\/pts\/\d+\r?\n/.test(output)) {
            typed = true;
            pty.write('typed\r');
          }
        });
        const kill = setTimeout(() => pty.kill(), 30_000);
        pty.onExit(({ exitCode }) => { clearTimeout(kill); resolve({ output, code: exitCode }); });
      });
      expect(r.output).toContain('got typed');
      expect(r.code, r.output).toBe(5);
      expect(last('/pods/web/exec')).toMatchObject({ method, code: 200 });
    });

    it("hostile: erin's Kubernetes user may not create pods/exec: kubectl gets the API server's Forbidden, nothing runs", async () => {
      const r = await kubectl('erin', ['exec', 'web', '--', 'touch', 'ran-as-erin'], { env });
      expect(r.code).toBe(1);
      expect(r.stderr).toContain('Error from server (Forbidden): pods "web" is forbidden: User "erin-k8s" cannot create resource "pods/exec" in API group "" in the namespace "default"');
      expect(existsSync(join(api.workDir, 'web', 'ran-as-erin'))).toBe(false);
    });
  });

  describe.each([
    ['SPDY in a WebSocket (SPDY/3.1+portforward.k8s.io)', {}, 'GET'],
    ['plain SPDY/3.1', { KUBECTL_PORT_FORWARD_WEBSOCKETS: 'false' }, 'POST'],
  ] as Array<[string, Record<string, string>, string]>)('kubectl port-forward over %s', (_name, env, method) => {
    it("bytes round-trip to the pod's port (the test's echo server)", async () => {
      const port = await getPort({ host: '127.0.0.1' });
      const forwardArgs = ['port-forward', '--address', '127.0.0.1', 'pod/web', `${port}:80`];
      const child = spawn(KUBECTL, forwardArgs, { env: envOf('alice', env) });
      let output = '';
      child.stdout.on('data', (d: Buffer) => (output += d.toString()));
      child.stderr.on('data', (d: Buffer) => (output += d.toString()));
      try {
        await waitUntil(`kubectl port-forward listening (${output})`, () => output.includes('Forwarding from'), 30_000);
        for (const bytes of [Buffer.from('ping\n'), Buffer.alloc(256 * 1024, 7)]) {
          const back = await new Promise<Buffer>((resolve, reject) => {
            const chunks: Buffer[] = [];
            const s = net.connect(port, '127.0.0.1', () => s.end(bytes));
            s.on('data', (d: Buffer) => chunks.push(d));
            s.on('end', () => resolve(Buffer.concat(chunks)));
            s.on('error', reject);
          });
          expect(back.equals(bytes), output).toBe(true);
        }
        expect(last('/pods/web/portforward')).toMatchObject({ method, code: 200, user: { name: 'alice-k8s' } });
      } finally {
        child.kill();
      }
    });
  });

  it('kubectl logs -f reads lines as they come, and the stream ends when kubectl goes', async () => {
    const logArgs = ['logs', '-f', 'web'];
    const child = spawn(KUBECTL, logArgs, { env: envOf('alice') });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    try {
      await waitUntil(`three log lines (${out})`, () => out.split('\n').length > 3, 30_000);
      expect(out).toMatch(/^web\/main line 1\nweb\/main line 2\nweb\/main line 3\n/);
      expect(last('/pods/web/log')).toMatchObject({ code: 200, user: { name: 'alice-k8s' } });
    } finally {
      child.kill();
    }
    await waitUntil('the log stream stopped once kubectl went', () => api.openLogStreams() === 0, 30_000);
  });

  it('hostile: a user whose role allows no Kubernetes user or group is refused by the Proxy, before the agent', async () => {
    const before = api.seen.length;
    for (const args of [['get', 'pods'], ['exec', 'web', '--', 'true']]) {
      const r = await kubectl(NOKUBE, args);
      expect(r.code).toBe(1);
      // Refused at kubectl's first request, discovery, whose errors client-go prints without the Status message.
      expect(r.stderr).toContain('Error from server (Forbidden)');
    }
    // A request kubectl decodes shows the Proxy's Kubernetes Status: the gateway's code, reason and hint.
    const raw = await kubectl(NOKUBE, ['get', '--raw', '/k8s/dev/api/v1/namespaces/default/pods']);
    expect(raw.code).toBe(1);
    expect(raw.stderr).toMatch(/^Error from server \(Forbidden\): GW_ERR_KUBE_NO_IMPERSONATION: your roles allow no Kubernetes user or group .*\(Ask an administrator/);
    expect(api.seen.length).toBe(before);
  });
});
