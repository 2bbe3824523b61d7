/**
 * The fleet (issue 28, "Real components, started by the tests"; test/helpers/fleet.ts): 12 agents of the project's
 * own release N in three groups, each its own process in a network namespace of its own, each reaching the Proxy
 * only through squid, half installed by apt from a signed repository, half from the release tarball. Today, in the
 * seed's channel mode (docs/upgrades.md):
 *
 * - every agent joins through squid, and a connection that bypasses squid fails;
 * - N+1-broken (the real N+1 whose database check fails from the start, the agent itself running) installed on one
 *   agent: its upgrader's health check (the agent's /readyz) fails, and N is put back and running;
 * - the channel moves to N+1 (the Proxy's configuration, reloaded with SIGHUP): inside the maintenance window every
 *   agent's own `gateway-upgrade run`, run as its timer would, installs N+1 (apt through squid from the repository,
 *   the tarball through squid from the release server), restarts its agent, and the agent is back on its tunnel;
 * - the channel is pinned back to N: every agent is downgraded the same way.
 *
 * After issue 28's parts are merged, the managed rollout goes on top of this fleet (the lead adds it; nothing here
 * is skipped or left as a stub):
 *   1. `gwctl create` of autoupdate_config (groups dev, staging, prod from FLEET_GROUPS with days, start hours, time
 *      zones and one canary each, strategy halt-on-error) and autoupdate_version (start N, target N+1);
 *   2. a loop that runs `fleet.upgrade(agent)` on every agent until `gwctl autoupdate status -f json` says every
 *      group is done (the timer's role: the upgrader follows the Proxy's instruction, AGENT's part);
 *   3. N+1-broken (`brokenTarball`, as in the test below; for the apt agents the same patch repacked with
 *      dpkg-deb into the group's repository) served as N+1 for one group: its canary halts the group, is rolled
 *      back, and the status names the canary and the failed check;
 *   4. `gwctl autoupdate rollback` and the same loop bring every agent back to N;
 *   5. an SSH session and a psql session opened through the Proxy to one agent before its upgrade end normally
 *      after it (DRAIN's part keeps them in the old process).
 * Each of these is one `it` using `fleet` and the helpers here, with the cluster's config gaining the rollout.
 */
import { readFile, writeFile } from 'node:fs/promises';
import https from 'node:https';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { brokenTarball, inBatches, PROXY_NAME, serveTarball, startFleet, type Fleet, type FleetAgent } from '../helpers/fleet.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { buildPackages, type BuiltPackages } from '../helpers/packages.js';
import { rootSuite } from '../helpers/root.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

const N = '17.0.0-dev';
const N1 = '17.0.1';
const FLEET_GROUPS = ['dev', 'staging', 'prod'];
const SIZE = 12;
/** Upgrades at once: each is a package manager or an install script plus a restart, on 2 shared cores. */
const PARALLEL = 6;

let pki: TestPki;
let cluster: RunningGateway;
let configYaml: (version: string) => string;
let fleet: Fleet;
let built: { n: BuiltPackages; n1: BuiltPackages };
let proxyPort: number;
let clusterCa: string;
const PASSWORD = 'correct horse battery';
const timings: Record<string, number> = {};

const gwctl = async (args: string[], input?: string) => {
  const r = await runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: cluster.dir }, ...(input === undefined ? {} : { input }) });
  if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.status}\n${r.stderr}`);
  return r.stdout;
};

/** Moves the channel `default` to `version`: the Proxy's configuration rewritten and reloaded, as an operator does. */
async function pinChannel(version: string): Promise<void> {
  const before = cluster.logs().split('configuration reloaded').length;
  await writeFile(cluster.configPath, configYaml(version));
  cluster.process.kill('SIGHUP');
  const deadline = Date.now() + 30_000;
  while (cluster.logs().split('configuration reloaded').length === before) {
    if (Date.now() > deadline) throw new Error(`the Proxy did not reload:\n${cluster.logs().slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

let windowHour = -1;

/**
 * A maintenance window open now and for the next round of upgrades (every day from this UTC hour; a window is the
 * hour): in its last 3 minutes, waits for the next hour, whose window is then made; the agents export it (at start,
 * and after every change of the resource) and every one's schedule covers now before this returns.
 */
async function openWindow(): Promise<void> {
  const now = new Date();
  if (now.getUTCMinutes() >= 57) await new Promise((r) => setTimeout(r, (60 - now.getUTCMinutes()) * 60_000 - now.getUTCSeconds() * 1000 + 1000));
  const hour = new Date().getUTCHours();
  if (hour === windowHour) return;
  const file = join(cluster.dir, 'window.yaml');
  await writeFile(file, `kind: cluster_maintenance_config\nversion: v1\nspec:\n  agent_upgrades:\n    utc_start_hour: ${hour}\n    weekdays: ["*"]\n`);
  await gwctl(['create', '--force', file]);
  windowHour = hour;
  for (const a of fleet?.agents ?? []) {
    await waitFor(`${a.name}'s exported schedule covers now`, async () => {
      const t = Date.now() / 1000;
      const text = await readFile(join(a.root, 'etc/gateway-upgrade.d/schedule'), 'utf8');
      return text.split('\n').some((l) => /^\d+ \d+$/.test(l) && Number(l.split(' ')[0]) <= t && t < Number(l.split(' ')[1]));
    });
  }
}

const timed = async <T>(step: string, fn: () => Promise<T>): Promise<T> => {
  const t = Date.now();
  try {
    return await fn();
  } finally {
    timings[step] = (Date.now() - t) / 1000;
  }
};

/** Every agent's upgrader, PARALLEL at a time; the results by agent. */
const upgradeAll = () => inBatches(fleet.agents, PARALLEL, async (a) => ({ a, r: await fleet.upgrade(a) }));

const restartsBefore = new Map<FleetAgent, number>();
async function countRestarts(): Promise<void> {
  for (const a of fleet.agents) restartsBefore.set(a, await a.restarts());
}

async function waitFor(what: string, ok: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await ok().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`${what}: not after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** One HTTPS request to the Proxy's web port (by its name, as the agents reach it), the answer as JSON. */
function web(method: string, path: string, headers: Record<string, string>, body?: unknown): Promise<{ status: number; json: any; cookie?: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request({ host: '127.0.0.1', port: proxyPort, servername: PROXY_NAME, method, path, ca: clusterCa, agent: false, headers: { host: `${PROXY_NAME}:${proxyPort}`, 'content-type': 'application/json', ...headers } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, json: text ? JSON.parse(text) : {}, cookie: res.headers['set-cookie']?.[0]?.split(';')[0] }));
    });
    req.on('error', reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

/** The versions the Proxy sees each fleet agent run (its tunnel hello), as the Web UI's agents page reads them. */
async function versionsSeenByProxy(): Promise<Record<string, string | null>> {
  const login = await web('POST', '/webapi/sessions', {}, { user: 'fleet-admin', password: PASSWORD });
  expect(login.status, JSON.stringify(login.json)).toBe(200);
  const agents = await web('GET', '/webapi/agents', { cookie: login.cookie!, authorization: `Bearer ${login.json.token as string}` });
  expect(agents.status, JSON.stringify(agents.json)).toBe(200);
  const rows = (agents.json.agents as Array<{ nodename: string; version: string | null; online: boolean }>).filter((r) => r.online);
  return Object.fromEntries(rows.map((r) => [r.nodename, r.version]));
}

/** Every agent's installed release says `version`, and the Proxy sees every agent connected and running it. */
async function expectAllAt(version: string): Promise<void> {
  for (const a of fleet.agents) expect(await fleet.version(a), a.name).toContain(version);
  const want = Object.fromEntries(fleet.agents.map((a) => [a.name, version]));
  let seen = '';
  await waitFor(`the Proxy sees every agent on ${version}`, async () => (seen = JSON.stringify(await versionsSeenByProxy())) === JSON.stringify(want)).catch((err: Error) => {
    throw new Error(`${err.message}: it sees ${seen}`);
  });
}

rootSuite(['netns'])(`a fleet of ${SIZE} agents in three groups, upgraded by their own gateway-upgrade through squid`, () => {
  beforeAll(async () => {
    built = await timed('packages', async () => ({ n: await buildPackages({ version: N }), n1: await buildPackages({ version: N1 }) }));
    pki = await makeTestPki();
    const port = await getPort({ host: '127.0.0.1' });
    proxyPort = port;
    configYaml = (version) =>
      [
        'gateway:',
        '  nodename: proxy-1',
        '  data_dir: DATA_DIR',
        '  log: { format: json, severity: info }',
        'auth_service:',
        '  cluster_name: fleet.example',
        '  listen_addr: 127.0.0.1:0',
        'proxy_service:',
        `  web_listen_addr: 127.0.0.1:${port}`,
        // Agents dial the name (it exists only in squid's hosts file); the certificate holds it.
        `  public_addr: [${PROXY_NAME}:${port}]`,
        '  automatic_upgrades_channels:',
        `    default: { static_version: v${version} }`,
        '',
      ].join('\n');
    cluster = await startGateway(configYaml(N));
    // startGateway wrote DATA_DIR replaced; later rewrites must keep the same directory.
    const dataDir = cluster.dataDir;
    const yaml = configYaml;
    configYaml = (version) => yaml(version).replaceAll('DATA_DIR', dataDir);
    await openWindow();
    clusterCa = await readFile(join(dataDir, 'admin', 'host-ca.pem'), 'utf8');
    await gwctl(['users', 'add', 'fleet-admin', '--roles=editor'], `${PASSWORD}\n`);
    const pin = /CA pin:\s+(\S+)/.exec(await gwctl(['status']))![1]!;
    const token = (JSON.parse(await gwctl(['tokens', 'add', '--type=node,db', '--uses=0', '--format', 'json'])) as { token: string }).token;
    fleet = await timed('fleet', () => startFleet({ size: SIZE, groups: FLEET_GROUPS, n: built.n, n1: built.n1, proxyPort: port, join: ['--token', token, '--ca-pin', pin], channel: 'default', pki }));
  }, 900_000);

  afterAll(async () => {
    await fleet?.stop();
    await cluster?.stop();
    await pki?.cleanup();
    // The budget (docs/upgrades.md, "How this is tested"): what each step took on this run.
    process.stderr.write(`fleet timings (s): ${JSON.stringify({ ...timings, ...(fleet ? { setup: fleet.seconds } : {}) })}\n`);
  }, 120_000);

  it(`${SIZE} agents of release ${N}, apt and tarball, in three groups, each joined through squid only`, async () => {
    expect(fleet.agents).toHaveLength(SIZE);
    for (const g of FLEET_GROUPS) expect(fleet.agents.filter((a) => a.group === g)).toHaveLength(SIZE / FLEET_GROUPS.length);
    expect(fleet.agents.filter((a) => a.kind === 'apt')).toHaveLength(SIZE / 2);
    await expectAllAt(N);
    // Squid logs a CONNECT when its tunnel closes: the agents' tunnels show there once their restarts closed them.
    for (const a of fleet.agents) expect(await fleet.bypassFails(a), `${a.name} cannot reach the Proxy without squid`).toBe(true);
    // Each is ready: its tunnel and its database answer (what the health command asks).
    for (const a of fleet.agents) await waitFor(`${a.name} ready`, async () => JSON.parse(await fleet.readiness(a)).status === 'ready');
  });

  it(`${N1}-broken (its database check fails from the start, the agent runs): the upgrader's health check fails and ${N} is put back, running`, async () => {
    const a = fleet.agents.find((x) => x.kind === 'tarball')!;
    serveTarball(fleet.releases, N1, await timed('broken build', () => brokenTarball(built.n1.tarballs.default.tarball)));
    await openWindow();
    await pinChannel(N1);
    const r = await timed('broken', () => fleet.upgrade(a, ['run'], { GATEWAY_UPGRADE_HEALTH_TIMEOUT: '20s' }));
    serveTarball(fleet.releases, N1, await readFile(built.n1.tarballs.default.tarball));
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(1);
    expect(r.stderr).toContain(`the upgrade ${N} -> ${N1} failed: the service did not come back with ${N1}`);
    expect(r.stderr).toContain(`the previous version ${N} was put back and is running`);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
    // N+1-broken ran (it was restarted into, then out of) and said why it was not ready: the health command's
    // output is /readyz's answer, naming the database check.
    expect(r.stderr).toMatch(/"not ready".*db orders-db/);
    expect(await a.restarts()).toBe(2);
    expect(await fleet.version(a)).toContain(N);
    await everyAgentBack([a]);
    await waitFor(`${a.name} ready again on ${N}`, async () => JSON.parse(await fleet.readiness(a)).status === 'ready');
  }, 300_000);

  it(`the channel moves to ${N1}: inside the window every agent upgrades itself, apt and tarball through squid`, async () => {
    await openWindow();
    await pinChannel(N1);
    await countRestarts();
    const asked = fleet.releaseRequests.length;
    const results = await timed('upgrade', upgradeAll);
    for (const { a, r } of results) {
      expect(r.code, `${a.name} (${a.kind}): ${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout, a.name).toContain(`upgraded gateway ${N} -> ${N1}; the service is running ${N1}`);
    }
    await expectAllAt(N1);
    for (const a of fleet.agents) expect(await a.restarts(), a.name).toBe(restartsBefore.get(a)! + 1);
    await everyAgentBack(fleet.agents);
    const log = await fleet.squid.readAccessLog();
    for (const a of fleet.agents) expect(log.some((l) => l.includes(` ${a.host.ip} CONNECT ${PROXY_NAME}:`)), `${a.name}'s tunnel and upgrader went through squid`).toBe(true);
    const apt = fleet.agents.filter((a) => a.kind === 'apt');
    const tarball = fleet.agents.filter((a) => a.kind === 'tarball');
    for (const a of apt) expect(log.some((l) => l.includes(` ${a.host.ip} GET http://apt.fleet.test:`) && l.includes(`gateway_${N1}_`)), `${a.name}'s package came through squid`).toBe(true);
    for (const a of tarball) expect(log.some((l) => l.includes(` ${a.host.ip} CONNECT cdn.fleet.test:`)), `${a.name}'s tarball came through squid`).toBe(true);
    expect(fleet.releaseRequests.slice(asked).filter((p) => p === `/gateway-ent-v${N1}-linux-amd64-bin.tar.gz`)).toHaveLength(tarball.length);
  }, 600_000);

  it(`the channel is pinned back to ${N}: every agent is downgraded the same way`, async () => {
    await openWindow();
    await pinChannel(N);
    await countRestarts();
    const results = await timed('downgrade', upgradeAll);
    for (const { a, r } of results) {
      expect(r.code, `${a.name} (${a.kind}): ${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout, a.name).toContain(`upgraded gateway ${N1} -> ${N}; the service is running ${N}`);
    }
    await expectAllAt(N);
    for (const a of fleet.agents) expect(await a.restarts(), a.name).toBe(restartsBefore.get(a)! + 1);
    await everyAgentBack(fleet.agents);
  }, 600_000);
});

/** Each agent restarted by its upgrader is on its tunnel again: a "reverse tunnel ready" after its last stop. */
async function everyAgentBack(agents: FleetAgent[]): Promise<void> {
  for (const a of agents) {
    const log = await a.log();
    expect(log.split('"msg":"stopping"').length - 1, `${a.name} was stopped by its restart command, and only by it`).toBe(await a.restarts());
    await fleet.waitForLog(a, 'reverse tunnel ready', { from: log.lastIndexOf('"msg":"stopping"') });
  }
}

