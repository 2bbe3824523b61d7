/**
 * OIDC sign-in (src/auth/sso/oidc.ts through src/auth/ssoapi.ts) against a real OpenID provider started here
 * (oidc-provider, HTTPS with the test CA named in the connector's `ca`), its login and consent pages driven with
 * plain HTTP requests. The Auth Service reaches the provider through its Dialer. Hostile: ID tokens forged by a man
 * in the middle at the token endpoint (another key; or aud, iss, nonce, exp changed and re-signed), a replayed
 * callback, a state of another connector, a callback from another browser, a mapping without a role, the provider
 * down, the rate limit. Every refusal is checked by its code.
 */
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createApiHandler } from '../../src/auth/api.js';
import { generateKeyPair, identityFromCert, sshPublicKeyFromPem } from '../../src/auth/pki.js';
import { parseManifest } from '../../src/auth/resources/index.js';
import { AuthService } from '../../src/auth/service.js';
import { openSqliteBackend, type Backend } from '../../src/backend/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { CookieJar, answerCode, request, startOidcIdp, type Answer, type OidcIdp } from '../helpers/sso.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const REDIRECT = 'https://gateway.example/webapi/sso/oidc/callback';
let pki: TestPki;
let idp: OidcIdp;
let backend: Backend;
let auth: AuthService;
let server: https.Server;
let base: string;

const connector = (name: string, extra: Record<string, unknown> = {}) => ({
  kind: 'oidc', version: 'v3', metadata: { name },
  spec: {
    issuer_url: idp.issuer, client_id: idp.clientId, client_secret: idp.clientSecret, redirect_url: REDIRECT, ca: pki.caPem,
    scope: ['email', 'groups'], display: 'Corporate SSO',
    claims_to_roles: [{ claim: 'groups', value: 'admins', roles: ['editor', 'access'] }, { claim: 'groups', value: 'dev*', roles: ['access'] }],
    ...extra,
  },
});

/** Our API as a browser or gwsh calls it. */
const api = (path: string, options: Parameters<typeof request>[1] = {}) => request(`${base}${path}`, { ca: auth.host.tls.certPem, ...options });

/** The web sign-in up to our callback's URL: login start (binding cookie), then the provider. */
async function toCallback(user: string, name = 'corp', redirect = '/web/agents'): Promise<{ callback: string; binding: string }> {
  const start = await api(`/webapi/sso/oidc/${name}/login?redirect=${encodeURIComponent(redirect)}`, { headers: { accept: 'text/html' } });
  expect(start.status, start.text).toBe(302);
  const binding = /__Host-gw_sso=([^;]+)/.exec(String(start.headers['set-cookie']))![1]!;
  const callback = await idp.signIn(start.location!, user);
  expect(callback.startsWith(REDIRECT)).toBe(true);
  return { callback, binding };
}

/** Calls our callback with the provider's query, as the browser would. */
function callback(url: string, binding: string | undefined, accept = 'application/json'): Promise<Answer> {
  const u = new URL(url);
  return api(`/webapi/sso/oidc/callback${u.search}`, { headers: { accept, ...(binding ? { cookie: `__Host-gw_sso=${binding}` } : {}) } });
}


beforeAll(async () => {
  pki = await makeTestPki();
  idp = await startOidcIdp(pki, { redirectUri: REDIRECT, groups: (u) => (u === 'alice' || /^(unverified|silent|noemail)/.test(u) ? ['admins', 'developers'] : u === 'dave' ? ['developers'] : ['marketing']) });
});

afterAll(async () => {
  await idp.close();
  await pki.cleanup();
});

beforeEach(async () => {
  idp.tamper = 'none';
  backend?.close();
  server?.close();
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'sso.example', dialer: new Dialer({ env: {} }), authentication: { type: 'oidc', connector_name: 'corp' } });
  await auth.createResources(auth.adminIdentity(), [connector('corp') as never, connector('other', { display: 'Other' }) as never], false);
  const keys = generateKeyPair();
  const cert = await auth.issueServerCert(keys.publicKeyPem, ['localhost']);
  server = https.createServer({ key: keys.privateKeyPem, cert }, createApiHandler(auth));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

describe('OIDC sign-in on the web', () => {
  it('lists the connectors and reports the configured one as the preference', async () => {
    const list = (await api('/webapi/connectors')).json();
    expect(list).toEqual({ connectors: [{ kind: 'oidc', name: 'corp', display: 'Corporate SSO' }, { kind: 'oidc', name: 'other', display: 'Other' }], default: 'corp' });
    expect(await auth.authPreference()).toEqual({ type: 'oidc', connector: { kind: 'oidc', name: 'corp', display: 'Corporate SSO' } });
  });

  it('starts with code + PKCE S256 + nonce + state, and the callback creates the web session and the SSO user', async () => {
    const start = await api('/webapi/sso/oidc/corp/login?redirect=/web/agents');
    const auth_url = new URL(start.location!);
    expect(auth_url.origin).toBe(idp.issuer);
    expect(Object.fromEntries(auth_url.searchParams)).toMatchObject({ response_type: 'code', client_id: idp.clientId, redirect_uri: REDIRECT, code_challenge_method: 'S256' });
    for (const p of ['code_challenge', 'nonce', 'state']) expect(auth_url.searchParams.get(p)).toMatch(/^[A-Za-z0-9_-]{20,}$/);
    expect(String(start.headers['set-cookie'])).toMatch(/^__Host-gw_sso=[A-Za-z0-9_-]{43}; Path=\/; HttpOnly; Secure; SameSite=None; Max-Age=600$/);

    const { callback: url, binding } = await toCallback('alice');
    const done = await callback(url, binding);
    expect(done.status, done.text).toBe(302);
    expect(done.location).toBe(`${base}/web/sso-complete?redirect=%2Fweb%2Fagents`);
    const cookies = ([] as string[]).concat(done.headers['set-cookie'] ?? []);
    const session = /^__Host-gw_session=([A-Za-z0-9_-]{43}); Path=\/; HttpOnly; Secure; SameSite=Strict; Max-Age=\d+$/.exec(cookies.find((c) => c.startsWith('__Host-gw_session='))!)![1]!;
    expect(cookies.some((c) => c.startsWith('__Host-gw_sso=;') && c.includes('Max-Age=0'))).toBe(true);

    // The page then takes its bearer once, and is the SSO user with the mapped roles.
    const handout = await api('/webapi/sessions/bearer', { method: 'POST', headers: { cookie: `__Host-gw_session=${session}`, origin: base } });
    expect(handout.status, handout.text).toBe(200);
    const current = (await api('/webapi/sessions/current', { headers: { cookie: `__Host-gw_session=${session}`, authorization: `Bearer ${handout.json().token}` } })).json();
    expect(current.user).toMatchObject({ name: 'alice@example.com', roles: ['editor', 'access'] });
    expect(current.connector).toEqual({ kind: 'oidc', name: 'corp', display: 'Corporate SSO' });
    const [user] = (await auth.getResources(auth.adminIdentity(), 'user', 'alice@example.com', false)) as Array<{ spec: Record<string, any>; metadata: Record<string, any> }>;
    expect(user!.spec.created_by).toMatchObject({ connector: 'corp', kind: 'oidc' });
    expect(user!.spec.traits.groups).toEqual(['admins', 'developers']);
    expect(Date.parse(user!.metadata.expires)).toBeGreaterThan(Date.now());
  });

  it("the identity provider's traits feed db_users and db_names: the grant the Proxy carries to a database agent", async () => {
    const { callback: url, binding } = await toCallback('alice');
    expect((await callback(url, binding)).status).toBe(302);
    // A stored role named access replaces the preset: database users from the IdP's groups, names from a template with a suffix.
    const role = { kind: 'role', version: 'v7', metadata: { name: 'access' }, spec: { allow: { db_labels: { '*': '*' }, db_users: ['{{external.groups}}'], db_names: ['{{internal.groups}}-db', 'shared'] }, deny: { db_users: ['admins'] } } };
    await auth.createResources(auth.adminIdentity(), [role as never], true);
    const resolved = await auth.resolveCaller({ kind: 'user', name: 'alice@example.com', cluster: 'sso.example', roles: ['editor', 'access'] });
    expect(resolved.db).toEqual({ users: { allow: ['admins', 'developers'], deny: ['admins'] }, names: { allow: ['admins-db', 'developers-db', 'shared'], deny: [] } });
  });

  it('a redirect to another origin is replaced by /web/', async () => {
    for (const evil of ['https://evil.example/', '//evil.example/x', '/\\evil.example']) {
      const { callback: url, binding } = await toCallback('dave', 'corp', evil);
      const done = await callback(url, binding);
      expect(done.location).toBe(`${base}/web/sso-complete?redirect=%2Fweb%2F`);
    }
  });
});

describe('OIDC: what is refused', () => {
  it.each([
    ['other-key', 'signature'],
    ['aud', 'audience'],
    ['iss', 'issuer'],
    ['nonce', 'nonce'],
    ['exp', 'expired'],
  ] as const)('an ID token forged in the middle (%s) → GW_ERR_SSO_TOKEN_INVALID naming the %s check', async (tamper, check) => {
    const { callback: url, binding } = await toCallback('alice');
    idp.tamper = tamper;
    const refused = await callback(url, binding);
    expect(answerCode(refused), refused.text).toBe('GW_ERR_SSO_TOKEN_INVALID');
    expect(refused.status).toBe(401);
    expect(refused.json().error.message).toContain(`the ${check} check`);
    expect(refused.headers['set-cookie'] ?? []).not.toContainEqual(expect.stringMatching(/^__Host-gw_session=/));
  });

  it.each([
    ['unverified', 'email_verified: false', 'email_verified'],
    ['silent', 'no email_verified claim', 'email_verified'],
    ['noemail', 'no email claim (no fallback to preferred_username or sub)', 'email'],
  ] as const)('hostile: a user named by an address the provider does not vouch for (%s: %s) → GW_ERR_SSO_USERNAME_REFUSED naming the claim, no user', async (user, _what, claim) => {
    const { callback: url, binding } = await toCallback(user);
    const refused = await callback(url, binding);
    expect(answerCode(refused), refused.text).toBe('GW_ERR_SSO_USERNAME_REFUSED');
    expect(refused.status).toBe(403);
    expect(refused.json().error.message).toContain(claim);
    expect(refused.json().error.hint).toContain(claim === 'email' ? 'username_claim' : 'allow_unverified_email');
    expect(refused.headers['set-cookie'] ?? []).not.toContainEqual(expect.stringMatching(/^__Host-gw_session=/));
    expect(await backend.get(`/users/${user}@example.com`)).toBeUndefined();
    expect(await backend.get(`/users/${user}`)).toBeUndefined();
  });

  it('the connector opts in: allow_unverified_email takes an address without email_verified; username_claim: preferred_username names a user without one', async () => {
    await auth.createResources(auth.adminIdentity(), [
      connector('lax', { allow_unverified_email: true }) as never,
      connector('handles', { username_claim: 'preferred_username', scope: ['email', 'groups', 'profile'] }) as never,
    ], false);
    const lax = await toCallback('silent', 'lax');
    expect((await callback(lax.callback, lax.binding)).status).toBe(302);
    expect(await backend.get('/users/silent@example.com')).toBeDefined();
    const handles = await toCallback('noemail', 'handles');
    expect((await callback(handles.callback, handles.binding)).status).toBe(302);
    expect(await backend.get('/users/noemail')).toBeDefined();
    // username_claim names that claim alone: an unverified address does not matter to it, a missing claim refuses.
    const other = await toCallback('unverified2', 'handles');
    expect((await callback(other.callback, other.binding)).status).toBe(302);
    expect(await backend.get('/users/unverified2')).toBeDefined();
  });

  it('allow_unverified_email takes true or false only', async () => {
    const yaml = (value: string) => `kind: oidc\nversion: v3\nmetadata: {name: typo}\nspec:\n  issuer_url: https://idp.example\n  client_id: c\n  client_secret: s\n  redirect_url: ${REDIRECT}\n  allow_unverified_email: ${value}\n  claims_to_roles: [{claim: groups, value: admins, roles: [access]}]\n`;
    expect((parseManifest(yaml('true'), 'typo.yaml')[0] as unknown as { spec: Record<string, unknown> }).spec.allow_unverified_email).toBe(true);
    expect(() => parseManifest(yaml('sure'), 'typo.yaml')).toThrow(expect.objectContaining({ code: 'GW_ERR_RESOURCE_INVALID' }));
    expect(() => parseManifest(yaml('"true"'), 'typo.yaml')).toThrow(/allow_unverified_email/);
  });

  it('a replayed callback → GW_ERR_SSO_STATE_INVALID (the request was taken by the first)', async () => {
    const { callback: url, binding } = await toCallback('alice');
    expect((await callback(url, binding)).status).toBe(302);
    const again = await callback(url, binding);
    expect(answerCode(again)).toBe('GW_ERR_SSO_STATE_INVALID');
    expect(again.status).toBe(400);
  });

  it('the state of a sign-in of another kind of connector → GW_ERR_SSO_STATE_INVALID', async () => {
    await auth.createResources(auth.adminIdentity(), [{ kind: 'github', version: 'v3', metadata: { name: 'hub' }, spec: { client_id: 'c', client_secret: 's', redirect_url: 'https://gateway.example/webapi/sso/github/callback', teams_to_roles: [{ organization: 'o', team: 't', roles: ['access'] }] } } as never], false);
    const start = await api('/webapi/sso/github/hub/login');
    const state = new URL(start.location!).searchParams.get('state')!;
    const binding = /__Host-gw_sso=([^;]+)/.exec(String(start.headers['set-cookie']))![1]!;
    const { callback: url } = await toCallback('alice');
    const mixed = new URL(url);
    mixed.searchParams.set('state', state);
    expect(answerCode(await callback(mixed.href, binding))).toBe('GW_ERR_SSO_STATE_INVALID');
  });

  it('a callback without the browser binding of the sign-in (another browser, a link handed on) → GW_ERR_SSO_STATE_INVALID', async () => {
    const { callback: url } = await toCallback('alice');
    expect(answerCode(await callback(url, undefined))).toBe('GW_ERR_SSO_STATE_INVALID');
    const { callback: url2 } = await toCallback('alice');
    expect(answerCode(await callback(url2, 'A'.repeat(43)))).toBe('GW_ERR_SSO_STATE_INVALID');
  });

  it('a browser gets a page naming the error, not JSON', async () => {
    const { callback: url } = await toCallback('alice');
    const page = await callback(url, undefined, 'text/html,application/xhtml+xml');
    expect(page.status).toBe(400);
    expect(page.headers['content-type']).toMatch(/^text\/html/);
    expect(page.text).toContain('GW_ERR_SSO_STATE_INVALID');
    expect(page.headers['content-security-policy']).toContain("default-src 'none'");
  });

  it('a user that no mapping gives a role → GW_ERR_SSO_NO_ROLES, no user record', async () => {
    const { callback: url, binding } = await toCallback('mallory');
    const refused = await callback(url, binding);
    expect(answerCode(refused)).toBe('GW_ERR_SSO_NO_ROLES');
    expect(refused.status).toBe(403);
    expect(await backend.get('/users/mallory@example.com')).toBeUndefined();
  });

  it('an unknown connector → GW_ERR_SSO_CONNECTOR_UNKNOWN; the provider down → GW_ERR_SSO_IDP_ERROR with a hint', async () => {
    expect(answerCode(await api('/webapi/sso/oidc/nope/login'))).toBe('GW_ERR_SSO_CONNECTOR_UNKNOWN');
    expect(answerCode(await api('/webapi/sso/ldap/corp/login'))).toBe('GW_ERR_SSO_CONNECTOR_UNKNOWN');
    const closed = https.createServer();
    await new Promise<void>((r) => closed.listen(0, '127.0.0.1', r));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    await auth.createResources(auth.adminIdentity(), [connector('down', { issuer_url: `https://127.0.0.1:${port}` }) as never], false);
    const down = await api('/webapi/sso/oidc/down/login');
    expect(answerCode(down)).toBe('GW_ERR_SSO_IDP_ERROR');
    expect(down.status).toBe(502);
    expect(down.json().error.hint).toMatch(/reach/);
  });

  it('a local user of the same name is never replaced by a single sign-on', async () => {
    await auth.addUser(auth.adminIdentity(), 'alice@example.com', ['access'], 'a local password');
    const { callback: url, binding } = await toCallback('alice');
    expect(answerCode(await callback(url, binding))).toBe('GW_ERR_ACCESS_DENIED');
  });

  it('failed callbacks of sign-ins are rate limited per source like password logins → GW_ERR_AUTH_RATE_LIMITED', async () => {
    for (let i = 0; i < 5; i++) expect(answerCode(await callback((await toCallback('alice')).callback, 'another-browser'))).toBe('GW_ERR_SSO_STATE_INVALID');
    const limited = await callback((await toCallback('alice')).callback, 'another-browser');
    expect(answerCode(limited)).toBe('GW_ERR_AUTH_RATE_LIMITED');
    expect(limited.status).toBe(429);
  });

  it('hostile: sign-in starts a page makes a browser fetch as subresources (<img>, <iframe>, fetch) are refused uncounted, so they cannot use up the address\'s starts', async () => {
    for (const dest of ['image', 'iframe', 'empty', 'script']) {
      for (let i = 0; i < 10; i++) {
        const refused = await api('/webapi/sso/oidc/corp/login', { headers: { 'sec-fetch-dest': dest, 'sec-fetch-mode': 'no-cors' } });
        expect(refused.status, refused.text).toBe(400);
        expect(answerCode(refused)).toBe('GW_ERR_API_BAD_REQUEST');
        expect(refused.headers['set-cookie']).toBeUndefined();
      }
    }
    const page = await api('/webapi/sso/oidc/corp/login', { headers: { 'sec-fetch-dest': 'document', 'sec-fetch-mode': 'navigate' } });
    expect(page.status, page.text).toBe(302);
  });

  it('hostile: callbacks with made-up states (any page can make a browser send them: <img src=…/callback?state=x>) do not lock the address out', async () => {
    for (let i = 0; i < 12; i++) expect(answerCode(await callback(`${REDIRECT}?code=x&state=forged${i}`, 'b'))).toBe('GW_ERR_SSO_STATE_INVALID');
    const { callback: url, binding } = await toCallback('alice');
    const done = await callback(url, binding);
    expect(done.status, done.text).toBe(302);
  });
});

describe('OIDC for gwsh (console mode)', () => {
  it('gives the URL to open; the callback sends the browser to gwsh with a one-time code; the exchange gives certificates', async () => {
    const keys = generateKeyPair();
    const secret = 'a secret only gwsh knows, 32 bytes or so';
    const { createHash } = await import('node:crypto');
    const body = { connector: 'corp', public_key: keys.publicKeyPem, ssh_public_key: sshPublicKeyFromPem(keys.publicKeyPem), redirect_url: 'http://127.0.0.1:45678/callback', secret_hash: createHash('sha256').update(secret).digest('hex') };
    const started = await api('/webapi/sso/console', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    expect(started.status, started.text).toBe(200);
    const { auth_url, request_id } = started.json();
    const back = await callback(await idp.signIn(auth_url, 'alice'), undefined);
    expect(back.status, back.text).toBe(302);
    const code = new URL(back.location!).searchParams.get('code')!;
    expect(back.location!.startsWith('http://127.0.0.1:45678/callback?code=')).toBe(true);

    const exchange = (b: Record<string, string>) => api('/webapi/sso/console/exchange', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(b) });
    expect(answerCode(await exchange({ request_id, code, secret: 'wrong' }))).toBe('GW_ERR_SSO_STATE_INVALID');
    // The grant is spent by the wrong secret: start again.
    const again = (await api('/webapi/sso/console', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })).json();
    const back2 = await callback(await idp.signIn(again.auth_url, 'alice'), undefined);
    const code2 = new URL(back2.location!).searchParams.get('code')!;
    const bundle = await exchange({ request_id: again.request_id, code: code2, secret });
    expect(bundle.status, bundle.text).toBe(200);
    const identity = identityFromCert(Buffer.from(bundle.json().tlsCert.replace(/-----[^-]+-----|\s/g, ''), 'base64'));
    expect(identity).toMatchObject({ kind: 'user', name: 'alice@example.com', roles: ['editor', 'access'] });
    expect(answerCode(await exchange({ request_id: again.request_id, code: code2, secret }))).toBe('GW_ERR_SSO_STATE_INVALID');
  });

  it('gwsh\'s own state in its loopback URL comes back with the code', async () => {
    const keys = generateKeyPair();
    const state = 'S'.repeat(43);
    const body = { connector: 'corp', public_key: keys.publicKeyPem, ssh_public_key: sshPublicKeyFromPem(keys.publicKeyPem), redirect_url: `http://127.0.0.1:45678/callback?state=${state}`, secret_hash: '0'.repeat(64) };
    const started = await api('/webapi/sso/console', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    expect(started.status, started.text).toBe(200);
    const back = await callback(await idp.signIn(started.json().auth_url, 'alice'), undefined);
    expect(back.location).toMatch(new RegExp(`^http://127\\.0\\.0\\.1:45678/callback\\?state=${state}&code=[A-Za-z0-9_-]{43}$`));
  });

  it.each([
    'https://evil.example/callback',
    'http://127.0.0.1:45678/callback?state=short',
    'http://127.0.0.1:45678/callback?state=SSSSSSSSSSSSSSSSSSSSSSSSSSSS&next=https://evil.example/',
    'http://127.0.0.1:45678/callback?code=SSSSSSSSSSSSSSSSSSSSSSSSSSSS',
    'http://127.0.0.1:45678/callback#state=SSSSSSSSSSSSSSSSSSSSSSSSSSSS',
    'http://127.0.0.1:45678@evil.example/callback',
  ])('hostile: refuses a redirect_url that is not gwsh\'s loopback callback (%s)', async (redirect_url) => {
    const keys = generateKeyPair();
    const answer = await api('/webapi/sso/console', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ connector: 'corp', public_key: keys.publicKeyPem, ssh_public_key: sshPublicKeyFromPem(keys.publicKeyPem), redirect_url, secret_hash: '0'.repeat(64) }) });
    expect(answerCode(answer)).toBe('GW_ERR_API_BAD_REQUEST');
  });
});
