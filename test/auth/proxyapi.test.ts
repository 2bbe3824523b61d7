/**
 * The Auth API of Proxies in their own process (src/auth/proxyapi.ts) and its client (src/client/remoteauth.ts),
 * on a real Auth API listener (mutual TLS on loopback) with a Proxy joined with a token of type proxy, an agent
 * joined with a node token and a user signed in: the routes, who may call them, the forwarded identity of the
 * web port's forwarder and the hostile cases (a user or an agent calling the routes, a user sending the
 * forwarding headers itself, a forged certificate forwarded by a Proxy).
 */
import { X509Certificate } from 'node:crypto';
import https from 'node:https';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { joinCluster, loadHostIdentity, type HostIdentity } from '../../src/agent/identity.js';
import { FORWARDED } from '../../src/wire/forwarded.js';
import { generateKeyPair, identityFromCert, signPresenceProof, signRenewProof } from '../../src/auth/pki.js';
import { MAX_STREAMS_PER_PROXY } from '../../src/auth/proxyapi.js';
import { parseManifest } from '../../src/auth/resources/index.js';
import { AuthService } from '../../src/auth/service.js';
import { openSqliteBackend, type Backend } from '../../src/backend/index.js';
import { EVENTS_RECONNECT_MS, EVENTS_RETRY, RemoteProxyAuth } from '../../src/client/remoteauth.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { connectRemoteAuth, startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { ManualClock } from '../helpers/clock.js';
import { waitUntil } from '../helpers/wait.js';

const PASSWORD = 'correct horse battery';
const CLUSTER = 'proxyapi.example';
const dialer = new Dialer({ env: {} });

interface Answer {
  status: number;
  body: { error?: { code: string } } & Record<string, unknown>;
}

interface Creds {
  cert: string;
  key: string;
}

/** One HTTPS request with full control of the client certificate and the headers. */
function request(addr: string, options: { method?: string; path: string; creds?: Creds; headers?: Record<string, string>; body?: unknown; ca: string }): Promise<Answer> {
  const i = addr.lastIndexOf(':');
  const text = options.body === undefined ? undefined : JSON.stringify(options.body);
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: addr.slice(0, i),
        port: Number(addr.slice(i + 1)),
        method: options.method ?? 'GET',
        path: options.path,
        ca: options.ca,
        agent: false,
        headers: { ...(text === undefined ? {} : { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) }), ...options.headers },
        ...(options.creds ?? {}),
      },
      (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(body) as Answer['body'] }));
      },
    );
    req.once('error', reject);
    req.end(text);
  });
}

/** The first line of the event stream, or the JSON error. */
function openStream(addr: string, creds: Creds, ca: string): Promise<{ status: number; first: string; close: () => void }> {
  const i = addr.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const req = https.request({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)), path: '/v1/proxy/events', ca, agent: false, ...creds }, (res) => {
      res.once('data', (c: Buffer) => resolve({ status: res.statusCode ?? 0, first: c.toString().split('\n')[0]!, close: () => req.destroy() }));
    });
    req.once('error', reject);
    req.end();
  });
}

let dir: string;
let config: GatewayConfig;
let lifecycle: Lifecycle;
let role: AuthRole;
let ca: string;
let proxy: HostIdentity;
let agent: HostIdentity;
let alice: Creds;
let forged: Creds;

async function joinWith(roles: Array<'proxy' | 'node'>, name: string): Promise<HostIdentity> {
  const { token } = await role.auth.addToken(role.auth.adminIdentity(), { roles });
  return joinCluster({ dataDir: join(dir, name), server: role.address, joinedVia: 'auth', token, caPin: role.auth.caPin(), roles, nodename: name, publicAddrs: [], dialer });
}

async function loginAt(auth: AuthService, username: string): Promise<Creds> {
  const keys = generateKeyPair();
  const bundle = await auth.login({ username, password: PASSWORD, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '192.0.2.1' });
  return { cert: bundle.tlsCert, key: keys.privateKeyPem };
}

const proxyCreds = (): Creds => ({ cert: proxy.cert, key: proxy.key });
const derB64 = (pem: string) => new X509Certificate(pem).raw.toString('base64');

beforeAll(async () => {
  setRootLogger(createLogger({ level: 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-proxyapi-'));
  config = parseConfig(
    ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'auth')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'),
    'proxyapi test',
  );
  lifecycle = new Lifecycle();
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  role = await startAuthRole({ config, limits, lifecycle });
  ca = role.auth.host.tls.certPem;
  await role.auth.addUser(role.auth.adminIdentity(), 'alice', ['access'], PASSWORD);
  alice = await loginAt(role.auth, 'alice');
  proxy = await joinWith(['proxy'], 'proxy1');
  agent = await joinWith(['node'], 'agent1');
  // A certificate of a look-alike cluster (same name, its own CAs): valid in form, signed by the wrong CA.
  const other = await AuthService.open({ backend: openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 }), clusterName: CLUSTER });
  await other.addUser(other.adminIdentity(), 'alice', ['editor'], PASSWORD);
  forged = await loginAt(other, 'alice');
});

afterAll(async () => {
  await lifecycle?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('the /v1/proxy/ routes', () => {
  it('serve a Proxy joined with a proxy token: calls, its own records, a server certificate for its own host ID with the role proxy only', async () => {
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer });
    try {
      expect(remote.clusterName).toBe(CLUSTER);
      expect(remote.user.tls.certPem).toBe(role.auth.user.tls.certPem);
      const who = await remote.resolveCaller(identityFromCert(alice.cert));
      expect(who).toMatchObject({ kind: 'user', name: 'alice', roles: ['access'] });
      // A Proxy in its own process gets the database grant too (alice has no db traits: nothing allowed).
      expect(who.db).toEqual({ users: { allow: [], deny: [] }, names: { allow: [], deny: [] } });
      expect((await remote.rolesOf(['access'])).map((r) => r.metadata.name)).toEqual(['access']);
      expect(await remote.getNode(agent.hostId)).toMatchObject({ hostId: agent.hostId });
      expect(await remote.getNode('no-such-host')).toBeUndefined();
      expect((await remote.listNodes()).map((n) => n.hostId)).toEqual(expect.arrayContaining([agent.hostId, proxy.hostId]));
      const record = { id: proxy.hostId, nodename: 'proxy1', version: '1.0.0', public_addr: 'proxy1:443', channels_digest: 'x', channels: {}, started_at: new Date().toISOString(), last_heartbeat: new Date().toISOString() };
      await remote.heartbeatProxy(record, 60_000);
      expect((await remote.listProxies()).map((p) => p.id)).toContain(proxy.hostId);
      expect(await remote.tunnelStrategy()).toMatchObject({ type: 'agent_mesh' });
      expect(await remote.authPreference()).toEqual({ type: 'local' });
      const cert = new X509Certificate(await remote.issueServerCert(generateKeyPair().publicKeyPem, ['proxy1.example']));
      expect(identityFromCert(cert.raw)).toMatchObject({ kind: 'host', name: proxy.hostId, roles: ['proxy'] });
      // Hostile: another Proxy's record.
      await expect(remote.heartbeatProxy({ ...record, id: 'someone-else' }, 60_000)).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_DENIED' });
      await expect(remote.setPresence({ hostId: agent.hostId, nodename: 'agent1', proxyId: 'someone-else', services: [], resources: {}, connectedAt: 'x', lastHeartbeat: 'y' } as never, 60_000)).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_DENIED' });
      await remote.removeProxy(proxy.hostId);
      // The maintenance window, for the Web UI's agents view.
      expect(await remote.maintenanceConfig()).toBeUndefined();
      const maintenance = parseManifest('kind: cluster_maintenance_config\nversion: v1\nspec:\n  agent_upgrades:\n    utc_start_hour: 4\n    weekdays: [Tue]\n', 'm.yaml');
      await role.auth.createResources({ kind: 'admin', name: 'admin', cluster: CLUSTER, roles: [] }, maintenance, true);
      expect(await remote.maintenanceConfig()).toMatchObject({ kind: 'cluster_maintenance_config', spec: { agent_upgrades: { utc_start_hour: 4 } } });
      await role.auth.removeResource({ kind: 'admin', name: 'admin', cluster: CLUSTER, roles: [] }, 'cluster_maintenance_config', 'cluster_maintenance_config');
    } finally {
      remote.close();
    }
  });

  it('refuse a user certificate, an agent host certificate and no certificate', async () => {
    const user = await request(role.address, { method: 'POST', path: '/v1/proxy/server-cert', creds: alice, ca, body: { public_key: generateKeyPair().publicKeyPem, names: ['x'] } });
    expect(user.status).toBe(403);
    expect(user.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
    const host = await request(role.address, { path: '/v1/proxy/proxies', creds: { cert: agent.cert, key: agent.key }, ca });
    expect(host.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
    const stream = await openStream(role.address, { cert: agent.cert, key: agent.key }, ca);
    expect(stream.status).toBe(403);
    const none = await request(role.address, { path: '/v1/proxy/proxies', ca });
    expect(none.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
  });

  it("renew an agent's host certificates for the key it joined with, as a Proxy carries its ask with the agent's proof; never without it, and no agent here", async () => {
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer });
    try {
      const key = new X509Certificate(agent.cert).publicKey.export({ type: 'spki', format: 'pem' }).toString();
      const proof = () => signRenewProof(agent.key, agent.hostId, CLUSTER, key, Date.now());
      // Hostile: the Proxy asks on its own (no proof, or a proof of another key): it would spend the host's renewals.
      await expect(remote.renewHost({ hostId: agent.hostId, publicKeyPem: key, via: 'ignored' })).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/carries no proof/) });
      // A proof signed with another key, for a host not yet refused through this Proxy: the signature is what fails.
      const forgedFor = await joinWith(['node'], 'agent-forged');
      const forgedKey = new X509Certificate(forgedFor.cert).publicKey.export({ type: 'spki', format: 'pem' }).toString();
      const forgedProof = signRenewProof(generateKeyPair().privateKeyPem, forgedFor.hostId, CLUSTER, forgedKey, Date.now());
      await expect(remote.renewHost({ hostId: forgedFor.hostId, publicKeyPem: forgedKey, via: 'ignored', carried: { proof: forgedProof } })).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_REFUSED', message: expect.stringMatching(/not signed by the key the host joined with/) });
      // Refused once, the same Proxy is shut out for that host for a minute, even with a good proof.
      await expect(remote.renewHost({ hostId: agent.hostId, publicKeyPem: key, via: 'ignored', carried: { proof: proof() } })).rejects.toMatchObject({ code: 'GW_ERR_HOST_RENEW_TOO_SOON' });
      const another = await joinWith(['node'], 'agent-carried');
      const anotherKey = new X509Certificate(another.cert).publicKey.export({ type: 'spki', format: 'pem' }).toString();
      const bundle = await remote.renewHost({ hostId: another.hostId, publicKeyPem: anotherKey, via: 'ignored', carried: { proof: signRenewProof(another.key, another.hostId, CLUSTER, anotherKey, Date.now()) } });
      expect(identityFromCert(bundle.tlsCert)).toMatchObject({ kind: 'host', name: another.hostId, roles: ['node'] });
      expect(new X509Certificate(bundle.tlsCert).publicKey.export({ type: 'spki', format: 'pem' }).toString()).toBe(anotherKey);
      // The audit says which Proxy carried it (the caller's host ID, not a field of the body).
      const events = await role.auth.listEvents(role.auth.adminIdentity(), 10);
      expect(events.map((e) => e.event).find((e) => e.event === 'host.renew')).toMatchObject({ host_id: another.hostId, via: proxy.hostId });
    } finally {
      remote.close();
    }
    const asAgent = await request(role.address, { method: 'POST', path: '/v1/proxy/host-renewals', creds: { cert: agent.cert, key: agent.key }, ca, body: { host_id: agent.hostId, public_key: 'x' } });
    expect(asAgent.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
  });

  it("record the sessions a Proxy carried as that Proxy's; hostile: no other kind of event, no claimed reporter, nothing from an agent", async () => {
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer });
    try {
      const mark = `s-${Date.now()}`;
      // The proxyId argument is not sent: the Auth Service takes the caller's host ID from its certificate.
      await remote.recordProxyEvent('someone-else', { event: 'db.session.end', session: mark, user: 'alice', resource: 'pg', bytes_in: 10, bytes_out: 20, reported_by: { proxy_id: 'someone-else' } });
      const mine = (await role.auth.listEvents(role.auth.adminIdentity(), 1000)).find((e) => e.event.session === mark);
      expect(mine?.event).toMatchObject({ event: 'db.session.end', user: 'alice', reported_by: { proxy_id: proxy.hostId } });
      // A Proxy may not write what it did not witness through this route: logins, SSH sessions, anything else.
      for (const event of ['user.login', 'session.start', 'lock.create', 'db.session.startx', undefined]) {
        await expect(remote.recordProxyEvent(proxy.hostId, { event, session: mark, user: 'alice' })).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
      }
      const agentCall = await request(role.address, { method: 'POST', path: '/v1/proxy/session-events', creds: { cert: agent.cert, key: agent.key }, ca, body: { event: { event: 'db.session.start', session: mark } } });
      expect(agentCall.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
      const userCall = await request(role.address, { method: 'POST', path: '/v1/proxy/session-events', creds: alice, ca, body: { event: { event: 'db.session.start', session: mark } } });
      expect(userCall.status).toBe(403);
      expect((await role.auth.listEvents(role.auth.adminIdentity(), 1000)).filter((e) => e.event.session === mark)).toHaveLength(1);
    } finally {
      remote.close();
    }
  });

  it("answer a Proxy's ask for an agent's rollout instruction (RemoteProxyAuth), and nobody else's", async () => {
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer });
    try {
      expect(await remote.autoupdateInstruction(agent.hostId, 'dev')).toMatchObject({ managed: false, update: false });
    } finally {
      remote.close();
    }
    const path = `/v1/autoupdate/instruction?host_id=${agent.hostId}`;
    expect((await request(role.address, { path, creds: { cert: agent.cert, key: agent.key }, ca })).body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
    expect((await request(role.address, { path, creds: alice, ca })).body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('refuse a body over the bound', async () => {
    const big = await request(role.address, { method: 'POST', path: '/v1/proxy/roles', creds: proxyCreds(), ca, body: { names: ['x'.repeat(200_000)] } });
    expect(big.body.error?.code).toBe('GW_ERR_API_TOO_LARGE');
  });

  it('cap the event streams of one Proxy', async () => {
    const open = [];
    for (let i = 0; i < MAX_STREAMS_PER_PROXY; i++) {
      const s = await openStream(role.address, proxyCreds(), ca);
      expect(s.status).toBe(200);
      expect(JSON.parse(s.first)).toMatchObject({ type: 'hello' });
      open.push(s);
    }
    const over = await openStream(role.address, proxyCreds(), ca);
    expect(over.status).toBe(429);
    expect(over.first).toContain('GW_ERR_API_TOO_MANY_STREAMS');
    for (const s of open) s.close();
    // Once closed, the Proxy gets a stream again.
    await waitUntil('a stream after the others closed', async () => {
      const again = await openStream(role.address, proxyCreds(), ca);
      again.close();
      return again.status === 200;
    });
  });
});

describe('the forwarded identity', () => {
  const status = (headers: Record<string, string>, creds?: Creds) => request(role.address, { path: '/v1/status', ca, headers, ...(creds ? { creds } : {}) });

  it('from a Proxy: the forwarded certificate is the caller, verified here; none forwarded means no caller', async () => {
    const ok = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(alice.cert), [FORWARDED.addr]: '198.51.100.7' }, proxyCreds());
    expect(ok.status).toBe(200);
    expect(ok.body.identity).toMatchObject({ kind: 'user', name: 'alice' });
    const none = await status({ [FORWARDED.marker]: '1', [FORWARDED.addr]: '198.51.100.7' }, proxyCreds());
    expect(none.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
  });

  it('hostile: a forged certificate forwarded by a Proxy is refused', async () => {
    const res = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(forged.cert) }, proxyCreds());
    expect(res.status).toBe(401);
    expect(res.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
    const garbage = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: Buffer.from('not a certificate').toString('base64') }, proxyCreds());
    expect(garbage.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
  });

  it('hostile: the headers from a user or an agent mean nothing', async () => {
    // A user forwarding "the admin": still itself.
    const admin = await startAdmin();
    const asUser = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(admin.cert) }, alice);
    expect(asUser.body.identity).toMatchObject({ kind: 'user', name: 'alice' });
    // No client certificate but a forwarded one: unauthenticated.
    const anonymous = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(alice.cert) });
    expect(anonymous.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
    const asAgent = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(alice.cert) }, { cert: agent.cert, key: agent.key });
    expect(asAgent.body.identity).toMatchObject({ kind: 'host', name: agent.hostId });
  });

  it("hostile: a Proxy forwarding another host's or the admin's certificate gets nothing of theirs", async () => {
    // Host certificates are public (every Proxy sees its peers' and the agents'): forwarded, they would make one
    // Proxy another Proxy, an agent or the admin.
    const otherProxy = await joinWith(['proxy'], 'proxy-other');
    const admin = await startAdmin();
    for (const cert of [otherProxy.cert, agent.cert, admin.cert]) {
      const res = await status({ [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(cert) }, proxyCreds());
      expect(res.status).toBe(401);
      expect((res.body.error as { message?: string } | undefined)?.message).toMatch(/cannot come through a Proxy/);
    }
    // Nor may it write the other Proxy's record that way.
    const heartbeat = await request(role.address, {
      method: 'PUT', path: '/v1/proxy/proxies/self', ca, creds: proxyCreds(),
      headers: { [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(otherProxy.cert) },
      body: { record: { id: otherProxy.hostId, nodename: 'x', version: '1', public_addr: 'evil.example:443', channels_digest: '', channels: {}, started_at: '', last_heartbeat: '' }, ttl_ms: 10_000 },
    });
    expect(heartbeat.status).toBeGreaterThanOrEqual(400);
    expect((await role.auth.listProxies()).find((p) => p.id === otherProxy.hostId)).toBeUndefined();
  });

  it('hostile: when checking the Proxy fails (a backend hiccup), a forwarded request fails; it is never the Proxy itself', async () => {
    const auth = role.auth as unknown as { resolveCaller: (id: unknown) => Promise<unknown> };
    const real = auth.resolveCaller;
    auth.resolveCaller = async () => {
      auth.resolveCaller = real;
      throw new GatewayError('GW_ERR_BACKEND_UNREACHABLE', 'injected: the backend did not answer');
    };
    try {
      // An anonymous client forwarded by the Proxy asks for a server certificate: with the old fallback it got one as the Proxy.
      const keys = generateKeyPair();
      const res = await request(role.address, { method: 'POST', path: '/v1/proxy/server-cert', ca, creds: proxyCreds(), headers: { [FORWARDED.marker]: '1' }, body: { public_key: keys.publicKeyPem, names: ['x.example'] } });
      expect(res.status).toBeGreaterThanOrEqual(500);
      expect(res.body.tlsCert ?? res.body.cert).toBeUndefined();
    } finally {
      auth.resolveCaller = real;
    }
  });

  it('the forwarded address is what login attempts are limited by, only when a Proxy forwards it', async () => {
    const keys = generateKeyPair();
    await role.auth.addUser(role.auth.adminIdentity(), 'carol', ['access'], PASSWORD);
    const login = (headers: Record<string, string>, creds?: Creds) =>
      request(role.address, { method: 'POST', path: '/webapi/login', ca, headers, ...(creds ? { creds } : {}), body: { username: 'carol', password: 'wrong password!', public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey } });
    const via = (addr: string) => ({ [FORWARDED.marker]: '1', [FORWARDED.addr]: addr });
    const codes: string[] = [];
    for (let i = 0; i < 6; i++) codes.push((await login(via('198.51.100.20'), proxyCreds())).body.error!.code);
    expect(codes.slice(0, 5)).toEqual(Array(5).fill('GW_ERR_AUTH_LOGIN_FAILED'));
    expect(codes[5]).toBe('GW_ERR_AUTH_RATE_LIMITED');
    // Another client behind the same Proxy is not limited by the first one's failures.
    expect((await login(via('198.51.100.21'), proxyCreds())).body.error?.code).toBe('GW_ERR_AUTH_LOGIN_FAILED');
    // A user naming a fresh address itself, directly: its own address counts (the loopback one, still free here).
    for (let i = 0; i < 5; i++) await login(via(`203.0.113.${i}`), alice);
    expect((await login(via('203.0.113.99'), alice)).body.error?.code).toBe('GW_ERR_AUTH_RATE_LIMITED');
  });
});

describe('RemoteProxyAuth', () => {
  it('closes a tracked session when a lock arrives over the event stream, and watchers hear of changes', async () => {
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer });
    try {
      let resyncs = 0;
      let proxiesChanged = 0;
      remote.watchCluster({ presence: () => undefined, proxies: () => void proxiesChanged++, resync: () => void resyncs++ });
      await waitUntil('the first resync (the stream connected)', () => resyncs > 0);
      let closed: GatewayError | undefined;
      await role.auth.addUser(role.auth.adminIdentity(), 'bob', ['access'], PASSWORD);
      const bob = identityFromCert((await loginAt(role.auth, 'bob')).cert);
      remote.sessions.track(await remote.resolveCaller(bob), 'test session', (reason) => (closed = reason));
      await remote.heartbeatProxy({ id: proxy.hostId, nodename: 'proxy1', version: '1.0.0', public_addr: 'p:443', channels_digest: 'x', channels: {}, started_at: new Date().toISOString(), last_heartbeat: new Date().toISOString() }, 60_000);
      await waitUntil('the proxies event', () => proxiesChanged > 0);
      await role.auth.createLock(role.auth.adminIdentity(), { target: { user: 'bob' } });
      await waitUntil('the session closed by the lock', () => closed !== undefined);
      expect(closed?.code).toBe('GW_ERR_ACCESS_LOCKED');
    } finally {
      remote.close();
    }
  });

  it('hostile timing: a lock whose first re-check fails (the Auth Service hiccups) still closes the session', async () => {
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer });
    const auth = role.auth as unknown as { revocationOf: (id: unknown) => Promise<unknown> };
    const real = auth.revocationOf;
    try {
      let resyncs = 0;
      remote.watchCluster({ presence: () => undefined, proxies: () => undefined, resync: () => void resyncs++ });
      await waitUntil('the stream connected', () => resyncs > 0);
      await role.auth.addUser(role.auth.adminIdentity(), 'erin', ['access'], PASSWORD);
      const erin = identityFromCert((await loginAt(role.auth, 'erin')).cert);
      let closed: GatewayError | undefined;
      remote.sessions.track(await remote.resolveCaller(erin), 'test session', (reason) => (closed = reason));
      // The next two re-checks fail on the Auth side (as during a fail-over); the lock must still land.
      let failures = 2;
      auth.revocationOf = async (id: unknown) => {
        if (failures-- > 0) throw new GatewayError('GW_ERR_BACKEND_UNREACHABLE', 'injected: the backend did not answer');
        return real.call(role.auth, id);
      };
      await role.auth.createLock(role.auth.adminIdentity(), { target: { user: 'erin' } });
      await waitUntil('the session closed by the lock, after the failed re-checks', () => closed !== undefined, 20_000);
      expect(closed?.code).toBe('GW_ERR_ACCESS_LOCKED');
      expect(failures).toBeLessThan(0);
    } finally {
      auth.revocationOf = real;
      remote.close();
    }
  });

  it('fails with GW_ERR_AUTH_UNREACHABLE naming the address when no Auth Service answers', async () => {
    const err = await RemoteProxyAuth.connect({ addresses: ['127.0.0.1:1'], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_AUTH_UNREACHABLE');
    expect((err as GatewayError).hint).toContain('127.0.0.1:1');
  });
});

describe('a Proxy role on a RemoteProxyAuth', () => {
  it('serves the Auth API router on its web port through the forwarder, and drops forwarding headers a client sends', async () => {
    const proxyDir = join(dir, 'proxy1');
    const proxyConfig = parseConfig(
      ['gateway:', '  nodename: localhost', `  data_dir: ${proxyDir}`, `  auth_server: ${role.address}`, 'auth_service:', '  enabled: no', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'),
      'proxy-only test',
    );
    const own = new Lifecycle();
    try {
      const limits = new ConnectionLimits(limitSettings(proxyConfig));
      own.onStop('backend', () => limits.close());
      const remote = await connectRemoteAuth({ config: proxyConfig, dialer, lifecycle: own });
      expect(remote.identity.hostId).toBe(proxy.hostId);
      const started = await startProxyRole({ config: proxyConfig, auth: remote.auth, api: remote.api, limits, dialer, lifecycle: own, proxyId: remote.identity.hostId });
      const web = started.addresses.web!;
      expect((await request(web, { path: '/webapi/ca', ca })).body.cluster_name).toBe(CLUSTER);
      expect((await request(web, { path: '/v1/status', ca, creds: alice })).body.identity).toMatchObject({ kind: 'user', name: 'alice' });
      // Hostile: no certificate, but the forwarding headers naming alice: the forwarder drops them.
      const spoofed = await request(web, { path: '/v1/status', ca, headers: { [FORWARDED.marker]: '1', [FORWARDED.cert]: derB64(alice.cert) } });
      expect(spoofed.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
      // Hostile: without a client certificate a body is bounded by what public routes take (64 KiB), not 1 MiB.
      const big = await request(web, { method: 'POST', path: '/webapi/login', ca, body: { username: 'alice', password: 'x'.repeat(100 * 1024) } });
      expect(big.status).toBe(413);
      expect(big.body.error?.code).toBe('GW_ERR_API_TOO_LARGE');
      // Refused by the forwarder itself, before buffering it all and sending it on.
      expect((big.body.error as { message?: string }).message).toMatch(/without a client certificate/);
      // Hostile: a forged certificate presented to the web port is refused there or at the Auth API.
      const forgedAnswer = await request(web, { path: '/v1/status', ca, creds: forged }).catch(() => undefined);
      if (forgedAnswer) expect(forgedAnswer.body.error?.code).toBe('GW_ERR_AUTH_UNAUTHENTICATED');
      const keys = generateKeyPair();
      const login = await request(web, { method: 'POST', path: '/webapi/login', ca, body: { username: 'alice', password: PASSWORD, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey } });
      expect(login.status).toBe(200);
      expect(identityFromCert(login.body.tlsCert as string)).toMatchObject({ kind: 'user', name: 'alice' });
      // Its own certificate for the Auth API renews as an agent's (POST /v1/agent/renew); calls, the event stream
      // and the forwarder go on with the new one.
      const before = remote.identity.cert;
      expect(await remote.renewal.check(Date.now() + 250 * 24 * 3600_000)).toBe('renewed');
      expect(remote.identity.cert).not.toBe(before);
      expect(loadHostIdentity(proxyDir)!.cert).toBe(remote.identity.cert);
      expect(remote.auth.upstream().cert).toBe(remote.identity.cert);
      expect((await remote.auth.listProxies()).map((p) => p.id)).toEqual(expect.any(Array));
      expect((await request(web, { path: '/v1/status', ca, creds: alice })).body.identity).toMatchObject({ kind: 'user', name: 'alice' });
      const events = await role.auth.listEvents(role.auth.adminIdentity(), 20);
      expect(events.map((e) => e.event).find((e) => e.event === 'host.renew' && e.host_id === proxy.hostId)).toMatchObject({ via: 'direct' });
    } finally {
      await own.stop();
    }
  });
});

/** An event stream kept open: its lines as they come, and whether it ended. */
function heldStream(addr: string, creds: Creds): Promise<{ lines: string[]; ended: () => boolean; close: () => void }> {
  const i = addr.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    let ended = false;
    const lines: string[] = [];
    const req = https.request({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)), path: '/v1/proxy/events', ca, agent: false, ...creds }, (res) => {
      expect(res.statusCode).toBe(200);
      res.on('data', (c: Buffer) => lines.push(...c.toString().split('\n').filter((l) => l !== '')));
      res.once('close', () => (ended = true));
      res.once('error', () => (ended = true));
      resolve({ lines, ended: () => ended, close: () => req.destroy() });
    });
    req.once('error', (err) => (ended ? undefined : reject(err)));
    req.end();
  });
}

/** A presence record as a Proxy's tunnel registry writes it. */
function presenceFor(hostId: string, proxyId: string, extra: Record<string, unknown> = {}) {
  const now = new Date().toISOString();
  return { hostId, nodename: 'agent1', proxyId, services: ['ssh'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [], node_labels: { env: 'prod' } }, connectedAt: now, lastHeartbeat: now, ...extra } as never;
}

const remoteOf = (who: HostIdentity) => RemoteProxyAuth.connect({ addresses: [role.address], credentials: { cert: who.cert, key: who.key, hostCa: who.hostCa, hostId: who.hostId }, dialer });
const eventsBy = async (match: (e: Record<string, unknown>) => boolean) => (await role.auth.listEvents(role.auth.adminIdentity(), 500)).map((e) => e.event).filter(match);

describe('each member acts only for itself (issue 23)', () => {
  it("hostile: a locked Proxy's open event stream is closed, and its record leaves the cluster's list", async () => {
    const rogue = await joinWith(['proxy'], 'proxy-locked');
    const stream = await heldStream(role.address, { cert: rogue.cert, key: rogue.key });
    await waitUntil('the hello', () => stream.lines.length > 0);
    expect(JSON.parse(stream.lines[0]!)).toMatchObject({ type: 'hello' });
    const remote = await remoteOf(rogue);
    try {
      await remote.heartbeatProxy({ id: rogue.hostId, nodename: 'proxy-locked', version: '1.0.0', public_addr: 'p:443', channels_digest: 'x', channels: {}, started_at: new Date().toISOString(), last_heartbeat: new Date().toISOString() }, 600_000);
      expect((await role.auth.listProxies()).map((p) => p.id)).toContain(rogue.hostId);
      await role.auth.createLock(role.auth.adminIdentity(), { target: { node: rogue.hostId } });
      await waitUntil('the locked Proxy\'s event stream closed', () => stream.ended());
      await waitUntil('its record removed', async () => !(await role.auth.listProxies()).some((p) => p.id === rogue.hostId));
      // And it cannot write it again, nor open a new stream.
      await expect(remote.heartbeatProxy({ id: rogue.hostId, nodename: 'x', version: '1', public_addr: 'p:443', channels_digest: 'x', channels: {}, started_at: '', last_heartbeat: '' }, 600_000)).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_LOCKED' });
      expect((await openStream(role.address, { cert: rogue.cert, key: rogue.key }, ca)).status).toBe(403);
    } finally {
      remote.close();
      stream.close();
    }
  });

  it("hostile: a removed Proxy's open event stream is closed", async () => {
    const gone = await joinWith(['proxy'], 'proxy-removed');
    const stream = await heldStream(role.address, { cert: gone.cert, key: gone.key });
    await waitUntil('the hello', () => stream.lines.length > 0);
    try {
      // No gwctl command removes a node record: it is deleted in the Backend, here through the Auth Service's own
      // handle (a second client of the SQLite file would be invisible to its watchers).
      const backend = (role.auth as unknown as { parts: { audit: { backend: Backend } } }).parts.audit.backend;
      expect(await backend.delete(`/nodes/${gone.hostId}`)).toBe(true);
      await waitUntil("the removed Proxy's event stream closed", () => stream.ended());
    } finally {
      stream.close();
    }
  });

  it('hostile: a Proxy writing presence for a made-up host ID, a path, a Proxy or a locked agent is refused', async () => {
    const remote = await remoteOf(proxy);
    const other = await joinWith(['proxy'], 'proxy-other');
    const locked = await joinWith(['node'], 'agent-locked');
    await role.auth.createLock(role.auth.adminIdentity(), { target: { node: locked.hostId } });
    try {
      for (const hostId of ['a/b/../c', '00000000-0000-4000-8000-00000000dead', '', proxy.hostId, other.hostId, locked.hostId]) {
        await expect(remote.setPresence(presenceFor(hostId, proxy.hostId), 60_000), hostId).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' });
      }
      // A tunnel that cannot be: connected an hour from now, or long before the agent joined.
      const later = new Date(Date.now() + 3600_000).toISOString();
      await expect(remote.setPresence(presenceFor(agent.hostId, proxy.hostId, { connectedAt: later }), 60_000)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' });
      await expect(remote.setPresence(presenceFor(agent.hostId, proxy.hostId, { connectedAt: '2001-01-01T00:00:00.000Z' }), 60_000)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' });
      const paths = (await role.auth.listPresence()).map((p) => p.hostId);
      expect(paths).not.toContain('a/b/../c');
      expect(paths).not.toContain(locked.hostId);
    } finally {
      remote.close();
    }
  });

  it("hostile: a Proxy's own record names addresses, not whatever its peers would then dial or print; the stored record stays", async () => {
    const remote = await remoteOf(proxy);
    const base = { id: proxy.hostId, nodename: 'proxy1', version: '1.0.0', public_addr: 'proxy1.example.com:443', channels_digest: 'x', channels: {}, started_at: new Date().toISOString(), last_heartbeat: new Date().toISOString() };
    try {
      await remote.heartbeatProxy({ ...base, peer_addr: 'proxy1.example.com:3021', public_addrs: ['proxy1.example.com:443'] }, 60_000);
      // A Proxy without a public address publishes its nodename: a bare name is a fine public_addr.
      await remote.heartbeatProxy({ ...base, public_addr: 'proxy1' }, 60_000);
      const bad: Array<Record<string, unknown>> = [
        { peer_addr: 'proxy1.example.com' }, // no port: every peer's dial would fail on it
        { peer_addr: 'a:b:c:443' },
        { peer_addr: 'proxy1.example.com:99999' },
        { peer_addr: 'http://169.254.169.254/latest:80' },
        { public_addr: 'evil\r\nSet-Cookie: x=1' },
        { public_addr: '' },
        { public_addrs: ['proxy1.example.com:443', 'no port'] },
      ];
      for (const change of bad) {
        await expect(remote.heartbeatProxy({ ...base, ...change } as never, 60_000), JSON.stringify(change)).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_REQUEST' });
      }
      expect((await role.auth.listProxies()).find((p) => p.id === proxy.hostId)).toMatchObject({ public_addr: 'proxy1' });
    } finally {
      remote.close();
    }
  });

  it("hostile: once an agent has signed its presence, a Proxy needs the agent's proof for it: none, another Proxy's, or forged labels are refused", async () => {
    const signing = await joinWith(['node'], 'agent-signing');
    const remote = await remoteOf(proxy);
    try {
      const sent = presenceFor(signing.hostId, proxy.hostId) as unknown as { services: string[]; resources: Record<string, unknown> };
      const proof = (proxyId: string, resources = sent.resources) => signPresenceProof(signing.key, signing.hostId, CLUSTER, { proxyId, services: sent.services, resources }, Date.now());
      // An agent that never signed (an earlier version): taken without a proof.
      await remote.setPresence(presenceFor(signing.hostId, proxy.hostId), 60_000);
      expect((await role.auth.getNode(signing.hostId))?.signsPresence).toBeUndefined();
      // Its first valid proof: taken, and from now on required.
      await remote.setPresence(presenceFor(signing.hostId, proxy.hostId, { proof: proof(proxy.hostId) }), 60_000);
      expect((await role.auth.getNode(signing.hostId))?.signsPresence).toBe(true);
      const refusedWith = async (extra: Record<string, unknown>, what: string) =>
        expect(remote.setPresence(presenceFor(signing.hostId, proxy.hostId, extra), 60_000), what).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' });
      await refusedWith({}, 'no proof');
      await refusedWith({ proof: proof('another-proxy') }, "a proof the agent gave another Proxy");
      await refusedWith({ proof: proof(proxy.hostId), resources: { ...sent.resources, node_labels: { env: 'dev' } } }, 'forged labels');
      await refusedWith({ proof: signPresenceProof(generateKeyPair().privateKeyPem, signing.hostId, CLUSTER, { proxyId: proxy.hostId, ...sent }, Date.now()) }, 'signed by another key');
      // The stored record keeps no proof.
      expect((await role.auth.listPresence()).find((p) => p.hostId === signing.hostId)?.proof).toBeUndefined();
      await remote.clearPresence(signing.hostId, 'ignored');
    } finally {
      remote.close();
    }
  });

  it('hostile: a presence for a real agent keeps only what that agent joined to serve, under the name it joined with', async () => {
    const remote = await remoteOf(proxy);
    try {
      const forged = presenceFor(agent.hostId, proxy.hostId, {
        nodename: 'payroll-db',
        services: ['ssh', 'db', 'app'],
        resources: { databases: [{ name: 'payroll', protocol: 'postgres', labels: { env: 'prod' } }], apps: [{ name: 'admin', kind: 'http', labels: {} }], desktops: [], kube_clusters: [], node_labels: { env: 'prod' } },
        direct: { ssh: '127.0.0.1:22' },
      });
      await remote.setPresence(forged, 60_000);
      const stored = (await role.auth.listPresence()).find((p) => p.hostId === agent.hostId && p.proxyId === proxy.hostId);
      expect(stored).toMatchObject({ nodename: 'agent1', services: ['ssh'], resources: { databases: [], apps: [], node_labels: { env: 'prod' } } });
      expect(stored?.direct).toBeUndefined();
      // The Proxy may clear its own record only, by a host ID.
      await remote.clearPresence(agent.hostId, 'ignored');
      expect((await role.auth.listPresence()).some((p) => p.hostId === agent.hostId && p.proxyId === proxy.hostId)).toBe(false);
      await expect(remote.clearPresence('a/b/../c', 'ignored')).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_PRESENCE_REFUSED' });
    } finally {
      remote.close();
    }
  });

  it("hostile: a Proxy cannot write user.login, nor a session.start of an agent whose tunnel it does not claim; what it relays is recorded via it", async () => {
    const remote = await remoteOf(proxy);
    try {
      const login = { event: 'user.login', user: 'alice', source: '203.0.113.9', method: 'local' };
      await expect(remote.recordAgentEvent(agent.hostId, 'agent1', login)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
      await expect(remote.recordProxyEvent(proxy.hostId, login)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
      // An SSH session is the node's to report, never a Proxy's own.
      const start = { event: 'session.start', user: 'alice', login: 'root', session_id: 'forged-1', by: { kind: 'admin', name: 'admin' } };
      await expect(remote.recordProxyEvent(proxy.hostId, start)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
      // No presence of this Proxy for the agent: it carries no tunnel of it.
      await expect(remote.recordAgentEvent(agent.hostId, 'agent1', start)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
      await expect(remote.recordAgentEvent('a/b/../c', 'agent1', start)).rejects.toMatchObject({ code: 'GW_ERR_MEMBER_EVENT_REFUSED' });
      expect(await eventsBy((e) => e.session_id === 'forged-1' || (e.event === 'user.login' && e.source === '203.0.113.9'))).toEqual([]);
      // With its presence of the agent: relayed, recorded with the agent's joined name and this Proxy as the relay,
      // the body's "by" and "reported_by" dropped.
      await remote.setPresence(presenceFor(agent.hostId, proxy.hostId), 60_000);
      await remote.recordAgentEvent(agent.hostId, 'someone-else', { ...start, session_id: 'relayed-1', reported_by: { host_id: 'x' } });
      const [relayed] = await eventsBy((e) => e.session_id === 'relayed-1');
      expect(relayed).toMatchObject({ event: 'session.start', reported_by: { host_id: agent.hostId, nodename: 'agent1', via: proxy.hostId } });
      expect(relayed?.by).toBeUndefined();
      // A session the Proxy routed, on its own account: recorded as its report.
      await remote.recordProxyEvent('someone-else', { event: 'db.session.start', user: 'alice', db: 'orders', session_id: 'db-1' });
      expect(await eventsBy((e) => e.session_id === 'db-1')).toEqual([expect.objectContaining({ event: 'db.session.start', reported_by: { proxy_id: proxy.hostId } })]);
      await remote.clearPresence(agent.hostId, 'ignored');
    } finally {
      remote.close();
    }
  });

  it('hostile: an agent reporting a kind it may not report is refused; its sessions are recorded under its own host ID', async () => {
    const post = (event: unknown) => request(role.address, { method: 'POST', path: '/v1/agent/events', creds: { cert: agent.cert, key: agent.key }, ca, body: { event } });
    for (const kind of ['user.login', 'lock.create', 'host.renew', undefined]) {
      const res = await post({ event: kind, user: 'alice', session_id: 'agent-forged' });
      expect(res.status, String(kind)).toBe(403);
      expect(res.body.error?.code).toBe('GW_ERR_MEMBER_EVENT_REFUSED');
    }
    expect(await eventsBy((e) => e.session_id === 'agent-forged')).toEqual([]);
    expect((await post({ event: 'session.end', user: 'alice', session_id: 'agent-own', reported_by: { host_id: proxy.hostId } })).status).toBe(200);
    expect(await eventsBy((e) => e.session_id === 'agent-own')).toEqual([expect.objectContaining({ reported_by: { host_id: agent.hostId, nodename: 'agent1' } })]);
  });
});

// Last: it stops the Auth Service of this file and starts it again on the same port and data directory.
describe('RemoteProxyAuth while the Auth Service is down', () => {
  /** The Auth Service of this file again, on the same port and data directory. */
  async function restartAuth(address: string): Promise<void> {
    const port = address.slice(address.lastIndexOf(':') + 1);
    const again = parseConfig(
      ['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'auth')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, `  listen_addr: 127.0.0.1:${port}`, ''].join('\n'),
      'proxyapi test, restarted',
    );
    lifecycle = new Lifecycle();
    const limits = new ConnectionLimits(limitSettings(again));
    lifecycle.onStop('backend', () => limits.close());
    role = await startAuthRole({ config: again, limits, lifecycle });
  }

  it('fails calls with GW_ERR_AUTH_UNREACHABLE naming the address, keeps what is open, and resyncs when the Auth Service is back', async () => {
    // The event stream's reconnects run on this clock (random 0: each delay the low end of equal jitter).
    const clock = new ManualClock();
    const remote = await RemoteProxyAuth.connect({ addresses: [role.address], credentials: { ...proxyCreds(), hostCa: proxy.hostCa, hostId: proxy.hostId }, dialer, backoffDeps: clock.deps(() => 0) });
    /** Fires the pending reconnect and waits until the try it starts has failed (the next one is scheduled). */
    const failedTry = async () => {
      const n = clock.delays.length;
      clock.fireNext();
      await waitUntil('the try failed and the next was scheduled', () => clock.delays.length > n);
    };
    try {
      let resyncs = 0;
      remote.watchCluster({ presence: () => undefined, proxies: () => undefined, resync: () => void resyncs++ });
      await waitUntil('the first resync', () => resyncs > 0);
      let closed: GatewayError | undefined;
      remote.sessions.track(await remote.resolveCaller(identityFromCert(alice.cert)), 'test session', (reason) => (closed = reason));
      const address = role.address;
      await lifecycle.stop();
      const err = await remote.listProxies().catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'GW_ERR_AUTH_UNREACHABLE' });
      expect((err as GatewayError).hint).toContain(address);
      // A re-check that cannot be answered closes nothing.
      expect(await remote.sessions.revalidate((id) => remote.revocationOf(id))).toEqual([]);
      expect(closed).toBeUndefined();
      // The stream that had said hello reconnects soon; the tries that fail back off (EVENTS_RETRY).
      await waitUntil('the reconnect of the stream that ended', () => clock.pending === 1);
      await failedTry();
      await failedTry();
      expect(clock.delays).toEqual([EVENTS_RECONNECT_MS, EVENTS_RETRY.firstMs / 2, EVENTS_RETRY.firstMs]);
      const before = resyncs;
      await restartAuth(address);
      clock.fireNext();
      await waitUntil('a resync after the event stream reconnected', () => resyncs > before);
      expect((await remote.listProxies()).length).toBeGreaterThanOrEqual(0);
      expect(remote.sessions.count()).toBe(1);
      // The hello started the backoff again: after the next outage the first failed try waits the first delay.
      await lifecycle.stop();
      await waitUntil('the reconnect of the stream that ended', () => clock.pending === 1);
      await failedTry();
      expect(clock.delays.slice(3)).toEqual([EVENTS_RECONNECT_MS, EVENTS_RETRY.firstMs / 2]);
      await restartAuth(address);
    } finally {
      remote.close();
    }
    expect(clock.pending).toBe(0);
  });
});

/** The local admin identity the Auth role wrote. */
async function startAdmin(): Promise<Creds> {
  const { readFile } = await import('node:fs/promises');
  return { cert: await readFile(join(dir, 'auth', 'admin', 'cert.pem'), 'utf8'), key: await readFile(join(dir, 'auth', 'admin', 'key.pem'), 'utf8') };
}
