/**
 * The Proxy's side of an agent's move to a better transport (src/proxy/tunnel.ts, drain_previous in the hello;
 * src/agent/ladder.ts): an Auth Service and a front door with a TunnelServer whose drain cap is short, and
 * TunnelAgents of this process (a probe says drain_previous, as the pool's does).
 *
 *   drain          the old tunnel's stream goes on, new dials go to the new tunnel, the old one closes when its
 *                  stream has
 *   control        a plain reconnect (no drain_previous) cuts the old tunnel's stream, as it always did
 *   several        a second move while one tunnel drains leaves it draining (a hand-over's successor that climbs
 *                  the ladder does not cut the old process's sessions); beyond TUNNEL_DRAINING_PER_AGENT_MAX
 *                  draining tunnels of one agent the oldest is closed at once
 *   hand-over      a new process's first hello (takeOver) drains the tunnel of the process before for its
 *                  drain_ms, and drainCapOf keeps a lying drain_ms within bounds
 *   cap            a stream that never ends is closed with its tunnel at the drain cap
 *   another host   a drain_previous from another host leaves this host's tunnel alone
 */
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import getPort from 'get-port';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadHostIdentity, saveHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { TunnelAgent, type TunnelAgentOptions } from '../../src/agent/tunnel.js';
import { generateKeyPair, sshPrivateKeyPem } from '../../src/auth/pki.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startFrontDoor, type FrontDoor } from '../../src/proxy/frontdoor.js';
import { drainCapOf, TunnelServer, type AgentLink } from '../../src/proxy/tunnel.js';
import { TUNNEL_DRAINING_PER_AGENT_MAX, TUNNEL_HANDOVER_DRAIN_MAX_MS } from '../../src/tunnel/protocol.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { VERSION } from '../../src/version.js';
import { echoAgentOptions } from '../helpers/tunnelagent.js';
import { waitUntil } from '../helpers/wait.js';

setRootLogger(createLogger({ level: process.env.DRAIN_LOG ? 'debug' : 'silent', format: 'json' }));

const CLUSTER = 'drain.example';
/** Long enough that a tunnel closed well before it was closed by a rule other than the cap. */
const DRAIN_CAP_MS = 20_000;
let dir: string;
const authLife = new Lifecycle();
let auth: AuthRole;
let tunnels: TunnelServer;
let door: FrontDoor;
let echo: net.Server;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-drain-'));
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const port = await getPort({ host: '127.0.0.1' });
  const yaml = ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'data')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: 127.0.0.1:${port}`, ''].join('\n');
  const config = parseConfig(yaml, 'drain test');
  const limits = new ConnectionLimits(limitSettings(config));
  authLife.onStop('backend', () => limits.close());
  auth = await startAuthRole({ config, limits, lifecycle: authLife });
  tunnels = new TunnelServer({ auth: auth.auth, hostKey: sshPrivateKeyPem(generateKeyPair().privateKeyPem), heartbeatIntervalMs: 20_000, heartbeatCountMax: 3, publicAddr: 'drain', proxyId: 'drain-proxy', drainCapMs: DRAIN_CAP_MS });
  const keys = generateKeyPair();
  door = await startFrontDoor({
    config,
    clusterName: CLUSTER,
    tls: { key: keys.privateKeyPem, cert: await auth.auth.issueServerCert(keys.publicKeyPem, ['127.0.0.1'], 'drain-proxy'), ca: [auth.auth.host.tls.certPem, auth.auth.user.tls.certPem] },
    api: auth.api,
    versions: new VersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    services: { tunnel: tunnels.handle },
    limits,
  });
});

afterAll(async () => {
  await tunnels?.close();
  await door?.close();
  await authLife.stop().catch(() => undefined);
  echo?.close();
  await rm(dir, { recursive: true, force: true });
});

let joined = 0;
async function joinHost(): Promise<HostIdentity> {
  const keys = generateKeyPair();
  const nodename = `drain-${++joined}`;
  const bundle = await auth.auth.joinLocal({ roles: ['db'], nodename, publicAddrs: [], publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey });
  saveHostIdentity(join(dir, nodename), keys.privateKeyPem, bundle, { roles: ['db'], nodename, server: door.addresses.web!, joinedVia: 'proxy' });
  return loadHostIdentity(join(dir, nodename))!;
}

const agents: TunnelAgent[] = [];
afterEach(() => {
  for (const a of agents.splice(0)) a.stop();
});

/** An agent for the identity, up at the Proxy; `probe` says drain_previous in its hello. */
async function up(identity: HostIdentity, extra: Partial<TunnelAgentOptions> = {}): Promise<{ agent: TunnelAgent; link: AgentLink }> {
  const before = tunnels.get(identity.hostId)?.link;
  const agent = new TunnelAgent(echoAgentOptions(identity, echo, extra));
  agents.push(agent);
  agent.start();
  await waitUntil('the tunnel is registered', () => agent.getState() === 'connected' && tunnels.get(identity.hostId) !== undefined && tunnels.get(identity.hostId)!.link !== before);
  return { agent, link: tunnels.get(identity.hostId)!.link };
}

function gone(link: AgentLink): () => boolean {
  let closed = false;
  link.onGone(() => (closed = true));
  return () => closed;
}

async function open(hostId: string): Promise<Duplex> {
  const stream = await tunnels.dial(hostId, { service: 'app', resource: 'pg', client_src: '127.0.0.1:1', client_dst: '127.0.0.1:2' });
  stream.on('error', () => undefined);
  return stream;
}

async function echoes(stream: Duplex, text: string): Promise<boolean> {
  if (stream.destroyed) return false;
  stream.write(text);
  const got = await Promise.race([once(stream, 'data').then(([c]) => (c as Buffer).toString()), once(stream, 'close').then(() => '')]);
  return got === text;
}

describe('an agent moving to a better transport (drain_previous)', () => {
  it('the old tunnel drains: its stream goes on, new dials go to the new tunnel, and it closes once that stream has', async () => {
    const identity = await joinHost();
    const first = await up(identity);
    const stream = await open(identity.hostId);
    expect(await echoes(stream, 'before')).toBe(true);
    const firstGone = gone(first.link);
    const second = await up(identity, { probe: true });
    void first.agent.drain(60_000);
    expect(second.link).not.toBe(first.link);
    expect(await echoes(stream, 'during the drain')).toBe(true);
    expect(firstGone()).toBe(false);
    const fresh = await open(identity.hostId);
    expect(await echoes(fresh, 'over the new tunnel')).toBe(true);
    expect(tunnels.get(identity.hostId)!.link).toBe(second.link);
    stream.destroy();
    await waitUntil('the drained tunnel closed after its last stream', firstGone);
    expect(await echoes(fresh, 'the new tunnel stays')).toBe(true);
  });

  it('control: a plain reconnect (no drain_previous) cuts the old tunnel with its stream, as before', async () => {
    const identity = await joinHost();
    const first = await up(identity);
    const stream = await open(identity.hostId);
    expect(await echoes(stream, 'before')).toBe(true);
    first.agent.stop();
    await up(identity);
    await waitUntil('the old stream is closed', () => stream.destroyed);
  });

  it('a second move while one tunnel drains leaves it draining, with its stream (a successor climbing the ladder)', async () => {
    const identity = await joinHost();
    // The agents whose tunnels the Proxy closes must not dial again during the test (a pool would have stopped
    // them): otherwise agents of one identity replace each other's tunnels and the last never settles.
    const noRedial = { backoff: { firstMs: 120_000, maxMs: 120_000, jitter: 'none' as const } };
    const first = await up(identity, noRedial);
    const stream = await open(identity.hostId);
    const firstGone = gone(first.link);
    await up(identity, { takeOver: { drainMs: 60_000 }, ...noRedial });
    await up(identity, { probe: true });
    expect(await echoes(stream, 'still draining')).toBe(true);
    expect(firstGone()).toBe(false);
  });

  it(`hostile: beyond ${TUNNEL_DRAINING_PER_AGENT_MAX} draining tunnels of one agent (each with a stream) the oldest is closed at once`, async () => {
    const identity = await joinHost();
    const noRedial = { backoff: { firstMs: 120_000, maxMs: 120_000, jitter: 'none' as const } };
    const streams: Duplex[] = [];
    const links: AgentLink[] = [];
    for (let i = 0; i <= TUNNEL_DRAINING_PER_AGENT_MAX; i++) {
      const { link } = await up(identity, { ...(i > 0 ? { probe: true } : {}), ...noRedial });
      links.push(link);
      streams.push(await open(identity.hostId));
    }
    const oldestGone = gone(links[0]!);
    await up(identity, { probe: true });
    // Well within the drain cap (20 s): closed by the per-agent rule, not by the cap.
    await waitUntil('the oldest draining tunnel is closed', oldestGone, DRAIN_CAP_MS / 2);
    await waitUntil('with its stream', () => streams[0]!.destroyed);
    for (const s of streams.slice(1)) expect(await echoes(s, 'the others drain on')).toBe(true);
  });

  it("a new process's first hello (takeOver) drains the old tunnel for its drain_ms, not the Proxy's cap", async () => {
    const identity = await joinHost();
    const first = await up(identity, { backoff: { firstMs: 120_000, maxMs: 120_000, jitter: 'none' as const } });
    const stream = await open(identity.hostId);
    const firstGone = gone(first.link);
    await up(identity, { takeOver: { drainMs: 1_000 } });
    expect(await echoes(stream, 'drains')).toBe(true);
    await waitUntil('closed at the asked drain (1 s), well before the cap (20 s)', firstGone, DRAIN_CAP_MS / 2);
    await waitUntil('with its stream', () => stream.destroyed);
  });

  it('hostile: drainCapOf keeps a drain_ms within [1 s, a day] and ignores what is not a number', () => {
    expect(drainCapOf({}, 600_000)).toBe(600_000);
    expect(drainCapOf({ drain_ms: 1_800_000 }, 600_000)).toBe(1_800_000);
    expect(drainCapOf({ drain_ms: 1e15 }, 600_000)).toBe(TUNNEL_HANDOVER_DRAIN_MAX_MS);
    expect(drainCapOf({ drain_ms: -5 }, 600_000)).toBe(1_000);
    expect(drainCapOf({ drain_ms: Number.NaN }, 600_000)).toBe(600_000);
    expect(drainCapOf({ drain_ms: Infinity }, 600_000)).toBe(600_000);
    expect(drainCapOf({ drain_ms: '99999999' as unknown as number }, 600_000)).toBe(600_000);
  });

  it('hostile: a stream that never ends is closed with the drained tunnel at the drain cap', { timeout: 60_000 }, async () => {
    const identity = await joinHost();
    const first = await up(identity);
    const stream = await open(identity.hostId);
    const firstGone = gone(first.link);
    await up(identity, { probe: true });
    expect(await echoes(stream, 'still open')).toBe(true);
    await waitUntil('the drain cap closed the tunnel', firstGone, DRAIN_CAP_MS + 15_000);
    await waitUntil('and its stream', () => stream.destroyed);
  });

  it("hostile: another host's drain_previous leaves this host's tunnel and stream alone", async () => {
    const a = await joinHost();
    const b = await joinHost();
    const first = await up(a);
    const stream = await open(a.hostId);
    const firstGone = gone(first.link);
    await up(b, { probe: true });
    expect(tunnels.get(a.hostId)!.link).toBe(first.link);
    expect(await echoes(stream, 'untouched')).toBe(true);
    expect(firstGone()).toBe(false);
  });
});
