/**
 * Attacks on the web surface that need more than one agent (the security review of issue 15), in one process: the
 * real Auth, Proxy and agent starters, over real HTTPS. Hostile:
 *
 *  - a rogue agent of the cluster advertises an HTTP app under the name of another agent's app, with a public
 *    address of its own. Launch tokens and app sessions are bound to the app's host, not its name alone: a token
 *    or an app cookie the rogue's host received never opens the other app.
 *  - login CSRF into an app: a user (mallory) hands another (alice) a launch link carrying mallory's own token.
 *    A launch starts on the app's host, which sets a nonce cookie in the browser; the token is bound to that nonce
 *    and redeemed only where the browser holds it: a token without state, with another nonce, mallory's token and
 *    state in alice's browser (no nonce, or her own), a replay, and a nonce cookie of another app's host are all
 *    refused by their codes; the app cannot set the gateway's cookies on its host either.
 */
import https from 'node:https';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { appSessionRef } from '../../src/auth/websessions.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAgentRole } from '../../src/roles/agent.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { daemonEnvironment } from '../../src/roles/environment.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { waitUntil } from '../helpers/wait.js';

const PASSWORD = 'correct horse battery';
const LEGIT_HOST = 'wiki.localhost';
const ROGUE_HOST = 'wiki.rogue.localhost';

let dir: string;
let lifecycle: Lifecycle;
let auth: AuthRole;
let web: string;
let ca: string;
const apps: HttpTestServer[] = [];

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

function call(method: string, path: string, host: string, headers: Record<string, string> = {}, body?: unknown): Promise<Answer> {
  const i = web.lastIndexOf(':');
  const text = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = https.request({ host: web.slice(0, i), port: Number(web.slice(i + 1)), method, path, ca, agent: false, servername: 'localhost', headers: { host, ...(text ? { 'content-type': 'application/json' } : {}), ...headers } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
    });
    req.on('error', reject);
    req.end(text);
  });
}

function agentConfig(name: string, host: string, app: HttpTestServer, extra: string[] = []): ReturnType<typeof parseConfig> {
  return parseConfig(
    [
      'gateway:',
      // The Proxy's agents dial it by its node name: the one in the Proxy's process must be resolvable.
      `  nodename: ${extra.length > 0 ? 'localhost' : name}`,
      `  data_dir: ${join(dir, name)}`,
      ...extra,
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: wiki, uri: "${app.url}", public_addr: ${host}, labels: {env: dev} }`,
      '',
    ].join('\n'),
    `${name} agent`,
  );
}

beforeAll(async () => {
  setRootLogger(createLogger({ level: process.env.WEB_ATTACKS_DEBUG ? 'info' : 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-web-attacks-'));
  for (const who of ['legit', 'rogue']) {
    apps.push(await startHttpServer((req, res) => {
      // An app that tries to set the gateway's cookies on its own host (and one of its own).
      const cookies = req.url === '/set-cookies' ? ['__Host-gw_app=planted; Path=/; Secure', `__Host-gw_launch_0123456789abcdef=${'p'.repeat(43)}; Path=/; Secure`, '__Host-gw_session=planted; Path=/; Secure', 'theme=dark; Path=/'] : [];
      res.writeHead(200, { 'content-type': 'text/plain', ...(cookies.length > 0 ? { 'set-cookie': cookies } : {}) }).end(req.url === '/set-cookies' ? `cookie: ${String(req.headers.cookie)}` : `${who} app for ${String(req.headers['x-gateway-user'])}\n`);
    }));
  }
  const config = agentConfig('legit', LEGIT_HOST, apps[0]!, [
    'auth_service:',
    '  cluster_name: attacks.example',
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    '  web_listen_addr: 127.0.0.1:0',
  ]);
  lifecycle = new Lifecycle();
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  const dialer = new Dialer({ env: {} });
  auth = await startAuthRole({ config, limits, lifecycle });
  ca = auth.auth.host.tls.certPem;
  const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: randomUUID() });
  web = proxy.addresses.web!;
  const environment = daemonEnvironment({});
  await startAgentRole({ config, services: ['auth_service', 'proxy_service', 'app_service'], localAuth: auth.auth, localProxy: web, dialer, environment, lifecycle });
  await startAgentRole({ config: agentConfig('rogue', ROGUE_HOST, apps[1]!), services: ['app_service'], localAuth: auth.auth, localProxy: web, dialer, environment, lifecycle });
  await waitUntil('both agents in the cluster view', () => proxy.cluster.agents().length === 2);
  await auth.auth.addUser(auth.auth.adminIdentity(), 'alice', ['access'], PASSWORD, ['root']);
  await auth.auth.addUser(auth.auth.adminIdentity(), 'mallory', ['access'], PASSWORD, ['root']);
}, 60_000);

afterAll(async () => {
  await lifecycle?.stop().catch(() => undefined);
  for (const app of apps) await app.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

type Session = { id: string; bearer: string };
const creds = (s: Session) => ({ cookie: `__Host-gw_session=${s.id}`, authorization: `Bearer ${s.bearer}`, origin: 'https://localhost' });
const login = (user: string): Promise<Session> => auth.auth.webLogin(user, PASSWORD, '127.0.0.1');
const errorOf = (a: Answer) => [a.status, a.headers['x-gateway-error']];

/** The start of a launch on an app's host, as the Open button navigates: the nonce (state) and its cookie. */
async function start(host: string, query = 'app=wiki'): Promise<{ state: string; cookie: string; next: URL; setCookie: string }> {
  const answer = await call('GET', `/x-gateway-auth?${query}`, host);
  expect(answer.status, answer.text).toBe(302);
  const next = new URL(String(answer.headers.location));
  const setCookie = String(answer.headers['set-cookie']);
  return { state: next.searchParams.get('state')!, cookie: setCookie.split(';')[0]!, next, setCookie };
}

/** What the launch page asks with the user's own session: a launch URL whose token is bound to state. */
async function launch(s: Session, state: string, addr?: string): Promise<URL> {
  const answer = await call('POST', '/webapi/apps/wiki/launch', 'localhost', creds(s), { state, ...(addr ? { addr } : {}) });
  expect(answer.status, answer.text).toBe(200);
  return new URL(JSON.parse(answer.text).url as string);
}

const redeem = (url: URL, host: string, cookie?: string) => call('GET', `${url.pathname}${url.search}`, host, cookie ? { cookie } : {});

describe('a rogue agent advertising an app under the name of another agent\'s app', () => {
  it('hostile: the launch token and the app cookie work only on the host the launch named, never on the other app of that name', async () => {
    const alice = await login('alice');
    for (const [named, other] of [[LEGIT_HOST, ROGUE_HOST], [ROGUE_HOST, LEGIT_HOST]] as const) {
      const here = await start(named);
      const url = await launch(alice, here.state, named);
      expect(url.hostname).toBe(named);
      // Even with the other host's nonce cookie name carrying this nonce (a raw client), the token is for another app.
      const renamed = `${(await start(other)).cookie.split('=')[0]}=${here.state}`;
      const elsewhere = await redeem(url, other, renamed);
      expect(errorOf(elsewhere), elsewhere.text).toEqual([401, 'GW_ERR_WEB_SESSION_INVALID']);

      const again = await start(named);
      const redeemed = await redeem(await launch(alice, again.state, named), named, again.cookie);
      expect(redeemed.status, redeemed.text).toBe(200);
      const cookie = (redeemed.headers['set-cookie'] as string[]).find((c) => c.startsWith('__Host-gw_app='))!.split(';')[0]!;
      const own = await call('GET', '/', named, { cookie });
      expect([own.status, own.text]).toEqual([200, `${named === LEGIT_HOST ? 'legit' : 'rogue'} app for alice\n`]);
      const across = await call('GET', '/', other, { cookie });
      expect(across.status, across.text).toBe(401);
    }
  });
});

describe('login CSRF into an app: the launch is bound to the browser that asked for it', () => {
  it('the start sets a nonce cookie on the app host only and sends the browser to the configured web address, never one from the request', async () => {
    const s = await start(LEGIT_HOST, `app=wiki&web=${encodeURIComponent('evil.example')}`);
    expect(`${s.next.origin}${s.next.pathname}`).toBe(`https://localhost:${web.slice(web.lastIndexOf(':') + 1)}/web/launch`);
    expect([s.next.searchParams.get('app'), s.next.searchParams.get('addr')]).toEqual(['wiki', LEGIT_HOST]);
    expect(s.state).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(s.setCookie).toMatch(new RegExp(`^__Host-gw_launch_[0-9a-f]{16}=${s.state}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=300$`));
    // Every start is a new nonce; another app's host names its cookie otherwise.
    expect((await start(LEGIT_HOST)).state).not.toBe(s.state);
    expect((await start(ROGUE_HOST)).cookie.split('=')[0]).not.toBe(s.cookie.split('=')[0]);
    // The launch route wants the nonce and a well-formed app host.
    const alice = await login('alice');
    const noState = await call('POST', '/webapi/apps/wiki/launch', 'localhost', creds(alice), {});
    expect([noState.status, JSON.parse(noState.text).error.code]).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    const badAddr = await call('POST', '/webapi/apps/wiki/launch', 'localhost', creds(alice), { state: s.state, addr: 'evil.example/x?' });
    expect([badAddr.status, JSON.parse(badAddr.text).error.code]).toEqual([400, 'GW_ERR_API_BAD_REQUEST']);
    const huge = await call('POST', '/webapi/apps/wiki/launch', 'localhost', creds(alice), { state: s.state, pad: 'x'.repeat(10_000) });
    expect(JSON.parse(huge.text).error.code).toBe('GW_ERR_API_TOO_LARGE');
  });

  it('hostile: a token without state, or with a state that is not the browser\'s nonce, is refused on a plain page', async () => {
    const alice = await login('alice');
    const s = await start(LEGIT_HOST);
    const url = await launch(alice, s.state, LEGIT_HOST);
    const stateless = new URL(url);
    stateless.searchParams.delete('state');
    const refused = await redeem(stateless, LEGIT_HOST, s.cookie);
    expect(errorOf(refused)).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    expect(refused.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(refused.text).toContain('GW_ERR_WEB_APP_LAUNCH_UNBOUND');
    expect(refused.headers['set-cookie']).toBeUndefined();
    // The browser's nonce is another one: refused before the token is spent; the right one still works.
    const other = await start(LEGIT_HOST);
    expect(errorOf(await redeem(url, LEGIT_HOST, other.cookie))).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    // A token bound to one nonce, shown with another the browser does hold: the Auth Service refuses it (and spends it).
    const swapped = new URL(url);
    swapped.searchParams.set('state', other.state);
    expect(errorOf(await redeem(swapped, LEGIT_HOST, other.cookie))).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    expect(errorOf(await redeem(url, LEGIT_HOST, s.cookie))).toEqual([401, 'GW_ERR_WEB_SESSION_INVALID']);
  });

  it("hostile: mallory's own token and state in alice's browser (without the nonce, or with her own) never log alice in as mallory", async () => {
    const mallory = await login('mallory');
    const alice = await login('alice');
    const m = await start(LEGIT_HOST);
    const link = await launch(mallory, m.state, LEGIT_HOST);
    // Alice's browser holds no nonce of mallory's: no cookie at all, or the one of her own launch.
    const bare = await redeem(link, LEGIT_HOST);
    expect(errorOf(bare)).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    expect(bare.headers['set-cookie']).toBeUndefined();
    const hers = await start(LEGIT_HOST);
    const mixed = await redeem(link, LEGIT_HOST, hers.cookie);
    expect(errorOf(mixed)).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    expect(mixed.headers['set-cookie']).toBeUndefined();
    // The token itself was good: in mallory's browser (her nonce) it opens the app as mallory.
    const own = await redeem(link, LEGIT_HOST, m.cookie);
    expect(own.status, own.text).toBe(200);
    const mCookie = (own.headers['set-cookie'] as string[]).find((c) => c.startsWith('__Host-gw_app='))!.split(';')[0]!;
    expect((await call('GET', '/', LEGIT_HOST, { cookie: mCookie })).text).toBe('legit app for mallory\n');

    // Mallory's link to the launch page with her state: alice's page asks with alice's session, and alice's browser
    // lacks mallory's nonce: refused; the token it made is alice's, never mallory's.
    const aliceToken = await launch(alice, m.state, LEGIT_HOST);
    expect(errorOf(await redeem(aliceToken, LEGIT_HOST, hers.cookie))).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
    // Mallory's link to the start instead: alice's browser gets a nonce of its own, and the launch is alice's.
    const fresh = await start(LEGIT_HOST);
    const ok = await redeem(await launch(alice, fresh.state, LEGIT_HOST), LEGIT_HOST, fresh.cookie);
    const aCookie = (ok.headers['set-cookie'] as string[]).find((c) => c.startsWith('__Host-gw_app='))!.split(';')[0]!;
    expect((await call('GET', '/', LEGIT_HOST, { cookie: aCookie })).text).toBe('legit app for alice\n');
  });

  it('hostile: a replay is refused, the nonce is cleared after use, and a nonce cookie of another app\'s host never counts', async () => {
    const alice = await login('alice');
    const s = await start(LEGIT_HOST);
    const url = await launch(alice, s.state, LEGIT_HOST);
    const first = await redeem(url, LEGIT_HOST, s.cookie);
    expect(first.status, first.text).toBe(200);
    expect(first.headers['set-cookie']).toEqual(expect.arrayContaining([`${s.cookie.split('=')[0]}=; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=0`]));
    expect(errorOf(await redeem(url, LEGIT_HOST, s.cookie))).toEqual([401, 'GW_ERR_WEB_SESSION_INVALID']);
    // After the clearing the browser has no nonce: the same URL is refused before the Auth Service.
    expect(errorOf(await redeem(url, LEGIT_HOST))).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);

    // A nonce set by the rogue app's host, bound into a token for the legit host: the legit host never takes it.
    const rogue = await start(ROGUE_HOST);
    const cross = await launch(alice, rogue.state, LEGIT_HOST);
    expect(errorOf(await redeem(cross, LEGIT_HOST, rogue.cookie))).toEqual([403, 'GW_ERR_WEB_APP_LAUNCH_UNBOUND']);
  });

  it("hostile: the app cannot set the gateway's cookies on its host (a planted nonce), nor receive them", async () => {
    const alice = await login('alice');
    const s = await start(LEGIT_HOST);
    const ok = await redeem(await launch(alice, s.state, LEGIT_HOST), LEGIT_HOST, s.cookie);
    const cookie = (ok.headers['set-cookie'] as string[]).find((c) => c.startsWith('__Host-gw_app='))!.split(';')[0]!;
    const answer = await call('GET', '/set-cookies', LEGIT_HOST, { cookie: `${cookie}; ${s.cookie}; theme=light` });
    expect(answer.status, answer.text).toBe(200);
    expect(answer.headers['set-cookie']).toEqual(['theme=dark; Path=/']);
    expect(answer.text).toBe('cookie: theme=light');
  });
});

describe('the audit of a Web UI app session (security.md, Session audit)', () => {
  it('the launch records app.session.start; signing out ends it: the next request is refused and the Proxy records the end with its requests and bytes', async () => {
    const alice = await login('alice');
    const s = await start(LEGIT_HOST);
    const ok = await redeem(await launch(alice, s.state, LEGIT_HOST), LEGIT_HOST, s.cookie);
    const cookie = (ok.headers['set-cookie'] as string[]).find((c) => c.startsWith('__Host-gw_app='))!.split(';')[0]!;
    const ref = appSessionRef(cookie.slice('__Host-gw_app='.length));
    for (let i = 0; i < 2; i++) expect((await call('GET', '/', LEGIT_HOST, { cookie })).text).toBe('legit app for alice\n');
    expect((await call('DELETE', '/webapi/sessions', 'localhost', creds(alice))).status).toBe(200);
    const refused = await call('GET', '/', LEGIT_HOST, { cookie });
    expect(refused.status).toBe(401);
    const events = (await auth.auth.listEvents(auth.auth.adminIdentity(), 1000)).map((e) => e.event).filter((e) => e.app_session === ref);
    expect(events.map((e) => e.event)).toEqual(['app.session.end', 'app.session.start']); // newest first
    expect(events[0]).toMatchObject({ user: 'alice', resource: 'wiki', requests: 2, bytes_out: 2 * 'legit app for alice\n'.length, error: 'GW_ERR_WEB_SESSION_INVALID', reported_by: { proxy_id: expect.any(String) } });
    // Hostile: a made-up app cookie is refused and writes nothing.
    const before = (await auth.auth.listEvents(auth.auth.adminIdentity(), 1000)).length;
    expect((await call('GET', '/', LEGIT_HOST, { cookie: `__Host-gw_app=${'x'.repeat(43)}` })).status).toBe(401);
    expect((await auth.auth.listEvents(auth.auth.adminIdentity(), 1000)).length).toBe(before);
  });
});
