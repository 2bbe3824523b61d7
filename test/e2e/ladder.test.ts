/**
 * The agent's transport ladder (issue 25, part 5; src/agent/ladder.ts) over real network paths: an Auth Service
 * and a Proxy in this process with the one port (TLS routing) and, beside it, its raw SSH tunnel listener
 * (tunnel_public_addr set), reached through a test host in its own network namespace (test/helpers/netns.ts):
 *
 *   agent pool (this process) ──► 198.18.x.2:443  (socat) ──► the Proxy's web port    rung alpn
 *                             ──► 198.18.x.2:3024 (socat) ──► the Proxy's tunnel port rung tunnel-port
 *
 * The Proxy advertises proxy.ladder.test:443 and :3024; the agents resolve that name to the test host through
 * the Dialer's lookup. A user's `gwsh proxy app` (a real process) reaches the agent's echo app through the Proxy.
 *
 *   fall and climb   the pool comes up on alpn; nftables in the namespace drops port 443 (silently): the tunnel
 *                    dies, and it comes back on tunnel-port (logged with its reason); a byte-exact stream flows
 *                    through gwsh proxy app; the DROP is lifted: the probe brings a tunnel up on alpn, the pool
 *                    moves (logged with its reason), the stream goes on to its last byte over the old tunnel,
 *                    which both ends drain and close once it ends; new connections go over the new tunnel
 *   flapping         with a cap of one move, the second time the rung comes back the pool does not move
 *   not the cluster  443 leads to a TLS server with a certificate of its own: the agent comes up on tunnel-port
 *                    and its probes, which reach that server, never move it
 *   stall            443 accepts TCP and says nothing: the TLS deadline ends the rung, the agent uses tunnel-port
 *
 * Short intervals come through options (probe backoff, heartbeats, TLS deadline); nothing asserts a timing.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import dns from 'node:dns';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import tls from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { AgentPool, type AgentPoolOptions } from '../../src/agent/pool.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole, type ProxyRole } from '../../src/roles/proxy.js';
import { captureLogRecords } from '../helpers/logs.js';
import { runCli } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { createTestHost, waitForPort, type TestHost } from '../helpers/netns.js';
import { rootSuite } from '../helpers/root.js';
import { waitUntil } from '../helpers/wait.js';
import { makeTestPki } from '../helpers/tls.js';

const describeAsRoot = rootSuite(['netns']);

const NAME = 'proxy.ladder.test';
const CLUSTER = 'ladder.example';
const PASSWORD = 'correct horse battery';
const BLOCK = `table inet gwladder {
  chain in { type filter hook input priority 0; tcp dport 443 drop; }
}
`;

interface LogLine {
  msg: string;
  code?: string;
  reason?: string;
  rung?: string;
  next?: string;
  from?: string;
  to?: string;
  why?: string;
  hostId?: string;
}
const logs = captureLogRecords<LogLine>();

let dir: string;
let v4: TestHost;
let echo: net.Server;
let auth: AuthRole;
let proxy: ProxyRole;
let webPort: number;
let tunnelPort: number;
let socat443: ChildProcess;
let userEnv: Record<string, string>;
const children: ChildProcess[] = [];
const authLife = new Lifecycle();
const proxyLife = new Lifecycle();

const block = () => void v4.run('nft', ['-f', '-'], BLOCK);
const unblock = () => void v4.run('nft', ['delete', 'table', 'inet', 'gwladder']);

/** Points the namespace's 443 somewhere else (a TCP port of this side). */
async function port443To(port: number): Promise<void> {
  socat443.kill('SIGKILL');
  await new Promise((r) => socat443.once('exit', r));
  socat443 = v4.spawn('socat', [`TCP4-LISTEN:443,bind=${v4.ip},fork,reuseaddr`, `TCP4:${v4.localIp}:${port}`]);
  await waitForPort(v4.ip, 443);
}

let joined = 0;
async function joinHost(server: string): Promise<HostIdentity> {
  const keys = generateKeyPair();
  const nodename = `ladder-${++joined}`;
  const bundle = await auth.auth.joinLocal({ roles: ['app'], nodename, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  const agentDir = join(dir, nodename);
  saveHostIdentity(agentDir, keys.privateKeyPem, bundle, { roles: ['app'], nodename, server, joinedVia: 'proxy' });
  return loadHostIdentity(agentDir)!;
}

function lookup(): net.LookupFunction {
  return (hostname, options, callback) => {
    if (hostname !== NAME) return dns.lookup(hostname, options, callback as never);
    if ((options as dns.LookupAllOptions).all) (callback as never as (e: null, a: dns.LookupAddress[]) => void)(null, [{ address: v4.ip, family: 4 }]);
    else (callback as never as (e: null, a: string, f: number) => void)(null, v4.ip, 4);
  };
}

const pools: AgentPool[] = [];
afterEach(() => {
  for (const p of pools.splice(0)) p.stop();
  try {
    unblock();
  } catch {
    // not blocked
  }
});

async function startPool(app: string, extra: Partial<AgentPoolOptions> = {}, server = `${NAME}:443`): Promise<{ pool: AgentPool; identity: HostIdentity }> {
  const identity = await joinHost(server);
  const pool = new AgentPool({
    identity,
    dialer: new Dialer({ env: {}, lookup: lookup(), connectTimeoutMs: 1500 }),
    services: ['app'],
    resources: { databases: [], apps: [{ name: app, kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
    connectResource: async () => net.connect((echo.address() as net.AddressInfo).port, '127.0.0.1'),
    backoff: { firstMs: 100, maxMs: 500 },
    ladderOptions: { probe: { firstMs: 300, maxMs: 1500, resetAfterMs: 0 } },
    probeTimeoutMs: 10_000,
    maxLinks: 1,
    ...extra,
  });
  pools.push(pool);
  pool.start();
  return { pool, identity };
}

/** The agent's tunnel at this Proxy: its protocol (2 on alpn, 1 on the tunnel port). */
const protocolOf = (hostId: string) => proxy.tunnels.get(hostId)?.link.protocol;

/** A stream through `gwsh proxy app` that keeps writing random chunks and checks what comes back, byte for byte. */
async function flowingStream(app: string): Promise<{ stop(): Promise<{ sent: string; received: string; bytes: number }>; received(): number }> {
  const { port } = await startGwshProxy(['app', app], userEnv, children);
  const socket = net.connect(port, '127.0.0.1');
  await new Promise((r) => socket.once('connect', r));
  const sent = createHash('sha256');
  const got = createHash('sha256');
  let sentBytes = 0;
  let gotBytes = 0;
  socket.on('data', (c: Buffer) => {
    got.update(c);
    gotBytes += c.length;
  });
  let writing = true;
  // A reset while the stream is meant to flow fails stop(); one at the close, after every byte came back, does not.
  let broke: Error | undefined;
  socket.on('error', (err) => {
    if (writing) broke ??= err;
  });
  const pump = async () => {
    while (writing && !socket.destroyed) {
      const chunk = randomBytes(4096);
      sent.update(chunk);
      sentBytes += chunk.length;
      if (!socket.write(chunk)) await new Promise((r) => socket.once('drain', r));
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const pumping = pump();
  return {
    received: () => gotBytes,
    async stop() {
      writing = false;
      await pumping;
      if (broke) throw broke;
      await waitUntil('every byte echoed back', () => gotBytes === sentBytes, 30_000, 50);
      socket.end();
      if (!socket.destroyed) await new Promise((r) => socket.once('close', r));
      return { sent: sent.digest('hex'), received: got.digest('hex'), bytes: sentBytes };
    },
  };
}

const since = (mark: number) => logs.slice(mark);

describeAsRoot('the transport ladder', () => {
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-ladder-'));
    echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    v4 = await createTestHost();
    webPort = await getPort();
    tunnelPort = await getPort();
    const yaml = [
      'gateway:',
      '  nodename: localhost',
      `  data_dir: ${join(dir, 'data')}`,
      'auth_service:',
      `  cluster_name: ${CLUSTER}`,
      '  listen_addr: 127.0.0.1:0',
      '  keep_alive_interval: 1000ms',
      '  keep_alive_count_max: 2',
      'proxy_service:',
      `  web_listen_addr: 0.0.0.0:${webPort}`,
      `  public_addr: ${NAME}:443`,
      `  tunnel_public_addr: ${NAME}:3024`,
      `  tunnel_listen_addr: 0.0.0.0:${tunnelPort}`,
      '',
    ].join('\n');
    const config = parseConfig(yaml, 'ladder test');
    const limits = new ConnectionLimits(limitSettings(config));
    authLife.onStop('backend', () => limits.close());
    auth = await startAuthRole({ config, limits, lifecycle: authLife });
    proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer: new Dialer({ env: {} }), lifecycle: proxyLife, proxyId: '00000000-0000-4000-8000-0000000000c3' });
    socat443 = v4.spawn('socat', [`TCP4-LISTEN:443,bind=${v4.ip},fork,reuseaddr`, `TCP4:${v4.localIp}:${webPort}`]);
    v4.spawn('socat', [`TCP4-LISTEN:3024,bind=${v4.ip},fork,reuseaddr`, `TCP4:${v4.localIp}:${tunnelPort}`]);
    await Promise.all([waitForPort(v4.ip, 443), waitForPort(v4.ip, 3024)]);
    await auth.auth.addUser(auth.auth.adminIdentity(), 'alice', ['access'], PASSWORD);
    userEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
    const login = await runCli('gwsh', ['login', `--proxy=127.0.0.1:${webPort}`, '--user=alice', `--ca-pin=${auth.auth.caPin()}`], { env: userEnv, input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
  }, 120_000);

  afterAll(async () => {
    for (const p of pools.splice(0)) p.stop();
    for (const c of children) c.kill('SIGKILL');
    await proxyLife.stop().catch(() => undefined);
    await authLife.stop().catch(() => undefined);
    await v4?.close();
    echo?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('falls to the tunnel port when 443 is dropped, and moves back to alpn on its own once it is not, a byte-exact stream through gwsh proxy app flowing across the move; then a flapping rung is not followed past the move cap', async () => {
    const { pool, identity } = await startPool('echo-ladder', { ladderOptions: { probe: { firstMs: 300, maxMs: 1500, resetAfterMs: 0 }, moves: { maxMoves: 1, windowMs: 3_600_000 } } });
    await waitUntil('up on alpn', () => pool.getState() === 'connected' && protocolOf(identity.hostId) === 2).catch((e) => {
      console.log(JSON.stringify(logs.filter((l) => /tunnel|ladder|reach/.test(l.msg)).slice(-20), null, 1));
      throw e;
    });
    expect(pool.ladder.current).toBe('alpn');

    let mark = logs.length;
    block();
    await waitUntil('back up on the tunnel port', () => pool.getState() === 'connected' && protocolOf(identity.hostId) === 1, 60_000);
    expect(pool.ladder.current).toBe('tunnel-port');
    const fall = since(mark).find((l) => l.msg === 'transport ladder: falling to the next rung');
    expect(fall).toMatchObject({ rung: 'alpn', next: 'tunnel-port' });
    expect(fall!.reason).toContain(`alpn (TLS with ALPN on the web address, ${NAME}:443) does not work from here`);

    const stream = await flowingStream('echo-ladder');
    await waitUntil('bytes flow over the tunnel port', () => stream.received() > 64 * 1024);
    mark = logs.length;
    unblock();
    await waitUntil('moved back to alpn', () => since(mark).some((l) => l.msg === 'transport ladder: moved') && protocolOf(identity.hostId) === 2, 60_000);
    const moved = since(mark).find((l) => l.msg === 'transport ladder: moved')!;
    expect(moved).toMatchObject({ from: 'tunnel-port', to: 'alpn' });
    expect(moved.reason).toBe(`alpn (TLS with ALPN on the web address, ${NAME}:443) works again: moving the tunnel up from tunnel-port; the old tunnel drains`);
    expect(since(mark).some((l) => l.msg === 'agent replaced its tunnel (a better transport, or a new process); draining the old one' && l.hostId === identity.hostId)).toBe(true);
    // The stream goes on over the drained tunnel after the move, then ends whole.
    const atMove = stream.received();
    await waitUntil('bytes still flow after the move', () => stream.received() > atMove + 64 * 1024);
    const { sent, received, bytes } = await stream.stop();
    expect(received).toBe(sent);
    expect(bytes).toBeGreaterThan(128 * 1024);
    await waitUntil('the Proxy closed the drained tunnel once its stream ended', () => since(mark).some((l) => l.msg === 'drained tunnel closed' && l.why === 'its last stream closed'));
    // A new connection goes over the new tunnel.
    const again = await flowingStream('echo-ladder');
    await waitUntil('bytes flow over alpn', () => again.received() > 16 * 1024);
    const second = await again.stop();
    expect(second.received).toBe(second.sent);

    // Flapping: down again, back again; the cap (one move an hour here) keeps it where it is.
    mark = logs.length;
    block();
    await waitUntil('back on the tunnel port', () => pool.getState() === 'connected' && protocolOf(identity.hostId) === 1, 60_000);
    unblock();
    await waitUntil('the probe is held back by the move cap', () => since(mark).some((l) => l.msg === 'transport ladder: not probing (too many moves)'), 30_000);
    expect(protocolOf(identity.hostId)).toBe(1);
    expect(since(mark).some((l) => l.msg === 'transport ladder: moved')).toBe(false);
  }, 240_000);

  it('hostile: 443 leads to a TLS server that is not the cluster: the agent comes up on the tunnel port, its probes reach that server and never move it', async () => {
    const pki = await makeTestPki();
    const { certPem, keyPem } = await pki.serverCert({ names: [NAME], ips: [] });
    let handshakes = 0;
    let appBytes = 0;
    const impostor = tls.createServer({ cert: certPem, key: keyPem, ALPNProtocols: ['gateway-reversetunnel-v2', 'gateway-reversetunnel'] }, (s) => {
      s.on('data', (c: Buffer) => (appBytes += c.length));
      s.on('error', () => undefined);
    });
    impostor.on('connection', () => handshakes++);
    await new Promise<void>((r) => impostor.listen(0, '0.0.0.0', r));
    await port443To((impostor.address() as net.AddressInfo).port);
    try {
      const mark = logs.length;
      // /webapi/find straight to the Proxy: only the rung's address leads to the impostor.
      const { pool, identity } = await startPool('echo-impostor', {}, `127.0.0.1:${webPort}`);
      await waitUntil('up on the tunnel port', () => pool.getState() === 'connected' && protocolOf(identity.hostId) === 1, 60_000);
      expect(since(mark).find((l) => l.msg === 'transport ladder: falling to the next rung')?.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
      await waitUntil('two probes failed', () => since(mark).filter((l) => l.msg === 'transport ladder: probe failed').length >= 2, 60_000);
      expect(since(mark).filter((l) => l.msg === 'transport ladder: probe failed').every((l) => l.code === 'GW_ERR_CLIENT_UNTRUSTED')).toBe(true);
      expect(since(mark).some((l) => l.msg === 'transport ladder: moved')).toBe(false);
      expect(protocolOf(identity.hostId)).toBe(1);
      expect(handshakes).toBeGreaterThanOrEqual(3);
      expect(appBytes).toBe(0); // the agent sent it nothing: no hello, no certificate-bound secret
    } finally {
      impostor.close();
      await port443To(webPort);
    }
  }, 180_000);

  it('hostile: 443 accepts TCP and then says nothing: the TLS deadline ends that rung and the agent comes up on the tunnel port', async () => {
    const held: net.Socket[] = [];
    const staller = net.createServer((s) => {
      held.push(s);
      s.on('error', () => undefined);
    });
    await new Promise<void>((r) => staller.listen(0, '0.0.0.0', r));
    await port443To((staller.address() as net.AddressInfo).port);
    try {
      const mark = logs.length;
      const { pool, identity } = await startPool('echo-stall', { handshakeTimeoutMs: 1500 }, `127.0.0.1:${webPort}`);
      await waitUntil('up on the tunnel port', () => pool.getState() === 'connected' && protocolOf(identity.hostId) === 1, 60_000);
      expect(since(mark).find((l) => l.msg === 'transport ladder: falling to the next rung')?.code).toBe('GW_ERR_TLS_HANDSHAKE_TIMEOUT');
      expect(held.length).toBeGreaterThanOrEqual(1);
    } finally {
      for (const s of held) s.destroy();
      staller.close();
      await port443To(webPort);
    }
  }, 120_000);
});
