/**
 * `gateway start --pid-file` and SIGHUP, with the real binaries (docs/systemd.md).
 *
 * A Proxy (auth + proxy) and an agent (app_service) each run with a pid file; the agent joins with a token and
 * keeps its reverse tunnel; alice reaches an echo app through `gwsh proxy app` and keeps that one TCP session
 * open, and a keep-alive HTTPS connection to the version server stays open too. Then: SIGHUP with a changed
 * channel version (the version server answers the new one), a changed log severity (debug lines appear),
 * broken files (the daemon keeps running, logs the error and its code, serves the old values), a change that
 * needs a restart (logged as such), SIGHUP to the agent. Throughout, the tunnel must stay up: no "agent
 * disconnected" / "reverse tunnel closed" lines, one "reverse tunnel ready", the node's connected_since
 * unchanged, and the same TCP session and HTTPS connection still carry data afterwards.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultConfig, parseConfig } from '../../src/config/index.js';
import { acquirePidFile, changedKeys, planReload, trustedSourcesChanged, withLiveKeys } from '../../src/reload.js';
import { BIN, runCli, startGateway, startGatewayExpectingFailure, type RunningGateway } from '../helpers/gateway.js';

const PASSWORD = 'correct horse battery';

// --- pure parts -------------------------------------------------------------------------------------------------

describe('what a reload changes', () => {
  const base = (extra = '') => parseConfig(`gateway:\n  data_dir: /tmp/x\n  log: { severity: info }\nauth_service:\n  keep_alive_count_max: 3\nproxy_service:\n  automatic_upgrades_channels:\n    stable/v17: { static_version: v17.0.1 }\n${extra}`, 'test.yaml');

  it('severity and channels are live; everything else needs a restart', () => {
    const running = base();
    const next = parseConfig(
      'gateway:\n  data_dir: /tmp/x\n  log: { severity: debug }\nauth_service:\n  keep_alive_count_max: 5\nproxy_service:\n  automatic_upgrades_channels:\n    stable/v17: { static_version: v17.0.2 }\n    edge: { forward_url: "https://versions.example.com/edge" }\n',
      'test.yaml',
    );
    expect(planReload(running, next)).toEqual({
      live: ['gateway.log.severity', 'proxy_service.automatic_upgrades_channels.edge', 'proxy_service.automatic_upgrades_channels.stable/v17.static_version'],
      restart: ['auth_service.keep_alive_count_max'],
    });
    expect(planReload(running, base())).toEqual({ live: [], restart: [] });
  });

  it("the PROXY header's trusted sources are live (a compromised balancer is taken out without a restart)", () => {
    const running = base('  proxy_protocol: on\n  proxy_protocol_trusted_sources: [10.0.0.10, 10.0.0.11]\n');
    const next = base('  proxy_protocol: on\n  proxy_protocol_trusted_sources: [10.0.0.10]\n');
    const plan = planReload(running, next);
    expect(plan).toEqual({ live: ['proxy_service.proxy_protocol_trusted_sources'], restart: [] });
    expect(trustedSourcesChanged(plan)).toBe(true);
    expect(withLiveKeys(running, next).proxy_service.proxy_protocol_trusted_sources).toEqual(['10.0.0.10']);
    // proxy_protocol itself needs a restart: the listeners count sources at accept when it is off.
    expect(planReload(running, base('  proxy_protocol: off\n  proxy_protocol_trusted_sources: [10.0.0.10, 10.0.0.11]\n')).restart).toEqual(['proxy_service.proxy_protocol']);
  });

  it('lists are compared whole and named by their key', () => {
    expect(changedKeys({ a: { b: [1, 2] }, c: 1 }, { a: { b: [2, 1] }, c: 1 })).toEqual(['a.b']);
    expect(changedKeys(defaultConfig(), defaultConfig())).toEqual([]);
  });
});

describe('the pid file', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-pid-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('is written 0644 with the pid and a newline, and removed on release only while it is ours', () => {
    const path = join(dir, 'a', 'gateway.pid');
    const pid = acquirePidFile(path, { pid: 4242 });
    expect(readFileSync(path, 'utf8')).toBe('4242\n');
    expect(statSync(path).mode & 0o777).toBe(0o644);
    pid.release();
    expect(existsSync(path)).toBe(false);
    const again = acquirePidFile(path, { pid: 4243 });
    const replaced = acquirePidFile(join(dir, 'other.pid'), { pid: 4244 });
    replaced.release();
    again.release();
    expect(existsSync(path)).toBe(false);
  });

  it('replaces a stale file: a dead pid, garbage, or a pid that now runs something else', async () => {
    const dead = await new Promise<number>((resolve) => {
      const child = spawn(process.execPath, ['-e', '0']);
      child.once('exit', () => resolve(child.pid!));
    });
    const path = join(dir, 'stale.pid');
    for (const content of [`${dead}\n`, 'not a pid\n', '']) {
      await writeFile(path, content);
      const pid = acquirePidFile(path, { pid: 5000 });
      expect(readFileSync(path, 'utf8')).toBe('5000\n');
      pid.release();
    }
    const sleeper = spawn('sleep', ['30']);
    try {
      await writeFile(path, `${sleeper.pid}\n`); // alive, but /proc/<pid>/cmdline is not a gateway's
      const pid = acquirePidFile(path, { pid: 5001 });
      expect(readFileSync(path, 'utf8')).toBe('5001\n');
      pid.release();
    } finally {
      sleeper.kill('SIGKILL');
    }
  });

  it('a directory that cannot be made is GW_ERR_PID_FILE_WRITE', async () => {
    await writeFile(join(dir, 'a-file'), '');
    expect(() => acquirePidFile(join(dir, 'a-file', 'gateway.pid'), { pid: 1 })).toThrow(expect.objectContaining({ code: 'GW_ERR_PID_FILE_WRITE' }));
  });
});

// --- the real daemons ---------------------------------------------------------------------------------------------

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let echo: net.Server;
let gwshProxy: ChildProcess | undefined;
let gwshOutput = '';
let session: net.Socket;
let sessionData = '';
let proxyAddr: string;
let clusterPidFile: string;
let agentPidFile: string;
let clusterConfig: (channelVersion: string, extra?: { severity?: string; keepAliveCountMax?: number }) => string;
let agentConfig: (severity: string, labels?: string) => string;
let webAgent: https.Agent;
let connectedSince: string | undefined;
const sockets = new Set<unknown>();

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });

/** GET a version-server path over the one keep-alive connection; also returns whether the socket was reused. */
function getVersion(channel: string): Promise<{ status: number; body: string; reused: boolean }> {
  const [host, port] = [proxyAddr.split(':')[0]!, Number(proxyAddr.split(':')[1])];
  return new Promise((resolve, reject) => {
    const req = https.request({ host, port, path: `/v1/webapi/automaticupgrades/channel/${channel}/version`, agent: webAgent }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, reused: req.reusedSocket }));
    });
    req.on('socket', (s) => sockets.add(s));
    req.on('error', reject);
    req.end();
  });
}

/** Sends a line on alice's session and waits for its echo. */
async function roundTrip(line: string): Promise<void> {
  const before = sessionData.length;
  session.write(`${line}\n`);
  const deadline = Date.now() + 10_000;
  while (!sessionData.slice(before).includes(`${line}\n`)) {
    if (Date.now() > deadline) throw new Error(`no echo of ${line}; got ${JSON.stringify(sessionData.slice(before))}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Sends SIGHUP and resolves with the n-th reload result line ("configuration reload…"). */
async function hup(gw: RunningGateway, n: number): Promise<Record<string, unknown>> {
  gw.process.kill('SIGHUP');
  const deadline = Date.now() + 10_000;
  for (;;) {
    const lines = gw
      .logs()
      .split('\n')
      .filter((l) => l.includes('"configuration reload'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    if (lines.length >= n) return lines[n - 1]!;
    if (Date.now() > deadline) throw new Error(`no reload result #${n}:\n${gw.logs().split('\n').slice(-15).join('\n')}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function nodeSpec(): Promise<{ status: string; connected_since?: string }> {
  const r = await gwctl(['get', 'nodes', '--format', 'json']);
  const node = (JSON.parse(r.stdout) as Array<{ metadata: { name: string }; spec: { status: string; connected_since?: string } }>).find((n) => n.metadata.name === agent.hostId);
  if (!node) throw new Error(`the agent is not listed:\n${r.stdout}`);
  return node.spec;
}

function expectTunnelsUntouched(): void {
  expect(cluster.logs()).not.toContain('"agent disconnected"');
  expect(cluster.logs()).not.toContain('missed its heartbeats');
  expect(agent.logs()).not.toContain('"reverse tunnel closed"');
  expect(agent.logs()).not.toContain('reverse tunnel down');
  expect(agent.logs().split('\n').filter((l) => l.includes('"reverse tunnel ready"'))).toHaveLength(1);
  expect(cluster.logs().split('\n').filter((l) => l.includes('"agent connected"'))).toHaveLength(1);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-reload-'));
  clusterPidFile = join(dir, 'run', 'proxy.pid');
  agentPidFile = join(dir, 'run', 'agent.pid');
  const webPort = await getPort({ host: '127.0.0.1' });
  proxyAddr = `127.0.0.1:${webPort}`;

  // A stop of the cluster resets the sessions through it (src/stream/splice.ts): the echo hears an RST, not a FIN.
  echo = net.createServer((s) => s.on('error', () => undefined).pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  const echoPort = (echo.address() as net.AddressInfo).port;

  clusterConfig = (channelVersion, extra = {}) =>
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      `  log: { format: json, severity: ${extra.severity ?? 'info'} }`,
      'auth_service:',
      '  cluster_name: reload.example',
      '  listen_addr: 127.0.0.1:0',
      '  keep_alive_interval: 1s',
      `  keep_alive_count_max: ${extra.keepAliveCountMax ?? 3}`,
      'proxy_service:',
      `  web_listen_addr: ${proxyAddr}`,
      `  public_addr: ${proxyAddr}`,
      '  automatic_upgrades_channels:',
      `    stable/v17: { static_version: ${channelVersion} }`,
      '',
    ].join('\n');
  agentConfig = (severity, labels = 'kind: echo') =>
    [
      'gateway:',
      '  nodename: agent-1',
      '  data_dir: DATA_DIR',
      `  log: { format: json, severity: ${severity} }`,
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: echo, uri: tcp://127.0.0.1:${echoPort}, labels: { ${labels} } }`,
      '',
    ].join('\n');

  cluster = await startGateway(clusterConfig('v17.0.1'), { args: ['--pid-file', clusterPidFile] });
  const status = await gwctl(['status']);
  const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
  expect((await gwctl(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=app', '--ttl=10m', '--format', 'json'])).stdout) as { token: string }).token;

  // A stale pid file from an agent that died: replaced at start.
  const dead = await new Promise<number>((resolve) => {
    const child = spawn(process.execPath, ['-e', '0']);
    child.once('exit', () => resolve(child.pid!));
  });
  await writeFile(agentPidFile, `${dead}\n`);
  agent = await startGateway(agentConfig('info'), { args: ['--token', token, '--ca-pin', pin, '--proxy', proxyAddr, '--pid-file', agentPidFile] });
  await agent.waitForLog('"reverse tunnel ready"', 20_000);

  const aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh') };
  const login = await runCli('gwsh', ['login', `--proxy=${proxyAddr}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
  expect(login.stderr).toBe('');
  const localPort = await getPort({ host: '127.0.0.1' });
  gwshProxy = spawn(process.execPath, [BIN('gwsh'), 'proxy', 'app', 'echo', '--port', String(localPort)], { env: { PATH: process.env.PATH ?? '', ...aliceEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
  gwshProxy.stdout!.on('data', (c: Buffer) => (gwshOutput += c.toString()));
  gwshProxy.stderr!.on('data', (c: Buffer) => (gwshOutput += c.toString()));
  const deadline = Date.now() + 20_000;
  while (!gwshOutput.includes('Started a local proxy for')) {
    if (Date.now() > deadline) throw new Error(`gwsh proxy app did not start:\n${gwshOutput}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  session = net.connect(localPort, '127.0.0.1');
  session.on('data', (c: Buffer) => (sessionData += c.toString()));
  session.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => session.once('connect', resolve).once('error', reject));
  webAgent = new https.Agent({ keepAlive: true, maxSockets: 1, ca: readFileSync(join(cluster.dataDir, 'admin', 'host-ca.pem'), 'utf8') });
}, 120_000);

afterAll(async () => {
  session?.destroy();
  webAgent?.destroy();
  gwshProxy?.kill('SIGTERM');
  await agent?.stop();
  await cluster?.stop();
  await new Promise<void>((resolve) => (echo ? echo.close(() => resolve()) : resolve()));
  await rm(dir, { recursive: true, force: true });
}, 60_000);

describe('gateway start --pid-file', () => {
  it('each daemon wrote its own pid, mode 0644; the stale agent pid file was replaced', async () => {
    expect(await readFile(clusterPidFile, 'utf8')).toBe(`${cluster.process.pid}\n`);
    expect(await readFile(agentPidFile, 'utf8')).toBe(`${agent.process.pid}\n`);
    expect(statSync(clusterPidFile).mode & 0o777).toBe(0o644);
    expect(agent.logs()).toContain('"replacing a stale pid file"');
    const started = JSON.parse(cluster.logs().split('\n').find((l) => l.includes('"gateway started"'))!) as { pid_file: string };
    expect(started.pid_file).toBe(clusterPidFile);
  });

  it('a second gateway with the same pid file is refused while the first runs', async () => {
    const r = await startGatewayExpectingFailure(
      ['gateway:', '  nodename: second', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  listen_addr: 127.0.0.1:0', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'),
      ['--pid-file', clusterPidFile],
    );
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_PID_FILE_BUSY');
    expect(r.stderr).toContain(`pid ${cluster.process.pid}`);
    expect(await readFile(clusterPidFile, 'utf8')).toBe(`${cluster.process.pid}\n`);
  });
});

describe('SIGHUP reloads the configuration without dropping tunnels or sessions', () => {
  it('before: the channel serves v17.0.1, the session echoes, the node is online', async () => {
    const v = await getVersion('stable/v17');
    expect(v).toMatchObject({ status: 200, body: 'v17.0.1' });
    // gwctl status lists the one Proxy and finds no channel drift (two Proxies that differ: test/roles/drift.test.ts).
    const status = (await gwctl(['status'])).stdout;
    expect(status).toContain('Proxies: 1');
    expect(status).toContain('Upgrade channels: every Proxy serves the same automatic_upgrades_channels');
    await roundTrip('before');
    const spec = await nodeSpec();
    expect(spec.status).toBe('online');
    connectedSince = spec.connected_since;
  });

  it('a new channel version is served at once, on the same keep-alive connection', async () => {
    await writeFile(cluster.configPath, clusterConfig('v17.0.2').replaceAll('DATA_DIR', cluster.dataDir));
    const result = await hup(cluster, 1);
    expect(result).toMatchObject({ msg: 'configuration reloaded', applied: ['proxy_service.automatic_upgrades_channels.stable/v17.static_version'], restart_needed: [] });
    const v = await getVersion('stable/v17');
    expect(v).toMatchObject({ status: 200, body: 'v17.0.2', reused: true });
    expect(sockets.size).toBe(1);
  });

  it('a new log severity reaches the loggers that already exist', async () => {
    await getVersion('nope');
    expect(cluster.logs()).not.toContain('GW_ERR_VERSION_UNKNOWN_CHANNEL'); // a debug line, not logged at info
    await writeFile(cluster.configPath, clusterConfig('v17.0.2', { severity: 'debug' }).replaceAll('DATA_DIR', cluster.dataDir));
    expect(await hup(cluster, 2)).toMatchObject({ msg: 'configuration reloaded', applied: ['gateway.log.severity'] });
    expect((await getVersion('nope')).status).toBe(404);
    await cluster.waitForLog('GW_ERR_VERSION_UNKNOWN_CHANNEL');
  });

  it('a broken file: the error is logged with its code, the daemon keeps running the previous configuration', async () => {
    await writeFile(cluster.configPath, `${clusterConfig('v17.0.3', { severity: 'debug' }).replaceAll('DATA_DIR', cluster.dataDir)}  web_listn_addr: 127.0.0.1:1\n`);
    const failed = await hup(cluster, 3);
    expect(failed).toMatchObject({ msg: 'configuration reload failed; still running the previous configuration', code: 'GW_ERR_CONFIG_UNKNOWN_KEY', level: 50 });
    expect(String(failed.err)).toContain('proxy_service.web_listn_addr');
    await writeFile(cluster.configPath, 'gateway: [unclosed\n');
    expect(await hup(cluster, 4)).toMatchObject({ code: 'GW_ERR_CONFIG_SYNTAX' });
    expect(cluster.process.exitCode).toBeNull();
    expect(await getVersion('stable/v17')).toMatchObject({ status: 200, body: 'v17.0.2', reused: true });
  });

  it('a change that needs a restart is logged as such (and the live part still applies)', async () => {
    await writeFile(cluster.configPath, clusterConfig('v17.0.4', { severity: 'debug', keepAliveCountMax: 5 }).replaceAll('DATA_DIR', cluster.dataDir));
    expect(await hup(cluster, 5)).toMatchObject({ msg: 'configuration reloaded', restart_needed: ['auth_service.keep_alive_count_max'] });
    const warn = JSON.parse(await cluster.waitForLog('take effect only after a restart')) as { keys: string[] };
    expect(warn.keys).toEqual(['auth_service.keep_alive_count_max']);
    expect((await getVersion('stable/v17')).body).toBe('v17.0.4');
  });

  it('SIGHUP to the agent: reloaded, its tunnel stays', async () => {
    await writeFile(agent.configPath, agentConfig('debug', 'kind: echo, tier: test').replaceAll('DATA_DIR', agent.dataDir));
    expect(await hup(agent, 1)).toMatchObject({ msg: 'configuration reloaded', applied: ['gateway.log.severity'], restart_needed: ['app_service.apps'] });
    await writeFile(agent.configPath, 'app_service: { enabled: maybe }\n');
    expect(await hup(agent, 2)).toMatchObject({ msg: 'configuration reload failed; still running the previous configuration' });
    expect(agent.process.exitCode).toBeNull();
  });

  it('after all of it: the same session still echoes, the tunnel never dropped, the node still online since the start', async () => {
    // Longer than the heartbeat window (1 s x 3): a dropped tunnel would have been noticed by now.
    await new Promise((r) => setTimeout(r, 4_000));
    await roundTrip('after');
    expect(sessionData).toBe('before\nafter\n');
    const spec = await nodeSpec();
    expect(spec.status).toBe('online');
    expect(spec.connected_since).toBe(connectedSince);
    expectTunnelsUntouched();
    expect(await readFile(clusterPidFile, 'utf8')).toBe(`${cluster.process.pid}\n`);
    expect(await readFile(agentPidFile, 'utf8')).toBe(`${agent.process.pid}\n`);
  });

  it('a clean stop removes the pid file', async () => {
    session.destroy();
    gwshProxy?.kill('SIGTERM');
    const pidFile = agentPidFile;
    expect(await agent.stop()).toBe(0);
    expect(existsSync(pidFile)).toBe(false);
  });
});
