/**
 * Tunnel protocol negotiation and v2 authentication, with real components in one process: an Auth Service
 * (startAuthRole), a Proxy (startProxyRole, the table as shipped), and an "old" Proxy (a TunnelServer behind a
 * front door whose table offers the tunnel's v1 ALPN only, as a Proxy of the previous version does). Agents are
 * TunnelAgents with identities the Auth Service issued.
 *
 *   - v2 is the default: the Proxy holds the agent's tunnel as v2, and a client's stream goes through it.
 *   - an agent of the previous version (offers v1 only) still connects to the new Proxy, over SSH.
 *   - a new agent still connects to an old Proxy (v1 only), over SSH.
 *   - hostile: a v2 agent with a certificate of another cluster, of a host the cluster does not know, of its own
 *     host ID with another key, or of a locked host, is refused: the agent reports GW_ERR_TUNNEL_AUTH with a hint,
 *     and the Proxy holds no tunnel for it.
 *   - hostile v2 peers with a valid certificate: garbage, an OPEN from the agent, an oversize frame, a first control
 *     line that is not a hello, a hello for another host: the Proxy closes the connection and registers nobody.
 *   - host certificate renewal over the tunnel (v2 and v1): an agent whose certificate runs out in seconds renews it
 *     and is let in again after the old one expired, where the same agent without renewal is refused; hostile: a
 *     renew for another key is refused, renews in a loop are answered too soon by the Proxy without reaching the
 *     Auth Service, and the tunnel stays.
 */
import { createPublicKey, X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import tls from 'node:tls';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { HostRenewal } from '../../src/agent/renewal.js';
import { TunnelAgent, type TunnelAgentOptions } from '../../src/agent/tunnel.js';
import { generateAuthority, generateKeyPair, issueTlsCert, sshPrivateKeyPem } from '../../src/auth/pki.js';
import type { JoinRole } from '../../src/auth/service.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startFrontDoor, type FrontDoor } from '../../src/proxy/frontdoor.js';
import { PROTOCOLS, type Protocol } from '../../src/proxy/protocols.js';
import { TunnelServer } from '../../src/proxy/tunnel.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole, type ProxyRole } from '../../src/roles/proxy.js';
import { frameHeader, FrameType } from '../../src/tunnel/frames.js';
import { TUNNEL_ALPN_V1, TUNNEL_ALPN_V2 } from '../../src/tunnel/protocol.js';
import { VERSION } from '../../src/version.js';
import { echoAgentOptions } from '../helpers/tunnelagent.js';
import { waitUntil } from '../helpers/wait.js';

setRootLogger(createLogger({ level: (process.env.TUNNEL_LOG as 'debug' | undefined) ?? 'silent' }));

const CLUSTER = 'negotiate.example';
let dir: string;
let config: GatewayConfig;
const authLife = new Lifecycle();
const proxyLife = new Lifecycle();
let auth: AuthRole;
let proxy: ProxyRole;
let proxyAddr: string;
let old: { tunnels: TunnelServer; door: FrontDoor; addr: string };
let echo: net.Server;

/** A table as a Proxy of the previous version had it: the tunnel row takes v1 only. */
const OLD_TABLE: readonly Protocol[] = PROTOCOLS.map((row) => (row.kind === 'tunnel' ? { ...row, on: { alpn: [TUNNEL_ALPN_V1] } } : row));

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-tunnel-v2-'));
  // A tunnel torn down resets its streams' resources (src/stream/splice.ts): the echo hears an RST, not a FIN.
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const port = await getPort({ host: '127.0.0.1' });
  const yaml = (webPort: number) =>
    ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'data')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${webPort}`, `  public_addr: 127.0.0.1:${webPort}`, ''].join('\n');
  config = parseConfig(yaml(port), 'negotiation test');
  const limits = new ConnectionLimits(limitSettings(config));
  authLife.onStop('backend', () => limits.close());
  auth = await startAuthRole({ config, limits, lifecycle: authLife });
  proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer: new Dialer({ env: {} }), lifecycle: proxyLife, proxyId: '00000000-0000-4000-8000-0000000000a1' });
  proxyAddr = proxy.addresses.web!;
  old = await startOldProxy(parseConfig(yaml(await getPort({ host: '127.0.0.1' })), 'old proxy'), limits);
});

afterAll(async () => {
  await old?.tunnels.close();
  await old?.door.close();
  await proxyLife.stop().catch(() => undefined);
  await authLife.stop().catch(() => undefined);
  echo?.close();
  await rm(dir, { recursive: true, force: true });
});

/** A Proxy of the previous version, as far as tunnels go: its front door offers the v1 ALPN only. */
async function startOldProxy(cfg: GatewayConfig, limits: ConnectionLimits): Promise<{ tunnels: TunnelServer; door: FrontDoor; addr: string }> {
  const keys = generateKeyPair();
  const tunnels = new TunnelServer({ auth: auth.auth, hostKey: sshPrivateKeyPem(generateKeyPair().privateKeyPem), heartbeatIntervalMs: 20_000, heartbeatCountMax: 3, publicAddr: 'old', proxyId: 'old-proxy' });
  const door = await startFrontDoor({
    config: cfg,
    clusterName: CLUSTER,
    tls: { key: keys.privateKeyPem, cert: await auth.auth.issueServerCert(keys.publicKeyPem, ['127.0.0.1'], 'old-proxy'), ca: [auth.auth.host.tls.certPem, auth.auth.user.tls.certPem] },
    api: auth.api,
    versions: new VersionServer({ channels: cfg.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    services: { tunnel: tunnels.handle },
    limits,
    protocols: OLD_TABLE,
  });
  return { tunnels, door, addr: door.addresses.web! };
}

let joined = 0;
/** A host joined to the cluster (its identity as the agent stores it), pointed at server. */
async function joinHost(server: string, roles: JoinRole[] = ['db']): Promise<HostIdentity> {
  const keys = generateKeyPair();
  const nodename = `agent-${++joined}`;
  const bundle = await auth.auth.joinLocal({ roles, nodename, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  const agentDir = join(dir, nodename);
  saveHostIdentity(agentDir, keys.privateKeyPem, bundle, { roles, nodename, server, joinedVia: 'proxy' });
  return loadHostIdentity(agentDir)!;
}

const agents: TunnelAgent[] = [];
afterEach(() => {
  for (const a of agents.splice(0)) a.stop();
});

function startAgent(identity: HostIdentity, extra: Partial<TunnelAgentOptions> = {}): { agent: TunnelAgent; failures: GatewayError[] } {
  const agent = new TunnelAgent(echoAgentOptions(identity, echo, extra));
  const failures: GatewayError[] = [];
  agent.on('failure', (e: GatewayError) => failures.push(e));
  agents.push(agent);
  agent.start();
  return { agent, failures };
}

async function roundTrip(tunnels: TunnelServer, hostId: string, text: string): Promise<string> {
  const stream = await tunnels.dial(hostId, { service: 'app', resource: 'pg', client_src: '127.0.0.1:1', client_dst: '127.0.0.1:2' });
  stream.write(text);
  const [echoed] = (await once(stream, 'data')) as [Buffer];
  stream.destroy();
  return echoed.toString();
}

describe('negotiation', () => {
  it('v2 is the default: the Proxy holds the tunnel as v2, and streams go through it', async () => {
    const identity = await joinHost(proxyAddr);
    const { agent } = startAgent(identity);
    await once(agent, 'connected');
    expect(proxy.tunnels.get(identity.hostId)?.link.protocol).toBe(2);
    expect(await roundTrip(proxy.tunnels, identity.hostId, 'over v2')).toBe('over v2');
    // Many at once on one tunnel.
    const texts = await Promise.all(Array.from({ length: 20 }, (_, i) => roundTrip(proxy.tunnels, identity.hostId, `stream ${i}`)));
    expect(texts).toEqual(Array.from({ length: 20 }, (_, i) => `stream ${i}`));
  });

  it('an agent of the previous version (v1 only) still connects to the new Proxy, over SSH', async () => {
    const identity = await joinHost(proxyAddr);
    const { agent } = startAgent(identity, { tunnelProtocols: ['v1'] });
    await once(agent, 'connected');
    expect(proxy.tunnels.get(identity.hostId)?.link.protocol).toBe(1);
    expect(await roundTrip(proxy.tunnels, identity.hostId, 'over v1')).toBe('over v1');
  });

  it('a new agent still connects to a Proxy of the previous version (v1 only), over SSH', async () => {
    const identity = await joinHost(old.addr);
    const { agent } = startAgent(identity);
    await once(agent, 'connected');
    expect(old.tunnels.get(identity.hostId)?.link.protocol).toBe(1);
    expect(await roundTrip(old.tunnels, identity.hostId, 'to the old Proxy')).toBe('to the old Proxy');
  });

  it('a lock on a v2 agent drops its tunnel, and the Proxy refuses it while the lock lasts', async () => {
    const identity = await joinHost(proxyAddr);
    const { agent, failures } = startAgent(identity);
    await once(agent, 'connected');
    const lock = await auth.auth.createLock(auth.auth.adminIdentity(), { target: { node: identity.hostId }, name: `lock-${identity.hostId}` });
    await waitUntil('the tunnel dropped', () => proxy.tunnels.get(identity.hostId) === undefined);
    await waitUntil('a refusal', () => failures.some((f) => f.code === 'GW_ERR_TUNNEL_AUTH'));
    expect(proxy.tunnels.get(identity.hostId)).toBeUndefined();
    await auth.auth.removeLocks(auth.auth.adminIdentity(), { name: lock.metadata.name });
    await waitUntil('back after the unlock', () => proxy.tunnels.get(identity.hostId) !== undefined);
  });
});

describe('v2 authentication refuses (hostile)', () => {
  async function refused(identity: HostIdentity): Promise<GatewayError> {
    const { failures } = startAgent(identity);
    await waitUntil('a refusal', () => failures.some((f) => f.code === 'GW_ERR_TUNNEL_AUTH'));
    const e = failures.find((f) => f.code === 'GW_ERR_TUNNEL_AUTH')!;
    expect(e.hint).toMatch(/join this cluster again/);
    expect(proxy.tunnels.get(identity.hostId)).toBeUndefined();
    return e;
  }

  it('a certificate of another cluster (trusting ours)', async () => {
    const real = await joinHost(proxyAddr);
    const otherCa = await generateAuthority('host', 'other.example');
    const keys = generateKeyPair();
    const cert = await issueTlsCert(otherCa, { publicKeyPem: keys.publicKeyPem, identity: { kind: 'host', name: real.hostId, cluster: 'other.example', roles: ['db'] }, ttlMs: 3_600_000, usage: 'both' });
    const e = await refused({ ...real, cluster: 'other.example', key: keys.privateKeyPem, cert, identity: { ...real.identity, cluster: 'other.example' } });
    expect(e.message).toMatch(/belongs to cluster "other.example"/);
  });

  it('a certificate of this cluster for a host it does not know', async () => {
    const real = await joinHost(proxyAddr);
    const keys = generateKeyPair();
    const cert = await auth.auth.issueServerCert(keys.publicKeyPem, ['127.0.0.1'], 'no-such-host', ['node']);
    await refused({ ...real, hostId: 'no-such-host', key: keys.privateKeyPem, cert });
  });

  it('a certificate for its own host ID with another key than the one it joined with', async () => {
    const real = await joinHost(proxyAddr);
    const keys = generateKeyPair();
    const cert = await auth.auth.issueServerCert(keys.publicKeyPem, ['127.0.0.1'], real.hostId, ['db']);
    await refused({ ...real, key: keys.privateKeyPem, cert });
  });

  it('a locked host', async () => {
    const identity = await joinHost(proxyAddr);
    await auth.auth.createLock(auth.auth.adminIdentity(), { target: { node: identity.hostId } });
    await refused(identity);
  });

  it('the same agent, offering v1, is refused there too (SSH): the same code', async () => {
    const identity = await joinHost(proxyAddr);
    await auth.auth.createLock(auth.auth.adminIdentity(), { target: { node: identity.hostId } });
    const { failures } = startAgent(identity, { tunnelProtocols: ['v1'] });
    await waitUntil('a refusal', () => failures.some((f) => f.code === 'GW_ERR_TUNNEL_AUTH'));
  });
});

describe('v2 hostile peers at the Proxy', () => {
  /** A TLS connection as the agent makes it (its certificate, ALPN v2), then bytes of the test's choosing. */
  async function connectAs(identity: HostIdentity): Promise<tls.TLSSocket> {
    const [host, port] = proxyAddr.split(':');
    const socket = tls.connect({ host, port: Number(port), ALPNProtocols: [TUNNEL_ALPN_V2], ca: identity.hostCa, cert: identity.cert, key: identity.key, servername: 'localhost', checkServerIdentity: () => undefined });
    socket.on('error', () => undefined);
    await once(socket, 'secureConnect');
    expect(socket.alpnProtocol).toBe(TUNNEL_ALPN_V2);
    return socket;
  }

  it.each([
    ['garbage after the handshake', Buffer.from('SSH-2.0-OpenSSH_9.2\r\n')],
    ['an OPEN from the agent', frameHeader(FrameType.OPEN, 1, 0)],
    ['a frame over the cap', frameHeader(FrameType.DATA, 0, 0x7fff_ffff)],
    ['a first control line that is not a hello', Buffer.concat([frameHeader(FrameType.DATA, 0, 21), Buffer.from('{"type":"heartbeat"}\n')])],
  ])('%s: the Proxy closes the connection, and no agent is registered', async (_what, bytes) => {
    const identity = await joinHost(proxyAddr);
    const socket = await connectAs(identity);
    socket.resume();
    socket.write(bytes);
    await waitUntil('the Proxy closed the connection', () => socket.destroyed || socket.readableEnded);
    expect(proxy.tunnels.get(identity.hostId)).toBeUndefined();
  });

  it("a renew without the host's proof of its key is refused by the Auth Service, though the tunnel is the host's", async () => {
    const identity = await joinHost(proxyAddr);
    const socket = await connectAs(identity);
    let seen = '';
    socket.on('data', (c: Buffer) => (seen += c.toString('latin1')));
    const line = (m: object) => {
      const text = Buffer.from(`${JSON.stringify(m)}\n`);
      return Buffer.concat([frameHeader(FrameType.DATA, 0, text.length), text]);
    };
    socket.write(line({ type: 'hello', version: 1, hostId: identity.hostId, nodename: identity.nodename, services: ['db'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] } }));
    await waitUntil('registered', () => proxy.tunnels.get(identity.hostId) !== undefined);
    const key = createPublicKey(identity.key).export({ type: 'spki', format: 'pem' }).toString();
    socket.write(line({ type: 'renew', id: 1, public_key: key }));
    await waitUntil('the answer', () => seen.includes('"type":"renewal"'));
    expect(seen).toMatch(/GW_ERR_HOST_RENEW_REFUSED[^\n]*carries no proof/);
    expect((await auth.auth.getNode(identity.hostId))?.renewedAt).toBeUndefined();
    socket.destroy();
  });

  it('a hello for another host than the certificate names is refused, the host of the certificate stays unregistered', async () => {
    const identity = await joinHost(proxyAddr);
    const other = await joinHost(proxyAddr);
    const socket = await connectAs(identity);
    socket.resume();
    const hello = Buffer.from(`${JSON.stringify({ type: 'hello', version: 1, hostId: other.hostId, nodename: 'x', services: ['db'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] } })}\n`);
    socket.write(Buffer.concat([frameHeader(FrameType.DATA, 0, hello.length), hello]));
    await waitUntil('the Proxy closed the connection', () => socket.destroyed || socket.readableEnded);
    expect(proxy.tunnels.get(identity.hostId)).toBeUndefined();
    expect(proxy.tunnels.get(other.hostId)).toBeUndefined();
  });
});

describe('host certificate renewal over the tunnel', () => {
  const SHORT_MS = 4_000;
  /** A joined host whose TLS certificate (its key, its identity) runs out SHORT_MS from now: renewal is due at once. */
  async function shortLived(): Promise<{ identity: HostIdentity; dataDir: string }> {
    const identity = await joinHost(proxyAddr);
    const publicKeyPem = createPublicKey(identity.key).export({ type: 'spki', format: 'pem' }).toString();
    const cert = await issueTlsCert(auth.auth.host, { publicKeyPem, identity: identity.identity, ttlMs: SHORT_MS, usage: 'both' });
    return { identity: { ...identity, cert }, dataDir: join(dir, identity.nodename) };
  }
  const expired = (cert: string) => waitUntil('the short certificate expired', () => Date.now() > Date.parse(new X509Certificate(cert).validTo) + 1000, SHORT_MS + 5_000);

  it.each([['v2'], ['v1']] as const)('%s: renewed before it runs out, the agent is let in again after the old one expired', async (version) => {
    const { identity, dataDir } = await shortLived();
    const short = identity.cert;
    const { agent, failures } = startAgent(identity, { tunnelProtocols: [version] });
    await once(agent, 'connected');
    const renewal = new HostRenewal({ identity, dataDir, ask: (key) => agent.requestRenewal(key) });
    expect(await renewal.check()).toBe('renewed');
    expect(identity.cert).not.toBe(short);
    expect(Date.parse(new X509Certificate(identity.cert).validTo) - Date.now()).toBeGreaterThan(300 * 24 * 3600_000);
    expect(loadHostIdentity(dataDir)!.cert).toBe(identity.cert);
    await expired(short);
    agent.drop('test: reconnect with the renewed certificate');
    await waitUntil('connected again', () => proxy.tunnels.get(identity.hostId) !== undefined && agent.getState() === 'connected');
    expect(await roundTrip(proxy.tunnels, identity.hostId, 'after the renewal')).toBe('after the renewal');
    expect(failures.filter((f) => f.code === 'GW_ERR_TUNNEL_AUTH')).toEqual([]);
  });

  it('the control case: the same agent without renewal is refused once its certificate expired', async () => {
    const { identity } = await shortLived();
    const { agent, failures } = startAgent(identity);
    await once(agent, 'connected');
    await expired(identity.cert);
    agent.drop('test: reconnect with the expired certificate');
    await waitUntil('a refusal', () => failures.length > 0);
    expect(failures[0]).toMatchObject({ code: 'GW_ERR_TUNNEL_AUTH', message: expect.stringMatching(/its host certificate expired at/), hint: expect.stringMatching(/clock/) });
    expect(proxy.tunnels.get(identity.hostId)).toBeUndefined();
  });

  it('hostile: a renew for another key is refused; renews in a loop are answered too soon by the Proxy itself; the tunnel stays', async () => {
    const identity = await joinHost(proxyAddr);
    const resources = { databases: [{ name: 'pg', protocol: 'postgres' as const, labels: {} }], apps: [], desktops: [], kube_clusters: [], node_host_cert: identity.sshCert };
    const { agent } = startAgent(identity, { resources });
    await once(agent, 'connected');
    // Another host's SSH host certificate (real, of this cluster) announced as its own: the Proxy keeps the one it has.
    const someoneElse = await joinHost(proxyAddr);
    agent.announceHostCert(someoneElse.sshCert);
    await new Promise((resolve) => setTimeout(resolve, 500)); // the Proxy's check (one Backend read) is done by then
    expect(proxy.tunnels.get(identity.hostId)?.resources.node_host_cert).toBe(identity.sshCert);
    const other = generateKeyPair();
    await expect(agent.requestRenewal(other.publicKeyPem)).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/not the one it joined with/) });
    const own = createPublicKey(identity.key).export({ type: 'spki', format: 'pem' }).toString();
    const results = await Promise.allSettled(Array.from({ length: 50 }, () => agent.requestRenewal(own)));
    for (const r of results) expect(r).toMatchObject({ status: 'rejected', reason: { code: 'GW_ERR_HOST_RENEW_TOO_SOON', message: expect.stringMatching(/less than 60 s ago/) } });
    expect((await auth.auth.getNode(identity.hostId))?.renewedAt).toBeUndefined();
    expect(await roundTrip(proxy.tunnels, identity.hostId, 'still up')).toBe('still up');
  });
});

describe('hostile: a host that is not an agent of the services its hello names', () => {
  // Issue 23: "a Proxy never [poses] as an agent". The roles come from the node record (the join token's types).
  for (const protocol of ['v2', 'v1'] as const) {
    it(`${protocol}: a Proxy's identity, or a node agent naming a database, is refused and holds no tunnel`, async () => {
      for (const roles of [['proxy'], ['node']] as JoinRole[][]) {
        const identity = await joinHost(proxyAddr, roles);
        const { agent, failures } = startAgent(identity, { tunnelProtocols: [protocol] }); // services: db
        const connected: string[] = [];
        agent.on('connected', (id: string) => connected.push(id));
        if (protocol === 'v2') await waitUntil('refused', () => failures.some((f) => f.code === 'GW_ERR_TUNNEL_AUTH'));
        else await once(agent, 'disconnected'); // on SSH the Proxy closes the connection after the hello
        expect(proxy.tunnels.get(identity.hostId)).toBeUndefined();
        expect(connected).toEqual([]);
        agent.stop();
      }
    });
  }

  it('an agent naming only services its roles allow is let in', async () => {
    const identity = await joinHost(proxyAddr, ['node', 'db']);
    const { agent } = startAgent(identity);
    await once(agent, 'connected');
    expect(proxy.tunnels.get(identity.hostId)?.services).toEqual(['db']);
  });
});
