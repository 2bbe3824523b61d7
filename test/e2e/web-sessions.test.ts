/**
 * Web sessions through a Proxy's real web port (the front door's TLS, HTTP server and deadlines), both ways a
 * Proxy reaches the Auth Service: in the same process (the router served in-process), and in its own process
 * (joined with a proxy token, RemoteProxyAuth and the forwarder: Cookie, Authorization, Origin and the addressed
 * host go to the Auth API, Set-Cookie comes back). The roles are started in this process, with their real
 * listeners on loopback, as the daemon composes them.
 *
 * Per Proxy: the browser's sign-in and the page's requests, each refusal by its code (no bearer, another
 * session's bearer, tampered cookie, another Origin, a lock, a deleted user), a huge Cookie header, the brute
 * force limit shared with gwsh's login (by the client's address, forwarded by the split Proxy), sign-out, the
 * bearer handout after SSO, expiry, a role taken away; and
 * ProxyAuth's web calls (what the Proxy's terminal and apps use) with their hostile cases. Nothing asserts time.
 */
import https from 'node:https';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { joinCluster } from '../../src/agent/identity.js';
import { generateKeyPair, parseSshCert } from '../../src/auth/pki.js';
import type { ProxyAuth } from '../../src/auth/proxyauth.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { connectRemoteAuth, startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { waitUntil } from '../helpers/wait.js';

/** The launch nonce an app's host set in the browser (a launch token is bound to it). */
const NONCE = 'n'.repeat(43);

const PASSWORD = 'correct horse battery';
const CLUSTER = 'websessions.example';
const COOKIE = /^__Host-gw_session=([A-Za-z0-9_-]{43}); Path=\/; HttpOnly; Secure; SameSite=Strict; Max-Age=(\d+)$/;
const dialer = new Dialer({ env: {} });

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: { error?: { code: string; message: string } } & Record<string, unknown>;
}

/** One HTTPS request to a web port (host:port), with the CA of the cluster's host certificates. */
function request(addr: string, options: { method?: string; path: string; headers?: Record<string, string>; body?: unknown; creds?: { cert: string; key: string } }): Promise<Answer> {
  const i = addr.lastIndexOf(':');
  const text = options.body === undefined ? undefined : JSON.stringify(options.body);
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: addr.slice(0, i),
        port: Number(addr.slice(i + 1)),
        method: options.method ?? 'GET',
        path: options.path,
        ca,
        agent: false,
        headers: { ...(text === undefined ? {} : { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) }), ...options.headers },
        ...(options.creds ?? {}),
      },
      (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => {
          let parsed: Answer['body'] = {};
          try {
            parsed = JSON.parse(body) as Answer['body'];
          } catch {
            // A refusal by the HTTP server itself (431) has no JSON body.
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: parsed });
        });
      },
    );
    req.once('error', reject);
    req.end(text);
  });
}

let dir: string;
let ca: string;
let role: AuthRole;
const lifecycles: Lifecycle[] = [];

interface Target {
  name: string;
  web: string;
  auth: ProxyAuth;
}
const targets: Target[] = [];

function configOf(lines: string[]): GatewayConfig {
  return parseConfig([...lines, ''].join('\n'), 'web sessions test');
}

beforeAll(async () => {
  setRootLogger(createLogger({ level: 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-websessions-'));
  const config = configOf(['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'auth')}`, 'auth_service:', `  cluster_name: ${CLUSTER}`, '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0']);
  const lifecycle = new Lifecycle();
  lifecycles.push(lifecycle);
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  role = await startAuthRole({ config, limits, lifecycle });
  ca = role.auth.host.tls.certPem;
  const admin = role.auth.adminIdentity();
  for (const prefix of ['one', 'split']) {
    await role.auth.addUser(admin, `${prefix}-alice`, ['access', 'editor'], PASSWORD, ['alice']);
    await role.auth.addUser(admin, `${prefix}-brute`, ['access'], PASSWORD);
    await role.auth.addUser(admin, `${prefix}-gone`, ['access'], PASSWORD);
    await role.auth.addUser(admin, `${prefix}-demoted`, ['access', 'editor'], PASSWORD);
  }
  const inProcess = await startProxyRole({ config, auth: role.auth, api: role.api, limits, dialer, lifecycle, proxyId: 'in-process-proxy' });
  targets.push({ name: 'one', web: inProcess.addresses.web!, auth: role.auth });

  // A Proxy in its own process, as `gateway start --roles=proxy` composes it.
  const { token } = await role.auth.addToken(admin, { roles: ['proxy'] });
  const proxyDir = join(dir, 'proxy');
  await joinCluster({ dataDir: proxyDir, server: role.address, joinedVia: 'auth', token, caPin: role.auth.caPin(), roles: ['proxy'], nodename: 'proxy', publicAddrs: [], dialer });
  const proxyConfig = configOf(['gateway:', '  nodename: localhost', `  data_dir: ${proxyDir}`, `  auth_server: ${role.address}`, 'auth_service:', '  enabled: no', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0']);
  const own = new Lifecycle();
  lifecycles.unshift(own);
  const proxyLimits = new ConnectionLimits(limitSettings(proxyConfig));
  own.onStop('backend', () => proxyLimits.close());
  const remote = await connectRemoteAuth({ config: proxyConfig, dialer, lifecycle: own });
  const split = await startProxyRole({ config: proxyConfig, auth: remote.auth, api: remote.api, limits: proxyLimits, dialer, lifecycle: own, proxyId: remote.identity.hostId });
  targets.push({ name: 'split', web: split.addresses.web!, auth: remote.auth });
}, 60_000);

afterAll(async () => {
  for (const l of lifecycles) await l.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const target = (name: string) => targets.find((t) => t.name === name)!;

describe.each(['one', 'split'])('through the %s-process Proxy', (name) => {
  const user = (u: string) => `${name}-${u}`;
  const creds = (s: { id: string; bearer: string }, extra: Record<string, string> = {}) => ({ cookie: `__Host-gw_session=${s.id}`, authorization: `Bearer ${s.bearer}`, ...extra });
  const sameOrigin = () => ({ origin: `https://${target(name).web}` });

  async function signIn(who: string): Promise<{ id: string; bearer: string; answer: Answer }> {
    const answer = await request(target(name).web, { method: 'POST', path: '/webapi/sessions', headers: sameOrigin(), body: { user: who, password: PASSWORD } });
    expect(answer.status, JSON.stringify(answer.body)).toBe(200);
    const m = COOKIE.exec(String(answer.headers['set-cookie']));
    expect(m, String(answer.headers['set-cookie'])).not.toBeNull();
    return { id: m![1]!, bearer: answer.body.token as string, answer };
  }

  it('signs in, and the page works with cookie + bearer: the session, tokens (the same RBAC as certificates), sign-out', async () => {
    const { web } = target(name);
    const s = await signIn(user('alice'));
    expect(Number(COOKIE.exec(String(s.answer.headers['set-cookie']))![2])).toBeGreaterThan(3600);
    expect(Object.keys(s.answer.headers).filter((h) => h.startsWith('access-control-'))).toEqual([]);
    const current = await request(web, { path: '/webapi/sessions/current', headers: creds(s) });
    expect(current.body).toMatchObject({ user: { name: user('alice'), roles: ['access', 'editor'], logins: ['alice'] }, acl: { tokens: { create: true } } });
    const created = await request(web, { method: 'POST', path: '/v1/tokens', headers: creds(s, sameOrigin()), body: { roles: ['node'], ttl_ms: 60_000 } });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const listed = await request(web, { path: '/v1/tokens', headers: creds(s) });
    expect((listed.body.tokens as unknown[]).length).toBeGreaterThan(0);
    // Another site's page cannot make the browser do it (the Auth API compares with the host the browser addressed).
    const forged = await request(web, { method: 'POST', path: '/v1/tokens', headers: creds(s, { origin: 'https://evil.example' }), body: { roles: ['node'] } });
    expect(forged.body.error?.code).toBe('GW_ERR_WEB_CSRF');
    expect(forged.status).toBe(403);
    const out = await request(web, { method: 'DELETE', path: '/webapi/sessions', headers: creds(s, sameOrigin()) });
    expect(out.status).toBe(200);
    expect(String(out.headers['set-cookie'])).toBe('__Host-gw_session=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0');
    expect((await request(web, { path: '/webapi/sessions/current', headers: creds(s) })).body.error?.code).toBe('GW_ERR_WEB_SESSION_INVALID');
  });

  it('refuses a missing cookie, a cookie without bearer, the bearer of another session and a tampered cookie, each with its code', async () => {
    const { web } = target(name);
    const a = await signIn(user('alice'));
    const b = await signIn(user('alice'));
    const code = async (headers: Record<string, string>, path = '/webapi/sessions/current') => {
      const answer = await request(web, { path, headers });
      expect(answer.status).toBe(401);
      return answer.body.error?.code;
    };
    expect(await code({})).toBe('GW_ERR_WEB_SESSION_MISSING');
    expect(await code({ cookie: `__Host-gw_session=${a.id}` }, '/v1/tokens')).toBe('GW_ERR_WEB_SESSION_INVALID');
    expect(await code(creds({ id: a.id, bearer: b.bearer }), '/v1/tokens')).toBe('GW_ERR_WEB_SESSION_INVALID');
    expect(await code(creds({ id: `${a.id.slice(0, 42)}${a.id.endsWith('x') ? 'y' : 'x'}`, bearer: a.bearer }))).toBe('GW_ERR_WEB_SESSION_INVALID');
    expect(await code({ authorization: `Bearer ${a.bearer}` }, '/v1/tokens')).toBe('GW_ERR_WEB_SESSION_MISSING');
  });

  it('a huge Cookie header: over the head limit the web port hangs up (or answers 431); under it, our cookie is not read at length', async () => {
    const { web } = target(name);
    const s = await signIn(user('alice'));
    const huge = await request(web, { path: '/v1/tokens', headers: creds(s, { cookie: `junk=${'x'.repeat(64 * 1024)}; __Host-gw_session=${s.id}` }) }).then(
      (answer) => answer.status,
      (err: Error) => err.message,
    );
    expect([431, 'socket hang up']).toContain(huge);
    const large = await request(web, { path: '/v1/tokens', headers: creds(s, { cookie: `junk=${'x'.repeat(10 * 1024)}; __Host-gw_session=${s.id}` }) });
    expect(large.status).toBe(401);
    expect(large.body.error?.code).toBe('GW_ERR_WEB_SESSION_INVALID');
    expect((await request(web, { path: '/v1/tokens', headers: creds(s) })).status).toBe(200);
  });

  it('a lock refuses the session while it lasts; a deleted user is refused', async () => {
    const { web } = target(name);
    const s = await signIn(user('alice'));
    const lock = await role.auth.createLock(role.auth.adminIdentity(), { target: { user: user('alice') } });
    const locked = await request(web, { path: '/webapi/sessions/current', headers: creds(s) });
    expect(locked.body.error?.code).toBe('GW_ERR_ACCESS_LOCKED');
    await role.auth.removeLocks(role.auth.adminIdentity(), { name: lock.metadata.name });
    expect((await request(web, { path: '/webapi/sessions/current', headers: creds(s) })).status).toBe(200);
    const gone = await signIn(user('gone'));
    await role.auth.removeUser(role.auth.adminIdentity(), user('gone'));
    expect((await request(web, { path: '/webapi/sessions/current', headers: creds(gone) })).body.error?.code).toBe('GW_ERR_AUTH_IDENTITY_REVOKED');
  });

  it('after SSO: the bearer is handed out once to the page (its Origin through this Proxy), and the session expires with its code', async () => {
    const { web } = target(name);
    const identity = { kind: 'user' as const, name: user('alice'), cluster: CLUSTER, roles: ['access'], logins: ['alice'] };
    const created = await role.auth.createWebSession(identity, '127.0.0.1', { connector: { kind: 'oidc', name: 'corp' } });
    const cookie = { cookie: `__Host-gw_session=${created.id}` };
    expect((await request(web, { method: 'POST', path: '/webapi/sessions/bearer', headers: { ...cookie, origin: 'https://evil.example' } })).body.error?.code).toBe('GW_ERR_WEB_CSRF');
    const handed = await request(web, { method: 'POST', path: '/webapi/sessions/bearer', headers: { ...cookie, ...sameOrigin() } });
    expect(handed.status, JSON.stringify(handed.body)).toBe(200);
    expect(handed.body).toMatchObject({ user: { name: user('alice') }, connector: { kind: 'oidc', name: 'corp' } });
    const again = await request(web, { method: 'POST', path: '/webapi/sessions/bearer', headers: { ...cookie, ...sameOrigin() } });
    expect(again.body.error?.code).toBe('GW_ERR_WEB_SESSION_INVALID');
    expect((await request(web, { path: '/webapi/sessions/current', headers: creds({ id: created.id, bearer: handed.body.token as string }) })).status).toBe(200);

    // A session of one second (an SSO assertion that ends soon): wait for the refusal, whenever it comes; what
    // matters is its code.
    const brief = await role.auth.createWebSession(identity, '127.0.0.1', { ttlMs: 1000 });
    let last: Answer | undefined;
    await waitUntil('the session to expire', async () => {
      last = await request(web, { path: '/webapi/sessions/current', headers: creds(brief) });
      return last.status !== 200;
    });
    expect(last!.status).toBe(401);
    expect(last!.body.error?.code).toBe('GW_ERR_WEB_SESSION_EXPIRED');
  });

  it('a role taken away stops counting at once for the open session', async () => {
    const { web } = target(name);
    const s = await signIn(user('demoted'));
    expect((await request(web, { path: '/v1/tokens', headers: creds(s) })).status).toBe(200);
    await role.auth.setUserRoles(role.auth.adminIdentity(), user('demoted'), ['access']);
    const denied = await request(web, { path: '/v1/tokens', headers: creds(s) });
    expect(denied.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
    expect((await request(web, { path: '/webapi/sessions/current', headers: creds(s) })).body).toMatchObject({ user: { roles: ['access'] }, acl: { tokens: { list: false } } });
  });

  it('brute force: the web login and gwsh login share one limit per user and client address', async () => {
    const { web } = target(name);
    for (let i = 0; i < 5; i++) {
      const wrong = await request(web, { method: 'POST', path: '/webapi/sessions', body: { user: user('brute'), password: `wrong ${i}` } });
      expect(wrong.body.error?.code).toBe('GW_ERR_AUTH_LOGIN_FAILED');
    }
    const web6 = await request(web, { method: 'POST', path: '/webapi/sessions', body: { user: user('brute'), password: PASSWORD } });
    expect(web6.body.error?.code).toBe('GW_ERR_AUTH_RATE_LIMITED');
    expect(web6.status).toBe(429);
    expect(web6.headers['set-cookie']).toBeUndefined();
    const keys = generateKeyPair();
    const cli = await request(web, { method: 'POST', path: '/webapi/login', body: { username: user('brute'), password: PASSWORD, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey } });
    expect(cli.body.error?.code).toBe('GW_ERR_AUTH_RATE_LIMITED');
  });

  it("ProxyAuth's web calls: the session's caller, an SSH certificate, app launch and app session; each refusal with its code", async () => {
    const { auth, web } = target(name);
    const s = await signIn(user('alice'));
    const view = await auth.resolveWebSession(s.id, s.bearer);
    expect(view.identity).toMatchObject({ kind: 'user', name: user('alice'), roles: ['access', 'editor'], logins: ['alice'] });
    await expect(auth.resolveWebSession(s.id, undefined)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    await expect(auth.resolveWebSession('tampered', s.bearer)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    const keys = generateKeyPair();
    const cert = parseSshCert((await auth.webSessionSshCert(s.id, s.bearer, keys.sshPublicKey)).ssh_cert, role.auth.user.ssh.publicKey);
    expect(cert.principals).toEqual(['alice']);
    await expect(auth.webSessionSshCert(s.id, 'not-the-bearer', keys.sshPublicKey)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    const { token } = await auth.createAppLaunch(s.id, s.bearer, 'grafana', NONCE);
    const app = await auth.redeemAppLaunch(token, 'grafana', NONCE);
    await expect(auth.redeemAppLaunch(token, 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    expect((await auth.resolveAppSession(app.sessionId, 'grafana')).identity.name).toBe(user('alice'));
    await expect(auth.resolveAppSession(app.sessionId, 'wiki')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    // Hostile: a browser session (or a user certificate) calling the Proxies' routes itself gets nothing.
    const direct = await request(web, { method: 'POST', path: '/v1/proxy/web-sessions/resolve', headers: creds(s, sameOrigin()), body: { id: s.id, bearer: s.bearer } });
    expect(direct.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
    // Signing out of the page ends the app session.
    expect((await request(web, { method: 'DELETE', path: '/webapi/sessions', headers: creds(s) })).status).toBe(200);
    await expect(auth.resolveAppSession(app.sessionId, 'grafana')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
  });
});
