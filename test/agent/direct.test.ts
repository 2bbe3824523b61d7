/**
 * Direct-join agents: an agent that joined the Auth Service directly (--auth-server) opens no tunnel, opens its
 * SSH, Kubernetes and Windows Desktop listeners, and writes its own presence (proxyId "direct") through the Auth
 * API; the Proxy's dialDirect reaches each service through them, each over mutual TLS: a real SSH session with
 * OpenSSH, a stand-in Kubernetes API server over HTTPS, an RDP-like TCP server, byte-exact. Hostile callers: a
 * user certificate or none on the agent's listeners, OpenSSH straight to the SSH listener (it would skip the
 * Proxy's locks and roles), a Proxy that expects another agent, a user writing presence, an agent advertising
 * addresses the Proxy must not dial (loopback, link-local, another host), a client that never sends its dial
 * request (closed at the deadline, counted). Renewal of its host certificates through the Auth API, and the hostile
 * callers of that route.
 *
 * Everything listens on this machine's first non-loopback IPv4 address: the Auth Service refuses loopback
 * listener addresses (the Proxy would dial itself).
 */
import { spawn } from 'node:child_process';
import { createPublicKey, randomBytes, X509Certificate } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { networkInterfaces, tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import type { Duplex, Readable } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKeyPair } from '../../src/auth/pki.js';
import { FORWARDED } from '../../src/wire/forwarded.js';
import { parseSshCert } from '../../src/auth/pki/ssh.js';
import type { Presence } from '../../src/auth/records.js';
import { ApiClient } from '../../src/client/api.js';
import { saveProfile } from '../../src/client/profile.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { dialDirect, type DirectDialDeps } from '../../src/proxy/direct.js';
import { startAgentRole, type AgentRole } from '../../src/roles/agent.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { daemonEnvironment } from '../../src/roles/environment.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startTracing, stopTracing } from '../../src/trace.js';
import type { DialRequest } from '../../src/tunnel/protocol.js';
import { startOtlpReceiver } from '../helpers/otlp.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';

const LOGIN = userInfo().username;
/** A non-loopback address of this machine: where the agent and the Auth Service listen. */
const HOST_IP = Object.values(networkInterfaces())
  .flat()
  .find((i) => i && i.family === 'IPv4' && !i.internal)?.address;
const dialer = new Dialer({ env: {} });

let dir: string;
let pki: TestPki;
let authLife: Lifecycle;
let agentLife: Lifecycle;
let auth: AuthRole;
let agent: AgentRole;
let agentLimits: ConnectionLimits;
let presence: Presence;
let proxyDeps: DirectDialDeps;
let kubeApi: https.Server;
let desktop: net.Server;

function agentConfig(kubePort: number, desktopPort: number): GatewayConfig {
  return parseConfig(
    [
      'gateway:',
      '  nodename: direct-node',
      `  data_dir: ${join(dir, 'agent')}`,
      '  limits:',
      '    header_timeout: 1s',
      '    tls_handshake_timeout: 2s',
      '    ssh_handshake_timeout: 2s',
      'ssh_service:',
      '  enabled: yes',
      `  listen_addr: ${HOST_IP}:0`,
      'kube_service:',
      '  enabled: yes',
      `  listen_addr: ${HOST_IP}:0`,
      '  clusters:',
      '    - name: prod',
      `      api_server: https://127.0.0.1:${kubePort}`,
      `      ca_file: ${pki.caCertPath}`,
      'windows_desktop_service:',
      '  enabled: yes',
      `  listen_addr: ${HOST_IP}:0`,
      '  desktops:',
      '    - name: win',
      `      addr: 127.0.0.1:${desktopPort}`,
      '',
    ].join('\n'),
    'direct agent',
  );
}

const request = (service: DialRequest['service'], resource: string): DialRequest => ({ service, resource, client_src: '198.51.100.7:40000', client_dst: '127.0.0.1:443', user: 'alice' });

function listen(server: net.Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)));
}

function readAll(stream: Readable): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.once('end', () => resolve(Buffer.concat(chunks)));
    stream.once('error', reject);
  });
}

/** `ssh <login>@host -p port echo direct-ok` with alice's profile in home (key, certificate, known_hosts). */
function openSsh(home: string, host: string, port: number): Promise<{ code: number | null; out: string; err: string }> {
  const args = ['-F', '/dev/null', '-p', String(port), '-i', join(home, 'ssh-key'), '-o', `CertificateFile=${join(home, 'ssh-key-cert.pub')}`, '-o', `UserKnownHostsFile=${join(home, 'known_hosts')}`, '-o', 'StrictHostKeyChecking=yes', '-o', 'BatchMode=yes', '-o', 'HostKeyAlias=direct-node', '-o', 'ConnectTimeout=20', `${LOGIN}@${host}`, 'echo direct-ok'];
  return new Promise((resolve) => {
    const child = spawn('ssh', args, { env: { PATH: process.env.PATH ?? '', HOME: home }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    child.once('close', (code) => resolve({ code, out, err }));
  });
}

function closed(stream: Duplex): Promise<void> {
  return new Promise((resolve) => (stream.destroyed ? resolve() : stream.once('close', () => resolve())));
}

beforeAll(async () => {
  if (!HOST_IP) return;
  setRootLogger(createLogger({ level: process.env.DEBUG_DIRECT ? 'debug' : 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-direct-'));
  pki = await makeTestPki();
  const kubeCert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
  kubeApi = https.createServer({ key: kubeCert.keyPem, cert: kubeCert.certPem }, (req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ gitVersion: 'v1.30.0-standin', path: req.url }));
  });
  // RDP-like: whatever the client sends comes back, byte for byte.
  // An echo; a connection that starts with "CUT\n" gets 1 MiB and then an RST (the resource breaking mid-answer).
  desktop = net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => undefined);
    s.once('data', (first: Buffer) => {
      s.pause();
      if (first.subarray(0, 4).toString() !== 'CUT\n') {
        s.unshift(first);
        s.pipe(s);
        return;
      }
      s.write(Buffer.alloc(1024 * 1024, 0x63), () => s.resetAndDestroy());
    });
  });
  const [kubePort, desktopPort] = [await listen(kubeApi), await listen(desktop)];

  const authConfig = parseConfig(['gateway:', `  data_dir: ${join(dir, 'auth')}`, 'auth_service:', '  cluster_name: direct.example', `  listen_addr: ${HOST_IP}:0`, ''].join('\n'), 'auth');
  authLife = new Lifecycle();
  const authLimits = new ConnectionLimits(limitSettings(authConfig));
  authLife.onStop('backend', () => authLimits.close());
  auth = await startAuthRole({ config: authConfig, limits: authLimits, lifecycle: authLife });
  const admin = auth.auth.adminIdentity();
  const { token } = await auth.auth.addToken(admin, { roles: ['node', 'kube', 'desktop'] });

  const config = agentConfig(kubePort, desktopPort);
  agentLife = new Lifecycle();
  agentLimits = new ConnectionLimits(limitSettings(config));
  agent = await startAgentRole({
    config,
    services: ['ssh_service', 'kube_service', 'windows_desktop_service'],
    join: { token, caPin: auth.auth.caPin(), authServer: auth.address },
    dialer,
    environment: daemonEnvironment({ GATEWAY_UPGRADE_DIR: join(dir, 'no-upgrader') }),
    lifecycle: agentLife,
    limits: agentLimits,
  });
  presence = (await auth.auth.listPresence()).find((p) => p.hostId === agent.hostIdentity.hostId)!;

  // The Proxy's credentials: a host certificate for its host ID, as the proxy role issues one.
  const keys = generateKeyPair();
  const cert = await auth.auth.issueServerCert(keys.publicKeyPem, ['proxy.direct.example'], '7d4a5c3e-0000-4000-8000-0000000dd001');
  proxyDeps = { dialer, cert, key: keys.privateKeyPem, hostCa: auth.auth.host.tls.certPem };
}, 60_000);

afterAll(async () => {
  await agentLife?.stop().catch(() => undefined);
  await authLife?.stop().catch(() => undefined);
  kubeApi?.close();
  desktop?.close();
  await pki?.cleanup();
  await rm(dir, { recursive: true, force: true });
});

// Without a non-loopback address, no listener address would be accepted by the Auth Service.
describe.skipIf(!HOST_IP)('a direct-join agent', () => {
  it('opens no tunnel, opens its three listeners, and writes its presence with proxyId "direct" and their addresses', () => {
    expect(agent.hostIdentity.joinedVia).toBe('auth');
    expect(agent.tunnelAgent).toBeUndefined();
    const bound = agent.direct!.bound;
    expect(Object.keys(bound).sort()).toEqual(['desktop', 'kube', 'ssh']);
    expect(agent.sshAddress).toBe(bound.ssh);
    expect(presence).toMatchObject({ proxyId: 'direct', nodename: 'direct-node', direct: bound });
    expect(presence.services.sort()).toEqual(['desktop', 'kube', 'ssh']);
    expect(presence.resources.kube_clusters).toEqual([{ name: 'prod', labels: {} }]);
  });

  it('desktop: the stream reaches the RDP-like server byte-exact, both ways', async () => {
    const stream = await dialDirect(presence, request('desktop', 'win'), proxyDeps);
    const sent = randomBytes(2 * 1024 * 1024);
    const back = readAll(stream);
    stream.end(sent);
    expect((await back).equals(sent)).toBe(true);
  });

  it('traced: the dial request\'s traceparent gets an agent.dial span, its child, as through a tunnel (one helper: dialhop.ts)', async () => {
    const receiver = await startOtlpReceiver();
    await startTracing({ url: receiver.url, sampleRatio: 1, headers: {}, serviceName: 'test' });
    try {
      const trace = 'd'.repeat(31) + '7';
      const stream = await dialDirect(presence, { ...request('desktop', 'win'), traceparent: `00-${trace}-${'e'.repeat(16)}-01` }, proxyDeps);
      stream.destroy();
      await stopTracing();
      const span = receiver.spans.find((s) => s.traceId === trace);
      expect(span).toMatchObject({ name: 'agent.dial', parentSpanId: 'e'.repeat(16), kind: 2 });
      expect(span!.attributes).toMatchObject({ 'gateway.service': 'desktop', 'gateway.resource': 'win', 'gateway.agent.host_id': agent.hostIdentity.hostId });
    } finally {
      await stopTracing();
      await receiver.close();
    }
  });

  it('hostile: a resource that breaks mid-answer is a break at the Proxy too (framed: never a clean end of a short answer)', async () => {
    const stream = await dialDirect(presence, request('desktop', 'win'), proxyDeps);
    let got = 0;
    stream.on('data', (c: Buffer) => (got += c.length));
    stream.on('error', () => undefined);
    const how = new Promise<string>((resolve) => {
      stream.once('end', () => resolve('end'));
      stream.once('close', () => setImmediate(() => resolve('break')));
    });
    stream.write('CUT\n');
    expect(await how, `after ${got} bytes`).toBe('break');
    expect(stream.readableEnded).toBe(false);
  });

  it('kube: the stream is the stand-in Kubernetes API server, behind the agent’s TLS to it', async () => {
    const stream = await dialDirect(presence, request('kube', 'prod'), proxyDeps);
    const back = readAll(stream);
    stream.write('GET /version HTTP/1.1\r\nHost: kube\r\nConnection: close\r\n\r\n');
    const text = (await back).toString();
    expect(text).toMatch(/^HTTP\/1\.1 200 OK/);
    expect(text).toContain('"gitVersion":"v1.30.0-standin"');
  });

  it('ssh: OpenSSH through the stream gets a session on the SSH Service (host certificate checked against the cluster CA)', async () => {
    const admin = auth.auth.adminIdentity();
    await auth.auth.addUser(admin, 'alice', ['access'], 'correct horse battery staple 42', [LOGIN]);
    const keys = generateKeyPair();
    const bundle = await auth.auth.login({ username: 'alice', password: 'correct horse battery staple 42', publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '127.0.0.1' });
    const home = join(dir, 'alice');
    saveProfile(home, 'proxy.direct.example:443', 'alice', keys.privateKeyPem, bundle);
    // As `gwsh known-hosts` does: the host key its host certificate (checked against the cluster CA) certifies.
    const hostCert = parseSshCert(presence.resources.node_host_cert!, bundle.sshHostCa);
    expect(hostCert).toMatchObject({ signedByCa: true, certType: 'host' });
    expect(hostCert.principals).toContain('direct-node');
    writeFileSync(join(home, 'known_hosts'), `direct-node ${hostCert.publicKey}\n`);
    // What the Proxy's SSH route would do: each client connection carried over dialDirect.
    const front = net.createServer((client) => {
      dialDirect(presence, request('ssh', `${LOGIN}@22`), proxyDeps).then(
        (up) => {
          client.pipe(up).pipe(client);
          up.once('close', () => client.destroy());
          client.once('close', () => up.destroy());
        },
        () => client.destroy(),
      );
    });
    const port = await listen(front);
    const result = await openSsh(home, '127.0.0.1', port);
    front.close();
    expect(result.err).not.toContain('REMOTE HOST IDENTIFICATION');
    expect(result, result.err).toMatchObject({ code: 0, out: 'direct-ok\n' });
  }, 30_000);

  it('hostile: OpenSSH straight to the agent’s SSH listener (a user certificate that still verifies, skipping the Proxy’s locks and roles) gets no session', async () => {
    const addr = presence.direct!.ssh!;
    const i = addr.lastIndexOf(':');
    const result = await openSsh(join(dir, 'alice'), addr.slice(0, i), Number(addr.slice(i + 1)));
    expect(result.code, result.err).not.toBe(0);
    expect(result.err).toMatch(/kex_exchange_identification|Connection (closed|reset)/);
    expect(result.out).not.toContain('direct-ok');
  }, 30_000);

  it('the proxy role’s own direct dialer (a host certificate it is issued for its host ID) reaches the desktop', async () => {
    const config = parseConfig(['gateway:', '  nodename: proxy-direct', `  data_dir: ${join(dir, 'auth')}`, 'auth_service:', '  cluster_name: direct.example', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'), 'proxy');
    const limits = new ConnectionLimits(limitSettings(config));
    authLife.onStop('backend', () => limits.close());
    const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle: authLife, proxyId: '7d4a5c3e-0000-4000-8000-0000000dd002' });
    const stream = await proxy.direct(presence, request('desktop', 'win'));
    const back = readAll(stream);
    stream.end('through the proxy role');
    expect((await back).toString()).toBe('through the proxy role');
  });

  it('hostile: a user certificate or no certificate on the kube and ssh listeners is refused with GW_ERR_DIRECT_AUTH, and reaches nothing', async () => {
    const keys = generateKeyPair();
    const userBundle = await auth.auth.login({ username: 'alice', password: 'correct horse battery staple 42', publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '127.0.0.1' });
    for (const [service, resource] of [['kube', 'prod'], ['ssh', `${LOGIN}@22`]] as const) {
      const [host, port] = [presence.direct![service]!.split(':')[0]!, Number(presence.direct![service]!.split(':')[1])];
      for (const creds of [{ cert: userBundle.tlsCert, key: keys.privateKeyPem }, {}]) {
        const socket = tls.connect({ host, port, ca: auth.auth.host.tls.certPem, checkServerIdentity: () => undefined, ...creds });
        socket.on('error', () => undefined);
        socket.write(`${JSON.stringify(request(service, resource))}\n`);
        const answer = JSON.parse((await readAll(socket)).toString().split('\n')[0]!) as { ok: boolean; error: { code: string } };
        expect(answer, service).toMatchObject({ ok: false, error: { code: 'GW_ERR_DIRECT_AUTH' } });
      }
      // The same user key as if it were the Proxy's: dialDirect reports the refusal with its code.
      await expect(dialDirect(presence, request(service, resource), { ...proxyDeps, cert: userBundle.tlsCert, key: keys.privateKeyPem })).rejects.toMatchObject({ code: 'GW_ERR_DIRECT_AUTH' });
    }
  });

  it('hostile: a presence naming a loopback or link-local address (written before the Auth Service checked) is not dialled', async () => {
    for (const addr of ['127.0.0.1:5432', '169.254.169.254:80', '[fe80::1]:22', '0.0.0.0:22']) {
      const stale = { ...presence, direct: { ssh: addr, desktop: addr } };
      await expect(dialDirect(stale, request('desktop', 'win'), proxyDeps), addr).rejects.toMatchObject({ code: 'GW_ERR_DIRECT_ADDR_REFUSED' });
    }
  });

  it('hostile: a presence that names another agent at this address fails the Proxy’s check of the agent’s certificate', async () => {
    const impostor = { ...presence, hostId: '00000000-0000-4000-8000-000000000bad' };
    await expect(dialDirect(impostor, request('desktop', 'win'), proxyDeps)).rejects.toMatchObject({ code: 'GW_ERR_DIRECT_AUTH' });
    await expect(dialDirect(presence, request('db', 'main'), proxyDeps)).rejects.toMatchObject({ code: 'GW_ERR_DIRECT_NO_LISTENER' });
    await expect(dialDirect(presence, request('desktop', 'nope'), proxyDeps)).rejects.toMatchObject({ code: 'GW_ERR_TUNNEL_NOT_FOUND' });
  });

  it('hostile: slowloris (TLS done, no dial request; SSH version line only) and a silent TCP client are closed at their deadlines and counted', async () => {
    const [host, port] = [presence.direct!.desktop!.split(':')[0]!, Number(presence.direct!.desktop!.split(':')[1])];
    const slow = tls.connect({ host, port, ca: auth.auth.host.tls.certPem, cert: proxyDeps.cert, key: proxyDeps.key, checkServerIdentity: () => undefined });
    slow.on('error', () => undefined);
    await new Promise((resolve) => slow.once('secureConnect', resolve));
    slow.write('{"service":"desk'); // and never the rest
    const silent = net.connect(port, host);
    silent.on('error', () => undefined);
    // The SSH listener: a Proxy whose client sends its version line and nothing more after the dial request.
    const sshAddr = presence.direct!.ssh!;
    const sshSlow = tls.connect({ host: sshAddr.slice(0, sshAddr.lastIndexOf(':')), port: Number(sshAddr.slice(sshAddr.lastIndexOf(':') + 1)), ca: auth.auth.host.tls.certPem, cert: proxyDeps.cert, key: proxyDeps.key, checkServerIdentity: () => undefined });
    sshSlow.on('error', () => undefined);
    sshSlow.resume(); // reads the answer, the server's version and key exchange, so that its end is seen
    sshSlow.write(`${JSON.stringify(request('ssh', `${LOGIN}@22`))}\nSSH-2.0-slow\r\n`);
    await Promise.all([closed(slow), closed(silent), closed(sshSlow)]);
    const stats = agentLimits.stats();
    expect(stats.agent_desktop!.deadlines['route-header']).toBeGreaterThanOrEqual(1);
    expect(stats.agent_desktop!.deadlines['tls-handshake']).toBeGreaterThanOrEqual(1);
    expect(stats.agent_ssh!.deadlines['ssh-handshake']).toBeGreaterThanOrEqual(1);
  });

  it('hostile: presence writes need the agent’s own host certificate and its roles; a wildcard host becomes the address the Auth Service sees', async () => {
    const adminDir = join(dir, 'auth', 'admin');
    const asAdmin = new ApiClient({ address: auth.address, dialer, ca: await readFile(join(adminDir, 'host-ca.pem'), 'utf8'), cert: await readFile(join(adminDir, 'cert.pem'), 'utf8'), key: await readFile(join(adminDir, 'key.pem'), 'utf8'), server: 'auth' });
    const body = { services: ['ssh'], resources: {}, direct: { ssh: '0.0.0.0:3022' }, connected_at: new Date().toISOString(), ttl_ms: 60_000 };
    await expect(asAdmin.call('PUT', '/v1/agent/presence', body)).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_DENIED' });
    const id = agent.hostIdentity;
    const asAgent = new ApiClient({ address: auth.address, dialer, ca: id.hostCa, cert: id.cert, key: id.key, server: 'auth' });
    await expect(asAgent.call('PUT', '/v1/agent/presence', { ...body, direct: { rdp: `${HOST_IP}:1` } })).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_REQUEST' });
    await expect(asAgent.call('PUT', '/v1/agent/presence', { ...body, direct: { ssh: 'not an address' } })).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_REQUEST' });
    const written = await asAgent.call<{ presence: { direct: { ssh: string } } }>('PUT', '/v1/agent/presence', body);
    expect(written.presence.direct.ssh).toBe(`${HOST_IP}:3022`);
    await agent.direct!.heartbeat(); // the agent's own heartbeat puts its real addresses back
    expect((await auth.auth.listPresence()).find((p) => p.hostId === id.hostId)!.direct).toEqual(agent.direct!.bound);
  });

  it('hostile: an agent cannot make the Proxy dial loopback, link-local, multicast or another host (SSRF)', async () => {
    const id = agent.hostIdentity;
    const asAgent = new ApiClient({ address: auth.address, dialer, ca: id.hostCa, cert: id.cert, key: id.key, server: 'auth' });
    const body = { services: ['ssh'], resources: {}, connected_at: new Date().toISOString(), ttl_ms: 60_000 };
    const refused = ['169.254.169.254:80', '127.0.0.1:3025', 'localhost:5432', '[::1]:22', '[fe80::1]:22', '224.0.0.1:22', '[ff02::1]:22', '0.0.0.1:22', '192.0.2.250:5432', 'db.internal.example:5432'];
    for (const addr of refused) {
      await expect(asAgent.call('PUT', '/v1/agent/presence', { ...body, direct: { ssh: addr } }), addr).rejects.toMatchObject({ code: 'GW_ERR_DIRECT_ADDR_REFUSED' });
    }
    const stored = (await auth.auth.listPresence()).find((p) => p.hostId === id.hostId)!;
    expect(stored.direct).toEqual(agent.direct!.bound);
  });

  it('hostile: /v1/agent/ calls forwarded by a Proxy (the FORWARDED headers) are refused, whoever sends them', async () => {
    const id = agent.hostIdentity;
    const [host, port] = [auth.address.slice(0, auth.address.lastIndexOf(':')), Number(auth.address.slice(auth.address.lastIndexOf(':') + 1))];
    const payload = JSON.stringify({ services: ['ssh'], resources: {}, direct: { ssh: '0.0.0.0:3022' }, connected_at: new Date().toISOString(), ttl_ms: 60_000 });
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = https.request(
        { host, port, method: 'PUT', path: '/v1/agent/presence', ca: id.hostCa, cert: id.cert, key: id.key, checkServerIdentity: () => undefined, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), [FORWARDED.marker]: '1', [FORWARDED.addr]: '169.254.169.254' } },
        (res) => readAll(res).then((b) => resolve({ status: res.statusCode ?? 0, body: b.toString() }), reject),
      );
      req.once('error', reject);
      req.end(payload);
    });
    expect(JSON.parse(answer.body)).toMatchObject({ error: { code: 'GW_ERR_DIRECT_FORWARDED' } });
    expect((await auth.auth.listPresence()).find((p) => p.hostId === id.hostId)!.direct).toEqual(agent.direct!.bound);
  });

  it('hostile: a connected_at far in the future (to win "newest agent" lookups) or before the join is refused; db and app resources are dropped', async () => {
    const id = agent.hostIdentity;
    const asAgent = new ApiClient({ address: auth.address, dialer, ca: id.hostCa, cert: id.cert, key: id.key, server: 'auth' });
    const body = { services: ['ssh', 'db', 'app'], resources: { databases: [{ name: 'main' }], apps: [{ name: 'grafana' }], kube_clusters: [{ name: 'prod', labels: {} }] }, direct: { ssh: '0.0.0.0:3022' }, ttl_ms: 60_000 };
    for (const at of ['9999-12-31T00:00:00.000Z', new Date(Date.now() + 5 * 60_000).toISOString(), '2000-01-01T00:00:00.000Z']) {
      await expect(asAgent.call('PUT', '/v1/agent/presence', { ...body, connected_at: at }), at).rejects.toMatchObject({ code: 'GW_ERR_DIRECT_CLOCK' });
    }
    await asAgent.call('PUT', '/v1/agent/presence', { ...body, connected_at: new Date().toISOString() });
    const stored = (await auth.auth.listPresence()).find((p) => p.hostId === id.hostId)!;
    expect(stored.services).toEqual(['ssh']);
    expect(stored.resources).toMatchObject({ databases: [], apps: [], kube_clusters: [{ name: 'prod', labels: {} }] });
    await agent.direct!.heartbeat();
  });

  it('renews its host certificates through POST /v1/agent/renew: stored, and served by its listeners from then on', async () => {
    const id = agent.hostIdentity;
    const before = id.cert;
    expect(await agent.renewal!.check(Date.now() + 250 * 24 * 3600_000)).toBe('renewed');
    expect(id.cert).not.toBe(before);
    expect(await readFile(join(dir, 'agent', 'host', 'cert.pem'), 'utf8')).toBe(id.cert);
    // The desktop listener now presents the renewed certificate, and the Proxy's dial through it still works.
    const [host, port] = [presence.direct!.desktop!.split(':')[0]!, Number(presence.direct!.desktop!.split(':')[1])];
    const socket = tls.connect({ host, port, ca: id.hostCa, cert: proxyDeps.cert, key: proxyDeps.key, checkServerIdentity: () => undefined });
    socket.on('error', () => undefined);
    await new Promise((resolve) => socket.once('secureConnect', resolve));
    expect(socket.getPeerCertificate().raw.equals(new X509Certificate(id.cert).raw)).toBe(true);
    socket.destroy();
    const stream = await dialDirect(presence, request('desktop', 'win'), proxyDeps);
    const back = readAll(stream);
    stream.end('after renewal');
    expect((await back).toString()).toBe('after renewal');
  });

  it('hostile: /v1/agent/renew refuses a caller that is not an agent, another key, and a second renewal within the hour', async () => {
    const adminDir = join(dir, 'auth', 'admin');
    const asAdmin = new ApiClient({ address: auth.address, dialer, ca: await readFile(join(adminDir, 'host-ca.pem'), 'utf8'), cert: await readFile(join(adminDir, 'cert.pem'), 'utf8'), key: await readFile(join(adminDir, 'key.pem'), 'utf8'), server: 'auth' });
    const key = generateKeyPair().publicKeyPem;
    await expect(asAdmin.call('POST', '/v1/agent/renew', { public_key: key })).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_DENIED' });
    const id = agent.hostIdentity;
    const asAgent = new ApiClient({ address: auth.address, dialer, ca: id.hostCa, cert: id.cert, key: id.key, server: 'auth' });
    await expect(asAgent.call('POST', '/v1/agent/renew', { public_key: key })).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED' });
    await expect(asAgent.call('POST', '/v1/agent/renew', { public_key: 7 })).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_REQUEST' });
    const own = createPublicKey(id.key).export({ type: 'spki', format: 'pem' }).toString();
    await expect(asAgent.call('POST', '/v1/agent/renew', { public_key: own })).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_TOO_SOON' });
  });

  it('hostile: a lock on the agent closes the streams the Proxy has open to it (issue 23)', async () => {
    const stream = await dialDirect(presence, request('desktop', 'win'), { ...proxyDeps, sessions: auth.auth.sessions });
    stream.write('before the lock');
    await new Promise<void>((resolve) => stream.once('data', () => resolve()));
    const admin = auth.auth.adminIdentity();
    await auth.auth.createLock(admin, { target: { node: agent.hostIdentity.hostId }, name: 'direct-agent-lock' });
    try {
      await closed(stream);
    } finally {
      await auth.auth.removeLocks(admin, { name: 'direct-agent-lock' });
    }
  });

  it('graceful stop removes its presence and closes its listeners', async () => {
    const addrs = Object.values(agent.direct!.bound);
    await agentLife.stop();
    await waitUntil('the presence is gone', async () => !(await auth.auth.listPresence()).some((p) => p.hostId === agent.hostIdentity.hostId));
    for (const addr of addrs) {
      const i = addr.lastIndexOf(':');
      const refused = await new Promise<boolean>((resolve) => {
        const s = net.connect(Number(addr.slice(i + 1)), addr.slice(0, i));
        s.once('connect', () => (s.destroy(), resolve(false)));
        s.once('error', () => resolve(true));
      });
      expect(refused, addr).toBe(true);
    }
  });
});

describe('the Database and Application Services open no listener', () => {
  it.each(['db_service', 'app_service'])('%s.listen_addr is refused by the configuration parser with GW_ERR_CONFIG_UNKNOWN_KEY', (service) => {
    expect(() => parseConfig(`${service}:\n  enabled: yes\n  listen_addr: 0.0.0.0:3030\n`, 'refused')).toThrow(expect.objectContaining({ code: 'GW_ERR_CONFIG_UNKNOWN_KEY', message: expect.stringContaining(`${service}.listen_addr`) }));
  });
});
