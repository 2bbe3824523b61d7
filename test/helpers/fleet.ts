/**
 * A fleet of real agents for the rollout tests (issue 28, "Real components, started by the tests"): each agent is
 * the project's own release (test/helpers/packages.ts: the .deb and the release tarball `npm run package` builds,
 * cached by the inputs' hash), installed into a root of its own, run as its own process in a network namespace of
 * its own, and upgraded by the `gateway-upgrade` that release carries, as its systemd timer would run it.
 *
 *   test process (the machine's namespace)                         namespace fleet-NN (one per agent)
 *   ┌──────────────────────────────────────────────┐   veth /30    ┌──────────────────────────────────────────┐
 *   │ gateway (auth + proxy)   127.0.0.1:<web>     │◄── squid ◄────┤ supervisor (sh) → gateway start          │
 *   │ apt repository (http)    127.0.0.1:<apt>     │  (0.0.0.0,    │   HTTPS_PROXY=http://<veth .1>:<squid>   │
 *   │ release server (https)   127.0.0.3:<cdn>     │   hosts file: │ gateway-upgrade run (same proxy; apt via │
 *   │ squid                    0.0.0.0:<squid>     │   *.fleet.test│   Acquire::http::Proxy)                  │
 *   └──────────────────────────────────────────────┘   →127.0.0.x) │ /readyz on 127.0.0.1:3000 (health)       │
 *                                                                  └──────────────────────────────────────────┘
 *
 * Nothing in a namespace has a route to the test's loopback: the Proxy, the repository and the release server
 * listen on 127.0.0.x, which inside a namespace is its own loopback, and their names (*.fleet.test) exist only in
 * squid's hosts file. An agent or an upgrader that bypassed squid would fail (`bypassFails` shows it).
 *
 * One namespace per agent (a veth pair and nothing else: measured cheap, the agents' Node.js processes are the cost)
 * and one squid for all, which every namespace reaches at its own end of its link.
 *
 * Each agent: its root (GATEWAY_UPGRADE_ROOT: the endpoint, the schedule the agent exports, the lock, the last run,
 * its data directory under var/lib/gateway, its pid file under run/, apt's state for the apt agents), a supervisor
 * that runs it as the unit does (Restart=always and PIDFile=: it follows a hand-over's successor, see
 * supervisorScript), the unit's restart command (SIGUSR2: the hand-over to the binary as installed now), the health
 * command asking the agent's /readyz inside its namespace. Its rollout group is
 * the `upgrade-group` label of its SSH Service (the agent's config key gateway.upgrade_group is the other way).
 *
 * Two kinds, alternating: `apt` (gateway and gateway-ent-updater installed by apt-get from a signed repository the
 * helper builds, served over HTTP through squid) and `tarball` (release N extracted and installed by its own
 * `install` script, as the install guide says; the upgrader downloads others through squid from the release server).
 *
 * Each agent also serves a database (db_service, `orders-db`: a TCP listener in its namespace), which its readiness
 * checks (/readyz: src/roles/health.ts). `brokenTarball` (and `brokenDeb`) make N+1-broken from the real N+1: the same release with
 * one file patched so that the database check fails from the start while the agent itself runs, its tunnel up and
 * its version N+1: what a canary must catch, and what the upgrader's health check rolls back.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createReadStream } from 'node:fs';
import { appendFile, chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join, normalize, sep } from 'node:path';
import { promisify } from 'node:util';
import type { BuiltPackages } from './packages.js';
import { createTestHost, type TestHost } from './netns.js';
import { startHttpServer, type HttpTestServer } from './servers.js';
import { startSquid, type Squid } from './squid.js';
import type { TestPki } from './tls.js';
import { makeAptLab, startReleaseServer, writeScript, type AptLab } from '../upgrade/helpers.js';
import { sha256 } from '../upgrade/tarball-fixtures.js';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const PROXY_NAME = 'proxy.fleet.test';
export const APT_NAME = 'apt.fleet.test';
export const CDN_NAME = 'cdn.fleet.test';
const CDN_IP = '127.0.0.3';
/** The agent's diagnostics port inside its namespace (each namespace has its own loopback). */
const DIAG_PORT = 3000;
/** The database each agent serves, a listener inside its namespace (its readiness connects to it). */
const DB_PORT = 5432;
const UPDATER = 'gateway-ent-updater';

export type AgentKind = 'apt' | 'tarball';

export interface FleetAgent {
  name: string;
  group: string;
  kind: AgentKind;
  host: TestHost;
  /** GATEWAY_UPGRADE_ROOT: everything of this agent lives under it. */
  root: string;
  /** The supervisor's files: agent.yaml, agent.log, restarts.log. */
  dir: string;
  /** The agent's pid file (`gateway start --pid-file`; the upgrader's default GATEWAY_UPGRADE_PID_FILE under its root). */
  pidFile: string;
  /** The installed `gateway` and `gateway-upgrade`. */
  gateway: string;
  upgrader: string;
  /** gateway-upgrade's environment (as /etc/default/gateway and the unit give it). */
  upgradeEnv: Record<string, string>;
  /** The agent's output so far. */
  log(): Promise<string>;
  /** How many times the restart command restarted it. */
  restarts(): Promise<number>;
  /** Its host ID (the rollout knows it by this), from its data directory's identity. */
  hostId(): Promise<string>;
  /** The pid its pid file names now. */
  mainPid(): Promise<number>;
}

export interface FleetOptions {
  /** At least 12 for issue 28's test; the kinds alternate apt, tarball. */
  size: number;
  /** Agent i is in groups[i % groups.length]. */
  groups: string[];
  n: BuiltPackages;
  n1: BuiltPackages;
  /** The Proxy's web port on 127.0.0.1 (its public_addr must hold PROXY_NAME:<port>). */
  proxyPort: number;
  /** The arguments that join an agent: --token, --ca-pin (the Proxy is added). */
  join: string[];
  /** The upgrade channel agents follow (the endpoint file's). */
  channel: string;
  /** Signs the release server's certificate; upgraders trust it (GATEWAY_UPGRADE_CA_FILE). */
  pki: TestPki;
  /** How many agents are installed or started at once (2 cores: 4 keeps the machine responsive). */
  parallel?: number;
  /** More PostgreSQL databases an agent serves, by agent name (their servers are the test's, in its namespace). */
  postgres?: Record<string, Array<{ name: string; uri: string }>>;
}

export interface Fleet {
  agents: FleetAgent[];
  squid: Squid;
  /** The release server's files by path (the tarballs of N and N+1 are there; a test may add others). */
  releases: Map<string, Buffer | string>;
  /** Paths the release server was asked, in order. */
  releaseRequests: string[];
  /** Seconds each setup step took (for the budget: docs/upgrades.md, "How this is tested"). */
  seconds: Record<string, number>;
  /** Runs the agent's `gateway-upgrade <args>` inside its namespace, as its timer would. */
  upgrade(agent: FleetAgent, args?: string[], env?: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }>;
  /** The agent's /readyz body (JSON: status and checks), asked inside its namespace. */
  readiness(agent: FleetAgent): Promise<string>;
  /** What the installed `gateway --version` says. */
  version(agent: FleetAgent): Promise<string>;
  /** Resolves once the agent's log has `text` (after `from` characters). */
  waitForLog(agent: FleetAgent, text: string, options?: { from?: number; timeoutMs?: number }): Promise<void>;
  /**
   * Serves N+1-broken as N+1 to `agent`: for a tarball agent the release server's N+1 tarball (every tarball agent
   * would get it: only the agents a rollout tells to update ask), for an apt agent its repository's gateway package
   * of N+1, indexed and signed again with its key. `mendN1` serves the genuine N+1 again everywhere.
   */
  breakN1(agent: FleetAgent): Promise<void>;
  mendN1(): Promise<void>;
  /** Whether a connection from inside the agent's namespace to the Proxy without squid fails (it must). */
  bypassFails(agent: FleetAgent): Promise<boolean>;
  stop(): Promise<void>;
}

/** Runs fn over items, at most `limit` at once, in order of start. */
export async function inBatches<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** Serves several apt repositories under /<name>/ over plain HTTP (as apt mirrors are), nothing outside them. */
async function startAptServer(repos: Map<string, string>): Promise<HttpTestServer> {
  return startHttpServer((req, res) => {
    const path = decodeURIComponent((req.url ?? '/').split('?')[0]!);
    const [, name, ...rest] = path.split('/');
    const repo = repos.get(name ?? '');
    const file = repo ? normalize(join(repo, ...rest)) : '';
    if (!repo || !file.startsWith(repo + sep) || req.method !== 'GET') {
      res.writeHead(404).end();
      return;
    }
    stat(file).then(
      (s) => {
        if (!s.isFile()) return void res.writeHead(404).end();
        res.writeHead(200, { 'content-length': s.size, 'content-type': 'application/octet-stream' });
        createReadStream(file).pipe(res);
      },
      () => void res.writeHead(404).end(),
    );
  });
}

/**
 * The agent's unit, as systemd runs it (Restart=always, PIDFile=): the agent writes its pid file; when the process
 * the supervisor started exits, the supervisor reads the pid file, and while it names another live process (the
 * successor a hand-over started, which took the pid file over) follows that one instead of starting a second agent,
 * as systemd does for PIDFile= when the main process exits (docs/upgrades.md, "Restarts that keep sessions"). Only
 * when the agent really ended (the pid file removed, or naming no live process) does it start the agent again.
 * The started process is waited for first: a zombie child answers kill -0.
 */
function supervisorScript(dir: string, pidFile: string, gateway: string, join_: string[]): string {
  const quoted = join_.map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(' ');
  return [
    `while [ ! -e ${dir}/stopped ]; do`,
    `  ${gateway} start -c ${dir}/agent.yaml --pid-file ${pidFile} --diag-addr 127.0.0.1:${DIAG_PORT} ${quoted} >> ${dir}/agent.log 2>&1 &`,
    '  wait $!',
    `  while main=$(cat ${pidFile} 2>/dev/null) && [ -n "$main" ] && kill -0 "$main" 2>/dev/null; do`,
    '    while kill -0 "$main" 2>/dev/null; do sleep 0.2; done',
    '  done',
    '  sleep 0.2',
    'done',
  ].join('\n');
}

/**
 * The restart command, as the unit's: SIGUSR2 to the main process (`systemctl kill --signal=SIGUSR2
 * --kill-whom=main gateway`), a hand-over to the binary as installed now. It returns at once: the upgrader's health
 * wait is what wants a new live pid in the pid file, the health command passing and the target version.
 */
function restartScript(dir: string, pidFile: string): string {
  return [`kill -USR2 "$(cat ${pidFile})"`, `echo restarted >> ${dir}/restarts.log`].join('\n');
}

interface Shared {
  o: FleetOptions;
  base: string;
  squid: Squid;
  aptPort: number;
  aptRepos: Map<string, string>;
  cdnPort: number;
  labs: AptLab[];
  /** Each apt agent's lab, by agent name. */
  labOf: Map<string, AptLab>;
  supervisors: ChildProcess[];
}

/** The root, the installed release N and the files gateway-upgrade reads, for one agent. */
async function installAgent(s: Shared, i: number, host: TestHost): Promise<FleetAgent> {
  const name = `fleet-${String(i + 1).padStart(2, '0')}`;
  const group = s.o.groups[i % s.o.groups.length]!;
  const kind: AgentKind = i % 2 === 0 ? 'apt' : 'tarball';
  const squidUrl = `http://${host.localIp}:${s.squid.port}`;
  let root: string;
  let gateway: string;
  let upgrader: string;
  let managerEnv: Record<string, string>;
  if (kind === 'apt') {
    const lab = await makeAptLab([
      { version: s.o.n.version, files: [s.o.n.debs.gateway, s.o.n.debs[UPDATER]] },
      { version: s.o.n1.version, files: [s.o.n1.debs.gateway, s.o.n1.debs[UPDATER]] },
    ]);
    s.labs.push(lab);
    s.labOf.set(name, lab);
    await lab.install(s.o.n.version, ['gateway', UPDATER]);
    s.aptRepos.set(name, lab.repo);
    const keyring = join(lab.root, 'usr/share/keyrings/gateway-archive-keyring.asc');
    // The install guide's line, over http through squid (the lab's own line is a file: one).
    await writeFile(join(lab.root, 'etc/apt/sources.list.d/gateway.list'), `deb [signed-by=${keyring}] http://${APT_NAME}:${s.aptPort}/${name} ${lab.codename} stable/v17\n`);
    // dpkg without an fsync per file: the roots are thrown away, and on 2 shared cores the syncs were the cost.
    await appendFile(join(lab.root, 'etc/apt/apt.conf'), `Acquire::http::Proxy "${squidUrl}";\nDPkg::Options:: "--force-unsafe-io";\n`);
    root = lab.root;
    gateway = join(root, 'usr/bin/gateway');
    upgrader = join(root, 'usr/bin/gateway-upgrade');
    managerEnv = { ...lab.env, GATEWAY_UPGRADE_PACKAGE_MANAGER: 'apt' };
  } else {
    root = join(s.base, name, 'root');
    const bin = join(root, 'usr/local/bin');
    const work = join(s.base, name, 'extract');
    await mkdir(work, { recursive: true });
    await run('tar', ['-xzf', s.o.n.tarballs.default.tarball, '-C', work]);
    await run(join(work, 'gateway/install'), [], { env: { PATH: process.env.PATH ?? '', GATEWAY_BIN_DIR: bin } });
    await rm(work, { recursive: true, force: true });
    gateway = join(bin, 'gateway');
    upgrader = join(bin, 'gateway-upgrade');
    managerEnv = { GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball', GATEWAY_UPGRADE_ARCH: 'x64', GATEWAY_UPGRADE_DOWNLOAD_URL: `https://${CDN_NAME}:${s.cdnPort}`, GATEWAY_UPGRADE_BIN_DIR: bin };
  }
  const dir = join(s.base, name, 'run');
  await mkdir(dir, { recursive: true });
  await host.startEcho(DB_PORT);
  await mkdir(join(root, 'etc/gateway-upgrade.d'), { recursive: true });
  await writeFile(join(root, 'etc/gateway-upgrade.d/endpoint'), `${PROXY_NAME}:${s.o.proxyPort}/v1/webapi/automaticupgrades/channel/${s.o.channel}\n`);
  await writeFile(
    join(dir, 'agent.yaml'),
    ['gateway:', `  nodename: ${name}`, `  data_dir: ${join(root, 'var/lib/gateway')}`, '  log: { format: json, severity: info }', 'ssh_service:', '  enabled: yes', '  listen_addr: 127.0.0.1:3022', `  labels: { upgrade-group: ${group}, fleet: "yes" }`, 'db_service:', '  databases:', `    - { name: orders-db, protocol: postgres, uri: "${host.ip}:${DB_PORT}" }`, ...(s.o.postgres?.[name] ?? []).map((d) => `    - { name: ${d.name}, protocol: postgres, uri: "${d.uri}" }`), ''].join('\n'),
  );
  const pidFile = join(root, 'run/gateway.pid');
  await mkdir(join(root, 'run'), { recursive: true });
  const restart = await writeScript(join(dir, 'restart.sh'), restartScript(dir, pidFile));
  // On failure it prints what /readyz said (the check that failed), which the upgrader shows.
  const health = await writeScript(join(dir, 'health.sh'), `curl -sf --max-time 2 http://127.0.0.1:${DIAG_PORT}/readyz >/dev/null || { curl -s --max-time 2 http://127.0.0.1:${DIAG_PORT}/readyz >&2; exit 1; }`);
  await writeScript(join(dir, 'supervisor.sh'), supervisorScript(dir, pidFile, gateway, [...s.o.join, '--proxy', `${PROXY_NAME}:${s.o.proxyPort}`]));
  const upgradeEnv: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    ...managerEnv,
    GATEWAY_UPGRADE_ROOT: root,
    GATEWAY_UPGRADE_CA_FILE: s.o.pki.caCertPath,
    GATEWAY_UPGRADE_VERSION_COMMAND: `${gateway} --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: health,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '90s',
    GATEWAY_UPGRADE_HEALTH_POLL: '500ms',
    HTTPS_PROXY: squidUrl,
    DEBIAN_FRONTEND: 'noninteractive',
  };
  return {
    name,
    group,
    kind,
    host,
    root,
    dir,
    pidFile,
    gateway,
    upgrader,
    upgradeEnv,
    log: () => readFile(join(dir, 'agent.log'), 'utf8').catch(() => ''),
    restarts: async () => (await readFile(join(dir, 'restarts.log'), 'utf8').catch(() => '')).split('\n').filter(Boolean).length,
    hostId: async () => (JSON.parse(await readFile(join(root, 'var/lib/gateway/host/identity.json'), 'utf8')) as { hostId: string }).hostId,
    mainPid: async () => Number((await readFile(pidFile, 'utf8')).trim()),
  };
}

/** The line N+1-broken breaks: the agent's reach of its resources (src/agent/resources.ts, in dist/ and its bundle). */
const BROKEN_AT = 'const found = addressOf(service, name);';

/**
 * N+1-broken: the release tarball `tarball` with its database reach made to fail, so that the agent starts, holds
 * its tunnel and reports its version, and its readiness says `db orders-db` failed. The line is patched wherever the
 * release holds it (dist/agent/resources.js and the bundle chunk `gateway start` loads). Returns the new tarball.
 */
export async function brokenTarball(tarball: string): Promise<Buffer> {
  const work = await mkdtemp(join(tmpdir(), 'gw-fleet-broken-'));
  try {
    await run('tar', ['-xzf', tarball, '-C', work]);
    await breakTree(join(work, 'gateway/lib/dist'), tarball);
    await run('tar', ['-I', 'gzip -1', '-cf', join(work, 'broken.tar.gz'), '-C', work, 'gateway']);
    return await readFile(join(work, 'broken.tar.gz'));
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/** Patches BROKEN_AT in every .js file under dir that has it (at least one must). */
async function breakTree(dir: string, what: string): Promise<void> {
  let patched = 0;
  for (const name of (await readdir(dir, { recursive: true })).filter((f) => f.endsWith('.js'))) {
    const text = await readFile(join(dir, name), 'utf8');
    if (!text.includes(BROKEN_AT)) continue;
    await writeFile(join(dir, name), text.replace(BROKEN_AT, `if (service === 'db') throw new Error('N+1-broken: the database service was made to fail at start'); ${BROKEN_AT}`));
    patched++;
  }
  if (patched === 0) throw new Error(`no file of ${what} has "${BROKEN_AT}": update brokenTarball with the release's code`);
}

/**
 * N+1-broken as a .deb: the real `gateway` package of N+1 unpacked (dpkg-deb -R keeps its control files and
 * scripts), patched as brokenTarball patches the tarball, and built again under the same name and version. Returns
 * the new file (in a directory the caller removes).
 */
export async function brokenDeb(deb: string, work: string): Promise<string> {
  const tree = join(work, 'tree');
  await run('dpkg-deb', ['-R', deb, tree]);
  await breakTree(tree, deb);
  const out = join(work, basename(deb));
  await run('dpkg-deb', ['-Zgzip', '-z1', '--root-owner-group', '-b', tree, out]);
  return out;
}

/** Serves `body` as the release tarball of `version` (and its .sha256) on the release server. */
export function serveTarball(releases: Map<string, Buffer | string>, version: string, body: Buffer): void {
  const name = `gateway-ent-v${version}-linux-amd64-bin.tar.gz`;
  releases.set(`/${name}`, body);
  releases.set(`/${name}.sha256`, `${sha256(body)}  ${name}\n`);
}

/** Starts the agent's supervisor inside its namespace (the agent gets only PATH, HTTPS_PROXY and its root). */
function startSupervisor(s: Shared, a: FleetAgent): void {
  const child = spawn('ip', ['netns', 'exec', a.host.ns, 'sh', join(a.dir, 'supervisor.sh')], {
    env: { PATH: process.env.PATH ?? '', HTTPS_PROXY: a.upgradeEnv.HTTPS_PROXY!, GATEWAY_UPGRADE_ROOT: a.root },
    stdio: 'ignore',
  });
  s.supervisors.push(child);
}

async function waitForLog(a: FleetAgent, text: string, options: { from?: number; timeoutMs?: number } = {}): Promise<void> {
  const deadline = Date.now() + (options.timeoutMs ?? 60_000);
  for (;;) {
    const log = await a.log();
    if (log.indexOf(text, options.from ?? 0) >= 0) return;
    if (Date.now() > deadline) throw new Error(`${a.name}: no "${text}" in its log after ${options.timeoutMs ?? 60_000} ms:\n${log.slice(-3000)}`);
    await sleep(250);
  }
}

/** Runs a command inside a namespace with exactly env; never throws for an exit status. */
function inNamespace(ns: string, command: string, args: string[], env: Record<string, string>, timeoutMs: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('ip', ['netns', 'exec', ns, command, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The squid every namespace reaches (at its own end of its link) and the servers behind it. */
async function startServices(o: FleetOptions, base: string, releases: Map<string, Buffer | string>, releaseRequests: string[]) {
  await writeFile(join(base, 'hosts'), `127.0.0.1 ${PROXY_NAME} ${APT_NAME}\n${CDN_IP} ${CDN_NAME}\n`, { mode: 0o644 });
  const squid = await startSquid({ host: '0.0.0.0', clients: ['198.18.0.0/15'], extraConfig: [`hosts_file ${join(base, 'hosts')}`] });
  const aptRepos = new Map<string, string>();
  const apt = await startAptServer(aptRepos);
  for (const p of [o.n, o.n1]) serveTarball(releases, p.version, await readFile(p.tarballs.default.tarball));
  const cdn = await startReleaseServer(o.pki, CDN_NAME, CDN_IP, { files: releases, requests: releaseRequests });
  return { squid, apt, aptRepos, cdn };
}

export async function startFleet(o: FleetOptions): Promise<Fleet> {
  const seconds: Record<string, number> = {};
  const timed = async <T>(step: string, fn: () => Promise<T>): Promise<T> => {
    const t = Date.now();
    try {
      return await fn();
    } finally {
      seconds[step] = (Date.now() - t) / 1000;
    }
  };
  const base = await mkdtemp(join(tmpdir(), 'gw-fleet-'));
  await chmod(base, 0o755);
  const releases = new Map<string, Buffer | string>();
  const releaseRequests: string[] = [];
  const services = await timed('services', () => startServices(o, base, releases, releaseRequests));
  const s: Shared = { o, base, squid: services.squid, aptPort: services.apt.port, aptRepos: services.aptRepos, cdnPort: services.cdn.port, labs: [], labOf: new Map(), supervisors: [] };
  const hosts: TestHost[] = [];
  const agents: FleetAgent[] = [];
  const stop = async () => {
    for (const a of agents) await writeFile(join(a.dir, 'stopped'), '').catch(() => undefined);
    await Promise.all(
      agents.map(async (a) => {
        const pid = await a.mainPid().catch(() => NaN);
        if (Number.isInteger(pid)) {
          try {
            process.kill(pid, 'SIGTERM');
          } catch {
            // already gone
          }
        }
      }),
    );
    await Promise.all(s.supervisors.map((c) => (c.exitCode !== null || c.signalCode !== null ? undefined : new Promise((r) => c.once('exit', r)))));
    await Promise.all(hosts.map((h) => h.close()));
    await services.cdn.close();
    await services.apt.close();
    await services.squid.stop();
    for (const lab of s.labs) await lab.cleanup();
    await rm(base, { recursive: true, force: true });
  };
  try {
    await timed('namespaces', async () => {
      for (let i = 0; i < o.size; i++) hosts.push(await createTestHost());
    });
    agents.push(...(await timed('install', () => inBatches(hosts, o.parallel ?? 4, (h, i) => installAgent(s, i, h)))));
    await timed('start', async () => {
      for (const a of agents) startSupervisor(s, a);
      await inBatches(agents, agents.length, (a) => waitForLog(a, 'reverse tunnel ready', { timeoutMs: 120_000 }));
    });
  } catch (err) {
    await stop().catch(() => undefined);
    throw err;
  }
  const n1Channel = `stable/v${o.n1.version.split('.')[0]}`;
  const brokenLabs = new Set<AptLab>();
  return {
    agents,
    squid: services.squid,
    releases,
    releaseRequests,
    seconds,
    upgrade: (a, args = ['run'], env = {}) => inNamespace(a.host.ns, a.upgrader, args, { ...a.upgradeEnv, ...env }, 300_000),
    readiness: async (a) => (await inNamespace(a.host.ns, 'curl', ['-s', '--max-time', '3', `http://127.0.0.1:${DIAG_PORT}/readyz`], { PATH: process.env.PATH ?? '' }, 10_000)).stdout,
    version: async (a) => (await run(a.gateway, ['--version'])).stdout.trim(),
    waitForLog,
    async breakN1(a) {
      const lab = s.labOf.get(a.name);
      if (!lab) return serveTarball(releases, o.n1.version, await brokenTarball(o.n1.tarballs.default.tarball));
      const work = await mkdtemp(join(tmpdir(), 'gw-fleet-broken-deb-'));
      try {
        await lab.replacePackage(n1Channel, await brokenDeb(o.n1.debs.gateway, work));
        brokenLabs.add(lab);
      } finally {
        await rm(work, { recursive: true, force: true });
      }
    },
    async mendN1() {
      serveTarball(releases, o.n1.version, await readFile(o.n1.tarballs.default.tarball));
      // Indexed and signed again, not restored: apt ignores a Release older than the one it already has.
      for (const lab of brokenLabs) await lab.replacePackage(n1Channel, o.n1.debs.gateway);
      brokenLabs.clear();
    },
    async bypassFails(a) {
      // The Proxy's port at the host's end of the link, and at the namespace's own loopback: neither answers.
      const direct = await Promise.all(
        [a.host.localIp, '127.0.0.1'].map((ip) => inNamespace(a.host.ns, 'curl', ['-sk', '--noproxy', '*', '--max-time', '3', `https://${ip}:${o.proxyPort}/webapi/ping`], { PATH: process.env.PATH ?? '' }, 10_000)),
      );
      return direct.every((r) => r.code !== 0);
    },
    stop,
  };
}
