/**
 * Two Proxies of one cluster in this process (startProxyRole twice on one in-process Auth Service), an agent
 * whose only tunnel goes to Proxy B (a real TunnelAgent serving tcp apps "echo" and "sink" from local servers),
 * and a user "alice" with the preset "access" role. Used by test/proxy/peer.test.ts and bench/peer.ts.
 */
import { createHash, randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { TunnelAgent } from '../../src/agent/tunnel.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole, type ProxyRole } from '../../src/roles/proxy.js';
import { readLine } from '../../src/stream/lines.js';
import type { DialRequest } from '../../src/tunnel/protocol.js';

export interface PeerCluster {
  dir: string;
  config: GatewayConfig;
  limits: ConnectionLimits;
  auth: AuthRole;
  a: ProxyRole & { id: string };
  b: ProxyRole & { id: string };
  agent: TunnelAgent;
  agentIdentity: HostIdentity;
  user: { key: string; cert: string };
  echo: net.Server;
  /** Every dial request the agent received, as it received it. */
  dials: DialRequest[];
  /** Opens the TCP app `resource` through the web port at `web` (gateway-tcp); resolves with the stream after {"ok":true}. */
  open(web: string, resource?: string): Promise<Duplex>;
  /** The answer line when the Proxy refuses (the stream is closed after it). */
  refusal(web: string, resource?: string): Promise<{ code: string; message: string }>;
  stop(): Promise<void>;
}

export interface PeerClusterOptions {
  limits?: string[];
  /** auth_service.keep_alive_interval: Proxy records' and agents' heartbeats (1s for tests: quick TTLs). */
  keepAlive?: string;
  /** The agent's idle data connections per tunnel (end-to-end streams); 0 (none) unless given. */
  e2ePool?: number;
}

export const splitAddr = (addr: string): { host: string; port: number } => {
  const i = addr.lastIndexOf(':');
  return { host: addr.slice(0, i).replace(/^\[|\]$/g, ''), port: Number(addr.slice(i + 1)) };
};

export async function startPeerCluster(options: PeerClusterOptions = {}): Promise<PeerCluster> {
  const dir = await mkdtemp(join(tmpdir(), 'gw-peering-'));
  const config = parseConfig(
    [
      'gateway:',
      '  nodename: localhost',
      `  data_dir: ${join(dir, 'data')}`,
      ...(options.limits ? ['  limits:', ...options.limits.map((l) => `    ${l}`)] : []),
      'auth_service:',
      '  cluster_name: peering.example',
      '  listen_addr: 127.0.0.1:0',
      `  keep_alive_interval: ${options.keepAlive ?? '1s'}`,
      '  tunnel_strategy: { type: proxy_peering, agent_connection_count: 1 }',
      'proxy_service:',
      '  web_listen_addr: 127.0.0.1:0',
      '  peer_listen_addr: 127.0.0.1:0',
      '',
    ].join('\n'),
    'peering test',
  );
  const lifecycle = new Lifecycle();
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  const dialer = new Dialer({ env: {} });
  const auth = await startAuthRole({ config, limits, lifecycle });
  const proxy = async () => {
    const id = randomUUID();
    return Object.assign(await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: id }), { id });
  };
  const a = await proxy();
  const b = await proxy();

  const echo = net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => undefined);
    s.pipe(s);
  });
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
  const echoPort = (echo.address() as net.AddressInfo).port;
  const sink = net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => undefined);
    s.resume();
    s.on('end', () => s.end());
  });
  await new Promise<void>((r) => sink.listen(0, '127.0.0.1', r));
  const sinkPort = (sink.address() as net.AddressInfo).port;

  // The agent: joined locally, its tunnel to B alone (B's web address is where it "joined").
  const keys = generateKeyPair();
  const agentDir = join(dir, 'agent');
  const bundle = await auth.auth.joinLocal({ roles: ['app'], nodename: 'agent-b', publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  saveHostIdentity(agentDir, keys.privateKeyPem, bundle, { roles: ['app'], nodename: 'agent-b', server: b.addresses.web!, joinedVia: 'proxy' });
  const agentIdentity = loadHostIdentity(agentDir)!;
  const dials: DialRequest[] = [];
  const agent = new TunnelAgent({
    identity: agentIdentity,
    dialer,
    services: ['app'],
    resources: { databases: [], apps: [{ name: 'echo', kind: 'tcp', labels: {} }, { name: 'sink', kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
    connectResource: (request: DialRequest) =>
      new Promise((resolve, reject) => {
        dials.push(request);
        const port = request.resource === 'echo' ? echoPort : request.resource === 'sink' ? sinkPort : 0;
        if (!port) return reject(new Error(`no app ${request.resource}`));
        const s = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true }, () => resolve(s));
        s.once('error', reject);
      }),
    // A probe's check (gwctl probe): a connect to the app, closed at once; never a dial of connectResource.
    reachResource: (_service, name) =>
      new Promise<number>((resolve, reject) => {
        const port = name === 'echo' ? echoPort : name === 'sink' ? sinkPort : 0;
        if (!port) return reject(new Error(`no app ${name}`));
        const s = net.connect({ port, host: '127.0.0.1' }, () => {
          s.destroy();
          resolve(0.5);
        });
        s.once('error', reject);
      }),
    heartbeatIntervalMs: config.auth_service.keep_alive_interval,
    ...(options.e2ePool ? { e2e: { pool: options.e2ePool } } : {}),
  });
  lifecycle.onStop('agents', () => agent.stop());
  const connected = new Promise<void>((r) => agent.once('connected', () => r()));
  agent.start();
  await connected;

  const admin = auth.auth.adminIdentity();
  await auth.auth.addUser(admin, 'alice', ['access'], 'correct horse battery staple', ['root']);
  const userKeys = generateKeyPair();
  const login = await auth.auth.login({ username: 'alice', password: 'correct horse battery staple', publicKeyPem: userKeys.publicKeyPem, sshPublicKey: userKeys.sshPublicKey, source: 'test' });
  const user = { key: userKeys.privateKeyPem, cert: login.tlsCert };
  const hostCa = auth.auth.host.tls.certPem;

  const connectApp = async (web: string, resource: string): Promise<{ socket: tls.TLSSocket; line: string }> => {
    const { host, port } = splitAddr(web);
    const socket = tls.connect({ host, port, servername: 'localhost', ca: hostCa, key: user.key, cert: user.cert, ALPNProtocols: ['gateway-tcp'] });
    socket.on('error', () => undefined);
    await new Promise<void>((resolve, reject) => socket.once('secureConnect', () => resolve()).once('error', reject));
    socket.write(`${JSON.stringify({ resource, kind: 'app' })}\n`);
    const line = await readLine(socket, { what: 'answer', timeoutMs: 30_000 });
    return { socket, line };
  };

  return {
    dir,
    config,
    limits,
    auth,
    a,
    b,
    agent,
    agentIdentity,
    user,
    echo,
    dials,
    async open(web, resource = 'echo') {
      const { socket, line } = await connectApp(web, resource);
      if (line !== '{"ok":true}') {
        socket.destroy();
        throw new Error(`refused: ${line}`);
      }
      return socket;
    },
    async refusal(web, resource = 'echo') {
      const { socket, line } = await connectApp(web, resource);
      socket.destroy();
      const answer = JSON.parse(line) as { ok: boolean; error?: { code: string; message: string } };
      if (answer.ok) throw new Error('the connection was allowed');
      return answer.error!;
    },
    async stop() {
      await lifecycle.stop().catch(() => undefined);
      echo.close();
      sink.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Writes `data` in chunks with back-pressure and resolves with the sha256 of as many bytes read back, then
 * closes the stream. (Half-close is not used to end the echo: a client's FIN loses the bytes still in flight
 * back from the agent on the local path too; see the report of this change.)
 */
export async function echoDigest(stream: Duplex, data: Buffer): Promise<string> {
  const hash = createHash('sha256');
  let got = 0;
  const done = new Promise<string>((resolve, reject) => {
    stream.on('data', (c: Buffer) => {
      hash.update(c);
      got += c.length;
      if (got >= data.length) resolve(hash.digest('hex'));
    });
    stream.once('close', () => reject(new Error(`the stream closed after ${got} of ${data.length} bytes`)));
    stream.once('error', reject);
  });
  for (let off = 0; off < data.length; off += 64 * 1024) {
    if (!stream.write(data.subarray(off, off + 64 * 1024))) await new Promise((r) => stream.once('drain', r));
  }
  const digest = await done;
  stream.destroy();
  return digest;
}

export const sha256 = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
