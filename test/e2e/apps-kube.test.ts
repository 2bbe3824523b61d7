/**
 * HTTP apps under their public address on the web port, TCP apps and desktops through gwsh, and Kubernetes by
 * SNI, all through an agent's reverse tunnel (real daemons on loopback).
 *
 * No Kubernetes API server can run here: the closest real thing is an HTTPS server with its own CA standing in
 * for it, which answers every request with the path and the headers it received (so the test sees exactly
 * what an API server would: the path after /k8s/<cluster> and the Impersonate-* headers). The agent's
 * connection to it goes through the Dialer, decided as kube.<cluster_name>.local (the seed's NO_PROXY rule 4).
 */
import { type ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startHttpsServer, startEchoServer, type EchoServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { curl } from '../helpers/curl.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { eventually } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';
const RESOURCE_IP = '127.0.0.6';
const PASSWORD = 'correct horse battery';

let dir: string;
let squid: Squid;
let pki: TestPki;
let cluster: RunningGateway;
let agent: RunningGateway;
let webPort: number;
let pin: string;
let app: http.Server;
let appPort: number;
let apiServer: HttpTestServer;
let desktop: EchoServer;
let userEnv: Record<string, string>;
let diagPort: number;
const children: ChildProcess[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-apps-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n${RESOURCE_IP} k8s-api.gw.test\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  pki = await makeTestPki();

  // The resources behind the agent.
  app = http.createServer((req, res) => {
    // /cut/chunked and /cut/sized: 64 KiB of the body, then the app's connection goes (a crash mid-answer).
    if (req.url === '/cut/chunked' || req.url === '/cut/sized') {
      res.writeHead(200, req.url === '/cut/sized' ? { 'content-length': String(1024 * 1024) } : {});
      res.write('x'.repeat(64 * 1024), () => res.socket?.destroy());
      return;
    }
    res.end(JSON.stringify({ app: 'grafana', path: req.url, user: req.headers['x-gateway-user'] }));
  });
  await new Promise<void>((r) => app.listen(0, RESOURCE_IP, r));
  appPort = (app.address() as net.AddressInfo).port;
  const apiCert = await pki.serverCert({ names: ['k8s-api.gw.test'], ips: [] });
  apiServer = await startHttpsServer({ cert: apiCert.certPem, key: apiCert.keyPem }, (req, res) => res.end(JSON.stringify({ path: req.url, headers: req.headers })), RESOURCE_IP);
  desktop = await startEchoServer(RESOURCE_IP);

  webPort = await getPort({ host: PROXY_IP });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: apps.example',
      '  listen_addr: 127.0.0.1:0',
      '  keep_alive_interval: 1s',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      `  public_addr: ${PROXY_NAME}:${webPort}`,
      '',
    ].join('\n'),
  );
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  await writeFile(
    join(dir, 'roles.yaml'),
    [
      'kind: role',
      'version: v7',
      'metadata: {name: dev-only}',
      'spec:',
      '  allow:',
      '    app_labels: {env: dev}',
      '    kubernetes_labels: {env: dev}',
      // viewers comes from alice's trait (gwctl users add --kubernetes-groups).
      "    kubernetes_groups: [dev-only, '{{internal.kubernetes_groups}}']",
      '    windows_desktop_labels: {"*": "*"}',
      '',
    ].join('\n'),
  );
  expect((await admin(['create', join(dir, 'roles.yaml')])).status).toBe(0);
  await admin(['users', 'add', 'alice', '--roles=dev-only', '--kubernetes-groups=viewers'], `${PASSWORD}\n`);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=app,kube,desktop', '--format', 'json'])).stdout) as { token: string }).token;

  diagPort = await getPort({ host: '127.0.0.1' });
  const caFile = join(dir, 'k8s-ca.pem');
  await writeFile(caFile, pki.caPem);
  agent = await startGateway(
    [
      'gateway:',
      '  nodename: agent-apps',
      '  data_dir: DATA_DIR',
      `  diag_addr: 127.0.0.1:${diagPort}`,
      '  log: { format: json }',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: grafana, uri: "http://${RESOURCE_IP}:${appPort}", public_addr: grafana.${PROXY_NAME}, labels: {env: dev} }`,
      `    - { name: prod-admin, uri: "http://${RESOURCE_IP}:${appPort}", public_addr: admin.${PROXY_NAME}, labels: {env: prod} }`,
      `    - { name: echo-tcp, uri: "tcp://${RESOURCE_IP}:${desktop.port}", labels: {env: dev} }`,
      'kube_service:',
      '  enabled: yes',
      '  clusters:',
      `    - { name: dev, api_server: "https://k8s-api.gw.test:${apiServer.port}", ca_file: ${caFile}, labels: {env: dev} }`,
      'windows_desktop_service:',
      '  enabled: yes',
      '  desktops:',
      `    - { name: win-1, addr: "${RESOURCE_IP}:${desktop.port}" }`,
      '',
    ].join('\n'),
    // The agent's only way out is squid; the Kubernetes API server's name is known only to squid as well.
    { args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`], env: { HTTPS_PROXY: squid.url } },
  );
  await agent.waitForLog('reverse tunnel ready');
  userEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice'), HTTPS_PROXY: squid.url };
  const login = await runCli('gwsh', ['login', `--proxy=${PROXY_NAME}:${webPort}`, '--user=alice', `--ca-pin=${pin}`], { env: { ...userEnv, HTTPS_PROXY: squid.url }, input: `${PASSWORD}\n` });
  expect(login.status).toBe(0);
}, 90_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGTERM');
  await agent?.stop();
  await cluster?.stop();
  await squid?.stop();
  app?.close();
  await apiServer?.close();
  await desktop?.close();
  await pki?.cleanup();
  await rm(dir, { recursive: true, force: true });
});

const userCert = () => ['--cert', join(userEnv.GWSH_HOME!, 'cert.pem'), '--key', join(userEnv.GWSH_HOME!, 'key.pem'), '--cacert', join(userEnv.GWSH_HOME!, 'host-ca.pem')];
const resolve = (name: string) => ['--resolve', `${name}:${webPort}:${PROXY_IP}`];

describe('HTTP apps on the web port', () => {
  it('gwsh apps ls lists what alice may reach, with labels and agent', async () => {
    const r = await runCli('gwsh', ['apps', 'ls', '-f', 'json'], { env: userEnv });
    const names = (JSON.parse(r.stdout) as Array<{ name: string; agent: string }>).map((a) => [a.name, a.agent]);
    expect(names).toEqual([
      ['echo-tcp', 'agent-apps'],
      ['grafana', 'agent-apps'],
    ]);
  });

  it('serves an app under its public address to a user with the right certificate and role', async () => {
    const r = await curl([...userCert(), ...resolve(`grafana.${PROXY_NAME}`), `https://grafana.${PROXY_NAME}:${webPort}/d/home?x=1`]);
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual({ app: 'grafana', path: '/d/home?x=1', user: 'alice' });
  });

  it('over HTTP/2 and HTTP/1.1 alike: no pseudo-header (:method, :path, ...) reaches the app', async () => {
    for (const flag of ['--http2', '--http1.1']) {
      const r = await curl([flag, '-w', '\n%{http_version}', ...userCert(), ...resolve(`grafana.${PROXY_NAME}`), `https://grafana.${PROXY_NAME}:${webPort}/d/h2`]);
      expect(r.stderr).toBe('');
      const [body, version] = r.stdout.split('\n');
      expect(version).toBe(flag === '--http2' ? '2' : '1.1');
      // A pseudo-header relayed to the app's HTTP/1.1 request would fail it (not a header name): 502.
      expect(JSON.parse(body!)).toEqual({ app: 'grafana', path: '/d/h2', user: 'alice' });
    }
  });

  it('HOSTILE: an app answer cut mid-body is cut at the client too (no last chunk, no short body taken as whole), over HTTP/2 and HTTP/1.1', async () => {
    for (const flag of ['--http2', '--http1.1']) {
      for (const path of ['/cut/chunked', '/cut/sized']) {
        const r = await curl([flag, ...userCert(), ...resolve(`grafana.${PROXY_NAME}`), `https://grafana.${PROXY_NAME}:${webPort}${path}`]);
        // curl: 18 a body shorter than its length, 56 a connection reset, 92 an HTTP/2 stream reset. Before, the
        // Proxy left the response open (28: curl's own deadline).
        expect([18, 56, 92], `${flag} ${path}: ${r.status} ${r.stderr}`).toContain(r.status);
        expect(r.stdout.length).toBeLessThan(1024 * 1024);
      }
    }
  });

  it('refuses without a certificate, and refuses an app her roles do not allow', async () => {
    const noCert = await curl(['--cacert', join(userEnv.GWSH_HOME!, 'host-ca.pem'), ...resolve(`grafana.${PROXY_NAME}`), `https://grafana.${PROXY_NAME}:${webPort}/`]);
    expect(JSON.parse(noCert.stdout)).toMatchObject({ error: { code: 'GW_ERR_AUTH_UNAUTHENTICATED' } });
    const prod = await curl([...userCert(), ...resolve(`admin.${PROXY_NAME}`), `https://admin.${PROXY_NAME}:${webPort}/`]);
    expect(JSON.parse(prod.stdout)).toMatchObject({ error: { code: 'GW_ERR_ACCESS_DENIED' } });
  });
});

describe('TCP apps and desktops through gwsh', () => {
  async function localProxy(args: string[]): Promise<number> {
    return (await startGwshProxy(args, userEnv, children)).port;
  }
  // gwsh reaches the Proxy through squid here, and squid does not relay half-close: read the echo, then close.
  async function echo(port: number, message: string): Promise<string> {
    return new Promise((resolvePromise, reject) => {
      const s = net.connect({ port, host: '127.0.0.1' }, () => s.write(message));
      let got = '';
      s.on('data', (c: Buffer) => {
        got += c.toString();
        if (got.length >= message.length) {
          s.end();
          resolvePromise(got);
        }
      });
      s.on('error', reject);
    });
  }

  it('a TCP app: bytes pass through', async () => {
    const port = await localProxy(['app', 'echo-tcp']);
    expect(await echo(port, 'tcp app says hi')).toBe('tcp app says hi');
  });

  it('starts after asking the Proxy only: the app sees no connection until a client makes one', async () => {
    // A server that takes one client at a time (iperf3) would count an opened-and-closed check as a failed client.
    const before = desktop.connections();
    const port = await localProxy(['app', 'echo-tcp']);
    expect(desktop.connections()).toBe(before);
    expect(await echo(port, 'first client')).toBe('first client');
    expect(desktop.connections()).toBe(before + 1);
  });

  it('an app her roles do not allow is refused at start, by the same check', async () => {
    const r = await runCli('gwsh', ['proxy', 'app', 'prod-admin', '--port', '0'], { env: userEnv });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_ACCESS_DENIED');
  });

  it('a desktop, forwarded as TCP', async () => {
    const port = await localProxy(['desktop', 'win-1']);
    expect(await echo(port, 'rdp bytes')).toBe('rdp bytes');
  });

  it('an unknown app is a clear error, not a hang', async () => {
    const r = await runCli('gwsh', ['proxy', 'app', 'nope', '--port', '0'], { env: userEnv });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_TUNNEL_NOT_FOUND');
    expect(r.stderr).toContain('nope');
  });
});

describe("the agent's health endpoints (gateway.diag_addr, the chart's probes)", () => {
  it('/healthz answers, and /readyz is 200 with the reverse tunnel up and its HTTP apps and API server answering', async () => {
    expect(JSON.parse((await curl([`http://127.0.0.1:${diagPort}/healthz`])).stdout)).toEqual({ status: 'ok' });
    const ready = await eventually('the agent ready', async () => {
      const r = JSON.parse((await curl([`http://127.0.0.1:${diagPort}/readyz`])).stdout) as { status: string; checks: Array<{ name: string; ok: boolean }> };
      if (r.status !== 'ready') throw new Error(JSON.stringify(r));
      return r;
    });
    expect(ready.checks.map((c) => c.name).sort()).toEqual(['app grafana', 'app prod-admin', 'kube dev', 'tunnel']);
    // Not the TCP app nor the desktop: a server that takes one client at a time would count each check as a failed client.
  });
});

describe('gwctl probe (through squid, as alice)', () => {
  const gwctlProbe = (args: string[]) => runCli('gwctl', ['probe', ...args], { env: userEnv });
  it('a Kubernetes cluster: the agent connects to its API server (through the Dialer) and closes; each hop timed', async () => {
    const r = await gwctlProbe(['kube', 'dev', '-f', 'json']);
    expect(r.stderr).toBe('');
    const out = JSON.parse(r.stdout) as { via: string; agent: string; hops: Array<{ hop: string }> };
    expect(out).toMatchObject({ via: 'local', agent: 'agent-apps' });
    expect(out.hops.map((h) => h.hop)).toEqual(['find', 'tunnel', 'resource']);
  });
  it('an app her roles do not reach (env: prod) is not found, exactly as an app that does not exist', async () => {
    const hidden = await gwctlProbe(['app', 'prod-admin']);
    const absent = await gwctlProbe(['app', 'no-such-app']);
    expect(hidden.stderr).toContain('code: GW_ERR_TUNNEL_NOT_FOUND');
    expect(hidden.stderr.replaceAll('prod-admin', 'X')).toBe(absent.stderr.replaceAll('no-such-app', 'X'));
  });
});

describe('Kubernetes by SNI', () => {
  const kubeHost = `kube-gateway-proxy-alpn.${PROXY_NAME}`;

  it("forwards to the API server as the user, in the groups the role's kubernetes_groups allow", async () => {
    const r = await curl([...userCert(), ...resolve(kubeHost), `https://${kubeHost}:${webPort}/k8s/dev/api/v1/namespaces`]);
    expect(r.stderr).toBe('');
    const seen = JSON.parse(r.stdout) as { path: string; headers: Record<string, string> };
    expect(seen.path).toBe('/api/v1/namespaces');
    expect(seen.headers['impersonate-user']).toBe('alice');
    expect(seen.headers['impersonate-group']).toBe('dev-only, viewers');
  });

  it('kubectl --as-group picks among the allowed groups; other Impersonate-* headers of the client are dropped', async () => {
    const r = await curl([...userCert(), ...resolve(kubeHost), '-H', 'Impersonate-Group: viewers', '-H', 'Impersonate-Extra-Scopes: all', `https://${kubeHost}:${webPort}/k8s/dev/api`]);
    const seen = JSON.parse(r.stdout) as { headers: Record<string, string> };
    expect(seen.headers['impersonate-group']).toBe('viewers');
    expect(seen.headers['impersonate-extra-scopes']).toBeUndefined();
  });

  it('hostile: impersonating a user or group the roles do not allow is refused before the API server sees it', async () => {
    for (const header of ['Impersonate-User: admin', 'Impersonate-Group: system:masters']) {
      const r = await curl([...userCert(), ...resolve(kubeHost), '-H', header, '-w', '\n%{http_code}', `https://${kubeHost}:${webPort}/k8s/dev/api/v1/secrets`]);
      const [body, status] = r.stdout.split('\n');
      expect(status).toBe('403');
      // The Proxy's JSON error, not the stand-in's echo: nothing was forwarded.
      expect(JSON.parse(body!)).toMatchObject({ error: { code: 'GW_ERR_KUBE_NO_IMPERSONATION' } });
    }
  });

  it("the agent's connection to the API server went through squid (HTTPS_PROXY), decided as kube.<cluster>.local", async () => {
    await squid.waitForAccessLog((l) => l.includes(`CONNECT k8s-api.gw.test:${apiServer.port}`));
    const plan = await runCli('gateway', ['dial-plan', '--json', 'kube.apps.example.local:443'], {
      env: { HTTPS_PROXY: squid.url, NO_PROXY: 'kube.apps.example.local' },
    });
    expect(JSON.parse(plan.stdout)).toMatchObject({ proxy: null, source: 'NO_PROXY' });
  });

  it('an unknown cluster and a request outside /k8s/ get clear errors', async () => {
    expect(JSON.parse((await curl([...userCert(), ...resolve(kubeHost), `https://${kubeHost}:${webPort}/k8s/prod/api`])).stdout)).toMatchObject({ error: { code: 'GW_ERR_TUNNEL_NOT_FOUND' } });
    expect(JSON.parse((await curl([...userCert(), ...resolve(kubeHost), `https://${kubeHost}:${webPort}/api`])).stdout)).toMatchObject({ error: { code: 'GW_ERR_API_NOT_FOUND' } });
  });
});
