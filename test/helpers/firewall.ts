/**
 * "Behind a real firewall": two network namespaces joined to this (root) namespace by veth pairs, with IP
 * forwarding in the root namespace OFF, so that a host in one namespace cannot reach the other at all:
 *
 *          ns-agent                     root namespace                      ns-proxy
 *   ┌───────────────────┐        ┌──────────────────────────┐        ┌───────────────────┐
 *   │agent daemon       │  veth  │squid on A.1:<port>       │  veth  │gateway daemon     │
 *   │databases on lo    │────────│clients (gwsh, psql ...)  │────────│(auth + proxy) on  │
 *   │A.2/30, default    │        │A.1/30        P.1/30      │        │P.2:443, P.2:3025  │
 *   │route via A.1      │        │ip_forward = 0            │        │default via P.1    │
 *   └───────────────────┘        └──────────────────────────┘        └───────────────────┘
 *
 * The agent's only way to the Proxy is squid (a process of the root namespace, which reaches P.2 on its own
 * link); its packets for P.2 reach the root namespace and are not forwarded. Clients in the root namespace reach
 * P.2 directly. A and P are /30s of 198.18.0.0/15 (RFC 2544 test networks); nothing leaves the machine.
 *
 * Everything is named with the prefix `gwfw<pid>` (namespaces `gwfw-<pid>-agent` / `-proxy`, links
 * `gwfw<pid>ao` ...); the original ip_forward value and the safety routes are kept in /tmp/gwfw-<pid>.state.json
 * until close() (with overlapping runs, the last one to finish restores ip_forward). createFirewall() first
 * removes what earlier runs whose process is gone left behind (killing the processes still inside their
 * namespaces, deleting links and routes, restoring ip_forward), and an exit hook cleans up if close() never
 * runs. Needs root.
 */
import { spawn, spawnSync, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { randomInt } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, type RunResult } from './gateway.js';
import { squidArgs, startSquid, type Squid, type SquidOptions } from './squid.js';

export const PREFIX = 'gwfw';
const IP_FORWARD = '/proc/sys/net/ipv4/ip_forward';
const stateFile = (pid: number) => join(tmpdir(), `${PREFIX}-${pid}.state.json`);

/** What close() must undo beyond the namespaces and links: kept on disk for the clean-up of a crashed run. */
interface State {
  ipForward: string;
  unreachableRoutes: string[];
}

export interface Firewall {
  /** ip netns names. */
  agentNs: string;
  proxyNs: string;
  /** The agent's address (inside ns-agent) and the root namespace's address on the agent's link (squid's). */
  agentIp: string;
  agentGatewayIp: string;
  /** The Proxy's address (inside ns-proxy) and the root namespace's address on the proxy's link. */
  proxyIp: string;
  proxyGatewayIp: string;
  /** Root-namespace end of the agent's veth pair (set down to cut the agent off). */
  agentLink: string;
  /** ip_forward before the firewall set it to 0 (restored by close()). */
  ipForwardBefore: string;
  /** Starts a long-running process inside a namespace (ip netns exec); killed by close() if still running. */
  spawnIn(ns: string, command: string, args: string[], options?: SpawnOptions): ChildProcess;
  /** Runs a command inside a namespace to completion. */
  runIn(ns: string, command: string, args: string[], options?: { env?: Record<string, string>; input?: string; timeoutMs?: number }): Promise<RunResult>;
  /** Whether a TCP connection from inside ns to host:port is established within timeoutMs; the error otherwise. */
  tcpConnectFrom(ns: string, host: string, port: number, timeoutMs?: number): Promise<{ ok: true } | { ok: false; error: string }>;
  /** Takes the agent's link down (up = false) or up again. */
  setAgentLink(up: boolean): void;
  close(): Promise<void>;
}

function ip(args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')} failed: ${r.stderr.trim()}`);
}

function alive(pid: number): boolean {
  return existsSync(`/proc/${pid}`);
}

function killNamespaceProcesses(ns: string): void {
  const r = spawnSync('ip', ['netns', 'pids', ns], { encoding: 'utf8' });
  for (const pid of r.stdout.split(/\s+/).filter(Boolean).map(Number)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
}

/** Removes namespaces, links and the ip_forward change of earlier runs whose test process no longer exists. */
export function removeStale(): string[] {
  const removed: string[] = [];
  const namespaces = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout.split('\n').map((l) => l.split(' ')[0]!).filter(Boolean);
  for (const ns of namespaces) {
    const m = new RegExp(`^${PREFIX}-(\\d+)-`).exec(ns);
    if (!m || alive(Number(m[1]))) continue;
    killNamespaceProcesses(ns);
    spawnSync('ip', ['netns', 'del', ns]);
    removed.push(ns);
  }
  const links = spawnSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' }).stdout.split('\n');
  for (const line of links) {
    const m = new RegExp(`^\\d+: (${PREFIX}(\\d+)[a-z]+)[@:]`).exec(line);
    if (!m || alive(Number(m[2]))) continue;
    spawnSync('ip', ['link', 'del', m[1]!]);
    removed.push(m[1]!);
  }
  for (const file of readdirSync(tmpdir())) {
    const m = new RegExp(`^${PREFIX}-(\\d+)\\.state\\.json$`).exec(file);
    if (!m || alive(Number(m[1]))) continue;
    try {
      const state = JSON.parse(readFileSync(join(tmpdir(), file), 'utf8')) as State;
      for (const cidr of state.unreachableRoutes) spawnSync('ip', ['route', 'del', 'unreachable', cidr, 'metric', '4000'], { stdio: 'ignore' });
      if ((state.ipForward === '0' || state.ipForward === '1') && otherLiveStates().length === 0) writeFileSync(IP_FORWARD, `${state.ipForward}\n`);
    } catch {
      // unreadable: nothing to restore
    }
    rmSync(join(tmpdir(), file), { force: true });
    removed.push(file);
  }
  return removed;
}

/** Two free /30 blocks of 198.18.0.0/15 (none of their addresses on any interface here). */
function pickBlocks(): [number, number] {
  const used = spawnSync('ip', ['-o', '-4', 'addr', 'show'], { encoding: 'utf8' }).stdout;
  for (;;) {
    const a = randomInt(0, 1 << 15);
    const b = randomInt(0, 1 << 15);
    if (a === b) continue;
    if ([a, b].some((blk) => [1, 2].some((i) => used.includes(` ${dotted(base(blk) + i)}/`)))) continue;
    return [a, b];
  }
}
const base = (block: number) => (198 << 24) + (18 << 16) + block * 4;
const dotted = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');

function readIpForward(): string {
  return readFileSync(IP_FORWARD, 'utf8').trim();
}

/** The states of other runs still going on (their process lives). */
function otherLiveStates(): State[] {
  const out: State[] = [];
  for (const file of readdirSync(tmpdir())) {
    const m = new RegExp(`^${PREFIX}-(\\d+)\\.state\\.json$`).exec(file);
    if (!m || Number(m[1]) === process.pid || !alive(Number(m[1]))) continue;
    try {
      out.push(JSON.parse(readFileSync(join(tmpdir(), file), 'utf8')) as State);
    } catch {
      // being written or removed
    }
  }
  return out;
}

export async function createFirewall(): Promise<Firewall> {
  if (process.getuid?.() !== 0) throw new Error('the firewall topology needs root (network namespaces, ip_forward)');
  removeStale();
  const pid = process.pid;
  const agentNs = `${PREFIX}-${pid}-agent`;
  const proxyNs = `${PREFIX}-${pid}-proxy`;
  const links = { agentOuter: `${PREFIX}${pid}ao`, agentInner: `${PREFIX}${pid}ai`, proxyOuter: `${PREFIX}${pid}po`, proxyInner: `${PREFIX}${pid}pi` };
  const [agentBlock, proxyBlock] = pickBlocks();
  const agentGatewayIp = dotted(base(agentBlock) + 1);
  const agentIp = dotted(base(agentBlock) + 2);
  const proxyGatewayIp = dotted(base(proxyBlock) + 1);
  const proxyIp = dotted(base(proxyBlock) + 2);
  const children = new Set<ChildProcess>();

  // Runs may overlap (two test processes): the value before the first of them is the one to restore, by the
  // last one to finish.
  const ipForwardBefore = otherLiveStates()[0]?.ipForward ?? readIpForward();
  const unreachableRoutes = [agentBlock, proxyBlock].map((blk) => `${dotted(base(blk))}/30`);
  writeFileSync(stateFile(pid), JSON.stringify({ ipForward: ipForwardBefore, unreachableRoutes } satisfies State));

  let closed = false;
  const closeSync = () => {
    if (closed) return;
    closed = true;
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    for (const ns of [agentNs, proxyNs]) {
      killNamespaceProcesses(ns);
      spawnSync('ip', ['netns', 'del', ns]);
    }
    for (const link of [links.agentOuter, links.proxyOuter]) spawnSync('ip', ['link', 'del', link], { stdio: 'ignore' });
    for (const cidr of unreachableRoutes) spawnSync('ip', ['route', 'del', 'unreachable', cidr, 'metric', '4000'], { stdio: 'ignore' });
    if (otherLiveStates().length === 0) writeFileSync(IP_FORWARD, `${ipForwardBefore}\n`);
    rmSync(stateFile(pid), { force: true });
  };
  process.once('exit', closeSync);

  try {
    writeFileSync(IP_FORWARD, '0\n');
    for (const [ns, outer, inner, gw, addr] of [
      [agentNs, links.agentOuter, links.agentInner, agentGatewayIp, agentIp],
      [proxyNs, links.proxyOuter, links.proxyInner, proxyGatewayIp, proxyIp],
    ] as const) {
      ip(['netns', 'add', ns]);
      ip(['link', 'add', outer, 'type', 'veth', 'peer', 'name', inner, 'netns', ns]);
      ip(['addr', 'add', `${gw}/30`, 'dev', outer]);
      ip(['link', 'set', outer, 'up']);
      ip(['-n', ns, 'addr', 'add', `${addr}/30`, 'dev', inner]);
      ip(['-n', ns, 'link', 'set', inner, 'up']);
      ip(['-n', ns, 'link', 'set', 'lo', 'up']);
    }
    // Both have a default route into the root namespace (the agent's way out is where squid is; the Proxy's is
    // its way back to anyone): what stops the agent reaching the Proxy is that the root namespace does not
    // forward, not a missing route.
    ip(['-n', agentNs, 'route', 'add', 'default', 'via', agentGatewayIp]);
    ip(['-n', proxyNs, 'route', 'add', 'default', 'via', proxyGatewayIp]);
    // While a link is down its connected route is gone: without these, packets for the namespace (squid's FIN to
    // the agent, say) would follow this machine's default route out of it. Lower priority than the link's route.
    for (const cidr of unreachableRoutes) ip(['route', 'add', 'unreachable', cidr, 'metric', '4000']);
  } catch (err) {
    closeSync();
    throw err;
  }

  const spawnIn = (ns: string, command: string, args: string[], options: SpawnOptions = {}): ChildProcess => {
    // `ip netns exec` execs the command itself: the child's pid is the command's.
    const child = spawn('ip', ['netns', 'exec', ns, command, ...args], { stdio: ['ignore', 'pipe', 'pipe'], ...options });
    children.add(child);
    child.once('exit', () => children.delete(child));
    return child;
  };

  const runIn: Firewall['runIn'] = (ns, command, args, options = {}) =>
    new Promise((resolve, reject) => {
      const child = spawnIn(ns, command, args, { env: { PATH: process.env.PATH ?? '', ...(options.env ?? {}) }, stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout!.on('data', (c: Buffer) => (stdout += c.toString()));
      child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
      const timeoutMs = options.timeoutMs ?? 60_000;
      const timer = setTimeout(() => {
        child.kill('SIGKILL');
        reject(new Error(`${command} ${args.join(' ')} (in ${ns}) did not finish in ${timeoutMs} ms\n${stdout}\n${stderr}`));
      }, timeoutMs);
      child.once('error', reject);
      child.once('close', (status) => {
        clearTimeout(timer);
        resolve({ status, stdout, stderr });
      });
      child.stdin!.on('error', () => undefined); // it may exit before reading its input
      child.stdin!.end(options.input ?? '');
    });

  const tcpConnectFrom: Firewall['tcpConnectFrom'] = async (ns, host, port, timeoutMs = 3000) => {
    const script = `
      const s = require('net').connect({ host: ${JSON.stringify(host)}, port: ${port} });
      const t = setTimeout(() => { console.log('timeout: no connection within ${timeoutMs} ms'); process.exit(0); }, ${timeoutMs});
      s.on('connect', () => { console.log('connected'); process.exit(0); });
      s.on('error', (e) => { console.log(e.code || e.message); process.exit(0); });`;
    const r = await runIn(ns, process.execPath, ['-e', script], { timeoutMs: timeoutMs + 10_000 });
    const out = r.stdout.trim();
    return out === 'connected' ? { ok: true } : { ok: false, error: out || r.stderr.trim() };
  };

  return {
    agentNs,
    proxyNs,
    agentIp,
    agentGatewayIp,
    proxyIp,
    proxyGatewayIp,
    agentLink: links.agentOuter,
    ipForwardBefore,
    spawnIn,
    runIn,
    tcpConnectFrom,
    setAgentLink(up) {
      ip(['link', 'set', links.agentOuter, up ? 'up' : 'down']);
    },
    async close() {
      const waits = [...children].map((c) => new Promise((r) => c.once('exit', r)));
      closeSync();
      await Promise.race([Promise.all(waits), new Promise((r) => setTimeout(r, 5000))]);
      process.off('exit', closeSync);
    },
  };
}

/** Polls until host:port accepts a TCP connection from here (made from 127.0.0.254 so squid's log can drop it). */
export async function waitForTcp(host: string, port: number, timeoutMs = 20_000, localAddress?: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = net.connect({ host, port, ...(localAddress ? { localAddress } : {}) });
      s.setTimeout(1000);
      s.once('connect', () => (s.destroy(), resolve(true)));
      s.once('error', () => resolve(false));
      s.once('timeout', () => (s.destroy(), resolve(false)));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing accepts connections on ${host}:${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface NsGateway {
  dir: string;
  dataDir: string;
  configPath: string;
  /** Bound addresses from the "gateway started" line. */
  addresses: Record<string, string>;
  hostId?: string;
  pid: number;
  /** Everything it logged, across restarts. */
  logs(): string;
  /** Resolves with the first log line (after `since`, an offset into logs()) containing text. */
  waitForLog(text: string, timeoutMs?: number, since?: number): Promise<string>;
  /** SIGKILL, and wait for the exit. */
  kill(): Promise<void>;
  /** Starts it again with the same configuration, data directory and arguments. */
  restart(): Promise<void>;
  /** SIGTERM and wait (SIGKILL after 10 s); keeps the directory unless removeDir. */
  stop(removeDir?: boolean): Promise<number | null>;
}

/**
 * `gateway start -c FILE ARGS` inside a namespace, resolving once it logs "gateway started". DATA_DIR in the
 * configuration becomes its data directory (kept across restart()).
 */
export async function startGatewayIn(
  fw: Pick<Firewall, 'spawnIn'>,
  ns: string,
  configYaml: string,
  options: {
    args?: string[];
    env?: Record<string, string>;
    timeoutMs?: number;
    name?: string;
    /** A command the daemon runs under, inside the namespace (e.g. unshare); it must exec the rest of its arguments. */
    wrap?: string[];
    /** The gateway program to run (default: this checkout's dist/cli/gateway.js), e.g. from publicCopyOfBuild(). */
    program?: string;
  } = {},
): Promise<NsGateway> {
  const dir = await mkdtemp(join(tmpdir(), `${PREFIX}-${options.name ?? 'daemon'}-`));
  const dataDir = join(dir, 'data');
  const configPath = join(dir, 'gateway.yaml');
  await writeFile(configPath, configYaml.replaceAll('DATA_DIR', dataDir));
  let output = '';
  let child: ChildProcess;
  const handle: NsGateway = {
    dir,
    dataDir,
    configPath,
    addresses: {},
    pid: 0,
    logs: () => output,
    waitForLog: (text, timeoutMs = 10_000, since = 0) =>
      new Promise<string>((resolve, reject) => {
        const deadline = Date.now() + timeoutMs;
        const check = () => {
          const line = output.slice(since).split('\n').find((l) => l.includes(text));
          if (line) return resolve(line);
          if (Date.now() > deadline) return reject(new Error(`no log line with ${JSON.stringify(text)} within ${timeoutMs} ms; last lines:\n${output.trimEnd().split('\n').slice(-15).join('\n')}`));
          setTimeout(check, 50);
        };
        check();
      }),
    async kill() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGKILL');
      await exited;
    },
    restart: () => launch(),
    async stop(removeDir = false) {
      let code: number | null = child.exitCode;
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise<number | null>((r) => child.once('exit', r));
        child.kill('SIGTERM');
        const killer = setTimeout(() => child.kill('SIGKILL'), 10_000);
        code = await exited;
        clearTimeout(killer);
      }
      if (removeDir) await rm(dir, { recursive: true, force: true });
      return code;
    },
  };
  const launch = async () => {
    const from = output.length;
    const argv = [...(options.wrap ?? []), process.execPath, options.program ?? BIN('gateway'), 'start', '-c', configPath, ...(options.args ?? [])];
    child = fw.spawnIn(ns, argv[0]!, argv.slice(1), {
      env: { PATH: process.env.PATH ?? '', ...(options.env ?? {}) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    const started = await new Promise<{ addresses: Record<string, string>; host_id?: string }>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`gateway did not start in time:\n${output.slice(from)}`)), options.timeoutMs ?? 30_000);
      const onExit = (code: number | null) => {
        clearTimeout(timer);
        reject(Object.assign(new Error(`gateway exited with ${code}:\n${output.slice(from)}`), { output: output.slice(from), code }));
      };
      const check = () => {
        const line = output.slice(from).split('\n').find((l) => l.includes('"gateway started"'));
        if (line) {
          clearTimeout(timer);
          child.off('exit', onExit);
          child.stdout!.off('data', check);
          child.stderr!.off('data', check);
          resolve(JSON.parse(line) as { addresses: Record<string, string>; host_id?: string });
        }
      };
      child.stdout!.on('data', check);
      child.stderr!.on('data', check);
      child.once('exit', onExit);
    });
    handle.addresses = started.addresses;
    handle.pid = child.pid!;
    if (started.host_id) handle.hostId = started.host_id;
  };
  await launch();
  return handle;
}

export interface RestartableSquid extends Squid {
  /** SIGTERM, wait for the exit, and start squid again with the same configuration, address and logs. */
  restart(): Promise<void>;
}

/**
 * startSquid() (test/helpers/squid.ts), plus restart(): the agents' HTTPS_PROXY names one address and port, so
 * the new squid must come back exactly there. It reuses the first squid's squid.conf (and so its logs).
 */
export async function startRestartableSquid(options: SquidOptions): Promise<RestartableSquid> {
  const first = await startSquid(options);
  let current: ChildProcess | undefined; // a restarted squid; the first one belongs to squid.ts
  let pid = first.pid;
  const exitOf = (p: number) =>
    (async () => {
      while (existsSync(`/proc/${p}`) && !/^State:\s+Z/m.test(readFileSync(`/proc/${p}/status`, 'utf8'))) await new Promise((r) => setTimeout(r, 50));
    })();
  const stopCurrent = async () => {
    if (current) {
      if (current.exitCode === null && current.signalCode === null) {
        const exited = new Promise((r) => current!.once('exit', r));
        current.kill('SIGTERM');
        const killer = setTimeout(() => current!.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(killer);
      }
      current = undefined;
    } else {
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        return;
      }
      await exitOf(pid);
    }
  };
  return {
    ...first,
    get pid() {
      return pid;
    },
    async restart() {
      await stopCurrent();
      const child = spawn('/usr/sbin/squid', squidArgs(first.dir), { stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
      current = child;
      pid = child.pid!;
      process.once('exit', () => child.kill('SIGKILL'));
      try {
        await waitForTcp(first.host, first.port, 20_000, first.host.startsWith('127.') ? '127.0.0.254' : undefined);
      } catch (err) {
        throw new Error(`${(err as Error).message}\n${stderr}`);
      }
    },
    async stop() {
      await stopCurrent();
      await first.stop();
    },
  };
}
