/**
 * The Web UI in a real browser: Debian's Chromium driven by playwright-core (test/helpers/browser.ts), against a
 * real daemon (auth + proxy, TLS routing on one port) and two real agents joined through the Proxy (`web-1`: SSH,
 * an HTTP app and a database entry; `db-2`: SSH), as a user meets it:
 *
 * sign-in with a local user (and a wrong password refused, its message on screen); the resources with their labels
 * and the filter, and what a narrower role does not show; the agents; the terminal (xterm.js over the WebSocket,
 * through the Proxy and the tunnel) running a command whose output appears on the screen, and a resize the shell
 * sees; an HTTP app opened from the page; the maintenance window edited by an allowed user (read back with gwctl)
 * and refused to a user without the rule (the error on screen, and the server's refusal of a save the page never
 * offered) and the agents view refused to that user; a join token created and revoked; the audit log; sign-out
 * (the old cookie refused); a lock closing an open terminal with its message; an expired session back at sign-in
 * with its message; a lock while a page shows data (the data, and a join token shown once, cleared under the error);
 * the join command the same as gwctl's (the Proxy's public address, not the browser's host); the README's first
 * admin (access,editor) offered the maintenance role's commands, which, run as shown, open the form; the layout at a
 * phone's width (390x844: the navigation collapsed behind Menu, no page wider than the screen, tables scrolling in
 * their own box) and at a desktop's, screenshots of both; and pages loading while a stressor changes the machine's
 * network (the browser runs in a namespace of its own: scripts/netns-run.sh). The page's console is checked for
 * errors (a Content-Security-Policy violation shows there).
 * Looking at the screenshots found what the DOM could not: underscores invisible in the terminal (fixed with
 * xterm's line height), hence the underscores in the command the terminal test runs.
 *
 * The browser trusts the cluster's host CA through an NSS database of its own (never ignoreHTTPSErrors) and
 * reaches the Proxy by the name `proxy.gateway.test` (host resolver rules), as a user's browser reaches it by DNS.
 * Screenshots of each step: test-results/web/web-browser/. Waits are for selectors; nothing asserts timing.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer, type Server } from 'node:https';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import getPort from 'get-port';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DESKTOP, launchBrowser, layoutFacts, networkIsolated, PHONE, type TestBrowser } from '../helpers/browser.js';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startNetworkStress } from '../helpers/netstress.js';
import { rootTest } from '../helpers/root.js';
import { makeTestPki } from '../helpers/tls.js';

const PROXY_NAME = 'proxy.gateway.test';
/** Apps live under the Proxy's name: its web certificate holds `*.<public name>` (as for apps-kube.test.ts). */
const APP_NAME = `grafana.${PROXY_NAME}`;
const LOGIN = userInfo().username;
const PASSWORD = 'correct horse battery';
let dir: string;
let cluster: RunningGateway;
const agents: RunningGateway[] = [];
let app: HttpServer;
let browser: TestBrowser;
let origin: string;

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });

async function gwctlOk(args: string[], input?: string): Promise<string> {
  const r = await gwctl(args, input);
  if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.status}\n${r.stderr}`);
  return r.stdout;
}

/** The roles and users of the test: alice may do everything the page offers, bob reaches env=dev nodes only. */
const ROLES = `kind: role
version: v7
metadata: { name: maintenance-admin }
spec:
  allow:
    rules:
      - resources: [cluster_maintenance_config]
        verbs: [create, read, update, delete]
---
kind: role
version: v7
metadata: { name: dev-access }
spec:
  allow:
    logins: ['{{internal.logins}}']
    node_labels: { env: dev }
`;

const agentYaml = (name: string, services: string[]) => ['gateway:', `  nodename: ${name}`, '  data_dir: DATA_DIR', '  log: { format: json }', ...services, ''].join('\n');

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-web-'));
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: web.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: 127.0.0.1:${port}`,
      // Agents dial the first address (their resolver does not know the test's names); the browser uses the name.
      `  public_addr: [127.0.0.1:${port}, ${PROXY_NAME}:${port}]`,
      '',
    ].join('\n'),
  );
  origin = `https://${PROXY_NAME}:${port}`;
  // The HTTP app behind web-1: answers who asked for what, so the page it shows is ours.
  app = createHttpServer((req, res) => {
    res.setHeader('content-type', 'text/html; charset=utf-8');
    res.end(`<!doctype html><title>Grafana (test)</title><h1 data-testid="app-page">hello from the app behind web-1</h1><p>${req.method} ${String(req.url).replace(/[<>&]/g, '')}</p>`);
  });
  await new Promise<void>((r) => app.listen(0, '127.0.0.1', r));
  const appPort = (app.address() as AddressInfo).port;

  await writeFile(join(dir, 'roles.yaml'), ROLES);
  await gwctlOk(['create', join(dir, 'roles.yaml')]);
  await gwctlOk(['users', 'add', 'alice', '--roles=access,editor,auditor,maintenance-admin', `--logins=${LOGIN}`], `${PASSWORD}\n`);
  await gwctlOk(['users', 'add', 'bob', '--roles=dev-access', `--logins=${LOGIN}`], `${PASSWORD}\n`);
  const pin = /CA pin:\s+(\S+)/.exec(await gwctlOk(['status']))![1]!;
  const token = (JSON.parse(await gwctlOk(['tokens', 'add', '--type=node,app,db', '--uses=0', '--format', 'json'])) as { token: string }).token;
  const join_ = ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${port}`];
  const started = await Promise.all([
    startGateway(
      agentYaml('web-1', [
        'ssh_service:',
        '  labels: { env: dev, team: web }',
        'app_service:',
        '  apps:',
        `    - { name: grafana, uri: "http://127.0.0.1:${appPort}", public_addr: ${APP_NAME}, labels: { env: dev, team: web } }`,
        'db_service:',
        '  databases:',
        '    - { name: orders-db, protocol: postgres, uri: "127.0.0.1:5432", labels: { env: prod, team: data } }',
      ]),
      { args: join_ },
    ),
    startGateway(agentYaml('db-2', ['ssh_service:', '  labels: { env: prod, team: data }']), { args: join_ }),
  ]);
  agents.push(...started);
  await Promise.all(agents.map((a) => a.waitForLog('reverse tunnel ready', 30_000).catch((err: Error) => Promise.reject(new Error(`${err.message}\n${a.logs().slice(-3000)}`)))));
  const ca = await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8');
  browser = await launchBrowser({ suite: 'web-browser', trust: [ca] });
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await Promise.all(agents.map((a) => a.stop()));
  await cluster?.stop();
  await new Promise((r) => (app ? app.close(r) : r(undefined)));
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Fills the sign-in form and submits it. */
async function signIn(page: Page, user: string, password: string): Promise<void> {
  await page.goto(`${origin}/web/login`);
  await page.getByTestId('login-user').fill(user);
  await page.getByTestId('login-password').fill(password);
  await page.getByTestId('login-submit').click();
}

/** The text of the terminal's screen (xterm's DOM renderer: one element per row). */
async function screenText(page: Page): Promise<string> {
  return page.locator('.xterm-rows').innerText();
}

describe('the browser harness', () => {
  it("loads /webapi/ping over TLS the browser checks against the cluster's CA (no certificate error ignored)", async () => {
    const { page } = browser;
    const res = await browser.step(page, 'ping', () => page.goto(`${origin}/webapi/ping`));
    expect(res?.status()).toBe(200);
    const ping = JSON.parse((await page.textContent('body')) ?? '') as { cluster_name: string; auth: { type: string } };
    expect(ping.cluster_name).toBe('web.example');
    expect(ping.auth.type).toBe('local');
  });

  it('refuses a server whose certificate another CA issued, and a name the Proxy certificate does not hold', async () => {
    const { context, page } = await browser.newPage();
    // A real HTTPS server with a certificate from a CA the browser does not trust.
    const pki = await makeTestPki();
    const cert = await pki.serverCert({ names: ['other.gateway.test'], ips: [] });
    const port = await getPort({ host: '127.0.0.1' });
    const server: Server = createServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => res.end('must not be shown'));
    await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
    try {
      await expect(page.goto(`https://other.gateway.test:${port}/`)).rejects.toThrow(/ERR_CERT_AUTHORITY_INVALID/);
    } finally {
      await new Promise((resolve) => server.close(resolve));
      await pki.cleanup();
    }
    // The Proxy's own port under a name its certificate does not hold.
    const wrong = origin.replace(PROXY_NAME, 'not-the-proxy.gateway.test');
    await expect(page.goto(`${wrong}/webapi/ping`)).rejects.toThrow(/ERR_CERT_COMMON_NAME_INVALID/);
    await context.close();
  });
});

describe('a local user in the Web UI', () => {
  it('a wrong password is refused with its message on the sign-in page', async () => {
    const { page } = browser;
    await browser.step(page, 'login', async () => {
      await page.goto(`${origin}/web/login`);
      await page.getByTestId('login-form').waitFor();
    });
    await browser.step(page, 'login-wrong-password', async () => {
      await signIn(page, 'alice', 'not the password');
      await page.getByTestId('login-error').waitFor();
    });
    expect(await page.getByTestId('login-error').innerText()).toMatch(/user name or password/i);
    expect(await page.getByTestId('login-error-code').innerText()).toBe('GW_ERR_AUTH_LOGIN_FAILED');
    expect(new URL(page.url()).pathname).toBe('/web/login');
  });

  it('signs in with the password, over HTTP/2, and lands on the resources with their labels', async () => {
    const { page } = browser;
    await browser.step(page, 'resources', async () => {
      await signIn(page, 'alice', PASSWORD);
      await page.getByTestId('resource-row-web-1').waitFor();
      await page.getByTestId('resource-row-db-2').waitFor();
    });
    expect(new URL(page.url()).pathname).toBe('/web/');
    expect(await page.getByTestId('current-user').innerText()).toContain('alice');
    expect(await page.getByTestId('resource-row-web-1').innerText()).toMatch(/env=dev[\s\S]*team=web/);
    expect(await page.getByTestId('resource-row-db-2').innerText()).toMatch(/env=prod[\s\S]*team=data/);
    const protocol = await page.evaluate(() => (performance.getEntriesByType('navigation')[0] as PerformanceNavigationTiming).nextHopProtocol);
    expect(protocol).toBe('h2');
    // The session cookie as the browser keeps it: HttpOnly, Secure, SameSite=Strict, and the page cannot read it.
    const cookie = (await browser.context.cookies(origin)).find((c) => c.name === '__Host-gw_session');
    expect(cookie).toMatchObject({ httpOnly: true, secure: true, sameSite: 'Strict', path: '/' });
    expect(await page.evaluate(() => document.cookie)).not.toContain('gw_session');
  });

  it('filters the resources by label, and shows the databases and apps in their tabs', async () => {
    const { page } = browser;
    await browser.step(page, 'resources-filtered', async () => {
      await page.getByTestId('filter').fill('env=prod');
      await page.getByTestId('resource-row-web-1').waitFor({ state: 'detached' });
    });
    expect(await page.getByTestId('resource-row-db-2').isVisible()).toBe(true);
    expect(new URL(page.url()).searchParams.get('q')).toBe('env=prod');
    await browser.step(page, 'resources-filter-nothing', async () => {
      await page.getByTestId('filter').fill('team=nobody');
      await page.getByTestId('resources-empty').waitFor();
    });
    await page.getByTestId('filter').fill('');
    await browser.step(page, 'resources-databases', async () => {
      await page.getByTestId('resource-tab-databases').click();
      await page.getByTestId('resource-row-orders-db').waitFor();
    });
    expect(await page.getByTestId('resource-row-orders-db').innerText()).toMatch(/postgres[\s\S]*env=prod/);
    await browser.step(page, 'resources-apps', async () => {
      await page.getByTestId('resource-tab-apps').click();
      await page.getByTestId('resource-row-grafana').waitFor();
    });
  });

  it('opens the HTTP app from the page: launched on its own host name, with its own cookie', async () => {
    const { page } = browser;
    await browser.step(page, 'app-opened', async () => {
      await page.getByTestId('app-open-grafana').click();
      await page.getByTestId('app-page').waitFor();
    });
    expect(new URL(page.url()).hostname).toBe(APP_NAME);
    expect(await page.locator('body').innerText()).toContain('hello from the app behind web-1');
    const appCookies = await browser.context.cookies(`https://${APP_NAME}${new URL(origin).port ? `:${new URL(origin).port}` : ''}`);
    expect(appCookies.find((c) => c.name === '__Host-gw_app')).toMatchObject({ httpOnly: true, secure: true, sameSite: 'Strict' });
    // The launch nonce was spent and cleared.
    expect(appCookies.filter((c) => c.name.startsWith('__Host-gw_launch'))).toEqual([]);
  });

  it("hostile: alice's own launch link, opened in another browser, is refused there and logs nobody in as alice", async () => {
    const { page } = browser;
    const appOrigin = `https://${APP_NAME}${new URL(origin).port ? `:${new URL(origin).port}` : ''}`;
    await page.goto(`${origin}/web/`);
    await page.getByTestId('resource-tab-apps').click();
    // Alice's launch runs as usual up to its last step, the link with her token, which is kept instead of opened.
    // The test answers that request itself: an aborted navigation would leave Chromium's error page, which reloads
    // itself a second later and would then open the link for real in the middle of the next test.
    let link: string | undefined;
    await page.route(`${appOrigin}/x-gateway-auth?token=*`, async (route) => {
      link = route.request().url();
      await route.fulfill({ status: 200, contentType: 'text/plain', body: 'the launch link, kept by the test' });
    });
    await page.getByTestId('app-open-grafana').click();
    await expect.poll(() => link, { timeout: 30_000 }).toBeDefined();
    await page.unrouteAll({ behavior: 'wait' });
    expect(new URL(link!).searchParams.get('state')).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const victim = await browser.newPage();
    try {
      await browser.step(victim.page, 'app-launch-unbound', async () => {
        const answer = await victim.page.goto(link!);
        expect(answer?.status()).toBe(403);
      });
      expect(await victim.page.locator('body').innerText()).toContain('GW_ERR_WEB_APP_LAUNCH_UNBOUND');
      expect((await victim.context.cookies(appOrigin)).map((c) => c.name)).toEqual([]);
    } finally {
      await victim.context.close();
    }
  });

  it('shows the agents with their version and online state', async () => {
    const { page } = browser;
    await browser.step(page, 'agents', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('agent-row-web-1').waitFor();
      await page.getByTestId('agent-row-db-2').waitFor();
    });
    expect(await page.getByTestId('agent-row-web-1').innerText()).toContain('17.0.0-dev');
  });

  it('opens a terminal on web-1: a command typed in the browser runs there and its output is on the screen', async () => {
    const { page } = browser;
    await page.goto(`${origin}/web/`);
    await browser.step(page, 'terminal', async () => {
      await page.getByTestId('resource-connect-web-1').click();
      await page.locator('[data-testid="terminal-status"][data-status="connected"]').waitFor();
      // The shell's prompt first, so that what is typed is not echoed ahead of it.
      await expect.poll(() => screenText(page), { timeout: 30_000 }).toMatch(/[#$] *$/m);
      await page.locator('.xterm').click();
      await page.keyboard.type('echo browser_under_$RANDOM\n');
      await expect.poll(() => screenText(page), { timeout: 30_000 }).toMatch(/^browser_under_\d+\s*$/m);
    });
    expect(await page.getByTestId('terminal-title').innerText()).toBe(`${LOGIN}@web-1`);
    // A resize reaches the shell: its window size changes with the browser's.
    await page.keyboard.type('clear; stty size\n');
    await expect.poll(() => screenText(page), { timeout: 30_000 }).toMatch(/^\d+ \d+\s*$/m);
    const before = /^(\d+ \d+)\s*$/m.exec(await screenText(page))![1];
    await page.setViewportSize({ width: 900, height: 600 });
    await browser.step(page, 'terminal-resized', async () => {
      await expect
        .poll(async () => {
          await page.keyboard.type('clear; stty size\n');
          return /^(\d+ \d+)\s*$/m.exec(await screenText(page))?.[1];
        }, { timeout: 30_000, interval: 500 })
        .not.toBe(before);
    });
    // And back: the shell has the first size again before the session is ended (the last line typed is then not
    // typed into a terminal that is still being laid out).
    await page.setViewportSize({ width: 1280, height: 800 });
    await expect
      .poll(async () => {
        await page.keyboard.type('clear; stty size\n');
        return /^(\d+ \d+)\s*$/m.exec(await screenText(page))?.[1];
      }, { timeout: 30_000, interval: 500 })
      .toBe(before);
    await page.keyboard.type('exit 3\n');
    await page.locator('[data-testid="terminal-status"][data-status="closed"]').waitFor();
    // xterm.js renders what is written on its next frame: poll the screen.
    await expect.poll(() => screenText(page)).toContain('exited with status 3');
  });

  it('edits the maintenance window; gwctl reads back what was saved', async () => {
    const { page } = browser;
    await page.goto(`${origin}/web/maintenance`);
    await page.getByTestId('maint-form').waitFor();
    await browser.step(page, 'maintenance-saved', async () => {
      for (const day of ['Tue', 'Thu']) {
        if (!(await page.getByTestId(`maint-weekday-${day}`).isChecked())) await page.getByTestId(`maint-weekday-${day}`).check();
      }
      await page.getByTestId('maint-hour').selectOption('3');
      await page.getByTestId('maint-save').click();
      await page.getByTestId('maint-saved').waitFor();
      await expect.poll(() => page.getByTestId('maint-current').innerText()).toContain('03:00');
    });
    const stored = JSON.parse(await gwctlOk(['get', 'cluster_maintenance_config', '--format', 'json'])) as Array<{ spec: { agent_upgrades: { utc_start_hour: number; weekdays: string[] } } }>;
    expect(stored[0]!.spec.agent_upgrades).toEqual({ utc_start_hour: 3, weekdays: ['Tue', 'Thu'] });
  });

  it('creates a join token, sees it listed, and revokes it', async () => {
    const { page } = browser;
    const tokenIds = async () => (JSON.parse(await gwctlOk(['tokens', 'ls', '--format', 'json'])) as Array<{ id: string }>).map((t) => t.id);
    const before = await tokenIds();
    await page.goto(`${origin}/web/tokens`);
    await page.getByTestId('token-form').waitFor();
    const value = await browser.step(page, 'token-created', async () => {
      await page.getByTestId('token-type-node').check();
      await page.getByTestId('token-create').click();
      await page.getByTestId('token-value').waitFor();
      return page.getByTestId('token-value').innerText();
    });
    expect(value).toMatch(/^[0-9a-f]{16,}$/i);
    // The command shown is the one gwctl tokens add prints: its --proxy is the Proxy's public address (ping's, here
    // 127.0.0.1:<port>), not the name the browser reached the page by (proxy.gateway.test).
    const shown = await page.getByTestId('token-command').innerText();
    const cli = (JSON.parse(await gwctlOk(['tokens', 'add', '--type=node', '--format', 'json'])) as { command: string; id: string; token: string });
    await gwctlOk(['tokens', 'rm', cli.token]);
    const sameToken = (c: string) => c.replace(/--token=\S+/, '--token=<token>');
    expect(sameToken(shown)).toBe(sameToken(cli.command));
    expect(shown).toContain(`--proxy=127.0.0.1:${new URL(origin).port}`);
    const created = (await tokenIds()).filter((id) => !before.includes(id));
    expect(created).toHaveLength(1);
    const id = created[0]!;
    await page.getByTestId(`token-row-${id}`).waitFor();
    page.once('dialog', (d) => void d.accept());
    await browser.step(page, 'token-revoked', async () => {
      await page.getByTestId(`token-revoke-${id}`).click();
      await page.getByTestId(`token-row-${id}`).waitFor({ state: 'detached' });
    });
    expect(await tokenIds()).toEqual(before);
  });

  it('shows the audit log with the web sign-in', async () => {
    const { page } = browser;
    await browser.step(page, 'audit', async () => {
      await page.goto(`${origin}/web/audit`);
      await page.locator('[data-event="user.login"]').first().waitFor();
    });
    // The app launched above: its session's start, by the Auth Service, with the app as the resource.
    const launched = page.locator('[data-event="app.session.start"]').first();
    await launched.waitFor();
    expect(await launched.locator('[data-col="resource"]').innerText()).toContain('grafana');
    // The terminal's SSH session: login@node as the resource.
    const ssh = page.locator('[data-event="session.end"]').first();
    await ssh.waitFor();
    expect(await ssh.locator('[data-col="resource"]').innerText()).toMatch(/@web-1$/);
  });

  it('signs out: the session is gone on the server, and the page is back at sign-in', async () => {
    const { page } = browser;
    const cookie = (await browser.context.cookies(origin)).find((c) => c.name === '__Host-gw_session')!;
    await page.goto(`${origin}/web/`);
    await browser.step(page, 'signed-out', async () => {
      await page.getByTestId('signout').click();
      await page.getByTestId('login-form').waitFor();
    });
    expect((await browser.context.cookies(origin)).find((c) => c.name === '__Host-gw_session')).toBeUndefined();
    // The old cookie, replayed, is refused by the server.
    const replay = await page.evaluate(async (id) => {
      const r = await fetch('/webapi/sessions/current', { headers: { cookie: `__Host-gw_session=${id}` } });
      return { status: r.status, body: await r.text() };
    }, cookie.value);
    expect(replay.status).toBe(401);
    await page.goto(`${origin}/web/`);
    await page.getByTestId('login-form').waitFor();
  });

  it('no page logged a console error (a Content-Security-Policy violation would)', () => {
    // Expected: the 401s of the wrong password and of the replayed cookie, and Chromium's own /favicon.ico for the
    // JSON document of /webapi/ping (the page itself declares its icon).
    const expected = (e: string) => /status of 401/.test(e) || /\/favicon\.ico\)$/.test(e);
    expect(browser.log(browser.page).errors.filter((e) => !expected(e))).toEqual([]);
  });
});

describe('a user whose roles allow less', () => {
  let page: Page;
  beforeAll(async () => {
    ({ page } = await browser.newPage());
  });

  it('sees only the servers their role selects (env=dev), and no admin pages in the navigation', async () => {
    await browser.step(page, 'bob-resources', async () => {
      await signIn(page, 'bob', PASSWORD);
      await page.getByTestId('resource-row-web-1').waitFor();
    });
    expect(await page.getByTestId('resource-row-db-2').count()).toBe(0);
    expect(await page.getByTestId('nav-maintenance').count()).toBe(0);
    expect(await page.getByTestId('nav-tokens').count()).toBe(0);
    expect(await page.getByTestId('nav-agents').count()).toBe(0);
  });

  it('is refused the maintenance window, with the reason on screen', async () => {
    await browser.step(page, 'bob-maintenance-refused', async () => {
      await page.goto(`${origin}/web/maintenance`);
      await page.getByTestId('maint-error').waitFor();
    });
    expect(await page.getByTestId('maint-error-code').innerText()).toBe('GW_ERR_ACCESS_DENIED');
    expect(await page.getByTestId('maint-error').innerText()).toContain('cluster_maintenance_config');
  });

  it('is refused the agents view (no rule on node), with the reason on screen', async () => {
    await browser.step(page, 'bob-agents-refused', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('agents-error').waitFor();
    });
    expect(await page.getByTestId('agents-error').innerText()).toContain('GW_ERR_ACCESS_DENIED');
  });

  it('and the server refuses the save the page does not offer (the same request, sent from the page by hand)', async () => {
    const answer = await page.evaluate(async () => {
      const bearer = Object.values(sessionStorage).find((v) => /^[A-Za-z0-9_-]{43}$/.test(v)) ?? '';
      const manifest = 'kind: cluster_maintenance_config\nspec:\n  agent_upgrades:\n    utc_start_hour: 5\n    weekdays: ["*"]\n';
      const body = JSON.stringify({ manifest, overwrite: true, source: 'web' });
      const r = await fetch('/v1/resources', { method: 'POST', headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json' }, body });
      return { status: r.status, body: (await r.json()) as { error?: { code: string } } };
    });
    expect(answer.status).toBe(403);
    expect(answer.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
    const stored = JSON.parse(await gwctlOk(['get', 'cluster_maintenance_config', '--format', 'json'])) as Array<{ spec: { agent_upgrades: { utc_start_hour: number } } }>;
    expect(stored[0]!.spec.agent_upgrades.utc_start_hour).toBe(3);
  });
});

describe('a lock while a page shows data', () => {
  it("clears bob's resources from the screen under the lock's error when the page loads them again", async () => {
    const { context, page } = await browser.newPage();
    await signIn(page, 'bob', PASSWORD);
    await page.getByTestId('resource-row-web-1').waitFor();
    await gwctlOk(['lock', '--user', 'bob', '--message', 'incident 43: data must go']);
    try {
      await browser.step(page, 'locked-data-cleared', async () => {
        await page.getByTestId('resources-refresh').click();
        await page.getByTestId('resources-error').waitFor();
      });
      expect(await page.getByTestId('resources-error-code').innerText()).toBe('GW_ERR_ACCESS_LOCKED');
      expect(await page.getByTestId('resources-error').innerText()).toContain('incident 43');
      // Nothing of what bob saw before the lock is left under the error.
      expect(await page.getByTestId('resource-row-web-1').count()).toBe(0);
      expect(await page.locator('.table').count()).toBe(0);
    } finally {
      await gwctlOk(['unlock', '--user', 'bob']);
      await context.close();
    }
  });

  it("takes a join token shown once off the screen with the token list, when the user is locked", async () => {
    const { context, page } = await browser.newPage();
    await signIn(page, 'alice', PASSWORD);
    await page.getByTestId('resource-row-web-1').waitFor();
    await page.goto(`${origin}/web/tokens`);
    await page.getByTestId('token-create').click();
    const value = await page.getByTestId('token-value').innerText();
    await gwctlOk(['lock', '--user', 'alice', '--message', 'incident 44']);
    try {
      await browser.step(page, 'locked-token-cleared', async () => {
        await page.getByTestId('tokens-refresh').click();
        await page.getByTestId('tokens-error').waitFor();
      });
      expect(await page.getByTestId('tokens-error-code').innerText()).toBe('GW_ERR_ACCESS_LOCKED');
      expect(await page.getByTestId('token-created').count()).toBe(0);
      expect(await page.locator('body').innerText()).not.toContain(value);
      expect(await page.locator('[data-testid^="token-row-"]').count()).toBe(0);
    } finally {
      await gwctlOk(['unlock', '--user', 'alice']);
      await gwctlOk(['tokens', 'rm', value]);
      await context.close();
    }
  });
});

describe("the README's first admin (access,editor) and the maintenance window", () => {
  it('is offered the page, which shows the commands that give the role; run as shown, they open the form', async () => {
    // The README's command for its first admin (its roles), for a user of this test.
    await gwctlOk(['users', 'add', 'carol', '--roles=access,editor', `--logins=${LOGIN}`], `${PASSWORD}\n`);
    const { context, page } = await browser.newPage();
    try {
      await signIn(page, 'carol', PASSWORD);
      await page.getByTestId('resource-row-web-1').waitFor();
      await browser.step(page, 'first-admin-maintenance-grant', async () => {
        await page.getByTestId('nav-maintenance').click();
        await page.getByTestId('maint-grant-steps').waitFor();
      });
      expect(await page.getByTestId('maint-error-code').innerText()).toBe('GW_ERR_ACCESS_DENIED');
      const steps = await page.getByTestId('maint-grant-steps').innerText();
      // The lines as shown, in a shell whose gwctl is this cluster's (the local admin, as on the Auth Service's machine).
      const gwctlFn = `gwctl() { '${process.execPath}' '${BIN('gwctl')}' --data-dir '${cluster.dataDir}' "$@"; }`;
      const ran = spawnSync('sh', ['-euc', `${gwctlFn}\n${steps}`], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '', HOME: dir }, timeout: 60_000 });
      expect(ran.status, ran.stderr).toBe(0);
      // A role given works from the next sign-in.
      await page.getByTestId('signout').click();
      await page.getByTestId('login-form').waitFor();
      await signIn(page, 'carol', PASSWORD);
      await page.getByTestId('resource-row-web-1').waitFor();
      await browser.step(page, 'first-admin-maintenance-form', async () => {
        await page.getByTestId('nav-maintenance').click();
        await page.getByTestId('maint-save').waitFor();
      });
      expect(await page.getByTestId('maint-grant').count()).toBe(0);
    } finally {
      await context.close();
    }
  });
});

/** The pages a layout test visits, each with what shows it has loaded. */
const LAYOUT_PAGES: ReadonlyArray<[name: string, path: string, ready: string]> = [
  ['resources', '/web/', '[data-testid="resource-row-web-1"]'],
  ['resources-databases', '/web/?kind=databases', '[data-testid="resource-row-orders-db"]'],
  ['resources-apps', '/web/?kind=apps', '[data-testid="resource-row-grafana"]'],
  ['agents', '/web/agents', '[data-testid="agent-row-web-1"]'],
  ['maintenance', '/web/maintenance', '[data-testid="maint-save"]'],
  ['tokens', '/web/tokens', '[data-testid="token-form"]'],
  ['audit', '/web/audit', '[data-event]'],
];

describe("at a phone's width (390x844) and at a desktop's", () => {
  it('the navigation collapses behind the menu button on a phone, opens, and closes on the next page', async () => {
    const { context, page } = await browser.newPage({ viewport: PHONE });
    try {
      await signIn(page, 'alice', PASSWORD);
      await page.getByTestId('resource-row-web-1').waitFor();
      expect(await page.getByTestId('nav-toggle').isVisible()).toBe(true);
      expect(await page.getByTestId('nav-resources').isVisible()).toBe(false);
      expect(await page.getByTestId('nav-toggle').getAttribute('aria-expanded')).toBe('false');
      // A row's action stays on the screen (at the right edge of its table's box) while the table scrolls.
      const connect = await page.getByTestId('resource-connect-web-1').boundingBox();
      expect(connect!.x + connect!.width).toBeLessThanOrEqual(PHONE.width);
      await browser.step(page, 'phone-nav-open', async () => {
        await page.getByTestId('nav-toggle').click();
        await page.getByTestId('nav-agents').waitFor({ state: 'visible' });
      });
      expect(await page.getByTestId('nav-toggle').getAttribute('aria-expanded')).toBe('true');
      await page.getByTestId('nav-agents').click();
      await page.getByTestId('agent-row-web-1').waitFor();
      expect(await page.getByTestId('nav-agents').isVisible()).toBe(false);
    } finally {
      await context.close();
    }
  });

  for (const [label, viewport] of [['phone', PHONE], ['desktop', DESKTOP]] as const) {
    it(`${label}: no page is wider than the screen, and each table scrolls in a box of its own`, async () => {
      const { context, page } = await browser.newPage({ viewport });
      try {
        await signIn(page, 'alice', PASSWORD);
        await page.getByTestId('resource-row-web-1').waitFor();
        const overflowing: string[] = [];
        for (const [name, path, ready] of LAYOUT_PAGES) {
          const facts = await browser.step(page, `${label}-${name}`, async () => {
            await page.goto(`${origin}${path}`);
            await page.locator(ready).first().waitFor();
            return layoutFacts(page);
          });
          expect(facts.scrollWidth, `${label} ${name}: the page is wider than the screen`).toBeLessThanOrEqual(facts.innerWidth);
          for (const box of facts.tableBoxes) {
            expect(box.inside, `${label} ${name}: a table box reaches past the screen`).toBe(true);
            expect(box.scrolls, `${label} ${name}: a table box does not scroll`).toBe(true);
            if (box.overflows) overflowing.push(name);
          }
          expect(await page.getByTestId('nav-toggle').isVisible()).toBe(label === 'phone');
          expect(await page.getByTestId('nav-resources').isVisible()).toBe(label === 'desktop');
        }
        // On a phone the tables are wider than the screen, and are scrolled in their box (not the page): the check
        // above is not vacuous. On a desktop they fit, but for the audit log, whose seven columns may scroll in
        // their box when an event carries a long resource or details.
        if (label === 'phone') expect(overflowing).toContain('resources');
        else expect(overflowing.filter((name) => name !== 'audit')).toEqual([]);
        if (label === 'phone') {
          // The narrowest phones (360 px) too, for the pages with forms and wide tables.
          await page.setViewportSize({ width: 360, height: 740 });
          for (const [name, path, ready] of LAYOUT_PAGES.filter(([n]) => ['resources', 'maintenance', 'tokens'].includes(n))) {
            await page.goto(`${origin}${path}`);
            await page.locator(ready).first().waitFor();
            const facts = await layoutFacts(page);
            expect(facts.scrollWidth, `360 px ${name}: the page is wider than the screen`).toBeLessThanOrEqual(facts.innerWidth);
          }
          await browser.shot(page, 'phone-360-tokens');
        }
      } finally {
        await context.close();
      }
    });
  }
});

describe('a lock in the middle of a terminal', () => {
  it("closes bob's open terminal with the lock's message, and refuses his next request", async () => {
    const { context, page } = await browser.newPage();
    await signIn(page, 'bob', PASSWORD);
    await page.getByTestId('resource-connect-web-1').click();
    await page.locator('[data-testid="terminal-status"][data-status="connected"]').waitFor();
    await expect.poll(() => screenText(page), { timeout: 30_000 }).toMatch(/[#$] *$/m);
    await gwctlOk(['lock', '--user', 'bob', '--message', 'incident 42: call security']);
    try {
      await browser.step(page, 'terminal-locked', async () => {
        await page.locator('[data-testid="terminal-status"][data-status="closed"]').waitFor();
        await expect.poll(() => screenText(page)).toContain('incident 42');
      });
      await page.goto(`${origin}/web/`);
      await browser.step(page, 'locked-resources', async () => {
        await page.getByText('GW_ERR_ACCESS_LOCKED').first().waitFor();
      });
    } finally {
      await gwctlOk(['unlock', '--user', 'bob']);
      await context.close();
    }
  });
});

describe('session expiry', () => {
  it('a session that has expired sends the page back to sign-in with the reason, and signing in again works', async () => {
    const { context, page } = await browser.newPage();
    await signIn(page, 'alice', PASSWORD);
    await page.getByTestId('resource-row-web-1').waitFor();
    // The daemon's clock cannot be moved from outside: the session's end is moved into the past in its record
    // (the Backend's SQLite file, written as the Auth Service writes it), which is what the server sees once the
    // lifetime has passed. The page still believes the session runs for hours.
    const id = (await context.cookies(origin)).find((c) => c.name === '__Host-gw_session')!.value;
    const db = new Database(join(cluster.dataDir, 'backend.sqlite'), { timeout: 10_000 });
    try {
      const key = `/web_sessions/${createHash('sha256').update(id).digest('hex')}`;
      const changed = db.prepare(`UPDATE gateway_kv SET value = json_set(value, '$.expiresAt', ?) WHERE key = ?`).run(Date.now() - 1000, key);
      expect(changed.changes).toBe(1);
    } finally {
      db.close();
    }
    await browser.step(page, 'session-expired', async () => {
      await page.getByTestId('resources-refresh').click();
      await page.getByTestId('login-message').waitFor();
    });
    expect(await page.getByTestId('login-message').innerText()).toMatch(/session expired/i);
    const url = new URL(page.url());
    expect(url.pathname).toBe('/web/login');
    expect(url.searchParams.get('redirect')).toBe('/web/');
    await page.getByTestId('login-user').fill('alice');
    await page.getByTestId('login-password').fill(PASSWORD);
    await page.getByTestId('login-submit').click();
    await page.getByTestId('resource-row-web-1').waitFor();
    await context.close();
  });
});

describe("the machine's network changing during the run", () => {
  // As root the browser files run in a network namespace of their own (scripts/netns-run.sh). The stressor adds and
  // deletes a namespace and an addressed link in the machine's namespace in a loop, as other work on a shared machine
  // does; run outside such a namespace (npx vitest run, as root), Chromium aborts these loads with ERR_NETWORK_CHANGED.
  rootTest(['netns'])('pages and API calls load while links and addresses come and go on the machine', async () => {
    const { context, page } = await browser.newPage();
    const stress = startNetworkStress();
    try {
      await signIn(page, 'alice', PASSWORD);
      await page.getByTestId('resource-row-web-1').waitFor();
      // Until the machine's network has changed 15 times more, with at least 5 loads (page and API) meanwhile.
      const changed = stress.waitCycles(15);
      let done = false;
      void changed.then(() => (done = true), () => (done = true));
      let loads = 0;
      while (!done || loads < 5) {
        await page.goto(`${origin}/web/agents`);
        await page.getByTestId('agent-row-web-1').waitFor();
        await page.getByTestId('nav-resources').click();
        await page.getByTestId('resource-row-web-1').waitFor();
        loads++;
      }
      await changed;
      await browser.shot(page, 'network-changed-meanwhile');
      const failed = browser.log(page).failed.filter((f) => !/^401 /.test(f));
      expect(failed, networkIsolated() ? 'in a namespace of its own' : 'not isolated: run it with npm run test:browser').toEqual([]);
    } finally {
      await stress.stop();
      await context.close();
    }
  }, 120_000);
});
