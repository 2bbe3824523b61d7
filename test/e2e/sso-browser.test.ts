/**
 * Single sign-on in a real browser (Debian's Chromium through playwright-core, test/helpers/browser.ts) against the
 * real daemon, with the identity providers of the SSO tests (test/helpers/sso.ts):
 *
 * The Proxy runs with separate listeners and the browser speaks HTTP/1.1 only (web-browser.test.ts covers TLS
 * routing on one port and HTTP/2), so that the Web UI is seen working in both modes and both protocols.
 *
 * - OIDC: a real OpenID provider (the `oidc-provider` package) on HTTPS with the test CA. The browser goes from
 *   the sign-in page's connector button to the provider, fills the provider's own login form and consent page,
 *   comes back through our callback and /web/sso-complete to the resources, signed in as the provider's user with
 *   the roles of the connector's `claims_to_roles`. Hostile: a user whom no mapping gives a role (the error page,
 *   with its code, and no session), and the provider's answer replayed in the browser (refused: the sign-in
 *   request was used).
 * - gwsh login --auth=corp: gwsh prints the provider's URL, the browser opens it and signs in, our callback sends
 *   it to gwsh's one-request listener on 127.0.0.1, and gwsh ends with the SSO user's certificates and roles.
 * - SAML: samlify acting as the identity provider. Its SSO URL (https://idp.example/sso, from its metadata) is
 *   served to the browser by the test through Playwright's request routing: a login form, then the HTTP-POST
 *   binding's form that the browser submits to our ACS, carrying the assertion samlify signed for the
 *   AuthnRequest the browser brought. The user lands signed in with the roles of `attributes_to_roles`.
 *
 * The browser trusts the cluster's host CA and the test CA (the OpenID provider's) through its own NSS database;
 * no certificate error is ignored. Screenshots: test-results/web/sso-browser/. Nothing asserts timing.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import type { Page, Route } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launchBrowser, type TestBrowser } from '../helpers/browser.js';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startOidcIdp, startSamlIdp, type OidcIdp, type SamlIdp } from '../helpers/sso.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { separateListenLines } from '../helpers/listeners.js';

const PROXY_NAME = 'proxy.gateway.test';
/** The SAML identity provider's single sign-on URL, as its metadata (test/helpers/sso.ts) names it. */
const SAML_SSO = 'https://idp.example/sso';
let dir: string;
let pki: TestPki;
let oidc: OidcIdp;
let saml: SamlIdp;
let cluster: RunningGateway;
let agent: RunningGateway;
let browser: TestBrowser;
let origin: string;

/** A YAML block scalar's lines, indented. */
const block = (text: string, indent: string) => text.trim().split('\n').map((l) => `${indent}${l}`);

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-sso-browser-'));
  pki = await makeTestPki();
  const [port, tunnelPort, sshPort] = await Promise.all([0, 1, 2].map(() => getPort({ host: '127.0.0.1' }))) as [number, number, number];
  origin = `https://${PROXY_NAME}:${port}`;
  oidc = await startOidcIdp(pki, {
    redirectUri: `${origin}/webapi/sso/oidc/callback`,
    groups: (u) => (u === 'alice' ? ['admins', 'developers'] : u === 'dave' ? ['developers'] : ['marketing']),
  });
  saml = await startSamlIdp(dir, { entityId: `https://${PROXY_NAME}/saml/sp`, acs: `${origin}/webapi/sso/saml/acs` });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: sso-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: sso.example',
      '  listen_addr: 127.0.0.1:0',
      '  authentication: { type: oidc, connector_name: corp }',
      // Separate listeners here (web-browser.test.ts has TLS routing on one port): the web port serves the page alone.
      '  proxy_listener_mode: separate',
      'proxy_service:',
      `  web_listen_addr: 127.0.0.1:${port}`,
      // The agent dials the first address (its resolver does not know the test's names); the browser the name.
      `  public_addr: [127.0.0.1:${port}, ${PROXY_NAME}:${port}]`,
      `  tunnel_public_addr: 127.0.0.1:${tunnelPort}`,
      ...separateListenLines('127.0.0.1', { ports: { listen_addr: sshPort, tunnel_listen_addr: tunnelPort } }),
      '',
    ].join('\n'),
  );
  const manifest = join(dir, 'connectors.yaml');
  await writeFile(
    manifest,
    [
      'kind: oidc',
      'version: v3',
      'metadata: { name: corp }',
      'spec:',
      `  issuer_url: ${oidc.issuer}`,
      `  client_id: ${oidc.clientId}`,
      `  client_secret: ${oidc.clientSecret}`,
      `  redirect_url: ${origin}/webapi/sso/oidc/callback`,
      '  display: Corporate SSO',
      '  scope: [email, groups]',
      '  ca: |',
      ...block(pki.caPem, '    '),
      '  claims_to_roles:',
      '    - { claim: groups, value: admins, roles: [editor, access] }',
      "    - { claim: groups, value: 'dev*', roles: [access] }",
      '---',
      'kind: saml',
      'version: v2',
      'metadata: { name: okta }',
      'spec:',
      `  acs: ${origin}/webapi/sso/saml/acs`,
      `  service_provider_issuer: https://${PROXY_NAME}/saml/sp`,
      '  display: Okta',
      '  entity_descriptor: |',
      ...block(saml.metadata, '    '),
      '  attributes_to_roles:',
      '    - { name: groups, value: sre, roles: [access, auditor] }',
      '',
    ].join('\n'),
  );
  const created = await runCli('gwctl', ['--data-dir', cluster.dataDir, 'create', manifest], { env: { HOME: dir } });
  expect(created.status, created.stderr).toBe(0);
  // One agent, so that the pages after sign-in show what the mapped roles reach.
  const admin = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(['gateway:', '  nodename: web-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  labels: { env: dev }', ''].join('\n'), {
    args: ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${port}`],
  });
  await agent.waitForLog('reverse tunnel ready', 30_000);
  const hostCa = await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8');
  // HTTP/1.1 only here (web-browser.test.ts is served over HTTP/2): the page and the sign-ins work with both.
  browser = await launchBrowser({ suite: 'sso-browser', trust: [hostCa, pki.caPem], args: ['--disable-http2'] });
}, 90_000);

afterAll(async () => {
  await browser?.close();
  await agent?.stop();
  await cluster?.stop();
  await oidc?.close();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** From the sign-in page's button to the provider's login form, filled in and consented to. */
async function oidcSignIn(page: Page, user: string, shots: boolean): Promise<void> {
  await page.goto(`${origin}/web/login`);
  await page.getByTestId('connector-corp').click();
  await page.waitForURL((u) => u.origin === oidc.issuer);
  const login = page.locator('input[name="login"]');
  await login.waitFor();
  await login.fill(user);
  await page.locator('input[name="password"]').fill('any password');
  if (shots) await browser.shot(page, 'oidc-provider-login');
  await page.locator('button[type="submit"]').click();
  // The provider's consent page, then back to us.
  await page.waitForURL((u) => u.origin !== oidc.issuer || u.pathname.includes('/interaction/'));
  if (new URL(page.url()).origin === oidc.issuer) {
    if (shots) await browser.shot(page, 'oidc-provider-consent');
    await page.locator('button[type="submit"]').click();
  }
}

describe('OIDC in the browser', () => {
  it('the sign-in page offers the configured connector first', async () => {
    const { page } = browser;
    await browser.step(page, 'login-with-connectors', async () => {
      await page.goto(`${origin}/web/login`);
      await page.getByTestId('connector-corp').waitFor();
      await page.getByTestId('connector-okta').waitFor();
    });
    expect(await page.getByTestId('connector-corp').innerText()).toContain('Corporate SSO');
    const protocol = await page.evaluate(() => (performance.getEntriesByType('navigation')[0] as PerformanceNavigationTiming).nextHopProtocol);
    expect(protocol).toBe('http/1.1');
  });

  it("signs in at the provider's own pages and lands with the roles its groups map to", async () => {
    const { page } = browser;
    await oidcSignIn(page, 'alice', true);
    await browser.step(page, 'oidc-signed-in', async () => {
      await page.getByTestId('resource-row-web-1').waitFor();
      await expect.poll(() => page.getByTestId('current-user').innerText()).toContain('alice@example.com');
    });
    const header = await page.locator('header').innerText();
    expect(header).toContain('editor, access');
    expect(header).toMatch(/Corporate SSO|corp/);
    expect(new URL(page.url()).pathname).toBe('/web/');
    // The SSO user is a user record of the cluster, made by the connector.
    const users = JSON.parse((await runCli('gwctl', ['--data-dir', cluster.dataDir, 'get', 'user/alice@example.com', '--format', 'json'], { env: { HOME: dir } })).stdout) as Array<{ spec: { roles: string[]; created_by?: { connector: string; kind: string } } }>;
    expect(users[0]!.spec).toMatchObject({ roles: ['editor', 'access'], created_by: { connector: 'corp', kind: 'oidc' } });
    await page.getByTestId('signout').click();
    await page.getByTestId('login-form').or(page.getByTestId('connectors')).first().waitFor();
  });

  it('a user whom no mapping gives a role is refused on an error page with its code, and has no session', async () => {
    const { context, page } = await browser.newPage();
    await oidcSignIn(page, 'mallory', false);
    await browser.step(page, 'oidc-no-roles', async () => {
      await page.getByText('GW_ERR_SSO_NO_ROLES').waitFor();
    });
    expect((await context.cookies(origin)).find((c) => c.name === '__Host-gw_session')).toBeUndefined();
    await context.close();
  });

  it("the provider's answer replayed in the browser is refused: the sign-in request was used", async () => {
    const { context, page } = await browser.newPage();
    let callback: string | undefined;
    page.on('request', (r) => {
      if (r.url().startsWith(`${origin}/webapi/sso/oidc/callback`)) callback ??= r.url();
    });
    await oidcSignIn(page, 'dave', false);
    await page.getByTestId('current-user').waitFor();
    expect(await page.getByTestId('current-user').innerText()).toContain('dave@example.com');
    expect(callback).toBeDefined();
    await browser.step(page, 'oidc-replay-refused', async () => {
      await page.goto(callback!);
      await page.getByText('GW_ERR_SSO_STATE_INVALID').waitFor();
    });
    await context.close();
  });
});

describe('gwsh login --auth with the browser', () => {
  it('gwsh prints the URL; the browser signs in at the provider and lands on gwsh\'s page on 127.0.0.1; gwsh has the roles', async () => {
    const admin = await runCli('gwctl', ['--data-dir', cluster.dataDir, 'status'], { env: { HOME: dir } });
    const pin = /CA pin:\s+(\S+)/.exec(admin.stdout)![1]!;
    const env = { PATH: process.env.PATH ?? '', HOME: dir, GWSH_HOME: join(dir, 'gwsh-alice') };
    const proxyAddr = new URL(origin).host.replace(PROXY_NAME, '127.0.0.1');
    const child = spawn(process.execPath, [BIN('gwsh'), 'login', `--proxy=${proxyAddr}`, '--auth=corp', `--ca-pin=${pin}`], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    const exited = new Promise<number | null>((r) => child.once('close', r));
    try {
      const url = await new Promise<string>((resolve, reject) => {
        const check = () => {
          const m = /Open this URL in your browser: (\S+)/.exec(out);
          if (m) resolve(m[1]!);
        };
        child.stdout.on('data', check);
        child.once('close', () => reject(new Error(`gwsh ended first:\n${out}\n${err}`)));
      });
      const { context, page } = await browser.newPage();
      await page.goto(url);
      await page.locator('input[name="login"]').fill('alice');
      await page.locator('input[name="password"]').fill('any password');
      await page.locator('button[type="submit"]').click();
      await page.waitForURL((u) => u.origin !== oidc.issuer || u.pathname.includes('/interaction/'));
      if (new URL(page.url()).origin === oidc.issuer) await page.locator('button[type="submit"]').click();
      await browser.step(page, 'gwsh-login-done', async () => {
        await page.waitForURL((u) => u.hostname === '127.0.0.1' && u.pathname === '/callback');
        await page.getByText('Signed in').first().waitFor();
      });
      await context.close();
      expect(await exited, err).toBe(0);
      const status = await runCli('gwsh', ['status', '--format', 'json'], { env });
      expect(JSON.parse(status.stdout).active).toMatchObject({ username: 'alice@example.com', roles: ['editor', 'access'] });
    } finally {
      if (child.exitCode === null) child.kill('SIGTERM');
    }
  });
});

describe('SAML in the browser', () => {
  it('signs in through samlify as the identity provider, and lands with the roles of the attribute mapping', async () => {
    const { context, page } = await browser.newPage();
    // The identity provider's pages at its SSO URL: a login form, then the HTTP-POST binding's form to our ACS.
    await context.route(`${SAML_SSO}**`, async (route: Route) => {
      const req = route.request();
      if (req.method() === 'GET') {
        await route.fulfill({ contentType: 'text/html', body: samlLoginPage(req.url()) });
        return;
      }
      const form = new URLSearchParams(req.postData() ?? '');
      const answer = await saml.respond(form.get('request')!, form.get('user')!, (form.get('groups') ?? '').split(',').filter(Boolean));
      await route.fulfill({ contentType: 'text/html', body: samlPostPage(`${origin}/webapi/sso/saml/acs`, answer.SAMLResponse, answer.RelayState) });
    });
    await page.goto(`${origin}/web/login`);
    await page.getByTestId('connector-okta').click();
    await page.waitForURL((u) => u.href.startsWith(SAML_SSO));
    await page.locator('input[name="user"]').fill('carol@example.com');
    await page.locator('input[name="groups"]').fill('sre,staff');
    await browser.shot(page, 'saml-idp-login');
    await page.locator('button[type="submit"]').click();
    await page.locator('#saml-post button').click();
    await browser.step(page, 'saml-signed-in', async () => {
      await page.getByTestId('resource-row-web-1').waitFor();
      await expect.poll(() => page.getByTestId('current-user').innerText()).toContain('carol@example.com');
    });
    expect(await page.locator('header').innerText()).toContain('access, auditor');
    expect(browser.log(page).errors).toEqual([]);
    await context.close();
  });
});

const escape = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/** The identity provider's login page (what a real one asks; the groups stand for its directory). */
function samlLoginPage(authUrl: string): string {
  return `<!doctype html><html><head><title>Identity provider (samlify)</title></head>
<body style="font-family: sans-serif; max-width: 28em; margin: 4em auto">
<h1>Example identity provider</h1><p>samlify, acting as a SAML 2.0 IdP, received an AuthnRequest from ${escape(new URL(authUrl).searchParams.has('SAMLRequest') ? 'the gateway' : 'nobody')}.</p>
<form method="post" action="${SAML_SSO}/login">
<input type="hidden" name="request" value="${escape(authUrl)}">
<p><label>User <input name="user"></label></p><p><label>Groups <input name="groups"></label></p>
<button type="submit">Sign in</button></form></body></html>`;
}

/** The HTTP-POST binding: a form the browser submits to the service provider's ACS. */
function samlPostPage(acs: string, response: string, relayState: string): string {
  return `<!doctype html><html><body><form id="saml-post" method="post" action="${escape(acs)}">
<input type="hidden" name="SAMLResponse" value="${escape(response)}"><input type="hidden" name="RelayState" value="${escape(relayState)}">
<button type="submit">Continue to the gateway</button></form></body></html>`;
}
