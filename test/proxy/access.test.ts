/**
 * src/proxy/access.ts at module level: the handler the front door hands database, TCP and gateway-proxy-ssh
 * connections to, once their TLS has ended. Each test runs it on the server end of a real loopback connection
 * and plays the client on the other end: it sends a route header and reads the answer line.
 *
 * Fakes: the server end carries what a TLS socket would say about its peer (a real user certificate issued by a
 * real user CA, so that peerIdentityOf checks it as it would in the Proxy); the Auth Service (a ProxyAuth, what
 * the Proxy uses of it) is a fake with the CAs, a real SessionRegistry, and roles and resolveCaller given by each
 * test; the TunnelServer is a fake with a list of agents and a dial() that records the request and returns the
 * other end of a loopback connection. The lookup itself (findTarget) is tested directly, as a pure function over
 * agents.
 */
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority, type Identity } from '../../src/auth/pki.js';
import type { RoleResource } from '../../src/auth/resources/types.js';
import type { ProxyAuth } from '../../src/auth/proxyauth.js';
import { SessionRegistry } from '../../src/auth/sessions.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import type { ConnInfo } from '../../src/mux/multiplexer.js';
import { ConnectionLimits } from '../../src/net/deadlines.js';
import { closeServer, guardedServer } from '../../src/net/listen.js';
import { createAccessHandler, ROUTE_HEADER_MAX_BYTES } from '../../src/proxy/access.js';
import { findTarget, findWebApp } from '../../src/proxy/resources.js';
import type { AgentResources, DialRequest, ServiceKind } from '../../src/tunnel/protocol.js';
import type { AgentSource } from '../../src/proxy/router.js';
import type { ConnectedAgent } from '../../src/proxy/tunnel.js';

setRootLogger(createLogger({ level: 'silent' }));

const CLUSTER = 'unit.example';
let userCa: CertAuthority;
let hostCa: CertAuthority;
const cleanups: Array<() => unknown> = [];

beforeAll(async () => {
  userCa = await generateAuthority('user', CLUSTER);
  hostCa = await generateAuthority('host', CLUSTER);
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
});

// --- agents --------------------------------------------------------------------------------------------------------

const NO_RESOURCES: AgentResources = { databases: [], apps: [], desktops: [], kube_clusters: [] };

function agent(hostId: string, o: { nodename?: string; services?: ServiceKind[]; connectedAt?: number; resources?: Partial<AgentResources> } = {}): ConnectedAgent {
  return {
    hostId,
    nodename: o.nodename ?? hostId,
    services: o.services ?? ['ssh', 'db', 'app', 'desktop', 'kube'],
    resources: { ...NO_RESOURCES, ...o.resources },
    connectedAt: new Date(o.connectedAt ?? 0),
    lastHeartbeat: new Date(o.connectedAt ?? 0),
    remote: '10.0.0.1:1',
  } as ConnectedAgent;
}

// --- target lookup -------------------------------------------------------------------------------------------------

describe('findTarget: which agent and resource a route header names', () => {
  const pg = (labels: Record<string, string>) => ({ databases: [{ name: 'orders', protocol: 'postgres' as const, labels }] });

  it('the most recently connected agent wins, whatever the order of the list', () => {
    const old = agent('old', { connectedAt: 1000, resources: pg({ v: 'old' }) });
    const recent = agent('recent', { connectedAt: 2000, resources: pg({ v: 'recent' }) });
    expect(findTarget([old, recent], 'gateway-postgres', { resource: 'orders' })?.agent.hostId).toBe('recent');
    expect(findTarget([recent, old], 'gateway-postgres', { resource: 'orders' })?.agent.hostId).toBe('recent');
    // A newer agent that does not serve the name does not hide an older one that does.
    const other = agent('other', { connectedAt: 3000, resources: { databases: [{ name: 'billing', protocol: 'postgres', labels: {} }] } });
    expect(findTarget([other, old], 'gateway-postgres', { resource: 'orders' })?.agent.hostId).toBe('old');
  });

  it('by exact name, with the resource’s labels, service and access kind', () => {
    const a = agent('a', { resources: pg({ env: 'prod' }) });
    expect(findTarget([a], 'gateway-postgres', { resource: 'orders' })).toMatchObject({ name: 'orders', service: 'db', access: 'db', labels: { env: 'prod' } });
    expect(findTarget([a], 'gateway-postgres', { resource: 'order' })).toBeUndefined();
    expect(findTarget([a], 'gateway-postgres', { resource: 'Orders' })).toBeUndefined();
  });

  it('a database only on the route of its own protocol', () => {
    const a = agent('a', { resources: { databases: [{ name: 'shop', protocol: 'mysql', labels: {} }] } });
    expect(findTarget([a], 'gateway-postgres', { resource: 'shop' })).toBeUndefined();
    expect(findTarget([a], 'gateway-mysql', { resource: 'shop' })?.name).toBe('shop');
    expect(findTarget([a], 'gateway-tcp', { resource: 'shop' })).toBeUndefined();
  });

  it('gateway-tcp: an app or a desktop; on one agent the app first, unless the header asks for a desktop', () => {
    const both = agent('both', { resources: { apps: [{ name: 'x', kind: 'tcp', labels: { is: 'app' } }], desktops: [{ name: 'x', labels: { is: 'desktop' } }] } });
    expect(findTarget([both], 'gateway-tcp', { resource: 'x' })).toMatchObject({ access: 'app', service: 'app', labels: { is: 'app' } });
    expect(findTarget([both], 'gateway-tcp', { resource: 'x', kind: 'app' })?.access).toBe('app');
    expect(findTarget([both], 'gateway-tcp', { resource: 'x', kind: 'desktop' })).toMatchObject({ access: 'windows_desktop', service: 'desktop', labels: { is: 'desktop' } });
    const desktopOnly = agent('d', { resources: { desktops: [{ name: 'x', labels: {} }] } });
    expect(findTarget([desktopOnly], 'gateway-tcp', { resource: 'x', kind: 'app' })).toBeUndefined();
    expect(findTarget([desktopOnly], 'gateway-tcp', { resource: 'x' })?.access).toBe('windows_desktop');
    // Another kind than app or desktop rules nothing out (the client's JSON is not trusted to be well-formed).
    expect(findTarget([desktopOnly], 'gateway-tcp', { resource: 'x', kind: 'printer' as 'app' })?.access).toBe('windows_desktop');
  });

  it('a node by node name, host ID, or host ID with the cluster name; a :port is ignored; only agents running SSH', () => {
    const node = agent('3f0c', { nodename: 'web-1', resources: { node_labels: { role: 'web' } } });
    for (const name of ['web-1', '3f0c', `3f0c.${CLUSTER}`, 'web-1:22']) {
      expect(findTarget([node], 'gateway-proxy-ssh', { resource: name })).toMatchObject({ name: 'web-1', service: 'ssh', access: 'node', labels: { role: 'web' } });
    }
    expect(findTarget([node], 'gateway-proxy-ssh', { resource: 'web-2' })).toBeUndefined();
    expect(findTarget([agent('3f0c', { nodename: 'web-1', services: ['db'] })], 'gateway-proxy-ssh', { resource: 'web-1' })).toBeUndefined();
    // A node without labels has none rather than undefined ones.
    expect(findTarget([agent('n', { nodename: 'bare' })], 'gateway-proxy-ssh', { resource: 'bare' })?.labels).toEqual({});
  });

  it('a route that reaches no resources, or no route, finds nothing', () => {
    const a = agent('a', { resources: pg({}) });
    expect(findTarget([a], 'gateway-reversetunnel', { resource: 'orders' })).toBeUndefined();
    expect(findTarget([a], 'gateway-nonsense', { resource: 'orders' })).toBeUndefined();
  });

  it('HTTP apps on the web port by public address, TCP apps excluded', () => {
    const a = agent('a', { resources: { apps: [{ name: 'grafana', kind: 'http', public_addr: 'grafana.proxy.test', labels: {} }, { name: 'raw', kind: 'tcp', public_addr: 'raw.proxy.test', labels: {} }] } });
    expect(findWebApp([a], 'grafana.proxy.test')).toMatchObject({ name: 'grafana', service: 'app', access: 'app' });
    expect(findWebApp([a], 'raw.proxy.test')).toBeUndefined();
  });
});

// --- the handler ---------------------------------------------------------------------------------------------------

const der = (pem: string) => new X509Certificate(pem).raw;

const role = (name: string, spec: RoleResource['spec']): RoleResource => ({ kind: 'role', version: 'v7', metadata: { name }, spec }) as RoleResource;
const DBA = role('dba', { allow: { db_labels: { env: 'prod' } } });
const OPS = role('ops', { allow: { node_labels: { '*': '*' }, app_labels: { '*': '*' }, windows_desktop_labels: { '*': '*' } } });
const NO_PROD = role('no-prod', { deny: { db_labels: { env: 'prod' } } });

interface Fakes {
  agents?: ConnectedAgent[];
  roles?: RoleResource[];
  resolveCaller?: (caller: Identity) => Promise<Identity>;
  dial?: (hostId: string, req: DialRequest) => Promise<net.Socket>;
  headerTimeoutMs?: number;
}

const limits = new ConnectionLimits({ tlsHandshakeMs: 0, headerMs: 0, requestMs: 0, idleMs: 0, sshHandshakeMs: 0, halfCloseLingerMs: 0, maxConnections: 1000, maxConnectionsPerSource: 1000 }, { openFiles: null });

/** Two ends of a real loopback connection: [client, server]. The server end is admitted by the guard `listener`. */
async function socketPair(listener = 'access-test'): Promise<[net.Socket, net.Socket]> {
  let accept!: (s: net.Socket) => void;
  const accepted = new Promise<net.Socket>((resolve) => (accept = resolve));
  const server = guardedServer(limits.listener(listener), (s) => accept(s));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  client.on('error', () => undefined);
  const [, serverEnd] = await Promise.all([once(client, 'connect'), accepted]);
  cleanups.push(() => client.destroy(), () => serverEnd.destroy(), () => closeServer(server));
  return [client, serverEnd];
}

/** What a TLS socket says about a peer that presented `certPem`, signed by `ca`. */
function presenting(socket: net.Socket, certPem: string | undefined, ca: CertAuthority): void {
  Object.assign(socket, {
    authorized: certPem !== undefined,
    getPeerCertificate: () => (certPem === undefined ? {} : { raw: der(certPem), issuerCertificate: { raw: der(ca.tls.certPem) }, valid_from: new Date().toUTCString() }),
  });
}

async function certFor(identity: Identity, ca = userCa): Promise<string> {
  const keys = generateKeyPair();
  return issueTlsCert(ca, { publicKeyPem: keys.publicKeyPem, identity, ttlMs: 3600_000, usage: 'client' });
}

const alice: Identity = { kind: 'user', name: 'alice', cluster: CLUSTER, roles: ['dba', 'ops'], logins: ['root', 'deploy'] };

interface Run {
  client: net.Socket;
  auth: ProxyAuth;
  /** Each dial: its request, and the agent's end of the channel the handler was given. */
  dials: Array<{ hostId: string; req: DialRequest; agentEnd: net.Socket }>;
  /** The first line the handler answered (without its newline). */
  answer(): Promise<string>;
  /** Everything the client received so far. */
  text(): string;
  /** Resolves when the handler ended its side of the stream. */
  ended(): Promise<void>;
}

/** Starts the handler on a fresh connection for `route`, the client presenting `identity`'s certificate (null: none). */
async function start(route: string, fakes: Fakes = {}, identity: Identity | null = alice, ca = userCa): Promise<Run> {
  const [client, server] = await socketPair();
  presenting(server, identity ? await certFor(identity, ca) : undefined, ca);
  const auth = {
    clusterName: CLUSTER,
    host: { tls: { certPem: hostCa.tls.certPem } },
    user: { tls: { certPem: userCa.tls.certPem } },
    sessions: new SessionRegistry(),
    resolveCaller: fakes.resolveCaller ?? (async (caller: Identity) => caller),
    rolesOf: async (names: readonly string[]) => (fakes.roles ?? [DBA, OPS]).filter((r) => names.includes(r.metadata.name)),
  } as unknown as ProxyAuth;
  const dials: Run['dials'] = [];
  const agents: AgentSource = {
    agents: () => fakes.agents ?? [],
    dial: async (hostId: string, req: DialRequest) => {
      if (fakes.dial) return fakes.dial(hostId, req);
      const [agentEnd, handlerEnd] = await socketPair('channel');
      dials.push({ hostId, req, agentEnd });
      return handlerEnd;
    },
  };
  const info: ConnInfo = { remoteAddress: '192.0.2.7', remotePort: 40000, localAddress: '192.0.2.1', localPort: 443, route };
  createAccessHandler(auth, agents, fakes.headerTimeoutMs ?? 20_000)(server, info);

  let received = '';
  const ended = once(client, 'end').then(() => undefined);
  client.setEncoding('utf8');
  client.on('data', (c: string) => (received += c));
  const answer = async () => {
    while (!received.includes('\n')) await Promise.race([once(client, 'data'), ended]).then(() => {
      if (!received.includes('\n') && client.readableEnded) throw new Error(`the stream ended without an answer line (got ${JSON.stringify(received)})`);
    });
    return received.slice(0, received.indexOf('\n'));
  };
  return { client, auth, dials, answer, text: () => received, ended: () => ended };
}

const send = (run: Run, header: unknown) => run.client.write(`${typeof header === 'string' ? header : JSON.stringify(header)}\n`);
const refusal = async (run: Run) => (JSON.parse(await run.answer()) as { ok: false; error: { code: string } }).error.code;

const prodDb = agent('db-agent', { nodename: 'db-host', resources: { databases: [{ name: 'orders', protocol: 'postgres', labels: { env: 'prod' } }] } });
const node = agent('node-1', { nodename: 'web-1', resources: { node_labels: { role: 'web' } } });

describe('the route header', () => {
  it('is one JSON line; bytes after it stay in the stream for the resource', async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    run.client.write('{"resource": "orders"}\nfirst bytes for the database');
    expect(await run.answer()).toBe('{"ok":true}');
    const channel = run.dials[0]!.agentEnd;
    let got = '';
    channel.setEncoding('utf8');
    channel.on('data', (c: string) => (got += c));
    await expect.poll(() => got).toBe('first bytes for the database');
  });

  it(`longer than ${ROUTE_HEADER_MAX_BYTES} bytes: refused without waiting for its end`, async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    run.client.write(`{"resource": "${'o'.repeat(ROUTE_HEADER_MAX_BYTES)}`);
    expect(await refusal(run)).toBe('GW_ERR_TUNNEL_PROTOCOL');
    expect(run.dials).toHaveLength(0);
  });

  it.each([
    ['not JSON', 'orders'],
    ['not an object', '["orders"]'],
    ['no resource', '{"login": "root"}'],
    ['an empty resource', '{"resource": ""}'],
    ['a resource that is not a string', '{"resource": 7}'],
  ])('%s: refused', async (_what, line) => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    send(run, line);
    expect(await refusal(run)).toBe('GW_ERR_TUNNEL_PROTOCOL');
    expect(run.dials).toHaveLength(0);
  });

  it('never sent: refused when the header deadline passes, and counted with the listener’s deadlines', async () => {
    const before = limits.listener('access-test').stats.deadlines['route-header'] ?? 0;
    const run = await start('gateway-postgres', { agents: [prodDb], headerTimeoutMs: 20 });
    expect(await refusal(run)).toBe('GW_ERR_TUNNEL_TIMEOUT');
    expect(limits.listener('access-test').stats.deadlines['route-header']).toBe(before + 1);
  });

  it('check: true answers whether the connection would be allowed, ends the stream, and dials nothing', async () => {
    const allowed = await start('gateway-postgres', { agents: [prodDb] });
    send(allowed, { resource: 'orders', check: true });
    expect(await allowed.answer()).toBe('{"ok":true}');
    await allowed.ended();
    expect(allowed.dials).toHaveLength(0);

    const denied = await start('gateway-postgres', { agents: [prodDb], roles: [OPS] });
    send(denied, { resource: 'orders', check: true });
    expect(await refusal(denied)).toBe('GW_ERR_ACCESS_DENIED');
  });
});

describe('who may connect', () => {
  it('no client certificate: unauthenticated', async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] }, null);
    expect(await refusal(run)).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
  });

  it('a host certificate: denied before any header is read', async () => {
    const host: Identity = { kind: 'host', name: 'db-agent', cluster: CLUSTER, roles: ['db'] };
    const run = await start('gateway-postgres', { agents: [prodDb] }, host, hostCa);
    expect(await refusal(run)).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('the user as it stands now: a refusal from resolveCaller is the answer', async () => {
    const resolveCaller = async () => {
      throw new GatewayError('GW_ERR_ACCESS_LOCKED', 'alice is locked');
    };
    const run = await start('gateway-postgres', { agents: [prodDb], resolveCaller });
    send(run, { resource: 'orders' });
    expect(await refusal(run)).toBe('GW_ERR_ACCESS_LOCKED');
  });

  it('the connection is tracked in auth.sessions while it is open, and a revocation closes it', async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    send(run, { resource: 'orders' });
    expect(await run.answer()).toBe('{"ok":true}');
    expect(run.auth.sessions.count((id) => id.name === 'alice')).toBe(1);
    await run.auth.sessions.revalidate(async () => new GatewayError('GW_ERR_ACCESS_LOCKED', 'locked'));
    await once(run.client, 'close');
    await expect.poll(() => run.auth.sessions.count()).toBe(0);
  });
});

describe('the resource and the checks', () => {
  it('a resource no connected agent serves: not found', async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    send(run, { resource: 'billing' });
    expect(await refusal(run)).toBe('GW_ERR_TUNNEL_NOT_FOUND');
  });

  it('roles that do not select the labels, or a role that denies them: denied', async () => {
    const notSelected = await start('gateway-postgres', { agents: [prodDb], roles: [OPS] });
    send(notSelected, { resource: 'orders' });
    expect(await refusal(notSelected)).toBe('GW_ERR_ACCESS_DENIED');

    const denied = await start('gateway-postgres', { agents: [prodDb], roles: [DBA, NO_PROD] }, { ...alice, roles: ['dba', 'no-prod'] });
    send(denied, { resource: 'orders' });
    expect(await refusal(denied)).toBe('GW_ERR_ACCESS_DENIED');
    expect(denied.dials).toHaveLength(0);
  });

  it('a node: only with a login the identity allows', async () => {
    for (const header of [{ resource: 'web-1' }, { resource: 'web-1', login: 'postgres' }]) {
      const run = await start('gateway-proxy-ssh', { agents: [node] });
      send(run, header);
      expect(await refusal(run)).toBe('GW_ERR_ACCESS_DENIED');
      expect(run.dials).toHaveLength(0);
    }
    const run = await start('gateway-proxy-ssh', { agents: [node] });
    send(run, { resource: 'web-1', login: 'deploy' });
    expect(await run.answer()).toBe('{"ok":true}');
    expect(run.dials[0]).toMatchObject({ hostId: 'node-1', req: { service: 'ssh', resource: 'deploy@web-1', user: 'alice' } });
  });

  it('a desktop through gateway-tcp is checked against windows_desktop_labels and dialled as a desktop', async () => {
    const a = agent('desk-agent', { resources: { desktops: [{ name: 'win', labels: {} }] } });
    const run = await start('gateway-tcp', { agents: [a], roles: [DBA] }, { ...alice, roles: ['dba'] });
    send(run, { resource: 'win', kind: 'desktop' });
    expect(await refusal(run)).toBe('GW_ERR_ACCESS_DENIED');
    const ok = await start('gateway-tcp', { agents: [a] });
    send(ok, { resource: 'win', kind: 'desktop' });
    expect(await ok.answer()).toBe('{"ok":true}');
    expect(ok.dials[0]?.req.service).toBe('desktop');
  });
});

describe('database access rules', () => {
  it('the dial to a database carries the grant resolveCaller gives (the user as it stands now); other dials carry none', async () => {
    const db = { users: { allow: ['orders_app'], deny: ['postgres'] }, names: { allow: ['orders'], deny: [] } };
    const resolveCaller = async (caller: Identity) => ({ ...caller, db });
    const run = await start('gateway-postgres', { agents: [prodDb], resolveCaller });
    send(run, { resource: 'orders' });
    expect(await run.answer()).toBe('{"ok":true}');
    expect(run.dials[0]?.req.db_access).toEqual(db);
    const desk = await start('gateway-tcp', { agents: [agent('desk-agent', { resources: { desktops: [{ name: 'win', labels: {} }] } })], resolveCaller });
    send(desk, { resource: 'win', kind: 'desktop' });
    expect(await desk.answer()).toBe('{"ok":true}');
    expect(desk.dials[0]?.req.db_access).toBeUndefined();
  });
});

describe('the answer', () => {
  it('allowed: {"ok":true}, the dial names the client and the user, then bytes flow both ways', async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    send(run, { resource: 'orders' });
    expect(await run.answer()).toBe('{"ok":true}');
    expect(run.dials).toEqual([
      {
        hostId: 'db-agent',
        agentEnd: expect.any(net.Socket),
        // No grant resolved for this identity: the agent is told that no database user or name is allowed.
        req: { service: 'db', resource: 'orders', client_src: '192.0.2.7:40000', client_dst: '192.0.2.1:443', user: 'alice', db_access: { users: { allow: [], deny: [] }, names: { allow: [], deny: [] } } },
      },
    ]);
    const channel = run.dials[0]!.agentEnd;
    channel.write('from the database');
    await expect.poll(() => run.text()).toBe('{"ok":true}\nfrom the database');
    let forth = '';
    channel.setEncoding('utf8');
    channel.on('data', (c: string) => (forth += c));
    run.client.write('from the client');
    await expect.poll(() => forth).toBe('from the client');
  });

  it('refused: exactly one line, {"ok":false,"error":{code,message}}, then the end of the stream', async () => {
    const run = await start('gateway-postgres', { agents: [prodDb] });
    send(run, { resource: 'billing' });
    await run.ended();
    const all = run.text();
    expect(all.endsWith('\n')).toBe(true);
    expect(all.split('\n')).toHaveLength(2);
    const answer = JSON.parse(all) as { ok: boolean; error: { code: string; message: string } };
    expect(answer.ok).toBe(false);
    expect(Object.keys(answer.error).sort()).toEqual(['code', 'message']);
    expect(answer.error.code).toBe('GW_ERR_TUNNEL_NOT_FOUND');
  });

  it('a dial that fails: its code is the answer', async () => {
    const dial = async () => {
      throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', 'connection refused by the database');
    };
    const run = await start('gateway-postgres', { agents: [prodDb], dial });
    send(run, { resource: 'orders' });
    expect(await refusal(run)).toBe('GW_ERR_TUNNEL_DIAL_FAILED');
  });
});
