/**
 * The agents page's rollout panel in Debian's Chromium (web/src/pages/rollout.tsx), against a REAL rollout: a real
 * daemon (Auth and Proxy on one port, auth_service.autoupdate_interval short), four real agents joined through the
 * Proxy in three groups (their `upgrade-group` label), the rollout resources created with gwctl, and the Auth
 * Service's own computation of the status, read by the page through GET /webapi/autoupdate/status:
 *
 *   group    time zone            agents                                  what happens
 *   dev      America/New_York     fleet-01 (already on the target)        started by the operator: done at once
 *   prod-eu  Europe/Berlin        fleet-02 (its upgrader last ran 50 h    unstarted: dev is done, its window opens
 *                                  ago: a stale agent)                    some 12 hours from now in its zone
 *   prod-us  America/Los_Angeles  fleet-03, fleet-04 (each with a         started by the operator: one canary; the
 *                                  database nobody listens on)            canary comes back on the target and its
 *                                                                         own health names the database: halted
 *
 * No upgrader runs (the fleet test does real ones): "the target" is this very build with its version string
 * changed (a copy of dist/cli saying 17.0.1), and the canary's upgrade is what an upgrader does to it: the agent
 * stopped and started again, same data directory, on the other build. Its health, its halt, its reason are the
 * real ones. Then a real rollback (gwctl autoupdate rollback) is said first on the page.
 *
 * Also: a Proxy in its own process (`--roles=proxy`, joined with a proxy token) serves the same panel from the
 * remote Auth Service (RemoteProxyAuth.autoupdateStatus); a user whose roles may not read autoupdate_agent_rollout
 * is not asked about it by the page, and the route refuses her (403, GW_ERR_ACCESS_DENIED) on both Proxies.
 *
 * With ROLLOUT_SCREENSHOT=<file.png> the halted rollout's page is saved there (docs/images/rollout.png is made so:
 * docs/upgrades.md says how).
 */
import { cp, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import getPort from 'get-port';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RolloutStatus } from '../../src/wire/autoupdate.js';
import { launchBrowser, type TestBrowser } from '../helpers/browser.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { eventually } from '../helpers/wait.js';

const PROXY_NAME = 'proxy.gateway.test';
const SPLIT_NAME = 'proxy2.gateway.test';
const PASSWORD = 'correct horse battery';
const START = '17.0.0-dev';
const TARGET = '17.0.1';
let dir: string;
let cluster: RunningGateway;
let split: RunningGateway;
const agents = new Map<string, RunningGateway>();
let browser: TestBrowser;
let origin: string;
let splitOrigin: string;
let join_: string[];
let nextBin: string;
/** A port nobody listens on: the prod-us agents' database. */
let deadDb: number;

const gwctl = async (args: string[], input?: string) => {
  const r = await runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
  if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.status}\n${r.stderr}`);
  return r.stdout;
};
const status = async () => JSON.parse(await gwctl(['autoupdate', 'status', '-f', 'json'])) as RolloutStatus;
const group = (s: RolloutStatus, name: string) => s.groups.find((g) => g.name === name);
/** The first status for which pick answers something (polled: no timing asserted). */
const statusWhen = <T>(what: string, pick: (s: RolloutStatus) => T | undefined): Promise<T> =>
  eventually(what, async () => {
    const v = pick(await status());
    if (v === undefined) throw new Error('not yet');
    return v;
  }, 60_000);

/** The hour in `zone` twelve hours from now: a window that is surely not open during the test. */
const farHour = (zone: string) => (Number(new Intl.DateTimeFormat('en-GB', { timeZone: zone, hour: '2-digit', hourCycle: 'h23' }).format(Date.now())) + 12) % 24;

/** This build with its version string changed: what the target release says in its hello (see the header). */
async function buildSaying(version: string): Promise<string> {
  const cli = fileURLToPath(new URL('../../dist/cli/', import.meta.url));
  const root = join(dir, `build-${version}`);
  await cp(cli, join(root, 'dist', 'cli'), { recursive: true });
  await writeFile(join(root, 'package.json'), '{"type":"module"}\n');
  await symlink(fileURLToPath(new URL('../../node_modules', import.meta.url)), join(root, 'node_modules'));
  let changed = 0;
  for (const name of await readdir(join(root, 'dist', 'cli'))) {
    if (!name.endsWith('.js')) continue;
    const path = join(root, 'dist', 'cli', name);
    const text = await readFile(path, 'utf8');
    if (text.includes(`VERSION = "${START}"`)) {
      await writeFile(path, text.replace(`VERSION = "${START}"`, `VERSION = "${version}"`));
      changed += 1;
    }
  }
  expect(changed, 'the bundle declares VERSION once').toBe(1);
  return join(root, 'dist', 'cli', 'gateway.js');
}

/** An agent of a group; its data directory is the test's, so that it can be restarted on another build. */
async function startAgent(name: string, groupName: string, options: { bin?: string; db?: number; upgraderDir?: string } = {}): Promise<RunningGateway> {
  const dataDir = join(dir, 'agents', name);
  await mkdir(dataDir, { recursive: true });
  const config = ['gateway:', `  nodename: ${name}`, `  data_dir: ${dataDir}`, '  log: { format: json }', 'ssh_service:', '  enabled: yes', `  labels: { upgrade-group: ${groupName} }`];
  if (options.db !== undefined) config.push('db_service:', '  databases:', `    - { name: orders-db, protocol: postgres, uri: "127.0.0.1:${options.db}" }`);
  const agent = await startGateway([...config, ''].join('\n'), {
    args: join_,
    dataDir,
    ...(options.bin ? { bin: options.bin } : {}),
    ...(options.upgraderDir ? { env: { GATEWAY_UPGRADE_DIR: options.upgraderDir } } : {}),
  });
  await agent.waitForLog('reverse tunnel ready', 30_000);
  agents.set(name, agent);
  return agent;
}

async function signIn(page: Page, at: string, user: string): Promise<void> {
  await page.goto(`${at}/web/login`);
  await page.getByTestId('login-user').fill(user);
  await page.getByTestId('login-password').fill(PASSWORD);
  await page.getByTestId('login-submit').click();
  await page.getByTestId('nav-agents').waitFor();
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-rollout-'));
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: rollout.example', '  listen_addr: 127.0.0.1:0', '  autoupdate_interval: 200ms', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: [127.0.0.1:${port}, ${PROXY_NAME}:${port}]`, ''].join('\n'),
  );
  origin = `https://${PROXY_NAME}:${port}`;
  await writeFile(join(dir, 'roles.yaml'), 'kind: role\nversion: v7\nmetadata: { name: reads-all }\nspec:\n  allow:\n    rules: [{ resources: ["*"], verbs: [list, read] }]\n');
  await gwctl(['create', join(dir, 'roles.yaml')]);
  await gwctl(['users', 'add', 'alice', '--roles=editor,reads-all'], `${PASSWORD}\n`);
  await gwctl(['users', 'add', 'olga', '--roles=editor'], `${PASSWORD}\n`);
  const pin = /CA pin:\s+(\S+)/.exec(await gwctl(['status']))![1]!;
  const token = (JSON.parse(await gwctl(['tokens', 'add', '--type=node,db', '--uses=0', '--format', 'json'])) as { token: string }).token;
  join_ = ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${port}`];
  nextBin = await buildSaying(TARGET);

  // fleet-02's upgrader last ran 50 hours ago (the file gateway-upgrade writes): stale for the rollout's 24 h.
  const upgraderDir = join(dir, 'upgrade.d');
  await mkdir(upgraderDir, { recursive: true });
  await writeFile(join(upgraderDir, 'last-run'), `${JSON.stringify({ version: 'v1', at: Math.floor(Date.now() / 1000) - 50 * 3600, result: 'up-to-date', current: START })}\n`);
  deadDb = await getPort({ host: '127.0.0.1' });
  await startAgent('fleet-01', 'dev', { bin: nextBin });
  await startAgent('fleet-02', 'prod-eu', { upgraderDir });
  await startAgent('fleet-03', 'prod-us', { db: deadDb });
  await startAgent('fleet-04', 'prod-us', { db: deadDb });

  // A Proxy in its own process, asking the Auth Service above through its API.
  const splitPort = await getPort({ host: '127.0.0.1' });
  const proxyToken = (JSON.parse(await gwctl(['tokens', 'add', '--type=proxy', '--format', 'json'])) as { token: string }).token;
  split = await startGateway(
    ['gateway:', '  nodename: proxy-2', '  data_dir: DATA_DIR', '  log: { format: json }', `  auth_server: ${cluster.addresses.auth}`, 'auth_service:', '  enabled: no', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${splitPort}`, `  public_addr: [127.0.0.1:${splitPort}, ${SPLIT_NAME}:${splitPort}]`, ''].join('\n'),
    { args: ['--roles=proxy', '--token', proxyToken, '--ca-pin', pin] },
  );
  splitOrigin = `https://${SPLIT_NAME}:${splitPort}`;
  browser = await launchBrowser({ suite: 'rollout-browser', trust: [await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8')] });
}, 180_000);

afterAll(async () => {
  await browser?.close();
  for (const a of agents.values()) await a.stop();
  await split?.stop();
  await cluster?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('the rollout panel of the agents page, on a real rollout', () => {
  it('no rollout resources: the real route answers managed false, and the page is the channels view, no panel', async () => {
    const { page } = browser;
    await signIn(page, origin, 'alice');
    const answer = page.waitForResponse((r) => r.url().endsWith('/webapi/autoupdate/status'));
    await browser.step(page, 'no-rollout', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('agent-row-fleet-01').waitFor();
    });
    const res = await answer;
    expect(res.status()).toBe(200);
    expect(await res.json()).toMatchObject({ managed: false, groups: [] });
    expect(await page.getByTestId('rollout-panel').count()).toBe(0);
    expect(await page.getByTestId('rollout-error').count()).toBe(0);
    expect(await page.locator('.page-header p').innerText()).toContain('No maintenance window');
  });

  it('a canary whose database does not answer on the target halts its group by itself; the page shows it first, with the waiting group and the stale agent', async () => {
    const manifest = [
      'kind: autoupdate_config',
      'spec:',
      '  agents:',
      '    canary_healthy_for: 10s',
      '    canary_deadline: 30m',
      '    schedules:',
      '      regular:',
      `        - { name: dev, time_zone: America/New_York, start_hour: ${farHour('America/New_York')}, canary_count: 1 }`,
      `        - { name: prod-eu, time_zone: Europe/Berlin, start_hour: ${farHour('Europe/Berlin')}, canary_count: 1 }`,
      `        - { name: prod-us, time_zone: America/Los_Angeles, start_hour: ${farHour('America/Los_Angeles')}, canary_count: 1 }`,
      '---',
      'kind: autoupdate_version',
      `spec: { agents: { start_version: ${START}, target_version: ${TARGET} } }`,
      '',
    ].join('\n');
    await gwctl(['create', '-'], manifest);
    await gwctl(['autoupdate', 'start', '--group', 'dev']);
    await statusWhen('dev is done (its one agent already runs the target)', (s) => (group(s, 'dev')?.state === 'done' ? true : undefined));
    await gwctl(['autoupdate', 'start', '--group', 'prod-us']);
    const canary = await statusWhen('prod-us picks its canary', (s) => (group(s, 'prod-us')?.state === 'canary' ? group(s, 'prod-us')!.canaries[0] : undefined));
    // The canary's upgrade, as the upgrader does it: the agent stopped and started again on the target's build.
    await agents.get(canary.nodename)!.stop();
    const upgraded = await startAgent(canary.nodename, 'prod-us', { bin: nextBin, db: deadDb });
    expect(upgraded.hostId).toBe(canary.host_id);
    const halted = await statusWhen('prod-us halts on its canary', (s) => (group(s, 'prod-us')?.state === 'halted' ? s : undefined));
    const reason = group(halted, 'prod-us')!.reason;
    expect(reason).toContain(`canary ${canary.nodename} (${canary.host_id}) failed: it runs ${TARGET} and reports itself unhealthy`);
    expect(reason).toContain('orders-db');
    expect(group(halted, 'prod-eu')).toMatchObject({ state: 'unstarted', time_zone: 'Europe/Berlin' });
    expect(group(halted, 'prod-eu')!.next_start).toBeDefined();

    const { page } = browser;
    await browser.step(page, 'halted', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('rollout-panel').waitFor();
      await page.getByTestId('agent-row-fleet-04').waitFor();
    });
    expect(await page.getByTestId('rollout-summary').innerText()).toContain(`${START} → ${TARGET}, halt-on-error, 3 groups`);
    // The seed's weekly window no longer decides, and the subtitle says so (instead of "No maintenance window").
    expect(await page.locator('.page-header p').innerText()).toContain('Upgrades follow the managed rollout below');
    const alert = await page.getByTestId('rollout-halted-prod-us').innerText();
    expect(alert).toContain(`Group prod-us halted: canary ${canary.nodename}`);
    expect(alert).toContain('orders-db');
    expect(await page.getByTestId('rollout-stale').innerText()).toContain('1 agent has not run its upgrader for too long');
    expect(await page.getByTestId('rollout-state-dev').innerText()).toBe('done');
    expect(await page.getByTestId('rollout-state-prod-eu').innerText()).toBe('not started');
    expect(await page.getByTestId('rollout-state-prod-us').innerText()).toBe('halted');
    expect(await page.getByTestId('rollout-group-prod-us').getAttribute('data-state')).toBe('halted');
    expect(await page.getByTestId(`rollout-canary-${canary.nodename}`).innerText()).toContain('failed');
    expect(await page.getByTestId('rollout-next-prod-eu').innerText()).toMatch(/next start: .* Europe\/Berlin \(in 1[0-3] h/);
    expect(await page.getByTestId('rollout-versions-dev').innerText()).toContain(`${TARGET} × 1`);
    expect(await page.getByTestId('rollout-versions-prod-us').innerText()).toMatch(new RegExp(`${START.replaceAll('.', '\\.')} × 1[\\s\\S]*${TARGET.replaceAll('.', '\\.')} × 1|${TARGET.replaceAll('.', '\\.')} × 1[\\s\\S]*${START.replaceAll('.', '\\.')} × 1`));
    expect(await page.getByTestId('rollout-stale-prod-eu').innerText()).toContain('fleet-02');
    expect(browser.log(page).errors).toEqual([]);
    if (process.env.ROLLOUT_SCREENSHOT) await page.screenshot({ path: process.env.ROLLOUT_SCREENSHOT, fullPage: true });
  });

  it('a Proxy in its own process shows the same rollout, asked of the Auth Service through its API', async () => {
    const { context, page } = await browser.newPage();
    await signIn(page, splitOrigin, 'alice');
    const answer = page.waitForResponse((r) => r.url().endsWith('/webapi/autoupdate/status'));
    await browser.step(page, 'split-proxy', async () => {
      await page.goto(`${splitOrigin}/web/agents`);
      await page.getByTestId('agent-row-fleet-01').waitFor();
    });
    const res = await answer;
    expect(res.status()).toBe(200);
    // A Proxy that could not ask its remote Auth Service would answer managed: false (no panel).
    expect(await res.json()).toMatchObject({ managed: true, target_version: TARGET });
    await page.getByTestId('rollout-panel').waitFor();
    expect(await page.getByTestId('rollout-state-prod-us').innerText()).toBe('halted');
    expect(await page.getByTestId('rollout-halted-prod-us').innerText()).toContain('orders-db');
    expect(await page.getByTestId('rollout-next-prod-eu').innerText()).toContain('Europe/Berlin');
    expect(browser.log(page).errors).toEqual([]);
    await context.close();
  });

  it('a real rollback in progress is said before anything else', async () => {
    await gwctl(['autoupdate', 'rollback']);
    const { page } = browser;
    await browser.step(page, 'rollback', async () => {
      await page.getByTestId('agents-refresh').click();
      await page.getByTestId('rollout-rollback').waitFor();
    });
    expect(await page.getByTestId('rollout-rollback').innerText()).toContain(`the whole fleet goes back to ${START} through the windows and canaries`);
  });

  it('a user whose roles may not read the rollout: the page does not ask, and the route refuses her on both Proxies (403, its code)', async () => {
    for (const at of [origin, splitOrigin]) {
      const { context, page } = await browser.newPage();
      const asked: string[] = [];
      page.on('request', (r) => void (r.url().includes('/webapi/autoupdate/') && asked.push(r.url())));
      await signIn(page, at, 'olga');
      await browser.step(page, 'not-asked', async () => {
        await page.goto(`${at}/web/agents`);
        await page.getByTestId('agent-row-fleet-01').waitFor();
      });
      expect(asked).toEqual([]);
      expect(await page.getByTestId('rollout-panel').count()).toBe(0);
      expect(browser.log(page).errors).toEqual([]);
      // Asked anyway, from the page as the app asks (its origin, its cookie, its bearer): refused with its code.
      const refused = await page.evaluate(async () => {
        const r = await fetch('/webapi/autoupdate/status', { headers: { authorization: `Bearer ${sessionStorage.getItem('gw_bearer') ?? ''}` } });
        return { status: r.status, body: (await r.json()) as { error?: { code?: string } } };
      });
      expect(refused.status, at).toBe(403);
      expect(refused.body.error?.code).toBe('GW_ERR_ACCESS_DENIED');
      await context.close();
    }
  });
});
