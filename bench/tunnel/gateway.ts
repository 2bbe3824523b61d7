/**
 * bench:tunnel's path setups on the gateway's side: the Proxy's and the agent's configurations, an agent start
 * timed from its logs, the daemons' environment (Node options, glibc tunables, the profiler preload) and a real
 * `gwsh proxy app` process. Everything runs the built CLIs from dist/ (test/helpers/gateway.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import dns from 'node:dns';
import type net from 'node:net';
import { BIN, startGateway, type RunningGateway } from '../../test/helpers/gateway.js';
import type { Squid } from '../../test/helpers/squid.js';
import { exited, sleep, withTimeout } from '../common.js';
import { DAEMON_GLIBC_TUNABLES, DAEMON_NODE_OPTIONS, GWSH_NODE_OPTIONS, PROXY_IP, PROXY_NAME, TARGET_IP } from './settings.js';

/** The Proxy daemon's configuration (auth + proxy in one process). */
export function proxyConfig(cluster: string, webPort: number, maxConnections?: number): string {
  return [
    'gateway:',
    '  nodename: proxy-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: info }',
    ...(maxConnections === undefined ? [] : [`  limits: { max_connections: ${maxConnections} }`]),
    'auth_service:',
    `  cluster_name: ${cluster}`,
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    `  web_listen_addr: ${PROXY_IP}:${webPort}`,
    `  public_addr: ${PROXY_NAME}:${webPort}`,
    '',
  ].join('\n');
}

/** The agent daemon's configuration: three tcp:// apps on TARGET_IP. */
export function agentConfig(sinkPort: number, echoPort: number, iperfPort: number): string {
  return [
    'gateway:',
    '  nodename: agent-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: info }',
    'app_service:',
    '  enabled: yes',
    '  apps:',
    `    - { name: sink, uri: "tcp://${TARGET_IP}:${sinkPort}" }`,
    `    - { name: echo, uri: "tcp://${TARGET_IP}:${echoPort}" }`,
    `    - { name: iperf, uri: "tcp://${TARGET_IP}:${iperfPort}" }`,
    '',
  ].join('\n');
}

/** Resolves the names only squid knows, for the ones who do not go through squid (the client, the idle agents). */
export const benchLookup: net.LookupFunction = (hostname, options, callback) => {
  if (hostname !== PROXY_NAME) return dns.lookup(hostname, options, callback);
  if (options.all) callback(null, [{ address: PROXY_IP, family: 4 }]);
  else callback(null, PROXY_IP, 4);
};

/** Stops a daemon (SIGKILL after 15 s); nothing when there is none. */
export async function stopGateway(gw: RunningGateway | undefined): Promise<void> {
  if (!gw) return;
  const killer = setTimeout(() => gw.process.kill('SIGKILL'), 15_000);
  await gw.stop();
  clearTimeout(killer);
}

/** The time field of a JSON log line. */
export function logTime(line: string): number {
  return (JSON.parse(line) as { time: number }).time;
}

export interface AgentStart {
  agent: RunningGateway;
  /** spawn -> "gateway started" (process start, configuration, identity). */
  startedMs: number;
  /** spawn -> "reverse tunnel ready" in the agent's log. */
  readyMs: number;
  /** spawn -> "agent connected" in the Proxy's log. */
  proxyMs: number;
  /** The tunnel protocol the two negotiated, as the Proxy logged it (v2, or v1: SSH). */
  protocol: string;
}

export async function startAgent(proxy: RunningGateway, yaml: string, dataDir: string, squid: Squid, env: Record<string, string> = {}, nodeArgs: string[] = []): Promise<AgentStart> {
  const from = proxy.logs().length;
  const t0 = Date.now();
  const agent = await startGateway(yaml, { dataDir, env: { HTTPS_PROXY: squid.url, ...env }, nodeArgs });
  const ready = await agent.waitForLog('reverse tunnel ready', 30_000).catch(async (err: unknown) => {
    await stopGateway(agent);
    throw new Error(`${(err as Error).message}\n${agent.logs()}`);
  });
  const started = agent.logs().split('\n').find((l) => l.includes('"gateway started"'))!;
  let connected: string | undefined;
  for (let i = 0; i < 100 && !connected; i++) {
    connected = proxy.logs().slice(from).split('\n').find((l) => l.includes('"agent connected"'));
    if (!connected) await sleep(20);
  }
  const protocol = connected ? `v${(JSON.parse(connected) as { protocol?: number }).protocol ?? 1}` : 'unknown';
  return { agent, startedMs: logTime(started) - t0, readyMs: logTime(ready) - t0, proxyMs: connected ? logTime(connected) - t0 : NaN, protocol };
}

/** What the agent's starts negotiated, in words for the section. */
export function tunnelProtocolText(starts: AgentStart[]): string {
  const seen = [...new Set(starts.map((s) => s.protocol))];
  const words: Record<string, string> = { v2: 'protocol v2: frames straight over mutual TLS, ALPN gateway-reversetunnel-v2', v1: 'protocol v1: SSH over TLS, ALPN gateway-reversetunnel' };
  return seen.map((p) => words[p] ?? `protocol ${p}`).join('; ');
}


/** The data path's daemons' environment: BENCH_DAEMON_NODE_OPTIONS (and extra options), BENCH_DAEMON_GLIBC_TUNABLES. */
export function daemonEnv(extraNodeOptions = ''): Record<string, string> {
  const opts = [DAEMON_NODE_OPTIONS, extraNodeOptions].filter(Boolean).join(' ');
  return { ...(opts ? { NODE_OPTIONS: opts } : {}), ...(DAEMON_GLIBC_TUNABLES ? { GLIBC_TUNABLES: DAEMON_GLIBC_TUNABLES } : {}) };
}

/** The same, with the profiler preload (bench/lib/cpuprofile.ts) writing to dir. */
export function profilerEnv(preload: string, dir: string): Record<string, string> {
  return { ...daemonEnv(`--require ${preload}`), BENCH_CPU_PROF_DIR: dir };
}


/** A `gwsh proxy app` process and the local port it listens on. */
export interface LocalProxy {
  process: ChildProcess;
  port: number;
  /** Its output so far (the last 8 000 characters of standard error): with --debug, the route each connection took. */
  output(): string;
  stop(): Promise<void>;
}

/**
 * A real `gwsh --debug proxy app <name> --port 0` with the given profile directory and GWSH_E2E as the caller
 * sets it in env (unset: gwsh's default, auto), node started with nodeArgs (e.g. --cpu-prof); resolves once it listens. --debug prints one line per connection
 * naming its route ("end-to-end to agent ..." or "the classic route ...: <reason>"): the bench checks it.
 */
export async function startGwshProxy(gwshHome: string, home: string, app: string, env: Record<string, string> = {}, bin = BIN('gwsh'), nodeArgs: string[] = []): Promise<LocalProxy> {
  const child = spawn(process.execPath, [...nodeArgs, bin, '--debug', 'proxy', 'app', app, '--port', '0'], {
    env: { PATH: process.env.PATH ?? '', HOME: home, GWSH_HOME: gwshHome, ...(GWSH_NODE_OPTIONS ? { NODE_OPTIONS: GWSH_NODE_OPTIONS } : {}), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-8000)));
  const port = await withTimeout(
    `gwsh proxy app ${app}`,
    new Promise<number>((resolve, reject) => {
      const check = () => {
        const m = /on 127\.0\.0\.1:(\d+)/.exec(out);
        if (m) resolve(Number(m[1]));
      };
      child.stdout!.on('data', check);
      child.once('exit', (code) => reject(new Error(`gwsh proxy app ${app} exited with ${code}:\n${out}`)));
    }),
    30_000,
  );
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    // SIGINT: gwsh closes its listener and exits once its connections are gone; one the Proxy lets linger after
    // the resource closed (half_close_linger) would keep it for up to 30 s.
    child.kill('SIGINT');
    const killer = setTimeout(() => child.kill('SIGKILL'), 2_000);
    await exited(child);
    clearTimeout(killer);
  };
  return { process: child, port, output: () => out, stop };
}
