/**
 * The agent's end of end-to-end streams (src/agent/e2edata.ts, e2estream.ts), with real components in one process:
 * an Auth Service (startAuthRole), a Proxy's TunnelServer behind a front door of the shipped table, and TunnelAgents
 * with identities the Auth Service issued. The Proxy's own e2e routes are another part's: the test plays them from
 * the contract (src/tunnel/e2e.ts). A small front on the Proxy's public address hands TLS to the front door and
 * takes the agent's data connections itself (parseDataPreamble, checked with checkDataPreamble against the key of the
 * tunnel whose kid it names); the test then sends e2e-open on that tunnel's control stream, signs grants with the
 * Proxy's key, and plays the client with a real TLS client (user certificates from the Auth Service's login).
 *
 *   - the hello of a v2 tunnel carries e2e {v: 1, pool, kube: true, peered: true} (kube: it impersonates on end-to-end kube streams; peered: it takes grants of a Proxy it holds no tunnel to); with pool 0 it carries none and nothing is dialled
 *   - a good stream reaches the echo app byte-exact after {"ok":true}; the agent reports its start with e2e: true
 *   - a grant another Proxy issued (behind a load balancer the stream comes on another Proxy's tunnel) is checked
 *     with the certificate of the agent's tunnel to that Proxy; with none, by the grant's x5c (Proxy peering: the
 *     host CA, role proxy, the name grant.iss), refused without one; routed again by that Proxy, it
 *     is refused as used (the agent's single use is what holds across Proxies)
 *   - hostile grants and clients, each refused inside the TLS with GW_ERR_E2E_REFUSED naming the check: signed by
 *     another key, for another agent, issued by a Proxy the agent holds no tunnel to, for another user, bound to another key, roles the certificate lacks, expired,
 *     replayed, a client certificate of another CA, none at all
 *   - an e2e-open naming a data connection the agent does not hold is ignored, and a connection whose e2e-open
 *     never comes is closed at the deadline (the client is not left hanging)
 *   - a client that never starts TLS is closed at the handshake deadline; one that sends 1 MiB that is not TLS, at once
 *   - a database stream: the grant's db_access is what the agent's gate checks the startup against, and the session
 *     is reported with its database user and name
 *   - a lock: the Proxy's revocation tells the agent (locks), which closes the open stream and refuses new ones,
 *     and forgets the user after LOCKED_USER_HOLD_MS (the agent's clock injected)
 *   - a path that drops every data connection is redialled only after the backoff, never in a loop
 *   - the pool refills after a stream takes a connection, and replaces one the path cut, the tunnel untouched
 *   - with HTTPS_PROXY the data connections go through squid (CONNECT in its log), and a stream works
 */
import type { Duplex } from 'node:stream';
import { randomBytes, X509Certificate } from 'node:crypto';
import dns from 'node:dns';
import { EventEmitter, once } from 'node:events';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls, { type TLSSocket } from 'node:tls';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { E2EStreams, LOCKED_USER_HOLD_MS } from '../../src/agent/e2estream.js';
import { TunnelAgent, type TunnelAgentOptions } from '../../src/agent/tunnel.js';
import { generateAuthority, generateKeyPair, identityFromCert, issueTlsCert, sshPrivateKeyPem } from '../../src/auth/pki.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startFrontDoor, type FrontDoor } from '../../src/proxy/frontdoor.js';
import { TunnelServer } from '../../src/proxy/tunnel.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { FramedStream } from '../../src/stream/framed.js';
import { readJsonLine, writeJsonLine } from '../../src/stream/lines.js';
import {
  checkDataPreamble,
  dataKeyId,
  dataKeyOf,
  E2E_ALPN,
  e2eServerName,
  GRANT_TTL_MS,
  dataAnswer,
  parseDataPreamble,
  signGrant,
  spkiHash,
  type E2EGrant,
} from '../../src/tunnel/e2e.js';
import type { DialAnswer, HelloMessage } from '../../src/tunnel/protocol.js';
import { VERSION } from '../../src/version.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { waitUntil } from '../helpers/wait.js';
import { pgStartup } from '../helpers/pgwire.js';

setRootLogger(createLogger({ level: (process.env.TUNNEL_LOG as 'debug' | undefined) ?? 'silent' }));

const CLUSTER = 'e2e-agent.example';
const PROXY_ID = '00000000-0000-4000-8000-0000000000e2';
const PASSWORD = 'correct horse battery';
/** The Proxy's public name: resolved to 127.0.0.1 by the agents' own lookup, and by squid's hosts_file (a loopback address is never proxied). */
const PROXY_NAME = 'proxy.e2e.test';
const lookup: net.LookupFunction = (hostname, options, callback) => {
  if (hostname !== PROXY_NAME) return dns.lookup(hostname, options, callback as never);
  if ((options as dns.LookupAllOptions).all) (callback as never as (e: null, a: dns.LookupAddress[]) => void)(null, [{ address: '127.0.0.1', family: 4 }]);
  else (callback as never as (e: null, a: string, f: number) => void)(null, '127.0.0.1', 4);
};
let dir: string;
const life = new Lifecycle();
let auth: AuthRole;
let tunnels: TunnelServer;
let door: FrontDoor;
let front: net.Server;
let frontAddr: string;
let proxyKey: string;
let echo: net.Server;
type Creds = { cert: string; key: string };
let alice: Creds;
let bob: Creds;
let carol: Creds;

/** The Proxy's side of each tunnel's TLS (what the key of its data connections comes from). */
const tunnelSockets: TLSSocket[] = [];
/** Hellos the Proxy received, read off the tunnels' first bytes. */
const hellos: HelloMessage[] = [];

interface DataConn {
  kid: string;
  n: number;
  socket: net.Socket;
  used: boolean;
}
const dataConns: DataConn[] = [];
const arrivals = new EventEmitter();
let refusedData = 0;
/** Set by a test: the Proxy cuts every data connection of this kid as soon as it arrives (a path that drops them). */
let cutKid: string | undefined;
/** While set, the fake Proxy's answers to data connections wait here (an e2e-open that overtakes its answer). */
let heldAnswers: Array<() => void> | undefined;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-agent-'));
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  front = net.createServer(onFront);
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve));
  frontAddr = `${PROXY_NAME}:${(front.address() as net.AddressInfo).port}`;
  const webPort = await getPort({ host: '127.0.0.1' });
  const yaml = ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'data')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${webPort}`, `  public_addr: ${frontAddr}`, ''].join('\n');
  const config: GatewayConfig = parseConfig(yaml, 'e2e agent test');
  const limits = new ConnectionLimits(limitSettings(config));
  life.onStop('backend', () => limits.close());
  auth = await startAuthRole({ config, limits, lifecycle: life });
  const keys = generateKeyPair();
  proxyKey = keys.privateKeyPem;
  tunnels = new TunnelServer({ auth: auth.auth, hostKey: sshPrivateKeyPem(generateKeyPair().privateKeyPem), heartbeatIntervalMs: 20_000, heartbeatCountMax: 3, publicAddr: frontAddr, proxyId: PROXY_ID });
  door = await startFrontDoor({
    config,
    clusterName: CLUSTER,
    tls: { key: keys.privateKeyPem, cert: await auth.auth.issueServerCert(keys.publicKeyPem, ['127.0.0.1', PROXY_NAME], PROXY_ID), ca: [auth.auth.host.tls.certPem, auth.auth.user.tls.certPem] },
    api: auth.api,
    versions: new VersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    services: { tunnel: onTunnel },
    limits,
  });
  for (const name of ['alice', 'bob', 'carol']) await auth.auth.addUser(auth.auth.adminIdentity(), name, ['access'], PASSWORD);
  [alice, bob, carol] = (await Promise.all(['alice', 'bob', 'carol'].map(login))) as [Creds, Creds, Creds];
});

afterAll(async () => {
  for (const a of agents.splice(0)) a.stop();
  await tunnels?.close();
  await door?.close();
  front?.close();
  for (const c of dataConns) c.socket.destroy();
  await life.stop().catch(() => undefined);
  echo?.close();
  await rm(dir, { recursive: true, force: true });
});

async function login(username: string): Promise<Creds> {
  const keys = generateKeyPair();
  const bundle = await auth.auth.login({ username, password: PASSWORD, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '192.0.2.1' });
  return { cert: bundle.tlsCert, key: keys.privateKeyPem };
}

/** The tunnel route: the TLS socket is kept (its exporter keys the data connections), its hello read off its bytes. */
function onTunnel(stream: import('node:stream').Duplex, info: Parameters<TunnelServer['handle']>[1]): void {
  const socket = stream as TLSSocket;
  tunnelSockets.push(socket);
  let seen = '';
  const sniff = (chunk: Buffer) => {
    seen += chunk.toString('latin1');
    const at = seen.indexOf('{"type":"hello"');
    const end = at < 0 ? -1 : seen.indexOf('\n', at);
    if (end < 0) return;
    socket.off('data', sniff);
    hellos.push(JSON.parse(Buffer.from(seen.slice(at, end), 'latin1').toString('utf8')) as HelloMessage);
  };
  socket.on('data', sniff);
  tunnels.handle(stream, info);
}

/** The Proxy's one port, as far as this test needs it: data connections here, everything else to the front door. */
function onFront(client: net.Socket): void {
  client.on('error', () => undefined);
  let buf = Buffer.alloc(0);
  const onData = (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    if (buf.length < 8) return;
    client.off('data', onData);
    client.pause();
    if (buf.subarray(0, 8).toString('latin1') !== 'GWDATA1 ') {
      const upstream = net.connect(Number(door.addresses.web!.split(':').pop()), '127.0.0.1');
      upstream.on('error', () => client.destroy());
      client.on('close', () => upstream.destroy());
      upstream.write(buf);
      client.pipe(upstream).pipe(client);
      return;
    }
    takeData(client, buf);
  };
  client.on('data', onData);
}

/** A data connection: its preamble parsed and checked against the key of the tunnel its kid names. */
function takeData(client: net.Socket, first: Buffer): void {
  let buf = first;
  const attempt = (): boolean => {
    const p = parseDataPreamble(buf);
    if (p.kind === 'need-more') return false;
    // The first pair that names a live tunnel here, as the Proxy takes it (src/proxy/e2edata.ts).
    const keys = tunnelSockets.filter((s) => !s.destroyed).map((s) => dataKeyOf(s));
    const key = p.kind === 'ok' ? p.pairs.map((pair) => keys.find((k) => dataKeyId(k) === pair.kid)).find((k) => k !== undefined) : undefined;
    if (p.kind !== 'ok' || !key || !checkDataPreamble(key, p)) {
      refusedData++;
      client.destroy();
      return true;
    }
    const kid = dataKeyId(key);
    if (buf.length > p.length) client.unshift(buf.subarray(p.length));
    if (kid === cutKid) {
      client.destroy();
      arrivals.emit('cut', p.n);
      return true;
    }
    const answer = () => client.write(dataAnswer({ ok: true, proxy: PROXY_ID }));
    if (heldAnswers) heldAnswers.push(answer);
    else answer();
    const conn: DataConn = { kid, n: p.n, socket: client, used: false };
    dataConns.push(conn);
    arrivals.emit('data', conn);
    return true;
  };
  if (attempt()) return;
  const onMore = (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    if (attempt()) client.off('data', onMore);
  };
  client.on('data', onMore);
  client.resume();
}

/** The kid of the data connections of the agent's current tunnel (the Proxy's side of its TLS). */
function kidOf(hostId: string): string | undefined {
  const agent = tunnels.get(hostId);
  if (!agent) return undefined;
  const live = tunnelSockets.filter((s) => !s.destroyed);
  // The newest live tunnel socket whose data connections arrived is this agent's (one agent per test at a time).
  for (const s of live.reverse()) {
    const kid = dataKeyId(dataKeyOf(s));
    if (dataConns.some((c) => c.kid === kid)) return kid;
  }
  return undefined;
}

function idleOf(kid: string): DataConn[] {
  return dataConns.filter((c) => c.kid === kid && !c.used && !c.socket.destroyed);
}

let joined = 0;
async function joinHost(roles: Array<'app' | 'node' | 'db'> = ['app']): Promise<HostIdentity> {
  const keys = generateKeyPair();
  const nodename = `agent-${++joined}`;
  const bundle = await auth.auth.joinLocal({ roles, nodename, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  const agentDir = join(dir, nodename);
  saveHostIdentity(agentDir, keys.privateKeyPem, bundle, { roles, nodename, server: frontAddr, joinedVia: 'proxy' });
  return loadHostIdentity(agentDir)!;
}

const agents: TunnelAgent[] = [];
afterEach(() => {
  for (const a of agents.splice(0)) a.stop();
});

/** An app agent serving the echo server as the TCP app "echo", end-to-end streams on (pool 2, quick retries). */
async function startAgent(extra: Partial<TunnelAgentOptions> = {}, roles: Array<'app' | 'db' | 'node'> = ['app']): Promise<{ agent: TunnelAgent; identity: HostIdentity }> {
  const identity = extra.identity ?? (await joinHost(roles));
  const agent = new TunnelAgent({
    dialer: new Dialer({ env: {}, lookup }),
    services: ['app'],
    resources: { databases: [], apps: [{ name: 'echo', kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] },
    connectResource: async () => net.connect((echo.address() as net.AddressInfo).port, '127.0.0.1'),
    backoff: { firstMs: 50, maxMs: 200 },
    e2e: { pool: 2, data: { backoff: { firstMs: 50, maxMs: 200 }, openWaitMs: 1_000 }, handshakeTimeoutMs: 2_000 },
    ...extra,
    identity,
  });
  agents.push(agent);
  agent.start();
  await waitUntil('the agent is connected', () => tunnels.get(identity.hostId) !== undefined && agent.getState() === 'connected', 15_000);
  return { agent, identity };
}

/** Waits until the agent's tunnel has `count` idle data connections at the Proxy; answers its kid. */
async function poolReady(hostId: string, count = 2): Promise<string> {
  let kid: string | undefined;
  await waitUntil(`${count} idle data connections`, () => (kid = kidOf(hostId)) !== undefined && idleOf(kid).length >= count, 15_000);
  return kid!;
}

function grantFor(identity: HostIdentity, over: Partial<E2EGrant> = {}, signer = proxyKey): { token: string; grant: E2EGrant } {
  const now = Date.now();
  const grant: E2EGrant = {
    v: 1,
    id: randomBytes(16).toString('hex'),
    iss: PROXY_ID,
    sub: 'alice',
    key: spkiHash(alice.cert),
    roles: ['access'],
    service: 'app',
    resource: 'echo',
    agent: identity.hostId,
    iat: now,
    exp: now + GRANT_TTL_MS,
    ...over,
  };
  return { token: signGrant(grant, signer), grant };
}

/**
 * Plays the Proxy and the client for one stream: takes an idle data connection of the tunnel (kid), sends e2e-open
 * for it (or for `conn`), and starts TLS with the agent on it as the client would through the Proxy's splice.
 */
async function openStream(hostId: string, kid: string, token: string, creds: Creds | undefined, options: { conn?: number; openAfterMs?: number; beforeTls?: () => Promise<void> } = {}): Promise<{ socket: TLSSocket; data: DataConn }> {
  const data = idleOf(kid)[0]!;
  data.used = true;
  const grantId = (JSON.parse(Buffer.from(token.split('.')[0]!, 'base64url').toString('utf8')) as E2EGrant).id;
  const open = () => writeJsonLine(tunnels.get(hostId)!.link.control, { type: 'e2e-open', conn: options.conn ?? data.n, grant: token, client_src: '192.0.2.7:40000', client_dst: frontAddr });
  // openAfterMs: the client's ClientHello is sent first (a Proxy may splice before its e2e-open reaches the agent).
  if (options.openAfterMs === undefined) open();
  else setTimeout(open, options.openAfterMs);
  await options.beforeTls?.();
  const socket = tls.connect({
    socket: data.socket,
    servername: e2eServerName(grantId),
    ALPNProtocols: [E2E_ALPN],
    ca: auth.auth.host.tls.certPem,
    ...(creds ? { cert: creds.cert, key: creds.key } : {}),
    checkServerIdentity: (_host, cert) => {
      const id = identityFromCert(cert.raw);
      return id.kind === 'host' && id.name === hostId ? undefined : new Error(`not agent ${hostId}`);
    },
  });
  socket.on('error', () => undefined);
  return { socket, data };
}

/** The stream after the agent's {"ok":true,"framed":true}: its bytes in frames that say their end (src/stream/framed.ts). */
async function okFramed(socket: TLSSocket): Promise<FramedStream> {
  expect(await answerOf(socket)).toEqual({ ok: true, framed: true });
  return new FramedStream(socket);
}

async function answerOf(socket: TLSSocket): Promise<DialAnswer> {
  return readJsonLine<DialAnswer>(socket, { what: 'dial answer', timeoutMs: 10_000 });
}

async function refusal(hostId: string, kid: string, token: string, creds: Creds | undefined): Promise<string> {
  const { socket } = await openStream(hostId, kid, token, creds);
  const answer = await answerOf(socket);
  socket.destroy();
  expect(answer.ok).toBe(false);
  if (answer.ok) return '';
  expect(answer.error.code).toBe('GW_ERR_E2E_REFUSED');
  return answer.error.message;
}

/**
 * An e2e-open of `token` on a stand-in for the agent's tunnel to another Proxy (its data connection a loopback
 * pair), with alice's TLS on the far end; answers the agent's refusal message.
 */
async function replayOn(streams: E2EStreams, proxyId: string, proxyCert: X509Certificate, token: string): Promise<string> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const accepted = once(server, 'connection') as Promise<[net.Socket]>;
  const near = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  const [far] = await accepted;
  server.close();
  streams.onOpen({ type: 'e2e-open', conn: 1, grant: token, client_src: '192.0.2.8:40000', client_dst: frontAddr }, {
    proxyId,
    proxyCert,
    take: (n) => (n === 1 ? far : undefined),
    track: () => undefined,
    serve: () => far.destroy(),
    sendEvent: () => undefined,
  });
  const socket = tls.connect({ socket: near, servername: 'localhost', ALPNProtocols: [E2E_ALPN], ca: auth.auth.host.tls.certPem, cert: alice.cert, key: alice.key, checkServerIdentity: () => undefined });
  socket.on('error', () => undefined);
  const answer = await answerOf(socket);
  socket.destroy();
  expect(answer.ok).toBe(false);
  return answer.ok ? '' : `${answer.error.code} ${answer.error.message}`;
}

async function echoes(socket: Duplex, bytes: Buffer): Promise<Buffer> {
  const got: Buffer[] = [];
  let n = 0;
  const done = new Promise<void>((resolve, reject) => {
    socket.on('data', (c: Buffer) => {
      got.push(c);
      n += c.length;
      if (n >= bytes.length) resolve();
    });
    socket.once('close', () => reject(new Error(`closed after ${n} bytes`)));
  });
  socket.write(bytes);
  await done;
  return Buffer.concat(got);
}

describe('end-to-end streams at the agent', () => {
  it('says e2e in the hello of a v2 tunnel and keeps the pool of data connections the Proxy checks', async () => {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const hello = hellos.find((h) => h.hostId === identity.hostId);
    expect(hello?.e2e).toEqual({ v: 1, pool: 2, kube: true, peered: true, stream: true });
    expect(idleOf(kid).map((c) => c.n).sort()).toEqual([1, 2]);
    expect(refusedData).toBe(0);
  });

  it('keeps at most 8 (what a Proxy keeps per tunnel), whatever it is given', async () => {
    const { identity } = await startAgent({ e2e: { pool: 100 } });
    await poolReady(identity.hostId, 8);
    expect(hellos.find((h) => h.hostId === identity.hostId)?.e2e).toEqual({ v: 1, pool: 8, kube: true, peered: true, stream: true });
    expect(agents[0]!.dataConnections.length).toBe(8);
  });

  it('replaces a connection idle for its whole idle time with a new number, not counted as a failure', async () => {
    const delays: number[] = [];
    const backoffDeps = { setTimer: (fn: () => void, ms: number) => (delays.push(ms), setTimeout(fn, ms)), clearTimer: (h: unknown) => clearTimeout(h as NodeJS.Timeout) };
    const { identity } = await startAgent({ e2e: { pool: 2, data: { idleMaxMs: 300, backoffDeps } } });
    const kid = await poolReady(identity.hostId);
    const first = idleOf(kid);
    await waitUntil('both replaced', () => first.every((c) => c.socket.destroyed) && idleOf(kid).length === 2, 10_000);
    expect(Math.min(...idleOf(kid).map((c) => c.n))).toBeGreaterThan(2);
    expect(delays).toEqual([]); // no backoff: an idle replacement is not a failure
  });

  it('with pool 0 says nothing of e2e and dials no data connection', async () => {
    const { identity } = await startAgent({ e2e: { pool: 0 } });
    const hello = hellos.find((h) => h.hostId === identity.hostId);
    expect(hello).toBeDefined();
    expect(hello!.e2e).toBeUndefined();
    expect(kidOf(identity.hostId)).toBeUndefined();
  });

  it('serves a good stream byte-exact after {"ok":true}, reports it with e2e: true, and refills the pool', async () => {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const { token, grant } = grantFor(identity);
    const { socket } = await openStream(identity.hostId, kid, token, alice);
    const fsocket = await okFramed(socket);
    const bytes = randomBytes(256 * 1024);
    expect((await echoes(fsocket, bytes)).equals(bytes)).toBe(true);
    // The taken connection is replaced: two idle again, the new one with the next number.
    await poolReady(identity.hostId, 2);
    expect(Math.max(...idleOf(kid).map((c) => c.n))).toBe(3);
    fsocket.end();
    await waitUntil('the agent reported the session', async () => (await auth.auth.listEvents(auth.auth.adminIdentity(), 50)).some((e) => e.event.event === 'app.session.end' && e.event.grant === grant.id), 10_000);
    const events = (await auth.auth.listEvents(auth.auth.adminIdentity(), 50)).map((e) => e.event).filter((e) => e.grant === grant.id);
    expect(events.map((e) => e.event).sort()).toEqual(['app.session.end', 'app.session.start']);
    expect(events[0]).toMatchObject({ e2e: true, user: 'alice', resource: 'echo', client: '192.0.2.7:40000' });
  });

  it("takes an e2e-open that overtook the Proxy's answer on its data connection, once the answer comes", async () => {
    heldAnswers = [];
    try {
      const { identity } = await startAgent();
      const kid = await poolReady(identity.hostId, 1);
      expect(agents[0]!.dataConnections).toEqual([]); // its answer is held: not yet idle at a known Proxy
      // The e2e-open goes first; the answer (which a Proxy writes before a client's byte) is let out after a pause.
      const release = async () => {
        await new Promise((r) => setTimeout(r, 300));
        const held = heldAnswers ?? [];
        heldAnswers = undefined;
        for (const answer of held) answer();
      };
      const { socket } = await openStream(identity.hostId, kid, grantFor(identity).token, alice, { beforeTls: release });
      const fsocket = await okFramed(socket);
      const bytes = randomBytes(4096);
      expect((await echoes(fsocket, bytes)).equals(bytes)).toBe(true);
      fsocket.destroy();
    } finally {
      heldAnswers = undefined;
    }
  });

  it('takes a ClientHello that reached the data connection before its e2e-open', async () => {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const { socket } = await openStream(identity.hostId, kid, grantFor(identity).token, alice, { openAfterMs: 300 });
    const fsocket = await okFramed(socket);
    const bytes = randomBytes(4096);
    expect((await echoes(fsocket, bytes)).equals(bytes)).toBe(true);
    fsocket.destroy();
  });

  it('refuses, inside the TLS with GW_ERR_E2E_REFUSED, every grant or client that does not pass a check', async () => {
    const { identity } = await startAgent({ e2e: { pool: 4, data: { backoff: { firstMs: 50, maxMs: 200 } } } });
    const kid = await poolReady(identity.hostId, 2);
    const next = async () => {
      await poolReady(identity.hostId, 1);
      return kid;
    };
    const other = generateKeyPair().privateKeyPem;
    expect(await refusal(identity.hostId, await next(), grantFor(identity, {}, other).token, alice)).toContain("signature is not the issuing Proxy's");
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { agent: '00000000-0000-4000-8000-00000000ffff' }).token, alice)).toContain('not this one');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { iss: 'another-proxy' }).token, alice)).toContain('to which this agent holds no tunnel');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { resource: 'not-served' }).token, alice)).toContain('does not serve app "not-served"');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { sub: 'bob', key: spkiHash(bob.cert) }).token, alice)).toContain('the grant is for user "bob", the certificate names "alice"');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { key: spkiHash(bob.cert) }).token, alice)).toContain('key is not the one the grant is bound to');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { roles: ['access', 'auditor'] }).token, alice)).toContain('lacks the role(s) the grant was authorized with: auditor');
    const past = Date.now() - 2 * GRANT_TTL_MS;
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { iat: past, exp: past + GRANT_TTL_MS }).token, alice)).toContain('expired');
    // Replayed: the first use opens the stream, the second is refused.
    const once1 = grantFor(identity);
    const first = await openStream(identity.hostId, await next(), once1.token, alice);
    const ffirst_socket = await okFramed(first.socket);
    ffirst_socket.destroy();
    expect(await refusal(identity.hostId, await next(), once1.token, alice)).toContain('used before');
    // A certificate of another user CA (same cluster name, user and key): not this cluster's.
    const foreignCa = await generateAuthority('user', CLUSTER);
    const aliceId = identityFromCert(alice.cert);
    const foreign = { cert: await issueTlsCert(foreignCa, { identity: aliceId, publicKeyPem: new X509Certificate(alice.cert).publicKey.export({ type: 'spki', format: 'pem' }) as string, usage: 'client', ttlMs: 3600_000 }), key: alice.key };
    expect(await refusal(identity.hostId, await next(), grantFor(identity).token, foreign)).toContain('not a user certificate of this cluster');
    expect(await refusal(identity.hostId, await next(), grantFor(identity).token, undefined)).toContain('no client certificate');
    // The tunnel is untouched by all of it.
    expect(agents[0]!.getState()).toBe('connected');
  });

  it('ignores an e2e-open for a data connection it does not hold, and closes one whose e2e-open never comes', async () => {
    // Idle connections are not replaced during the test: only the e2e-open deadline can close this one.
    const { identity } = await startAgent({ e2e: { pool: 2, data: { backoff: { firstMs: 50, maxMs: 200 }, openWaitMs: 1_000, idleMaxMs: 600_000 } } });
    const kid = await poolReady(identity.hostId);
    const { socket, data } = await openStream(identity.hostId, kid, grantFor(identity).token, alice, { conn: 999 });
    // The client's ClientHello reached data connection n, which no e2e-open assigned: it is closed at the deadline.
    await new Promise((resolve) => socket.once('close', resolve));
    expect(socket.authorized).toBe(false);
    await waitUntil('the unassigned data connection closed', () => data.socket.destroyed, 5_000);
    await poolReady(identity.hostId, 2); // replaced
    expect(agents[0]!.getState()).toBe('connected');
  });

  it("closes a user's open stream when the Proxy says the user is locked, and refuses the user's new ones", async () => {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const carolGrant = (over: Partial<E2EGrant> = {}) => grantFor(identity, { sub: 'carol', key: spkiHash(carol.cert), ...over }).token;
    const { socket } = await openStream(identity.hostId, kid, carolGrant(), carol);
    const fsocket = await okFramed(socket);
    await poolReady(identity.hostId, 1);
    const bystander = await openStream(identity.hostId, kid, grantFor(identity).token, alice);
    const fbystander_socket = await okFramed(bystander.socket);
    const untrack = tunnels.trackE2E(identity.hostId, await auth.auth.resolveCaller(identityFromCert(carol.cert)));
    const untrackAlice = tunnels.trackE2E(identity.hostId, await auth.auth.resolveCaller(identityFromCert(alice.cert)));
    const closed = new Promise((resolve) => fsocket.once('close', resolve));
    const signedBefore = Date.now();
    await auth.auth.createLock(auth.auth.adminIdentity(), { target: { user: 'carol' }, name: 'lock-carol' });
    await closed;
    untrack();
    untrackAlice();
    // Another user's stream on the same agent goes on.
    const bytes = randomBytes(1024);
    expect((await echoes(fbystander_socket, bytes)).equals(bytes)).toBe(true);
    fbystander_socket.destroy();
    await poolReady(identity.hostId, 1);
    // A grant signed before the lock (a compromised or slow Proxy's) is refused.
    expect(await refusal(identity.hostId, kid, carolGrant({ iat: signedBefore - 1_000, exp: signedBefore + GRANT_TTL_MS }), carol)).toContain('user "carol" is locked');
  });

  it("takes a grant of another Proxy it holds a tunnel to, checked with that tunnel's certificate; refuses it once that tunnel is gone", async () => {
    const identity0 = await joinHost();
    const streams = new E2EStreams({ identity: identity0, services: ['app'], resources: { databases: [], apps: [{ name: 'echo', kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] }, ssh: false, log: createLogger({ level: 'silent' }) });
    const { identity } = await startAgent({ identity: identity0, e2e: { pool: 2, streams } });
    const kid = await poolReady(identity.hostId);
    // Proxy B: its certificate as the agent's tunnel to it would have verified it (registerProxy is what a tunnel does).
    const b = generateKeyPair();
    const bCert = new X509Certificate(await auth.auth.issueServerCert(b.publicKeyPem, ['localhost'], 'proxy-b'));
    const forget = streams.registerProxy('proxy-b', bCert);
    const grantOfB = grantFor(identity, { iss: 'proxy-b' }, b.privateKeyPem).token;
    const { socket } = await openStream(identity.hostId, kid, grantOfB, alice);
    const fsocket = await okFramed(socket);
    const bytes = randomBytes(1024);
    expect((await echoes(fsocket, bytes)).equals(bytes)).toBe(true);
    fsocket.destroy();
    // The same grant routed again by Proxy B itself (on the agent's tunnel to B, here a stand-in): each Proxy takes
    // a grant once, so across Proxies it is the agent's single use that refuses it.
    expect(await replayOn(streams, 'proxy-b', bCert, grantOfB)).toMatch(/^GW_ERR_E2E_REFUSED .*used before/);
    // Signed by B's key but naming this tunnel's Proxy: checked with this tunnel's certificate, refused.
    expect(await refusal(identity.hostId, await poolReady(identity.hostId, 1), grantFor(identity, {}, b.privateKeyPem).token, alice)).toContain("signature is not the issuing Proxy's");
    forget();
    expect(await refusal(identity.hostId, await poolReady(identity.hostId, 1), grantFor(identity, { iss: 'proxy-b' }, b.privateKeyPem).token, alice)).toContain('to which this agent holds no tunnel');
  });

  it("takes a grant of a Proxy it holds no tunnel to (Proxy peering) by the grant's own issuer certificate, and refuses another CA's, a non-Proxy host's, another name's", async () => {
    const { identity } = await startAgent({ e2e: { pool: 4, data: { backoff: { firstMs: 50, maxMs: 200 } }, handshakeTimeoutMs: 2_000 } });
    const kid = await poolReady(identity.hostId, 2);
    const next = () => poolReady(identity.hostId, 1).then(() => kid);
    // Proxy C: a Proxy of this cluster the agent holds no tunnel to; its certificate travels in the grant (x5c).
    const c = generateKeyPair();
    const cX5c = new X509Certificate(await auth.auth.issueServerCert(c.publicKeyPem, ['localhost'], 'proxy-c')).raw.toString('base64url');
    const ofC = grantFor(identity, { iss: 'proxy-c', x5c: cX5c }, c.privateKeyPem).token;
    const { socket } = await openStream(identity.hostId, await next(), ofC, alice);
    const framed = await okFramed(socket);
    const bytes = randomBytes(2048);
    expect((await echoes(framed, bytes)).equals(bytes)).toBe(true);
    framed.destroy();
    // The same name and role from another host CA.
    const foreignCa = await generateAuthority('host', CLUSTER);
    const f = generateKeyPair();
    const fX5c = new X509Certificate(await issueTlsCert(foreignCa, { publicKeyPem: f.publicKeyPem, identity: { kind: 'host', name: 'proxy-c', cluster: CLUSTER, roles: ['proxy'] }, ttlMs: 3600_000, usage: 'both' })).raw.toString('base64url');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { iss: 'proxy-c', x5c: fX5c }, f.privateKeyPem).token, alice)).toContain("was not signed by this cluster's host CA");
    // An agent's host certificate of this cluster (no role proxy) signing for itself.
    const other = await joinHost();
    const agentX5c = new X509Certificate(other.cert).raw.toString('base64url');
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { iss: other.hostId, x5c: agentX5c }, other.key).token, alice)).toContain("not a Proxy's");
    // Proxy C's certificate and key, naming another Proxy as the issuer.
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { iss: 'proxy-d', x5c: cX5c }, c.privateKeyPem).token, alice)).toContain('the grant names Proxy proxy-d, its certificate names proxy-c');
    // Carried by C but signed by another key: the signature is still checked.
    expect(await refusal(identity.hostId, await next(), grantFor(identity, { iss: 'proxy-c', x5c: cX5c }, generateKeyPair().privateKeyPem).token, alice)).toContain("signature is not the issuing Proxy's");
  });

  it("forgets a locked user after LOCKED_USER_HOLD_MS (an honest Proxy signs no grant while the lock lasts; one lifted is not held against the user)", async () => {
    let offset = 0;
    const now = () => Date.now() + offset;
    const identity0 = await joinHost();
    const streams = new E2EStreams({ identity: identity0, services: ['app'], resources: { databases: [], apps: [{ name: 'echo', kind: 'tcp', labels: {} }], desktops: [], kube_clusters: [] }, ssh: false, log: createLogger({ level: 'silent' }), now });
    const { identity } = await startAgent({ identity: identity0, e2e: { pool: 2, streams } });
    const kid = await poolReady(identity.hostId);
    const grant = () => grantFor(identity, { sub: 'bob', key: spkiHash(bob.cert), iat: now(), exp: now() + GRANT_TTL_MS }).token;
    writeJsonLine(tunnels.get(identity.hostId)!.link.control, { type: 'locks', users: ['bob'], reason: 'test' });
    await waitUntil('the lock taken', async () => {
      await poolReady(identity.hostId, 1);
      const { socket } = await openStream(identity.hostId, kid, grant(), bob);
      const answer = await answerOf(socket);
      socket.destroy();
      return !answer.ok && answer.error.message.includes('locked');
    }, 10_000);
    offset = LOCKED_USER_HOLD_MS + 1_000;
    await poolReady(identity.hostId, 1);
    const { socket } = await openStream(identity.hostId, kid, grant(), bob);
    const fsocket = await okFramed(socket);
    fsocket.destroy();
  });

  it("a lock with the Proxy's time refuses the user's grants issued until then, and takes one issued after (an unlock) at once", async () => {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const at = Date.now();
    const grant = (iat: number) => grantFor(identity, { sub: 'bob', key: spkiHash(bob.cert), iat, exp: iat + GRANT_TTL_MS }).token;
    writeJsonLine(tunnels.get(identity.hostId)!.link.control, { type: 'locks', users: ['bob'], reason: 'test', at });
    await waitUntil('the lock taken', async () => {
      await poolReady(identity.hostId, 1);
      const { socket } = await openStream(identity.hostId, kid, grant(at - 1_000), bob);
      const answer = await answerOf(socket);
      socket.destroy();
      return !answer.ok && answer.error.message.includes('locked');
    }, 10_000);
    await poolReady(identity.hostId, 1);
    const { socket } = await openStream(identity.hostId, kid, grant(at + 1), bob);
    (await okFramed(socket)).destroy();
  });

  it('replaces a data connection the path cut, the tunnel untouched; the tunnel stopping closes them all', async () => {
    const { agent, identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const victim = idleOf(kid)[0]!;
    victim.socket.destroy();
    await waitUntil('the cut connection replaced', () => idleOf(kid).length === 2 && !idleOf(kid).includes(victim), 10_000);
    expect(Math.max(...idleOf(kid).map((c) => c.n))).toBe(3);
    expect(agent.getState()).toBe('connected');
    expect(agent.dataConnections.length).toBe(2);
    // The tunnel stops: so do its data connections.
    agent.stop();
    await waitUntil('the idle data connections closed with the tunnel', () => idleOf(kid).length === 0, 10_000);
    expect(agent.dataConnections).toEqual([]);
  });
});

/**
 * Plays a Proxy with no data connection of the agent waiting: opens a stream of the agent's tunnel, writes `first`
 * (the e2e-open with conn 0 by default) as its first line, and starts the client's TLS with the agent on it.
 */
async function tunnelStreamTls(hostId: string, token: string, creds: Creds, first?: Record<string, unknown>): Promise<{ stream: Duplex; socket: TLSSocket }> {
  const stream = await tunnels.get(hostId)!.link.open('192.0.2.9', 40000);
  stream.on('error', () => undefined);
  writeJsonLine(stream, first ?? { type: 'e2e-open', conn: 0, grant: token, client_src: '192.0.2.9:40000', client_dst: frontAddr });
  const grantId = (JSON.parse(Buffer.from(token.split('.')[0]!, 'base64url').toString('utf8')) as E2EGrant).id;
  const socket = tls.connect({
    socket: stream,
    servername: e2eServerName(grantId),
    ALPNProtocols: [E2E_ALPN],
    ca: auth.auth.host.tls.certPem,
    cert: creds.cert,
    key: creds.key,
    checkServerIdentity: (_host, cert) => {
      const id = identityFromCert(cert.raw);
      return id.kind === 'host' && id.name === hostId ? undefined : new Error(`not agent ${hostId}`);
    },
  });
  socket.on('error', () => undefined);
  return { stream, socket };
}

describe('an end-to-end stream on a stream of the tunnel (no data connection waited at the Proxy)', () => {
  it('is checked and served as on a data connection, and its grant is spent for both', async () => {
    const { agent, identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const { token, grant } = grantFor(identity);
    const { socket } = await tunnelStreamTls(identity.hostId, token, alice);
    const fsocket = await okFramed(socket);
    const bytes = randomBytes(256 * 1024);
    expect((await echoes(fsocket, bytes)).equals(bytes)).toBe(true);
    // No data connection was taken for it.
    expect(idleOf(kid)).toHaveLength(2);
    fsocket.end();
    await waitUntil('the agent reported the session', async () => (await auth.auth.listEvents(auth.auth.adminIdentity(), 50)).some((e) => e.event.event === 'app.session.end' && e.event.grant === grant.id), 10_000);
    // The same grant again, on a data connection this time: used.
    expect(await refusal(identity.hostId, kid, token, alice)).toContain('used before');
    // And a grant the checks refuse is refused on a tunnel stream inside the TLS, as on a data connection.
    const refused = await tunnelStreamTls(identity.hostId, grantFor(identity, { resource: 'not-served' }).token, alice);
    const answer = await answerOf(refused.socket);
    expect(answer.ok).toBe(false);
    if (!answer.ok) expect(answer.error).toMatchObject({ code: 'GW_ERR_E2E_REFUSED', message: expect.stringContaining('does not serve app "not-served"') });
    refused.socket.destroy();
    expect(agent.getState()).toBe('connected');
  });

  it('hostile: a tunnel stream whose e2e-open names a data connection, or carries no grant, is closed before any TLS; the tunnel stays', async () => {
    const { agent, identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const { token } = grantFor(identity);
    for (const first of [
      { type: 'e2e-open', conn: 1, grant: token, client_src: '192.0.2.9:40000', client_dst: frontAddr },
      { type: 'e2e-open', conn: 0, grant: 42, client_src: '192.0.2.9:40000', client_dst: frontAddr },
    ]) {
      const { stream, socket } = await tunnelStreamTls(identity.hostId, token, alice, first);
      await new Promise((resolve) => socket.once('close', resolve));
      expect(socket.authorized).toBe(false);
      expect(stream.destroyed).toBe(true);
    }
    // Data connection 1 was not taken by the stream that named it, and the grant was not spent.
    expect(idleOf(kid)).toHaveLength(2);
    const { socket } = await tunnelStreamTls(identity.hostId, token, alice);
    (await okFramed(socket)).destroy();
    expect(agent.getState()).toBe('connected');
  });
});

describe('hostile and slow clients on a data connection', () => {
  /** Takes an idle data connection and assigns it with a good grant, as the Proxy would; the test then plays the client raw. */
  async function assigned(): Promise<{ data: DataConn; identity: HostIdentity }> {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    const data = idleOf(kid)[0]!;
    data.used = true;
    writeJsonLine(tunnels.get(identity.hostId)!.link.control, { type: 'e2e-open', conn: data.n, grant: grantFor(identity).token, client_src: '192.0.2.7:40000', client_dst: frontAddr });
    return { data, identity };
  }

  it('closes a stream whose client never starts TLS, at the handshake deadline', async () => {
    const { data } = await assigned();
    // No idle replacement and no other timer can close it: only the handshake deadline (2 s in these agents).
    await new Promise((resolve) => data.socket.once('close', resolve));
    expect(agents[0]!.getState()).toBe('connected');
  });

  it('closes a stream whose client sends 1 MiB of something that is not TLS, keeping none of it', async () => {
    const { data } = await assigned();
    const closed = new Promise((resolve) => data.socket.once('close', resolve));
    data.socket.on('error', () => undefined);
    data.socket.write(Buffer.concat([Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'), randomBytes(1024 * 1024)]));
    await closed;
    expect(agents[0]!.getState()).toBe('connected');
  });
});

describe('a database end to end', () => {
  const dbAccess = { users: { allow: ['alice'], deny: [] }, names: { allow: ['shop'], deny: [] } };

  it("checks the client's startup against the grant's db_access and reports the session with the database user and name", async () => {
    const { identity } = await startAgent(
      { services: ['db'], resources: { databases: [{ name: 'pg', protocol: 'postgres', labels: {} }], apps: [], desktops: [], kube_clusters: [] } },
      ['db'],
    );
    const kid = await poolReady(identity.hostId);
    const { token, grant } = grantFor(identity, { service: 'db', resource: 'pg', db_access: dbAccess });
    const { socket } = await openStream(identity.hostId, kid, token, alice);
    const fsocket = await okFramed(socket);
    const startup = pgStartup([['user', 'alice'], ['database', 'shop']]);
    // The "database" is the echo server: the startup it got comes back byte for byte.
    expect((await echoes(fsocket, startup)).equals(startup)).toBe(true);
    fsocket.end();
    await waitUntil('the agent reported the database session', async () => (await auth.auth.listEvents(auth.auth.adminIdentity(), 50)).some((e) => e.event.event === 'db.session.end' && e.event.grant === grant.id), 10_000);
    const start = (await auth.auth.listEvents(auth.auth.adminIdentity(), 50)).map((e) => e.event).find((e) => e.event === 'db.session.start' && e.grant === grant.id);
    expect(start).toMatchObject({ e2e: true, user: 'alice', resource: 'pg', db_user: 'alice', db_name: 'shop', protocol: 'postgres' });

    // A database user the grant does not allow: the gate's own refusal (a PostgreSQL ErrorResponse), nothing relayed.
    await poolReady(identity.hostId, 1);
    const other = await openStream(identity.hostId, kid, grantFor(identity, { service: 'db', resource: 'pg', db_access: dbAccess }).token, alice);
    const fother_socket = await okFramed(other.socket);
    const got: Buffer[] = [];
    fother_socket.on('data', (c: Buffer) => got.push(c));
    fother_socket.write(pgStartup([['user', 'postgres'], ['database', 'shop']]));
    await new Promise((resolve) => fother_socket.once('end', resolve));
    const reply = Buffer.concat(got);
    expect(reply[0]).toBe('E'.charCodeAt(0));
    expect(reply.toString('latin1')).toContain('postgres');
  });
});

describe('SSH end to end', () => {
  it("hands the stream to the SSH Service with the grant's login@port and user, after {\"ok\":true}; an agent without one refuses", async () => {
    const seen: Array<{ resource: string; user?: string; client: string }> = [];
    const { identity } = await startAgent(
      {
        services: ['app', 'ssh'],
        serveSsh: (channel, request) => {
          seen.push({ resource: request.resource, ...(request.user ? { user: request.user } : {}), client: request.client_src });
          channel.end('SSH-2.0-test\r\n');
        },
      },
      ['app', 'node'],
    );
    const kid = await poolReady(identity.hostId);
    const { socket } = await openStream(identity.hostId, kid, grantFor(identity, { service: 'ssh', resource: 'root@22' }).token, alice);
    const fsocket = await okFramed(socket);
    const [banner] = (await new Promise((resolve) => fsocket.once('data', (c: Buffer) => resolve([c])))) as [Buffer];
    expect(banner.toString()).toBe('SSH-2.0-test\r\n');
    expect(seen).toEqual([{ resource: 'root@22', user: 'alice', client: '192.0.2.7:40000' }]);
    fsocket.destroy();
  });

  it('refuses an ssh grant on an agent that runs no SSH Service', async () => {
    const { identity } = await startAgent();
    const kid = await poolReady(identity.hostId);
    expect(await refusal(identity.hostId, kid, grantFor(identity, { service: 'ssh', resource: 'root@22' }).token, alice)).toContain('does not serve ssh');
  });
});

describe('a path that drops every data connection', () => {
  it('redials each one only after the backoff, never in a loop, and the tunnel stays', async () => {
    const delays: number[] = [];
    const { agent, identity } = await startAgent({
      e2e: { pool: 2, data: { backoff: { firstMs: 50, maxMs: 200 }, backoffDeps: { setTimer: (fn, ms) => (delays.push(ms), setTimeout(fn, ms)), clearTimer: (h) => clearTimeout(h as NodeJS.Timeout) } } },
    });
    const kid = await poolReady(identity.hostId);
    let cut = 0;
    arrivals.on('cut', () => cut++);
    cutKid = kid;
    try {
      for (const c of idleOf(kid)) c.socket.destroy();
      await waitUntil('six data connections cut', () => cut >= 6, 15_000);
    } finally {
      cutKid = undefined;
    }
    // Every redial after a cut waited for the backoff (equal jitter: at least half of 50 ms, doubling to 200).
    expect(delays.length).toBeGreaterThanOrEqual(6);
    expect(delays.every((d) => d >= 25 && d <= 200)).toBe(true);
    expect(Math.max(...delays)).toBeGreaterThanOrEqual(100);
    expect(agent.getState()).toBe('connected');
    await poolReady(identity.hostId, 2); // the path is good again: the pool is whole
  });
});

describe('end-to-end streams through a corporate proxy', () => {
  let squid: Squid;
  beforeAll(async () => {
    await chmod(dir, 0o755); // squid reads its hosts_file as the user "proxy"
    const hostsFile = join(dir, 'hosts');
    await writeFile(hostsFile, `127.0.0.1 ${PROXY_NAME}\n`, { mode: 0o644 });
    squid = await startSquid({ extraConfig: [`hosts_file ${hostsFile}`] });
  });
  afterAll(async () => {
    await squid?.stop();
  });

  it('dials the data connections through HTTPS_PROXY, as the tunnel, and a stream works through them', async () => {
    const { agent, identity } = await startAgent({ dialer: new Dialer({ env: { HTTPS_PROXY: squid.url } }) });
    const kid = await poolReady(identity.hostId);
    // The ClientHello first, as in the case above, on a connection the Dialer got through squid's CONNECT.
    const { socket } = await openStream(identity.hostId, kid, grantFor(identity).token, alice, { openAfterMs: 300 });
    const fsocket = await okFramed(socket);
    const bytes = randomBytes(64 * 1024);
    expect((await echoes(fsocket, bytes)).equals(bytes)).toBe(true);
    fsocket.destroy();
    agent.stop();
    // Squid writes a CONNECT line when its tunnel closes: the tunnel's, and one per data connection.
    await waitUntil('squid logged the CONNECTs', async () => (await squid.readAccessLog()).filter((l) => l.includes(`CONNECT ${frontAddr}`)).length >= 3, 15_000);
  });
});

describe('gateway.e2e_pool', () => {
  const parse = (v: string) => parseConfig(['gateway:', `  e2e_pool: ${v}`, ''].join('\n'), 'e2e.yaml');
  it('defaults to 2, takes 0 to 8, and names what is wrong with anything else', () => {
    expect(parseConfig('', 'empty.yaml').gateway.e2e_pool).toBe(2);
    expect(parse('0').gateway.e2e_pool).toBe(0);
    expect(parse('8').gateway.e2e_pool).toBe(8);
    for (const bad of ['9', '-1', '1.5', 'two', '"2"']) expect(() => parse(bad), bad).toThrow(/gateway\.e2e_pool.*integer from 0 to 8/s);
  });
});
