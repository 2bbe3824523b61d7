/**
 * The role starters of src/roles/, each started alone in this process where it can run alone today: the auth
 * role; the proxy role with an in-process Auth Service behind nothing but ProxyAuth; an agent with a local Auth
 * Service, with and without a Proxy; host certificate renewal as the agent role wires it. Each test checks what the role serves, then that stop() closes it in the
 * one order (a log of every closer the starters registered) and that its ports are closed afterwards.
 */
import { randomUUID } from 'node:crypto';
import https from 'node:https';
import net from 'node:net';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { ProxyAuth } from '../../src/auth/proxyauth.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { loadHostIdentity } from '../../src/agent/identity.js';
import { waitUntil } from '../helpers/wait.js';
import { startAgentRole } from '../../src/roles/agent.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { daemonEnvironment } from '../../src/roles/environment.js';
import { Lifecycle, type Closer, type StopPhase } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';

/** A Lifecycle that logs when each registered closer starts and ends. */
class RecordingLifecycle extends Lifecycle {
  readonly log: Array<{ phase: StopPhase; at: 'start' | 'end' }> = [];

  override onStop(phase: StopPhase, closer: Closer): void {
    super.onStop(phase, async () => {
      this.log.push({ phase, at: 'start' });
      try {
        await closer();
      } finally {
        this.log.push({ phase, at: 'end' });
      }
    });
  }
}

/** The phases that closed something, in order; each one's closers all ended before the next one's started. */
function phasesClosed(log: RecordingLifecycle['log']): StopPhase[] {
  const phases = [...new Set(log.map((e) => e.phase))];
  for (let i = 1; i < phases.length; i++) {
    const lastEnd = log.map((e) => (e.phase === phases[i - 1] && e.at === 'end' ? 1 : 0)).lastIndexOf(1);
    const firstStart = log.findIndex((e) => e.phase === phases[i] && e.at === 'start');
    expect(lastEnd, `${phases[i - 1]} ended before ${phases[i]} started`).toBeLessThan(firstStart);
  }
  return phases;
}

/** Resolves true when a TCP connection to addr is refused. */
function refused(addr: string): Promise<boolean> {
  const i = addr.lastIndexOf(':');
  return new Promise((resolve) => {
    const socket = net.connect(Number(addr.slice(i + 1)), addr.slice(0, i).replace(/^\[|\]$/g, ''));
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
  });
}

function getJson(addr: string, path: string, ca: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const i = addr.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const req = https.get({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)), path, ca, agent: false }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown> }));
    });
    req.once('error', reject);
  });
}

let dir: string;
let config: GatewayConfig;
let lifecycle: RecordingLifecycle;
let limits: ConnectionLimits;
// No proxy variables: a developer's own must not reach these dials, and no upgrader directory exists.
const environment = () => daemonEnvironment({ GATEWAY_UPGRADE_DIR: join(dir, 'no-upgrader') });
const dialer = new Dialer({ env: {} });

beforeAll(() => setRootLogger(createLogger({ level: 'silent' })));

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-roles-'));
  config = parseConfig(
    [
      'gateway:',
      // The name the Proxy tells its agents to dial (it has no public_addr here): this machine.
      '  nodename: localhost',
      `  data_dir: ${join(dir, 'data')}`,
      'auth_service:',
      '  cluster_name: roles.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      '  web_listen_addr: 127.0.0.1:0',
      'ssh_service:',
      '  enabled: yes',
      '',
    ].join('\n'),
    'roles test',
  );
  lifecycle = new RecordingLifecycle();
  // As the daemon does: one set of limits for every listener, closed with the Backend.
  limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
});

afterEach(async () => {
  await lifecycle.stop().catch(() => undefined);
  await rm(dir, { recursive: true, force: true });
});

const startAuth = (proxyPublicAddr?: string): Promise<AuthRole> =>
  startAuthRole({ config, limits, lifecycle, ...(proxyPublicAddr ? { proxyPublicAddr } : {}) });

/** Only what ProxyAuth declares, delegating to the in-process service: no CA private key, no other method. */
function onlyProxyAuth(role: AuthRole, issued: string[]): ProxyAuth {
  const auth = role.auth;
  const pub = (ca: typeof auth.host) => ({ tls: { certPem: ca.tls.certPem }, ssh: { publicKey: ca.ssh.publicKey } });
  return {
    clusterName: auth.clusterName,
    host: pub(auth.host),
    user: pub(auth.user),
    authPreference: () => auth.authPreference(),
    sessions: auth.sessions,
    resolveCaller: (c) => auth.resolveCaller(c),
    resolveSshUser: (name, issuedAt) => auth.resolveSshUser(name, issuedAt),
    rolesOf: (names) => auth.rolesOf(names),
    revocationOf: (id) => auth.revocationOf(id),
    getNode: (hostId) => auth.getNode(hostId),
    setPresence: (p, ttlMs) => auth.setPresence(p, ttlMs),
    clearPresence: (hostId, proxyId, connectedAt) => auth.clearPresence(hostId, proxyId, connectedAt),
    heartbeatProxy: (record, ttlMs) => auth.heartbeatProxy(record, ttlMs),
    removeProxy: (id) => auth.removeProxy(id),
    listProxies: () => auth.listProxies(),
    listPresence: () => auth.listPresence(),
    tunnelStrategy: () => auth.tunnelStrategy(),
    watchCluster: (handlers) => auth.watchCluster(handlers),
    recordAgentEvent: (hostId, nodename, event) => auth.recordAgentEvent(hostId, nodename, event),
    recordProxyEvent: (proxyId, event) => auth.recordProxyEvent(proxyId, event),
    renewHost: (request) => auth.renewHost(request),
    watchMaintenance: (onChange) => auth.watchMaintenance(onChange),
    maintenanceConfig: () => auth.maintenanceConfig(),
    listNodes: () => auth.listNodes(),
    issueServerCert: (key, names, hostId) => {
      issued.push(hostId ?? 'auth');
      return auth.issueServerCert(key, names, hostId);
    },
    resolveWebSession: (id, bearer) => auth.resolveWebSession(id, bearer),
    webSessionSshCert: (id, bearer, key) => auth.webSessionSshCert(id, bearer, key),
    createAppLaunch: (id, bearer, app, state) => auth.createAppLaunch(id, bearer, app, state),
    redeemAppLaunch: (token, app, state) => auth.redeemAppLaunch(token, app, state),
    resolveAppSession: (sessionId, app) => auth.resolveAppSession(sessionId, app),
  };
}

describe('role starters, each alone in this process', () => {
  it('auth: serves its API with mutual TLS, writes the admin identity, and closes its listener before the Backend', async () => {
    const role = await startAuth();
    const ca = await getJson(role.address, '/webapi/ca', role.auth.host.tls.certPem);
    expect(ca).toMatchObject({ status: 200, body: { cluster_name: 'roles.example', host_ca: role.auth.host.tls.certPem } });
    expect(await readFile(join(dir, 'data', 'admin', 'auth-addr'), 'utf8')).toBe(`${role.address}\n`);
    expect(await readFile(join(dir, 'data', 'admin', 'host-ca.pem'), 'utf8')).toBe(role.auth.host.tls.certPem);

    await lifecycle.stop();
    expect(phasesClosed(lifecycle.log)).toEqual(['auth', 'backend']);
    expect(await refused(role.address)).toBe(true);
  });

  it('proxy: runs on a ProxyAuth that is only the interface, serves the router it is given, closes before the Auth API', async () => {
    const auth = await startAuth();
    const issued: string[] = [];
    const proxyId = '7d4a5c3e-0000-4000-8000-00000000a001';
    const proxy = await startProxyRole({ config, auth: onlyProxyAuth(auth, issued), api: auth.api, limits, dialer, lifecycle, proxyId });
    const web = proxy.addresses.web!;
    expect(issued).toEqual([proxyId]);
    // It registered itself: the cluster lists it, and /webapi/find names it.
    expect((await auth.auth.listProxies()).map((p) => p.id)).toEqual([proxyId]);
    const ping = await getJson(web, '/webapi/ping', auth.auth.host.tls.certPem);
    expect(ping).toMatchObject({ status: 200, body: { cluster_name: 'roles.example' } });
    // The Auth API's router, through the web port.
    expect(await getJson(web, '/webapi/ca', auth.auth.host.tls.certPem)).toMatchObject({ status: 200, body: { cluster_name: 'roles.example' } });

    await lifecycle.stop();
    expect(phasesClosed(lifecycle.log)).toEqual(['proxy', 'auth', 'backend']);
    expect(await refused(web)).toBe(true);
  });

  it('agent with a local Auth Service and no Proxy: gets its identity from it and opens no tunnel', async () => {
    const auth = await startAuth();
    const agent = await startAgentRole({ config, services: ['auth_service', 'ssh_service'], localAuth: auth.auth, dialer, environment: environment(), lifecycle });
    expect(agent.hostIdentity).toMatchObject({ cluster: 'roles.example', roles: ['node'], joinedVia: 'local' });
    expect(await auth.auth.getNode(agent.hostIdentity.hostId)).toMatchObject({ nodename: 'localhost', roles: ['node'] });
    expect(agent.tunnelAgent).toBeUndefined();

    await lifecycle.stop();
    // agents: the agent's certificate, a source of the expiry metric (src/metrics/certs.ts), unregistered; no tunnel.
    expect(phasesClosed(lifecycle.log)).toEqual(['agents', 'auth', 'backend']);
  });

  it('agent with a local Auth Service and Proxy: its tunnel reaches the Proxy, and it stops before the Proxy, the Auth API and the Backend', async () => {
    const auth = await startAuth();
    const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: randomUUID() });
    const agent = await startAgentRole({
      config,
      services: ['auth_service', 'proxy_service', 'ssh_service'],
      localAuth: auth.auth,
      localProxy: proxy.addresses.web!,
      dialer,
      environment: environment(),
      lifecycle,
    });
    const tunnel = agent.tunnelAgent!;
    await new Promise((resolve) => tunnel.once('connected', resolve));
    expect(proxy.tunnels.get(agent.hostIdentity.hostId)).toMatchObject({ nodename: 'localhost', services: ['ssh'] });

    await lifecycle.stop();
    expect(phasesClosed(lifecycle.log)).toEqual(['agents', 'proxy', 'auth', 'backend']);
    expect(proxy.tunnels.list()).toEqual([]);
  });

  it('agent that has not joined, with no token and no local Auth Service: refused before it opens anything', async () => {
    const started = startAgentRole({ config, services: ['ssh_service'], dialer, environment: environment(), lifecycle });
    await expect(started).rejects.toMatchObject({ code: 'GW_ERR_AGENT_IDENTITY' });
    await lifecycle.stop();
    expect(phasesClosed(lifecycle.log)).toEqual(['backend']);
  });
});

describe('host certificate renewal, as the agent role wires it', () => {
  const LATER = () => Date.now() + 250 * 24 * 3600_000;

  it('an identity issued here renews from the Auth Service in this process; the stored identity and the next hello carry it', async () => {
    const auth = await startAuth();
    const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: randomUUID() });
    const agent = await startAgentRole({ config, services: ['auth_service', 'proxy_service', 'ssh_service'], localAuth: auth.auth, localProxy: proxy.addresses.web!, dialer, environment: environment(), lifecycle });
    const tunnel = agent.tunnelAgent!;
    await new Promise((resolve) => tunnel.once('connected', resolve));
    const before = agent.hostIdentity.cert;
    expect(await agent.renewal!.check(LATER())).toBe('renewed');
    const stored = loadHostIdentity(join(dir, 'data'))!;
    expect(stored.cert).not.toBe(before);
    // The role's identity (what `gateway status` and the banner read) is the one stored, though the tunnel has its own copy.
    expect(agent.hostIdentity.cert).toBe(stored.cert);
    expect(agent.hostIdentity.sshCert).toBe(stored.sshCert);
    expect((await auth.auth.getNode(agent.hostIdentity.hostId))?.renewedAt).toBeDefined();
    // The live tunnel's Proxy takes the new SSH host certificate (host-cert), and its presence says so.
    await waitUntil('the Proxy holds the renewed SSH certificate', () => proxy.tunnels.get(agent.hostIdentity.hostId)?.resources.node_host_cert === stored.sshCert);
    await waitUntil('and its presence', async () => (await auth.auth.listPresence()).some((p) => p.hostId === agent.hostIdentity.hostId && p.resources.node_host_cert === stored.sshCert));
    proxy.tunnels.get(agent.hostIdentity.hostId)!.link.end(); // the agent dials again, with a new hello
    await waitUntil('the next hello carries it too', () => proxy.tunnels.get(agent.hostIdentity.hostId)?.resources.node_host_cert === stored.sshCert && tunnel.getState() === 'connected');
  });

  it('an agent joined through a Proxy renews over its tunnel', async () => {
    const auth = await startAuth();
    const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: randomUUID() });
    const { token } = await auth.auth.addToken(auth.auth.adminIdentity(), { roles: ['db'] });
    const agentConfig = parseConfig(['gateway:', '  nodename: db-agent', `  data_dir: ${join(dir, 'agent')}`, 'db_service:', '  enabled: yes', '  databases:', '    - { name: main, protocol: postgres, uri: "127.0.0.1:5432" }', ''].join('\n'), 'agent');
    const agent = await startAgentRole({ config: agentConfig, services: ['db_service'], join: { token, caPin: auth.auth.caPin(), proxy: proxy.addresses.web! }, dialer, environment: environment(), lifecycle });
    expect(agent.hostIdentity.joinedVia).toBe('proxy');
    await waitUntil('the tunnel is up', () => agent.tunnelAgent!.getState() === 'connected');
    expect(await agent.renewal!.check(LATER())).toBe('renewed');
    expect(loadHostIdentity(join(dir, 'agent'))!.cert).toBe(agent.hostIdentity.cert);
    expect(await auth.auth.listEvents(auth.auth.adminIdentity(), 10)).toEqual(expect.arrayContaining([expect.objectContaining({ event: expect.objectContaining({ event: 'host.renew', host_id: agent.hostIdentity.hostId, via: proxy.tunnels.proxyId }) })]));
  });
});
