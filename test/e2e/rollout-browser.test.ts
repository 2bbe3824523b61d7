/**
 * The agents page's rollout panel in Debian's Chromium (web/src/pages/rollout.tsx), against a real daemon (Auth and
 * Proxy on one port) and one real agent joined through the Proxy:
 *
 * - from the real route (GET /webapi/autoupdate/status): this build's Proxy has no rollout wired, so it answers
 *   {managed: false} and the page is the channels' view as before, no panel; for a user whose roles may not read
 *   autoupdate_agent_rollout (its session's acl.rollout.read) the page does not ask;
 * - from a stored status (the route's answer replaced in the browser by a RolloutStatus of the contract, since no
 *   Auth Service of this build computes one): a halted group is seen first with its reason, each group's state, its
 *   next start in its own time zone, its canaries and their states, agents by version, stale agents; then a rollback
 *   in progress. After issue 28's parts merge, the lead points this at a real rollout (gwctl create of the rollout
 *   resources) and drops the stored status.
 *
 * With ROLLOUT_SCREENSHOT=<file.png> the stored halted rollout's page is saved there (docs/images/rollout.png was made
 * so: docs/upgrades.md says how).
 */
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RolloutStatus } from '../../src/wire/autoupdate.js';
import { launchBrowser, type TestBrowser } from '../helpers/browser.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';

const PROXY_NAME = 'proxy.gateway.test';
const PASSWORD = 'correct horse battery';
let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let browser: TestBrowser;
let origin: string;

const gwctl = async (args: string[], input?: string) => {
  const r = await runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
  if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.status}\n${r.stderr}`);
  return r.stdout;
};

const hour = 3600_000;
const at = (ms: number) => new Date(Date.now() + ms).toISOString();

/** A rollout of the contract (src/wire/autoupdate.ts) as the Auth Service would answer it mid-way, staging halted. */
const HALTED: RolloutStatus = {
  managed: true,
  mode: 'enabled',
  strategy: 'halt-on-error',
  start_version: '17.0.0',
  target_version: '17.0.1',
  rollout_id: 'r-2026-11-29-a',
  groups: [
    { name: 'dev', state: 'done', reason: 'every agent of the group runs 17.0.1', since: at(-3 * hour), canaries: [{ host_id: 'c1', nodename: 'fleet-01', state: 'healthy' }], versions: { '17.0.1': 4 }, stale: [] },
    {
      name: 'staging',
      state: 'halted',
      reason: 'canary fleet-02 failed its health check after the upgrade: database orders-db did not answer (db_service); the canary was rolled back to 17.0.0',
      since: at(-hour),
      canaries: [{ host_id: 'c2', nodename: 'fleet-02', state: 'rolledback', detail: 'db orders-db: connection refused' }],
      versions: { '17.0.0': 4 },
      stale: [],
    },
    {
      name: 'prod',
      state: 'unstarted',
      reason: 'waits for staging (halted)',
      next_start: at(20 * hour),
      time_zone: 'Europe/Berlin',
      canaries: [{ host_id: 'c3', nodename: 'fleet-03', state: 'pending' }],
      versions: { '17.0.0': 3, '16.4.2': 1 },
      stale: [{ host_id: 's1', nodename: 'fleet-12', last_run: at(-50 * hour) }],
    },
  ],
};
const ROLLING_BACK: RolloutStatus = { ...HALTED, rollback: { since: at(-60_000), now: false } };

async function signIn(page: Page, user: string): Promise<void> {
  await page.goto(`${origin}/web/login`);
  await page.getByTestId('login-user').fill(user);
  await page.getByTestId('login-password').fill(PASSWORD);
  await page.getByTestId('login-submit').click();
  await page.getByTestId('nav-agents').waitFor();
}

/** The route's answer replaced by a stored status in this page only (see the header). */
async function feed(page: Page, status: RolloutStatus): Promise<void> {
  await page.unroute('**/webapi/autoupdate/status');
  await page.route('**/webapi/autoupdate/status', (route) => route.fulfill({ status: 200, contentType: 'application/json', body: JSON.stringify(status) }));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-rollout-'));
  const port = await getPort({ host: '127.0.0.1' });
  cluster = await startGateway(
    ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: rollout.example', '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: 127.0.0.1:${port}`, `  public_addr: [127.0.0.1:${port}, ${PROXY_NAME}:${port}]`, ''].join('\n'),
  );
  origin = `https://${PROXY_NAME}:${port}`;
  await writeFile(join(dir, 'roles.yaml'), 'kind: role\nversion: v7\nmetadata: { name: reads-all }\nspec:\n  allow:\n    rules: [{ resources: ["*"], verbs: [list, read] }]\n');
  await gwctl(['create', join(dir, 'roles.yaml')]);
  await gwctl(['users', 'add', 'alice', '--roles=editor,reads-all'], `${PASSWORD}\n`);
  await gwctl(['users', 'add', 'olga', '--roles=editor'], `${PASSWORD}\n`);
  const pin = /CA pin:\s+(\S+)/.exec(await gwctl(['status']))![1]!;
  const token = (JSON.parse(await gwctl(['tokens', 'add', '--type=node', '--format', 'json'])) as { token: string }).token;
  agent = await startGateway(['gateway:', '  nodename: fleet-01', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  labels: { upgrade-group: dev }', ''].join('\n'), {
    args: ['--token', token, '--ca-pin', pin, '--proxy', `127.0.0.1:${port}`],
  });
  await agent.waitForLog('reverse tunnel ready', 30_000);
  browser = await launchBrowser({ suite: 'rollout-browser', trust: [await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8')] });
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await agent?.stop();
  await cluster?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('the rollout panel of the agents page', () => {
  it('from the real route: no rollout, so the page is the channels view, no panel', async () => {
    const { page } = browser;
    await signIn(page, 'alice');
    const answer = page.waitForResponse((r) => r.url().endsWith('/webapi/autoupdate/status'));
    await browser.step(page, 'no-rollout', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('agent-row-fleet-01').waitFor();
    });
    const res = await answer;
    expect(res.status()).toBe(200);
    expect(await res.json()).toEqual({ managed: false, groups: [] });
    expect(await page.getByTestId('rollout-panel').count()).toBe(0);
    expect(await page.getByTestId('rollout-error').count()).toBe(0);
  });

  it('a halted rollout: the halted group first with its reason, then each group with its state, next start in its zone, canaries, versions, stale agents', async () => {
    const { page } = browser;
    await feed(page, HALTED);
    await browser.step(page, 'halted', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('rollout-panel').waitFor();
      await page.getByTestId('agent-row-fleet-01').waitFor();
    });
    expect(await page.getByTestId('rollout-summary').innerText()).toContain('17.0.0 → 17.0.1, halt-on-error, 3 groups');
    expect(await page.getByTestId('rollout-halted-staging').innerText()).toContain('Group staging halted: canary fleet-02 failed its health check');
    expect(await page.getByTestId('rollout-stale').innerText()).toContain('1 agent has not run its upgrader for too long');
    expect(await page.getByTestId('rollout-state-dev').innerText()).toBe('done');
    expect(await page.getByTestId('rollout-state-staging').innerText()).toBe('halted');
    expect(await page.getByTestId('rollout-group-staging').getAttribute('data-state')).toBe('halted');
    expect(await page.getByTestId('rollout-canary-fleet-02').innerText()).toContain('rolledback');
    expect(await page.getByTestId('rollout-next-prod').innerText()).toMatch(/next start: .* Europe\/Berlin \(in (19|20) h/);
    expect(await page.getByTestId('rollout-versions-prod').innerText()).toMatch(/17\.0\.0 × 3[\s\S]*16\.4\.2 × 1/);
    expect(await page.getByTestId('rollout-stale-prod').innerText()).toContain('fleet-12');
    expect(browser.log(page).errors).toEqual([]);
    if (process.env.ROLLOUT_SCREENSHOT) await page.screenshot({ path: process.env.ROLLOUT_SCREENSHOT, fullPage: true });
  });

  it('a rollback in progress is said before anything else', async () => {
    const { page } = browser;
    await feed(page, ROLLING_BACK);
    await browser.step(page, 'rollback', async () => {
      await page.getByTestId('agents-refresh').click();
      await page.getByTestId('rollout-rollback').waitFor();
    });
    expect(await page.getByTestId('rollout-rollback').innerText()).toContain('the whole fleet goes back to 17.0.0 through the windows and canaries');
    await page.unroute('**/webapi/autoupdate/status');
  });

  it('a user whose roles may not read the rollout (its session says so) sees the agents, and the page does not ask', async () => {
    const { context, page } = await browser.newPage();
    const asked: string[] = [];
    page.on('request', (r) => void (r.url().includes('/webapi/autoupdate/') && asked.push(r.url())));
    await signIn(page, 'olga');
    await browser.step(page, 'not-asked', async () => {
      await page.goto(`${origin}/web/agents`);
      await page.getByTestId('agent-row-fleet-01').waitFor();
    });
    expect(asked).toEqual([]);
    expect(await page.getByTestId('rollout-panel').count()).toBe(0);
    expect(browser.log(page).errors).toEqual([]);
    await context.close();
  });
});
