/**
 * The fleet (issue 28, "Real components, started by the tests"; test/helpers/fleet.ts): 12 agents of the project's
 * own release N in three groups, each its own process in a network namespace of its own, each reaching the Proxy
 * only through squid, half installed by apt from a signed repository, half from the release tarball, under a
 * MANAGED rollout (docs/upgrades.md, "Managed rollouts"; the seed's channel mode is covered by the apt, dnf, zypper
 * and packaged tests):
 *
 * - every agent joins through squid, and a connection that bypasses squid fails;
 * - `gwctl create` of autoupdate_config (groups dev, staging, prod, each opening at the current hour in its own time
 *   zone, one canary each, halt-on-error) and autoupdate_version (start N, target N+1);
 * - N+1-broken (the real N+1 whose database check fails, the agent itself running) is served to dev's canary (a
 *   tarball or a repacked .deb in its signed repository, whichever kind the planner chose): its upgrader installs
 *   it, the agent's health names the failed check, the rollout halts by itself (status, audit), the canary is told
 *   the start version and its upgrader has put N back;
 * - the genuine N+1 is served, `gwctl autoupdate start --group dev`, and every agent's `gateway-upgrade run` (the
 *   timer's role) until every group is done, in order: all 12 on N+1 as the Proxy sees them; a psql session and an
 *   SSH session opened through the Proxy before their agent's upgrade go on after it (the restart is the hand-over, SIGUSR2, and the
 *   supervisor follows the pid file as systemd's PIDFile= does);
 * - `gwctl autoupdate rollback --now` and the same loop: all 12 back on N.
 */
import type { ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import https from 'node:https';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentInstruction, RolloutStatus } from '../../src/wire/autoupdate.js';
import { inBatches, PROXY_NAME, startFleet, type Fleet, type FleetAgent } from '../helpers/fleet.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { openInteractive } from '../helpers/interactive.js';
import { BIN, runCli, runProgram, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { buildPackages, type BuiltPackages } from '../helpers/packages.js';
import { rootSuite } from '../helpers/root.js';
import { sessionLogin } from '../helpers/sessionlogin.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { waitUntil } from '../helpers/wait.js';

/** The OS account sessions log in as (see test/helpers/sessionlogin.ts: not root's own dotfiles). */
const LOGIN = sessionLogin();

const N = '17.0.0-dev';
const N1 = '17.0.1';
const FLEET_GROUPS = ['dev', 'staging', 'prod'];
const SIZE = 12;
/** Upgrades at once: each is a package manager or an install script plus a restart, on 2 shared cores. */
const PARALLEL = 6;

let pki: TestPki;
let cluster: RunningGateway;
let fleet: Fleet;
let built: { n: BuiltPackages; n1: BuiltPackages };
let proxyPort: number;
let clusterCa: string;
const PASSWORD = 'correct horse battery';
const timings: Record<string, number> = {};
/** The agent whose PostgreSQL a psql session reaches through the Proxy across its upgrade (prod: it upgrades last). */
const PSQL_AGENT = 'fleet-09';
/** That PostgreSQL's port, inside the agent's namespace (the echo listener orders-db has 5432). */
const PG_PORT = 5433;
let pg: PostgresServer;
let psqlPort: number;
const children: ChildProcess[] = [];
const gwshEnv = () => ({ HOME: cluster.dir, GWSH_HOME: join(cluster.dir, 'gwsh-alice') });
const conn = () => `host=127.0.0.1 port=${psqlPort} user=${pg.user} dbname=${pg.user} sslmode=disable connect_timeout=10`;
const psql = (sql: string) => runProgram('psql', [conn(), '-X', '-At', '-c', sql], { env: { HOME: cluster.dir, PGPASSWORD: pg.password } });

/** An interactive program (test/helpers/interactive.ts), stopped with the fleet's other children. */
const openSession = (what: string, command: string, args: string[], env: Record<string, string>) => openInteractive(what, command, args, env, children);

/** A psql session through `gwsh proxy db`. */
const openPsql = () => openSession('psql', 'psql', [conn(), '-X', '-At'], { HOME: cluster.dir, PGPASSWORD: pg.password });
/** An SSH session through the Proxy (`gwsh ssh`, the agent's own SSH Service) running a shell that reads its stdin. */
const openSsh = (node: string) =>
  openSession('gwsh ssh', process.execPath, [BIN('gwsh'), 'ssh', `${LOGIN}@${node}`, 'sh', '-c', "'echo ssh-before; read line; echo ssh-after-$line'"], gwshEnv());

const gwctl = async (args: string[], input?: string) => {
  const r = await runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: cluster.dir }, ...(input === undefined ? {} : { input }) });
  if (r.status !== 0) throw new Error(`gwctl ${args.join(' ')}: ${r.status}\n${r.stderr}`);
  return r.stdout;
};

const timed = async <T>(step: string, fn: () => Promise<T>): Promise<T> => {
  const t = Date.now();
  try {
    return await fn();
  } finally {
    timings[step] = (Date.now() - t) / 1000;
  }
};

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


/** The groups' time zones: each group's window opens at the current hour in its own zone (staging's is half an hour off UTC). */
const ZONES: Record<string, string> = { dev: 'UTC', staging: 'Asia/Kolkata', prod: 'America/New_York' };
const hourIn = (timeZone: string) => Number(new Intl.DateTimeFormat('en-US', { hour: 'numeric', hourCycle: 'h23', timeZone }).format(new Date()));

/**
 * The rollout's resources. Each window opens at the current hour in its zone and lasts 3 h, so that it is open for
 * the whole file whenever in the hour it runs; canary_healthy_for is its minimum.
 */
const rolloutManifest = () =>
  [
    'kind: autoupdate_config',
    'spec:',
    '  agents:',
    '    strategy: halt-on-error',
    '    maintenance_window_duration: 3h',
    '    canary_healthy_for: 10s',
    '    schedules:',
    '      regular:',
    ...FLEET_GROUPS.map((g) => `        - { name: ${g}, days: ["*"], start_hour: ${hourIn(ZONES[g]!)}, time_zone: ${ZONES[g]}, wait_hours: 0, canary_count: 1 }`),
    '---',
    'kind: autoupdate_version',
    `spec: { agents: { start_version: ${N}, target_version: ${N1} } }`,
    '',
  ].join('\n');

async function rolloutStatus(): Promise<RolloutStatus> {
  return JSON.parse(await gwctl(['autoupdate', 'status', '-f', 'json'])) as RolloutStatus;
}

/** What the Proxy tells this agent's upgrader (its public route, as `gateway-upgrade` asks it). */
async function instruction(a: FleetAgent): Promise<AgentInstruction> {
  const r = await web('GET', `/v1/webapi/autoupdate/agent?host_id=${await a.hostId()}`, {});
  expect(r.status, JSON.stringify(r.json)).toBe(200);
  return r.json as AgentInstruction;
}

/** Polls the rollout's status until `pick` returns something. */
async function statusUntil<T>(what: string, pick: (s: RolloutStatus) => T | undefined, timeoutMs = 60_000): Promise<T> {
  let last: RolloutStatus | undefined;
  let found: T | undefined;
  await waitFor(what, async () => (found = pick((last = await rolloutStatus()))) !== undefined, timeoutMs).catch((err: Error) => {
    throw new Error(`${err.message}; the status: ${JSON.stringify(last)}`);
  });
  return found!;
}

/** The version each agent runs, as its upgrader last left it (every agent starts on N). */
const runs = new Map<FleetAgent, string>();

/**
 * The timer's role, until `done` says the rollout is where it should be: each pass asks the Proxy every agent's
 * instruction and runs `gateway-upgrade run` (PARALLEL at a time) on the agents told to install a version they do
 * not run (a run on the others only prints the instruction's reason and exits 0: skipped to spare the 2 cores).
 * Every run must succeed; a halted group ends the loop with its reason.
 */
async function rolloutLoop(what: string, done: (s: RolloutStatus) => boolean, timeoutMs = 420_000): Promise<RolloutStatus> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const s = await rolloutStatus();
    if (done(s)) return s;
    const halted = s.groups.find((g) => g.state === 'halted');
    if (halted) throw new Error(`${what}: group ${halted.name} halted: ${halted.reason}`);
    if (Date.now() > deadline) throw new Error(`${what}: not after ${timeoutMs} ms; the status: ${JSON.stringify(s)}`);
    const told = await inBatches(fleet.agents, PARALLEL, async (a) => ({ a, i: await instruction(a) }));
    const todo = told.filter(({ a, i }) => i.update && i.version !== undefined && i.version !== runs.get(a));
    if (todo.length === 0) {
      await new Promise((r) => setTimeout(r, 1000));
      continue;
    }
    await inBatches(todo, PARALLEL, async ({ a, i }) => {
      const r = await fleet.upgrade(a);
      expect(r.code, `${a.name} (${a.kind}) told ${JSON.stringify(i)}: ${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout, a.name).toContain(`upgraded gateway ${runs.get(a)} -> ${i.version}; the service is running ${i.version}`);
      runs.set(a, i.version!);
    });
  }
}

/** Every group's connected agents all run `version` (as the Auth Service counts them). */
const allOn = (version: string) => (s: RolloutStatus) => s.groups.length === FLEET_GROUPS.length && s.groups.every((g) => JSON.stringify(g.versions) === JSON.stringify({ [version]: SIZE / FLEET_GROUPS.length }));

rootSuite(['netns', 'dbUsers'])(`a fleet of ${SIZE} agents in three groups, upgraded by a managed rollout through squid`, () => {
  beforeAll(async () => {
    built = await timed('packages', async () => ({ n: await buildPackages({ version: N }), n1: await buildPackages({ version: N1 }) }));
    pki = await makeTestPki();
    const port = await getPort({ host: '127.0.0.1' });
    proxyPort = port;
    cluster = await startGateway(
      [
        'gateway:',
        '  nodename: proxy-1',
        '  data_dir: DATA_DIR',
        '  log: { format: json, severity: info }',
        'auth_service:',
        '  cluster_name: fleet.example',
        '  listen_addr: 127.0.0.1:0',
        // The rollout steps every second (and after every change of the resources or the presence).
        '  autoupdate_interval: 1s',
        'proxy_service:',
        `  web_listen_addr: 127.0.0.1:${port}`,
        // Agents dial the name (it exists only in squid's hosts file); the certificate holds it.
        // The second name is the test's own (gwsh, from the machine's namespace, has no squid hosts file).
        `  public_addr: [${PROXY_NAME}:${port}, 127.0.0.1:${port}]`,
        // The endpoint files name this channel; with the rollout's resources, the rollout decides, not the channel.
        '  automatic_upgrades_channels:',
        `    default: { static_version: v${N} }`,
        '',
      ].join('\n'),
    );
    clusterCa = await readFile(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8');
    await gwctl(['users', 'add', 'fleet-admin', '--roles=editor'], `${PASSWORD}\n`);
    const pin = /CA pin:\s+(\S+)/.exec(await gwctl(['status']))![1]!;
    const token = (JSON.parse(await gwctl(['tokens', 'add', '--type=node,db', '--uses=0', '--format', 'json'])) as { token: string }).token;
    const postgres = { [PSQL_AGENT]: [{ name: 'orders-pg', uri: `127.0.0.1:${PG_PORT}` }] };
    fleet = await timed('fleet', () => startFleet({ size: SIZE, groups: FLEET_GROUPS, n: built.n, n1: built.n1, proxyPort: port, join: ['--token', token, '--ca-pin', pin], channel: 'default', pki, postgres }));
    for (const a of fleet.agents) runs.set(a, N);
    pg = await startPostgres({ port: PG_PORT, netns: fleet.agents.find((a) => a.name === PSQL_AGENT)!.host.ns });
    // root: every namespace shares the machine's accounts, and the agent runs as root.
    await gwctl(['users', 'add', 'alice', '--roles=access', `--logins=${LOGIN}`, `--db-users=${pg.user}`, `--db-names=${pg.user}`], `${PASSWORD}\n`);
    const login = await runCli('gwsh', ['login', `--proxy=127.0.0.1:${port}`, '--user=alice', `--ca-pin=${pin}`], { env: gwshEnv(), input: `${PASSWORD}\n` });
    expect(login.status, login.stderr).toBe(0);
  }, 900_000);

  afterAll(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await fleet?.stop();
    await pg?.stop();
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
    for (const a of fleet.agents) expect(await fleet.bypassFails(a), `${a.name} cannot reach the Proxy without squid`).toBe(true);
    // Each is ready: its tunnel and its database answer (what the health command asks).
    for (const a of fleet.agents) await waitFor(`${a.name} ready`, async () => JSON.parse(await fleet.readiness(a)).status === 'ready');
  });

  it(`the rollout ${N} -> ${N1} is created; ${N1}-broken on dev's canary halts the rollout by itself, and the canary is back on ${N}`, async () => {
    await gwctl(['create', '-'], rolloutManifest());
    const dev = await statusUntil('dev starts with its canary (its window is open)', (s) => (s.groups[0]?.state === 'canary' && s.groups[0].canaries.length === 1 ? s.groups[0] : undefined));
    expect(dev.name).toBe('dev');
    const s0 = await rolloutStatus();
    expect(s0.groups.map((g) => [g.name, g.time_zone, g.state])).toEqual([['dev', 'UTC', 'canary'], ['staging', 'Asia/Kolkata', 'unstarted'], ['prod', 'America/New_York', 'unstarted']]);
    const canary = fleet.agents.find((a) => a.name === dev.canaries[0]!.nodename)!;
    expect(canary.group).toBe('dev');
    process.stderr.write(`dev's canary: ${canary.name} (${canary.kind})\n`);
    await waitFor(`${canary.name} is told it is dev's canary`, async () => {
      const i = await instruction(canary);
      return i.update && i.canary === true && i.version === N1;
    });
    // Every other agent is told to stay.
    for (const a of fleet.agents.filter((x) => x !== canary)) expect(await instruction(a), a.name).toMatchObject({ managed: true, update: false });

    await timed('broken build', () => fleet.breakN1(canary));
    const r = await timed('broken', () => fleet.upgrade(canary, ['run'], { GATEWAY_UPGRADE_HEALTH_TIMEOUT: '30s' }));
    await fleet.mendN1();
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(1);
    expect(r.stderr).toContain(`the upgrade ${N} -> ${N1} failed`);
    expect(r.stderr).toContain(`the previous version ${N} was put back and is running`);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
    expect(await fleet.version(canary)).toContain(N);

    // The rollout halted by itself on the canary's own health (measured by the agent, carried over its tunnel).
    const halted = await statusUntil('dev halts', (s) => (s.groups[0]?.state === 'halted' ? s : undefined));
    const hostId = await canary.hostId();
    expect(halted.groups[0]!.reason).toContain(hostId);
    expect(halted.groups[0]!.reason).toContain('orders-db');
    expect(halted.groups.slice(1).map((g) => g.state)).toEqual(['unstarted', 'unstarted']);
    expect(await gwctl(['autoupdate', 'status'])).toContain('Group dev: HALTED');
    const events = JSON.parse(await gwctl(['get', 'events', '-f', 'json'])) as Array<{ spec: { event: string; reason?: string } }>;
    expect(events.find((e) => e.spec.event === 'autoupdate.halted')?.spec.reason).toContain('orders-db');
    // The canary is told the start version; its upgrader had already put N back, so a run has nothing to do.
    await waitFor(`${canary.name} is told ${N}`, async () => (await instruction(canary)).version === N);
    const again = await fleet.upgrade(canary);
    expect(again.code, `${again.stdout}\n${again.stderr}`).toBe(0);
    expect(await fleet.version(canary)).toContain(N);
    await waitFor(`${canary.name} ready again on ${N}`, async () => JSON.parse(await fleet.readiness(canary)).status === 'ready');
    await everyAgentBack([canary]);
  }, 300_000);

  it(`the genuine ${N1}: dev started again, then each group in its window, every agent upgrading itself through squid`, async () => {
    await countRestarts();
    const asked = fleet.releaseRequests.length;
    // A psql session through the Proxy to one agent, opened before its upgrade.
    const pgAgent = fleet.agents.find((a) => a.name === PSQL_AGENT)!;
    psqlPort = (await startGwshProxy(['db', 'orders-pg'], gwshEnv(), children, { timeoutMs: 30_000 })).port;
    const session = openPsql();
    session.send('select 1000 + 1;');
    await session.waitFor('1001');
    const ssh = openSsh(PSQL_AGENT);
    await ssh.waitFor('ssh-before');
    const oldPid = await pgAgent.mainPid();

    await gwctl(['autoupdate', 'start', '--group', 'dev']);
    const s = await timed('rollout', () => rolloutLoop(`every group done on ${N1}`, (x) => x.groups.every((g) => g.state === 'done') && allOn(N1)(x)));

    // The session goes on in the old process (draining), typed into after the upgrade; a new one reaches the successor.
    const newPid = await pgAgent.mainPid();
    expect(newPid).not.toBe(oldPid);
    session.send('select 2000 + 2;');
    await session.waitFor('2002');
    const fresh = await psql('select 43');
    expect(fresh.stdout.trim(), fresh.stderr).toBe('43');
    const opened = (await pgAgent.log()).split('\n').filter((l) => l.includes('database session opened')).map((l) => (JSON.parse(l) as { pid: number }).pid);
    expect(opened).toEqual([oldPid, newPid]);
    session.send('\\q');
    expect(await session.exited).toBe(0);
    ssh.send('typed-after-the-upgrade');
    await ssh.waitFor('ssh-after-typed-after-the-upgrade');
    expect(await ssh.exited).toBe(0);
    // In order: dev before staging before prod (each group became done after the one before it).
    const since = s.groups.map((g) => Date.parse(g.since!));
    expect(since[0]).toBeLessThanOrEqual(since[1]!);
    expect(since[1]).toBeLessThanOrEqual(since[2]!);
    const started = (JSON.parse(await gwctl(['get', 'events', '-f', 'json'])) as Array<{ spec: { event: string; reason?: string } }>)
      .filter((e) => e.spec.event === 'autoupdate.group_started')
      .map((e) => /group (\S+)/.exec(e.spec.reason ?? '')?.[1]);
    expect(started.filter((g) => g !== 'dev').length, JSON.stringify(started)).toBe(2);
    expect(started.indexOf('staging')).toBeLessThan(started.indexOf('prod'));
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

  it(`gwctl autoupdate rollback --now: every agent goes back to ${N}`, async () => {
    await countRestarts();
    const r = JSON.parse(await gwctl(['autoupdate', 'rollback', '--now', '-f', 'json'])) as RolloutStatus;
    expect(r.rollback).toMatchObject({ now: true });
    await timed('rollback', () => rolloutLoop(`every agent back on ${N}`, allOn(N)));
    await expectAllAt(N);
    for (const a of fleet.agents) expect(await a.restarts(), a.name).toBe(restartsBefore.get(a)! + 1);
    await everyAgentBack(fleet.agents);
  }, 600_000);
});

/**
 * Each restart was a hand-over and nothing else: one successor asked per restart, each old process drained and
 * stopped, and the supervisor, following the pid file, never started a second agent beside the successor (which
 * would have found the pid file or the data directory held).
 */
async function everyAgentBack(agents: FleetAgent[]): Promise<void> {
  for (const a of agents) {
    const restarts = await a.restarts();
    const count = (log: string, text: string) => log.split(text).length - 1;
    await waitFor(`${a.name}'s ${restarts} previous processes drained and stopped`, async () => count(await a.log(), '"msg":"stopping"') === restarts);
    const log = await a.log();
    expect(count(log, 'hand-over: starting the successor'), `${a.name}: one hand-over per restart`).toBe(restarts);
    expect(count(log, '"msg":"gateway started"'), `${a.name}: the first agent and one successor per restart`).toBe(restarts + 1);
    expect(log, a.name).not.toContain('GW_ERR_PID_FILE_BUSY');
    expect(log, a.name).not.toContain('GW_ERR_DATA_DIR_IN_USE');
  }
}
