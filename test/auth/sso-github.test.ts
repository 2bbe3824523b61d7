/**
 * The code-hosting OAuth connector (kind github, src/auth/sso/github.ts). The code-hosting service cannot be
 * reached here: this is a local server speaking its OAuth2 (authorize, access_token) and REST API (/user,
 * /user/teams, paged), on HTTPS with the test CA, named by the connector's endpoint_url / api_endpoint_url as a
 * self-hosted instance would be. Checked: the authorize URL (state, PKCE), the code exchange with the client
 * secret and the verifier, teams → roles, and the refusals (the service's error, a replayed callback, no role,
 * the service down).
 */
import { createHash, randomBytes } from 'node:crypto';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createApiHandler } from '../../src/auth/api.js';
import { generateKeyPair } from '../../src/auth/pki.js';
import { AuthService } from '../../src/auth/service.js';
import { openSqliteBackend, type Backend } from '../../src/backend/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { answerCode, request, type Answer } from '../helpers/sso.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const REDIRECT = 'https://gateway.example/webapi/sso/github/callback';
const CLIENT = { id: 'Iv1.gateway', secret: 'the-client-secret' };
const TEAMS: Record<string, Array<{ org: string; team: string }>> = {
  octocat: [{ org: 'acme', team: 'sre' }, ...Array.from({ length: 120 }, (_, i) => ({ org: 'acme', team: `filler-${i}` }))],
  nobody: [{ org: 'other', team: 'marketing' }],
};

let pki: TestPki;
let hub: https.Server;
let hubUrl: string;
/** code → {user, challenge}; the local service's own state. */
const codes = new Map<string, { user: string; challenge: string }>();
const tokens = new Map<string, string>();
let backend: Backend;
let auth: AuthService;
let server: https.Server;
let base: string;

function json(res: import('node:http').ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
}

/** The local code-hosting service: /login/oauth/authorize signs `login` in at once; the API answers with bearer tokens. */
function codeHosting(req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse): void {
  const url = new URL(req.url!, hubUrl);
  if (url.pathname === '/login/oauth/authorize') {
    const code = randomBytes(8).toString('hex');
    codes.set(code, { user: url.searchParams.get('login')!, challenge: url.searchParams.get('code_challenge')! });
    const back = new URL(url.searchParams.get('redirect_uri')!);
    back.searchParams.set('code', code);
    back.searchParams.set('state', url.searchParams.get('state')!);
    res.writeHead(302, { location: back.href }).end();
    return;
  }
  if (url.pathname === '/login/oauth/access_token') {
    let body = '';
    req.on('data', (c: Buffer) => (body += c));
    req.on('end', () => {
      const form = new URLSearchParams(body);
      const grant = codes.get(form.get('code') ?? '');
      codes.delete(form.get('code') ?? '');
      if (form.get('client_secret') !== CLIENT.secret) return json(res, 200, { error: 'incorrect_client_credentials', error_description: 'The client_id and/or client_secret passed are incorrect.' });
      if (!grant) return json(res, 200, { error: 'bad_verification_code', error_description: 'The code passed is incorrect or expired.' });
      if (createHash('sha256').update(form.get('code_verifier') ?? '').digest('base64url') !== grant.challenge) return json(res, 200, { error: 'invalid_grant', error_description: 'PKCE verification failed' });
      const token = randomBytes(16).toString('hex');
      tokens.set(token, grant.user);
      json(res, 200, { access_token: token, token_type: 'bearer', scope: 'read:org' });
    });
    return;
  }
  const user = tokens.get((req.headers.authorization ?? '').replace(/^Bearer /, ''));
  if (!user) return json(res, 401, { message: 'Bad credentials' });
  if (url.pathname === '/api/v3/user') return json(res, 200, { login: user, id: 1 });
  if (url.pathname === '/api/v3/user/teams') {
    const page = Number(url.searchParams.get('page') ?? 1);
    const per = Number(url.searchParams.get('per_page') ?? 30);
    return json(res, 200, (TEAMS[user] ?? []).slice((page - 1) * per, page * per).map((t) => ({ slug: t.team, organization: { login: t.org } })));
  }
  json(res, 404, { message: 'Not Found' });
}

const api = (path: string, options: Parameters<typeof request>[1] = {}) => request(`${base}${path}`, { ca: auth.host.tls.certPem, ...options });

/** Start, the service's authorize page (signs `login` in), and our callback with the binding cookie. */
async function signIn(login: string): Promise<{ done: Answer; callback: string; binding: string }> {
  const start = await api('/webapi/sso/github/hub/login?redirect=/web/tokens');
  const binding = /__Host-gw_sso=([^;]+)/.exec(String(start.headers['set-cookie']))![1]!;
  const authorize = new URL(start.location!);
  authorize.searchParams.set('login', login);
  const back = await request(authorize.href, { ca: pki.caPem });
  const callback = new URL(back.location!);
  const done = await api(`/webapi/sso/github/callback${callback.search}`, { headers: { cookie: `__Host-gw_sso=${binding}` } });
  return { done, callback: callback.search, binding };
}

beforeAll(async () => {
  pki = await makeTestPki();
  const cert = await pki.serverCert({ names: ['localhost'], ips: ['127.0.0.1'] });
  hub = https.createServer({ key: cert.keyPem, cert: cert.certPem }, codeHosting);
  await new Promise<void>((r) => hub.listen(0, '127.0.0.1', r));
  hubUrl = `https://127.0.0.1:${(hub.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise<void>((r) => hub.close(() => r()));
  await pki.cleanup();
});

beforeEach(async () => {
  backend?.close();
  server?.close();
  backend = openSqliteBackend({ path: ':memory:', sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'hub.example', dialer: new Dialer({ env: {} }) });
  const spec = { client_id: CLIENT.id, client_secret: CLIENT.secret, redirect_url: REDIRECT, endpoint_url: hubUrl, api_endpoint_url: `${hubUrl}/api/v3`, ca: pki.caPem, teams_to_roles: [{ organization: 'acme', team: 'sre', roles: ['editor', 'access'] }] };
  await auth.createResources(auth.adminIdentity(), [
    { kind: 'github', version: 'v3', metadata: { name: 'hub' }, spec } as never,
    { kind: 'github', version: 'v3', metadata: { name: 'wrong-secret' }, spec: { ...spec, client_secret: 'not-it' } } as never,
    // Another identity provider whose users name themselves (a public service anyone may register a login at).
    { kind: 'github', version: 'v3', metadata: { name: 'public' }, spec: { ...spec, teams_to_roles: [{ organization: 'other', team: 'marketing', roles: ['access'] }] } } as never,
  ], false);
  const keys = generateKeyPair();
  const cert = await auth.issueServerCert(keys.publicKeyPem, ['localhost']);
  server = https.createServer({ key: keys.privateKeyPem, cert }, createApiHandler(auth));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

describe('code-hosting OAuth sign-in (a local server in place of the service)', () => {
  it('sends the user to the self-hosted instance with client_id, redirect_uri, state and a PKCE challenge', async () => {
    const start = await api('/webapi/sso/github/hub/login');
    const u = new URL(start.location!);
    expect(`${u.origin}${u.pathname}`).toBe(`${hubUrl}/login/oauth/authorize`);
    expect(Object.fromEntries(u.searchParams)).toMatchObject({ client_id: CLIENT.id, redirect_uri: REDIRECT, scope: 'read:org', code_challenge_method: 'S256' });
    expect(u.searchParams.get('state')).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });

  it('maps the user\'s teams (read page by page) to roles and creates the session', async () => {
    const { done } = await signIn('octocat');
    expect(done.status, done.text).toBe(302);
    expect(done.location).toBe(`${base}/web/sso-complete?redirect=%2Fweb%2Ftokens`);
    const session = /__Host-gw_session=([A-Za-z0-9_-]{43})/.exec(String(done.headers['set-cookie']))![1]!;
    const handout = await api('/webapi/sessions/bearer', { method: 'POST', headers: { cookie: `__Host-gw_session=${session}`, origin: base } });
    expect(handout.json().user).toMatchObject({ name: 'octocat', roles: ['editor', 'access'] });
    const [user] = (await auth.getResources(auth.adminIdentity(), 'user', 'octocat', false)) as Array<{ spec: Record<string, any> }>;
    expect(user!.spec.traits.github_teams).toHaveLength(121);
    expect(user!.spec.created_by).toMatchObject({ kind: 'github', connector: 'hub' });
  });

  it('refuses: no team that maps, a replayed callback, the service\'s own error, the service down', async () => {
    expect(answerCode((await signIn('nobody')).done)).toBe('GW_ERR_SSO_NO_ROLES');
    const { callback, binding } = await signIn('octocat');
    expect(answerCode(await api(`/webapi/sso/github/callback${callback}`, { headers: { cookie: `__Host-gw_sso=${binding}` } }))).toBe('GW_ERR_SSO_STATE_INVALID');

    const start = await api('/webapi/sso/github/wrong-secret/login');
    const b = /__Host-gw_sso=([^;]+)/.exec(String(start.headers['set-cookie']))![1]!;
    const back = new URL((await request(`${start.location!}&login=octocat`, { ca: pki.caPem })).location!);
    const refused = await api(`/webapi/sso/github/callback${back.search}`, { headers: { cookie: `__Host-gw_sso=${b}` } });
    expect(answerCode(refused)).toBe('GW_ERR_SSO_IDP_ERROR');
    expect(refused.json().error.message).toContain('incorrect_client_credentials');

    const denied = await api('/webapi/sso/github/hub/login');
    const state = new URL(denied.location!).searchParams.get('state')!;
    const bd = /__Host-gw_sso=([^;]+)/.exec(String(denied.headers['set-cookie']))![1]!;
    const error = await api(`/webapi/sso/github/callback?error=access_denied&error_description=The+user+has+denied+your+application&state=${state}`, { headers: { cookie: `__Host-gw_sso=${bd}` } });
    expect(answerCode(error)).toBe('GW_ERR_SSO_IDP_ERROR');
    expect(error.status).toBe(502);
  });

  it('hostile: a user of another connector with the same name does not take over the SSO user (its roles, traits, certificates)', async () => {
    const { done } = await signIn('octocat');
    expect(done.status, done.text).toBe(302);
    // The attacker's own account at the other provider is named "octocat" too (TEAMS maps it to other/marketing).
    TEAMS.octocat!.push({ org: 'other', team: 'marketing' });
    try {
      const start = await api('/webapi/sso/github/public/login');
      const b = /__Host-gw_sso=([^;]+)/.exec(String(start.headers['set-cookie']))![1]!;
      const back = new URL((await request(`${start.location!}&login=octocat`, { ca: pki.caPem })).location!);
      const taken = await api(`/webapi/sso/github/callback${back.search}`, { headers: { cookie: `__Host-gw_sso=${b}` } });
      expect(answerCode(taken), taken.text).toBe('GW_ERR_ACCESS_DENIED');
      expect(taken.json().error.message).toContain('"hub"');
    } finally {
      TEAMS.octocat!.pop();
    }
    const [user] = (await auth.getResources(auth.adminIdentity(), 'user', 'octocat', false)) as Array<{ spec: Record<string, any> }>;
    expect(user!.spec.created_by).toMatchObject({ kind: 'github', connector: 'hub' });
    expect(user!.spec.roles).toEqual(['editor', 'access']);
  });
});
