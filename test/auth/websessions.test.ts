/**
 * Web sessions (src/auth/websessions.ts) through the real router (src/auth/api.ts) on a real HTTPS server, as a
 * browser uses them: the login's cookie, the bearer on every request, the Origin check, expiry by the service's
 * clock (injected), sign-out, locks, deletions and lost roles, the shared rate limit with gwsh's login, the
 * one-time bearer handout after SSO, the web terminal's SSH certificates and app launches. Every refusal is
 * checked by its stable code.
 */
import { X509Certificate } from 'node:crypto';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createApiHandler } from '../../src/auth/api.js';
import { caPin, generateKeyPair, parseSshCert } from '../../src/auth/pki.js';
import { parseManifest } from '../../src/auth/resources/index.js';
import { AuthService } from '../../src/auth/service.js';
import { appSessionRef, MAX_WEB_SESSION_MS, WEB_SSH_CERT_MAX_MS } from '../../src/auth/websessions.js';
import { openSqliteBackend } from '../../src/backend/index.js';

/** The launch nonce an app's host set in the browser (a launch token is bound to it). */
const NONCE = 'n'.repeat(43);

const PASSWORD = 'correct horse battery';
const keys = generateKeyPair();
const COOKIE = /^__Host-gw_session=([A-Za-z0-9_-]{43}); Path=\/; HttpOnly; Secure; SameSite=Strict; Max-Age=(\d+)$/;

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Record<string, unknown> & { error?: { code: string; message: string; hint: string } };
}

let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let server: https.Server;
let host: string;
let now: number;

/** One request to the router as a browser (or a client) sends it. */
function call(method: string, path: string, options: { headers?: Record<string, string>; body?: unknown } = {}): Promise<Answer> {
  const text = options.body === undefined ? undefined : JSON.stringify(options.body);
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: (server.address() as AddressInfo).port,
        method,
        path,
        ca: auth.host.tls.certPem,
        servername: 'localhost',
        headers: { host, ...(text === undefined ? {} : { 'content-type': 'application/json' }), ...(options.headers ?? {}) },
        agent: false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Answer['body'] }));
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

interface Session {
  id: string;
  bearer: string;
  cookie: string;
  answer: Answer;
}

/** The headers the page sends with every API request. */
const creds = (s: Pick<Session, 'id' | 'bearer'>, extra: Record<string, string> = {}) => ({ cookie: `__Host-gw_session=${s.id}`, authorization: `Bearer ${s.bearer}`, ...extra });

async function webLogin(user: string, password = PASSWORD, headers: Record<string, string> = {}): Promise<Session> {
  const answer = await call('POST', '/webapi/sessions', { body: { user, password }, headers });
  expect(answer.status, JSON.stringify(answer.body)).toBe(200);
  const cookie = String(answer.headers['set-cookie']);
  const id = COOKIE.exec(cookie)![1]!;
  return { id, bearer: answer.body.token as string, cookie, answer };
}

function expectCode(answer: Answer, status: number, code: string): void {
  expect(answer.body.error?.code, JSON.stringify(answer.body)).toBe(code);
  expect(answer.status).toBe(status);
  expect(answer.body.error?.hint).toMatch(/\S/);
}

beforeEach(async () => {
  now = Date.now();
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'web.example', clock: () => now });
  await auth.addUser(auth.adminIdentity(), 'alice', ['access', 'editor'], PASSWORD, ['alice', 'root']);
  await auth.addUser(auth.adminIdentity(), 'bob', ['access'], PASSWORD, ['bob']);
  const serverKeys = generateKeyPair();
  const cert = await auth.issueServerCert(serverKeys.publicKeyPem, ['localhost']);
  server = https.createServer({ key: serverKeys.privateKeyPem, cert, ca: auth.user.tls.certPem, requestCert: true, rejectUnauthorized: false }, createApiHandler(auth));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  host = `gateway.example:${(server.address() as AddressInfo).port}`;
});

afterEach(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
  await backend.close();
});

describe('signing in on the web', () => {
  it("a role's max_session_ttl shortens the web session, its cookie and the gwsh login's certificates alike", async () => {
    const [role] = parseManifest('kind: role\nversion: v7\nmetadata: {name: short-lived}\nspec: {options: {max_session_ttl: 30m}}\n', 'r.yaml');
    await auth.createResources(auth.adminIdentity(), [role!], false);
    await auth.addUser(auth.adminIdentity(), 'carol', ['access', 'short-lived'], PASSWORD, ['carol']);
    const s = await webLogin('carol');
    expect(Number(COOKIE.exec(s.cookie)![2])).toBe(30 * 60);
    expect(s.answer.body.expires_at).toBe(new Date(now + 30 * 60_000).toISOString());
    // The same cap on the CLI's certificates.
    const keys = generateKeyPair();
    const bundle = await auth.login({ username: 'carol', password: PASSWORD, publicKeyPem: keys.publicKeyPem, sshPublicKey: keys.sshPublicKey, source: '127.0.0.1' });
    const cert = new X509Certificate(bundle.tlsCert);
    expect(Date.parse(cert.validTo) - now).toBeLessThanOrEqual(30 * 60_000 + 1000);
    // Users whose roles set none keep the full lifetime.
    expect(Number(COOKIE.exec((await webLogin('alice')).cookie)![2])).toBe(12 * 3600);
  });

  it('sets the session cookie with every attribute, answers the bearer and the user, and sends no CORS header', async () => {
    const s = await webLogin('alice');
    const maxAge = Number(COOKIE.exec(s.cookie)![2]);
    expect(maxAge).toBe(12 * 3600);
    expect(s.bearer).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(s.bearer).not.toBe(s.id);
    expect(s.answer.body).toMatchObject({ user: { name: 'alice', roles: ['access', 'editor'], logins: ['alice', 'root'] }, expires_at: new Date(now + 12 * 3600_000).toISOString() });
    expect(Object.keys(s.answer.headers).filter((h) => h.startsWith('access-control-'))).toEqual([]);
    expect(s.answer.headers['cache-control']).toBe('no-store');
    // Neither secret is stored: the record is keyed by the id's hash and holds the bearer's hash.
    const stored = await backend.range('/web_sessions/');
    expect(stored).toHaveLength(1);
    expect(stored[0]!.key).not.toContain(s.id);
    expect(stored[0]!.value).not.toContain(s.id);
    expect(stored[0]!.value).not.toContain(s.bearer);
    const events = (await backend.range('/events/')).map((i) => JSON.parse(i.value) as Record<string, unknown>);
    expect(events).toContainEqual(expect.objectContaining({ event: 'user.login', user: 'alice', method: 'web' }));
  });

  it('a wrong password is GW_ERR_AUTH_LOGIN_FAILED and sets no cookie; an SSO user (no password) cannot sign in with one', async () => {
    const answer = await call('POST', '/webapi/sessions', { body: { user: 'alice', password: 'wrong password' } });
    expectCode(answer, 401, 'GW_ERR_AUTH_LOGIN_FAILED');
    expect(answer.headers['set-cookie']).toBeUndefined();
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'nobody', password: PASSWORD } }), 401, 'GW_ERR_AUTH_LOGIN_FAILED');
    // A user written by a manifest (as SSO users are) has no password hash: no password signs it in.
    await auth.createResources(auth.adminIdentity(), [{ kind: 'user', version: 'v2', metadata: { name: 'carol' }, spec: { roles: ['access'] } }], false);
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'carol', password: '' } }), 401, 'GW_ERR_AUTH_LOGIN_FAILED');
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'carol', password: PASSWORD } }), 401, 'GW_ERR_AUTH_LOGIN_FAILED');
  });

  it('hostile bodies: over 64 KiB is GW_ERR_API_TOO_LARGE, fields of the wrong type are GW_ERR_API_BAD_REQUEST, neither counts as a failed login', async () => {
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'bob', password: 'x'.repeat(70 * 1024) } }), 413, 'GW_ERR_API_TOO_LARGE');
    for (const body of [{ user: 'bob' }, { user: ['bob'], password: PASSWORD }, { user: 'bob', password: 12345678 }]) {
      expectCode(await call('POST', '/webapi/sessions', { body }), 400, 'GW_ERR_API_BAD_REQUEST');
    }
    for (let i = 0; i < 4; i++) expectCode(await call('POST', '/webapi/sessions', { body: { user: 'bob', password: `wrong ${i}` } }), 401, 'GW_ERR_AUTH_LOGIN_FAILED');
    expect((await call('POST', '/webapi/sessions', { body: { user: 'bob', password: PASSWORD } })).status).toBe(200);
  });

  it('the lifetime is the user certificate TTL, capped', async () => {
    const long = await AuthService.open({ backend, clusterName: 'web.example', clock: () => now, userCertTtlMs: 1000 * 3600_000 });
    const created = await long.createWebSession({ kind: 'user', name: 'bob', cluster: 'web.example', roles: ['access'], logins: ['bob'] }, '192.0.2.1');
    expect(created.expiresAt - now).toBe(MAX_WEB_SESSION_MS);
    expect(created.cookie).toContain(`Max-Age=${MAX_WEB_SESSION_MS / 1000}`);
  });

  it('brute force: 5 wrong passwords on the web, then both the web login and gwsh login are GW_ERR_AUTH_RATE_LIMITED, the right password too', async () => {
    for (let i = 0; i < 5; i++) expectCode(await call('POST', '/webapi/sessions', { body: { user: 'bob', password: `wrong ${i}` } }), 401, 'GW_ERR_AUTH_LOGIN_FAILED');
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'bob', password: PASSWORD } }), 429, 'GW_ERR_AUTH_RATE_LIMITED');
    const cli = await call('POST', '/webapi/login', { body: { username: 'bob', password: PASSWORD, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey } });
    expectCode(cli, 429, 'GW_ERR_AUTH_RATE_LIMITED');
    // The other way round: failures at gwsh's login count for the web.
    for (let i = 0; i < 5; i++) {
      expectCode(await call('POST', '/webapi/login', { body: { username: 'alice', password: `wrong ${i}`, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey } }), 401, 'GW_ERR_AUTH_LOGIN_FAILED');
    }
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'alice', password: PASSWORD } }), 429, 'GW_ERR_AUTH_RATE_LIMITED');
  });
});

describe('the session on every request', () => {
  it('cookie + bearer of the same session: the current session with its acl, and the /v1/ routes with the same RBAC', async () => {
    const alice = await webLogin('alice');
    const current = await call('GET', '/webapi/sessions/current', { headers: creds(alice) });
    expect(current.status).toBe(200);
    expect(current.body).toEqual({
      user: { name: 'alice', roles: ['access', 'editor'], logins: ['alice', 'root'] },
      expires_at: new Date(now + 12 * 3600_000).toISOString(),
      // An editor (access,editor, as the README's first admin) may not read the window, but may grant its role.
      acl: { maintenance: { read: false, update: false, grant: true }, tokens: { list: true, create: true, delete: true }, events: { list: true }, agents: { list: true }, rollout: { read: false } },
    });
    const created = await call('POST', '/v1/tokens', { headers: creds(alice, { origin: `https://${host}` }), body: { roles: ['node'] } });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    // The page prints the joining command with the cluster's CA pin.
    expect(created.body.ca_pin).toBe(caPin(auth.host.tls.certPem));
    expect((await call('GET', '/v1/tokens', { headers: creds(alice) })).body.tokens).toHaveLength(1);

    const bob = await webLogin('bob');
    expect((await call('GET', '/webapi/sessions/current', { headers: creds(bob) })).body.acl).toEqual({
      maintenance: { read: false, update: false, grant: false },
      tokens: { list: false, create: false, delete: false },
      events: { list: false },
      agents: { list: false },
      rollout: { read: false },
    });
    expectCode(await call('GET', '/v1/tokens', { headers: creds(bob) }), 403, 'GW_ERR_ACCESS_DENIED');
  });

  it('refuses each wrong pairing with its code: no cookie, cookie without bearer, bearer of another session, tampered or malformed cookie', async () => {
    const alice = await webLogin('alice');
    const bob = await webLogin('bob');
    expectCode(await call('GET', '/webapi/sessions/current'), 401, 'GW_ERR_WEB_SESSION_MISSING');
    expectCode(await call('GET', '/v1/tokens', { headers: { authorization: `Bearer ${alice.bearer}` } }), 401, 'GW_ERR_WEB_SESSION_MISSING');
    expectCode(await call('GET', '/v1/tokens', { headers: { cookie: `__Host-gw_session=${alice.id}` } }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    expectCode(await call('GET', '/v1/tokens', { headers: creds({ id: alice.id, bearer: bob.bearer }) }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    const flipped = alice.id.slice(0, -1) + (alice.id.endsWith('A') ? 'B' : 'A');
    expectCode(await call('GET', '/v1/tokens', { headers: creds({ id: flipped, bearer: alice.bearer }) }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    expectCode(await call('GET', '/v1/tokens', { headers: creds({ id: '../../users/alice', bearer: alice.bearer }) }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    expectCode(await call('GET', '/v1/tokens', { headers: { cookie: `__Host-gw_session=${alice.id}`, authorization: 'Basic YWxpY2U6eA==' } }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    // A huge Cookie header (within the listener's head limit) with our cookie at its end: refused, not parsed at length.
    const huge = `${'x'.repeat(9000)}=1; __Host-gw_session=${alice.id}`;
    expectCode(await call('GET', '/v1/tokens', { headers: { cookie: huge, authorization: `Bearer ${alice.bearer}` } }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    // Without a session at all, the /v1/ routes still ask for a certificate (gwsh, gwctl).
    expectCode(await call('GET', '/v1/tokens'), 401, 'GW_ERR_AUTH_UNAUTHENTICATED');
    // Still fine with the right pair.
    expect((await call('GET', '/v1/tokens', { headers: creds(alice) })).status).toBe(200);
  });

  it('expires by the service clock: GW_ERR_WEB_SESSION_EXPIRED, and it can still be signed out', async () => {
    const alice = await webLogin('alice');
    now += 12 * 3600_000 - 1000;
    expect((await call('GET', '/webapi/sessions/current', { headers: creds(alice) })).status).toBe(200);
    now += 1000;
    expectCode(await call('GET', '/webapi/sessions/current', { headers: creds(alice) }), 401, 'GW_ERR_WEB_SESSION_EXPIRED');
    expectCode(await call('GET', '/v1/tokens', { headers: creds(alice) }), 401, 'GW_ERR_WEB_SESSION_EXPIRED');
    const out = await call('DELETE', '/webapi/sessions', { headers: creds(alice) });
    expect(out.status).toBe(200);
    expect(String(out.headers['set-cookie'])).toMatch(/^__Host-gw_session=; Path=\/; HttpOnly; Secure; SameSite=Strict; Max-Age=0$/);
  });

  it('after sign-out the session is gone (GW_ERR_WEB_SESSION_INVALID); sign-out needs the bearer too', async () => {
    const alice = await webLogin('alice');
    expectCode(await call('DELETE', '/webapi/sessions', { headers: { cookie: `__Host-gw_session=${alice.id}` } }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    const out = await call('DELETE', '/webapi/sessions', { headers: creds(alice) });
    expect(out.status).toBe(200);
    expect(String(out.headers['set-cookie'])).toContain('Max-Age=0');
    expectCode(await call('GET', '/webapi/sessions/current', { headers: creds(alice) }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    expect(await backend.range('/web_sessions/')).toHaveLength(0);
    const events = (await backend.range('/events/')).map((i) => JSON.parse(i.value) as Record<string, unknown>);
    expect(events).toContainEqual(expect.objectContaining({ event: 'web.logout', by: { kind: 'user', name: 'alice' } }));
  });

  it('a lock refuses the session while it lasts; a deleted user stays refused even when created again; a lost role stops counting at once', async () => {
    const alice = await webLogin('alice');
    await auth.createLock(auth.adminIdentity(), { target: { user: 'alice' }, name: 'stop-alice' });
    expectCode(await call('GET', '/webapi/sessions/current', { headers: creds(alice) }), 403, 'GW_ERR_ACCESS_LOCKED');
    expectCode(await call('GET', '/v1/tokens', { headers: creds(alice) }), 403, 'GW_ERR_ACCESS_LOCKED');
    await auth.removeLocks(auth.adminIdentity(), { name: 'stop-alice' });
    expect((await call('GET', '/v1/tokens', { headers: creds(alice) })).status).toBe(200);
    // A lock on one of its roles.
    await auth.createLock(auth.adminIdentity(), { target: { role: 'editor' }, name: 'stop-editors' });
    expectCode(await call('GET', '/v1/tokens', { headers: creds(alice) }), 403, 'GW_ERR_ACCESS_LOCKED');
    await auth.removeLocks(auth.adminIdentity(), { name: 'stop-editors' });

    await auth.setUserRoles(auth.adminIdentity(), 'alice', ['access']);
    expectCode(await call('GET', '/v1/tokens', { headers: creds(alice) }), 403, 'GW_ERR_ACCESS_DENIED');
    expect((await call('GET', '/webapi/sessions/current', { headers: creds(alice) })).body).toMatchObject({ user: { roles: ['access'] }, acl: { tokens: { list: false } } });
    // Given back: the session was never worth more than at login, and editor was in it.
    await auth.setUserRoles(auth.adminIdentity(), 'alice', ['access', 'editor']);
    expect((await call('GET', '/v1/tokens', { headers: creds(alice) })).status).toBe(200);

    await auth.removeUser(auth.adminIdentity(), 'alice');
    expectCode(await call('GET', '/webapi/sessions/current', { headers: creds(alice) }), 401, 'GW_ERR_AUTH_IDENTITY_REVOKED');
    now += 5000;
    await auth.addUser(auth.adminIdentity(), 'alice', ['access', 'editor'], PASSWORD, ['alice']);
    expectCode(await call('GET', '/webapi/sessions/current', { headers: creds(alice) }), 401, 'GW_ERR_AUTH_IDENTITY_REVOKED');
  });

  it('a state-changing request from another Origin is GW_ERR_WEB_CSRF and changes nothing; the same origin passes', async () => {
    const alice = await webLogin('alice');
    for (const origin of ['https://evil.example', 'null', `http://${host}`, `https://${host}.evil.example`, 'not an origin']) {
      expectCode(await call('POST', '/v1/tokens', { headers: creds(alice, { origin }), body: { roles: ['node'] } }), 403, 'GW_ERR_WEB_CSRF');
      expectCode(await call('DELETE', '/webapi/sessions', { headers: creds(alice, { origin }) }), 403, 'GW_ERR_WEB_CSRF');
    }
    expect((await call('GET', '/v1/tokens', { headers: creds(alice) })).body.tokens).toEqual([]);
    // Login CSRF: a foreign page cannot sign the browser in either.
    expectCode(await call('POST', '/webapi/sessions', { body: { user: 'alice', password: PASSWORD }, headers: { origin: 'https://evil.example' } }), 403, 'GW_ERR_WEB_CSRF');
    // A read from another origin is answered (the bearer protects it) without any CORS header: the browser hides it.
    const read = await call('GET', '/v1/tokens', { headers: creds(alice, { origin: 'https://evil.example' }) });
    expect(read.status).toBe(200);
    expect(Object.keys(read.headers).filter((h) => h.startsWith('access-control-'))).toEqual([]);
    expect((await call('POST', '/v1/tokens', { headers: creds(alice, { origin: `https://${host}` }), body: { roles: ['node'] } })).status).toBe(200);
    // Port 443 is the default: https://host and https://host:443 are one origin.
    const plain = await call('POST', '/v1/tokens', { headers: creds(alice, { origin: 'https://gateway.example', host: 'gateway.example:443' }), body: { roles: ['node'] } });
    expect(plain.status, JSON.stringify(plain.body)).toBe(200);
  });
});

describe('after an SSO callback', () => {
  const identity = { kind: 'user' as const, name: 'bob', cluster: 'web.example', roles: ['access'], logins: ['bob'] };

  it('the page gets the bearer once with the cookie alone, from its own origin', async () => {
    const created = await auth.createWebSession(identity, '192.0.2.9', { connector: { kind: 'oidc', name: 'corp' } });
    expect(created.cookie).toMatch(COOKIE);
    const cookie = { cookie: `__Host-gw_session=${created.id}` };
    expectCode(await call('POST', '/webapi/sessions/bearer', { headers: cookie }), 403, 'GW_ERR_WEB_CSRF');
    expectCode(await call('POST', '/webapi/sessions/bearer', { headers: { ...cookie, origin: 'https://evil.example' } }), 403, 'GW_ERR_WEB_CSRF');
    const handed = await call('POST', '/webapi/sessions/bearer', { headers: { ...cookie, origin: `https://${host}` } });
    expect(handed.status, JSON.stringify(handed.body)).toBe(200);
    expect(handed.body).toMatchObject({ user: { name: 'bob' }, connector: { kind: 'oidc', name: 'corp' } });
    const bearer = handed.body.token as string;
    expect(bearer).not.toBe(created.bearer);
    expectCode(await call('POST', '/webapi/sessions/bearer', { headers: { ...cookie, origin: `https://${host}` } }), 401, 'GW_ERR_WEB_SESSION_INVALID');
    const current = await call('GET', '/webapi/sessions/current', { headers: creds({ id: created.id, bearer }) });
    expect(current.body).toMatchObject({ user: { name: 'bob' }, connector: { kind: 'oidc', name: 'corp' } });
    // The bearer the callback was given (and discarded) is no longer the session's.
    expectCode(await call('GET', '/webapi/sessions/current', { headers: creds({ id: created.id, bearer: created.bearer }) }), 401, 'GW_ERR_WEB_SESSION_INVALID');
  });

  it('two concurrent handouts: exactly one gets the bearer; a password session never hands it out', async () => {
    const created = await auth.createWebSession(identity, '192.0.2.9');
    const headers = { cookie: `__Host-gw_session=${created.id}`, origin: `https://${host}` };
    const answers = await Promise.all(Array.from({ length: 6 }, () => call('POST', '/webapi/sessions/bearer', { headers })));
    expect(answers.filter((a) => a.status === 200)).toHaveLength(1);
    for (const a of answers.filter((x) => x.status !== 200)) expectCode(a, 401, 'GW_ERR_WEB_SESSION_INVALID');
    const alice = await webLogin('alice');
    expectCode(await call('POST', '/webapi/sessions/bearer', { headers: { cookie: `__Host-gw_session=${alice.id}`, origin: `https://${host}` } }), 401, 'GW_ERR_WEB_SESSION_INVALID');
  });
});

describe('the web terminal and apps (ProxyAuth)', () => {
  it('an SSH certificate for the session user: its logins, at most an hour, never past the session', async () => {
    const alice = await webLogin('alice');
    const { ssh_cert } = await auth.webSessionSshCert(alice.id, alice.bearer, keys.sshPublicKey);
    const parsed = parseSshCert(ssh_cert, auth.user.ssh.publicKey);
    expect(parsed.principals).toEqual(['alice', 'root']);
    expect(parsed.keyId).toBe('alice');
    expect(parsed.validBefore - now).toBeLessThanOrEqual(WEB_SSH_CERT_MAX_MS);
    now += 12 * 3600_000 - 60_000;
    const late = parseSshCert((await auth.webSessionSshCert(alice.id, alice.bearer, keys.sshPublicKey)).ssh_cert);
    expect(late.validBefore).toBeLessThanOrEqual(now + 60_000);
    await expect(auth.webSessionSshCert(alice.id, undefined, keys.sshPublicKey)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    await expect(auth.webSessionSshCert(alice.id, alice.bearer, 'ssh-rsa not-a-key')).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_KEY' });
  });

  it('a launch token works once and only for its app; the app session ends with its parent', async () => {
    const alice = await webLogin('alice');
    await expect(auth.createAppLaunch(alice.id, 'wrong-bearer', 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    const wrongApp = await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE);
    await expect(auth.redeemAppLaunch(wrongApp.token, 'wiki', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    // Spent by the wrong try.
    await expect(auth.redeemAppLaunch(wrongApp.token, 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });

    // Hostile: a token is bound to the nonce it was made for; redeemed with another (or no) nonce it is refused, and spent.
    await expect(auth.createAppLaunch(alice.id, alice.bearer, 'grafana', '')).rejects.toMatchObject({ code: 'GW_ERR_API_BAD_REQUEST' });
    const unbound = await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE);
    await expect(auth.redeemAppLaunch(unbound.token, 'grafana', 'o'.repeat(43))).rejects.toMatchObject({ code: 'GW_ERR_WEB_APP_LAUNCH_UNBOUND' });
    await expect(auth.redeemAppLaunch(unbound.token, 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    await expect(auth.redeemAppLaunch((await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE)).token, 'grafana', '')).rejects.toMatchObject({ code: 'GW_ERR_WEB_APP_LAUNCH_UNBOUND' });

    const { token } = await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE);
    const app = await auth.redeemAppLaunch(token, 'grafana', NONCE);
    await expect(auth.redeemAppLaunch(token, 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    expect(app.expiresAt).toBe(now + 12 * 3600_000);
    // The audit names the app session by a hash the Proxy's app.session.end carries too, never by its id (the cookie's secret).
    const started = (await auth.listEvents(auth.adminIdentity(), 1000)).filter((e) => e.event.event === 'app.session.start');
    expect(started.at(0)?.event).toMatchObject({ app: 'grafana', user: 'alice', app_session: appSessionRef(app.sessionId) });
    expect(JSON.stringify(started)).not.toContain(app.sessionId);
    expect((await auth.resolveAppSession(app.sessionId, 'grafana')).identity).toMatchObject({ name: 'alice', roles: ['access', 'editor'] });
    await expect(auth.resolveAppSession(app.sessionId, 'wiki')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    // An app session is not a web session, and the reverse.
    await expect(auth.resolveWebSession(app.sessionId, alice.bearer)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    await expect(auth.resolveAppSession(alice.id, 'grafana')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    // A lock reaches it like any other caller.
    await auth.createLock(auth.adminIdentity(), { target: { user: 'alice' }, name: 'l' });
    await expect(auth.resolveAppSession(app.sessionId, 'grafana')).rejects.toMatchObject({ code: 'GW_ERR_ACCESS_LOCKED' });
    await auth.removeLocks(auth.adminIdentity(), { name: 'l' });
    // Signing out of the page ends the app session.
    expect((await call('DELETE', '/webapi/sessions', { headers: creds(alice) })).status).toBe(200);
    await expect(auth.resolveAppSession(app.sessionId, 'grafana')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
  });

  it('ten concurrent redemptions of one launch token: exactly one app session', async () => {
    const alice = await webLogin('alice');
    const { token } = await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE);
    const results = await Promise.allSettled(Array.from({ length: 10 }, () => auth.redeemAppLaunch(token, 'grafana', NONCE)));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect(r.reason).toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
  });

  it('a launch token lives 60 s; an app session expires with its parent', async () => {
    const alice = await webLogin('alice');
    const late = await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE);
    now += 61_000;
    await expect(auth.redeemAppLaunch(late.token, 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    const app = await auth.redeemAppLaunch((await auth.createAppLaunch(alice.id, alice.bearer, 'grafana', NONCE)).token, 'grafana', NONCE);
    now = app.expiresAt;
    await expect(auth.resolveAppSession(app.sessionId, 'grafana')).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_EXPIRED' });
    await expect(auth.redeemAppLaunch('x'.repeat(43), 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
    await expect(auth.redeemAppLaunch('short', 'grafana', NONCE)).rejects.toMatchObject({ code: 'GW_ERR_WEB_SESSION_INVALID' });
  });
});

describe('GET /v1/events', () => {
  it('newest first, at most limit (1-500), for callers that may list events', async () => {
    const alice = await webLogin('alice');
    for (let i = 0; i < 3; i++) {
      now += 1000;
      await auth.addToken(auth.adminIdentity(), { roles: ['node'] });
    }
    const answer = await call('GET', '/v1/events?limit=2', { headers: creds(alice) });
    expect(answer.status, JSON.stringify(answer.body)).toBe(200);
    const events = answer.body.events as Array<{ name: string; event: { event: string; time: string } }>;
    expect(events).toHaveLength(2);
    expect(events[0]!.event.time > events[1]!.event.time).toBe(true);
    expect(events[0]!.event.event).toBe('token.create');
    for (const limit of ['0', '501', 'abc', '1.5']) expectCode(await call('GET', `/v1/events?limit=${limit}`, { headers: creds(alice) }), 400, 'GW_ERR_API_BAD_REQUEST');
    const bob = await webLogin('bob');
    expectCode(await call('GET', '/v1/events', { headers: creds(bob) }), 403, 'GW_ERR_ACCESS_DENIED');
  });
});
