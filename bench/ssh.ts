/**
 * bench:ssh — the interactive round trip of one keystroke in a pty session, through the gateway and, as the
 * peers, OpenSSH straight to an sshd on the same machine and OpenSSH through a jump host (`ssh -J`, the path
 * users compare a gateway with):
 *
 *   gateway   `ssh -F <gwsh config> -tt root@web-1`: ProxyCommand `gwsh proxy ssh` -> TLS (ALPN
 *             gateway-proxy-ssh) to the Proxy daemon (auth + proxy, real `gateway start`, on PROXY_IP) -> the
 *             agent's reverse tunnel (protocol v2: frames over mutual TLS) -> the agent daemon's SSH Service (ssh2, real `gateway
 *             start` with ssh_service) -> /bin/bash -l on a pty. Everything on loopback; no squid (the agent's
 *             leg through a CONNECT proxy is measured by bench:tunnel).
 *   OpenSSH   `ssh -tt -p PORT root@SSHD_IP` to Debian's sshd started here with its own sshd_config (authorized
 *             key, no PAM) -> bash -l on a pty.
 *   ssh -J    `ssh -J root@JUMP_IP:PORT -tt -p PORT root@SSHD_IP`: ssh runs a second ssh (`ssh -W`) to a second
 *             sshd, the jump host (own sshd_config, on JUMP_IP), which opens a direct-tcpip channel to the first
 *             sshd -> bash -l.
 *
 * All clients: OpenSSH's ssh, the same cipher (ssh2's first choice; on both hops of ssh -J), ECDSA P-256 user
 * keys, both sshds' host keys in a known_hosts file written here (StrictHostKeyChecking yes, BatchMode yes:
 * nothing prompts), driven by node-pty as a terminal would: write one character, wait for the remote shell's
 * echo (readline's), repeat. The characters alternate between "x" and DEL, so the line stays short; both are
 * keystrokes and both are timed. BENCH_ROUNDS rounds, each opening a fresh session on each path (the time from
 * spawning ssh to the first answer of the shell is "session start"), then BENCH_KEYS / BENCH_ROUNDS keystrokes per
 * path, the paths taking turns (the first path rotates from round to round).
 *
 * BENCH_TRACE=N (300 when `perf` is installed, else 0: off): after that, one more session per path whose N keystrokes are traced
 * (bench/keytrace.ts: perf trace of every process on the path), and the section gets, per path, the time spent
 * inside each process and between each pair.
 *
 * BENCH_DAEMON_NODE_OPTIONS: NODE_OPTIONS of the Proxy and agent daemons, to try settings (e.g. --max-semi-space-size).
 *
 * Settings (environment): BENCH_KEYS (3000), BENCH_ROUNDS (3), BENCH_WARMUP (50 per session), BENCH_TRACE (300), BENCH_RECORD (0:
 * print the section only). Writes the figures, the ratios and the machine to bench/RESULTS.md (section "ssh").
 * Runs as root (sshd, and the login root on every path, so that no OS user has to be created).
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import getPort from 'get-port';
import * as nodePty from 'node-pty';
import { runCli, startGateway, type RunningGateway } from '../test/helpers/gateway.js';
import { recordSection } from './record.js';
import { envNumber, exited, percentile, spawnSshd } from './common.js';
import { commOf, descendants, hops, startTrace, type Traced } from './keytrace.js';


const KEYS = envNumber('BENCH_KEYS', 3000);
const ROUNDS = envNumber('BENCH_ROUNDS', 3);
const WARMUP = envNumber('BENCH_WARMUP', 50, 0);
const PROXY_IP = '127.0.0.7';
const SSHD_IP = '127.0.0.8';
const JUMP_IP = '127.0.0.9';
const PASSWORD = 'correct horse battery';
const READY_TIMEOUT_MS = 30_000;
const KEY_TIMEOUT_MS = 10_000;
/** perf is there to trace with (Debian's linux-perf): then the breakdown is part of every run unless BENCH_TRACE=0. */
const HAS_PERF = spawnSync('perf', ['--version'], { stdio: 'ignore' }).status === 0;
const TRACE = envNumber('BENCH_TRACE', HAS_PERF ? 300 : 0, 0);
const DAEMON_OPTIONS = process.env.BENCH_DAEMON_NODE_OPTIONS ?? '';

const median = (xs: number[]) => percentile([...xs].sort((a, b) => a - b), 50);
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

interface Sshd {
  port: number;
  pid: number;
  hostKeyLine: string;
  stop(): Promise<void>;
}

/** An sshd of its own (files named after `name` in dir) on ip; the authorized keys are dir/authorized_keys. */
async function startSshd(dir: string, name: string, ip: string): Promise<Sshd> {
  // sshd refuses to start without its privilege separation directory (the package creates it at boot only).
  if (!existsSync('/run/sshd')) mkdirSync('/run/sshd', { mode: 0o755 });
  const hostKey = join(dir, `${name}_host_key`);
  const keygen = spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', hostKey], { encoding: 'utf8' });
  if (keygen.status !== 0) throw new Error(`ssh-keygen: ${keygen.stderr}`);
  const port = await getPort({ host: ip });
  const cfg = join(dir, `${name}_config`);
  await writeFile(
    cfg,
    [
      `ListenAddress ${ip}:${port}`,
      `HostKey ${hostKey}`,
      `AuthorizedKeysFile ${join(dir, 'authorized_keys')}`,
      `PidFile ${join(dir, `${name}.pid`)}`,
      'UsePAM no',
      'StrictModes no',
      'PermitRootLogin prohibit-password',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'X11Forwarding no',
      'PrintMotd no',
      'PrintLastLog no',
      'UseDNS no',
      'AllowTcpForwarding yes', // the jump host's `ssh -W` (a direct-tcpip channel)
      '',
    ].join('\n'),
  );
  const child = await spawnSshd(cfg);
  const pub = readFileSync(`${hostKey}.pub`, 'utf8').trim().split(' ').slice(0, 2).join(' ');
  return {
    port,
    pid: child.pid!,
    hostKeyLine: `[${ip}]:${port} ${pub}`,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const killer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited(child);
      clearTimeout(killer);
    },
  };
}

/** One interactive ssh session in a pty (node-pty), as a terminal emulator runs it. */
class Session {
  private readonly term: nodePty.IPty;
  private buffer = '';
  private waiter: { text: string; resolve: () => void } | undefined;
  private exit: Promise<number>;
  /** Characters on the shell's line: a DEL only ever follows an "x" (DEL on an empty line rings the bell). */
  private onLine = 0;
  readonly startMs: number;
  get pid(): number {
    return this.term.pid;
  }

  constructor(args: string[], env: Record<string, string>) {
    const t0 = nowMs();
    this.term = nodePty.spawn('ssh', args, { name: 'xterm', cols: 100, rows: 30, cwd: env.HOME, env });
    this.startMs = t0;
    this.exit = new Promise((resolve) => this.term.onExit(({ exitCode }) => resolve(exitCode)));
    this.term.onData((d) => {
      this.buffer += d;
      if (this.waiter && this.buffer.includes(this.waiter.text)) {
        const w = this.waiter;
        this.waiter = undefined;
        w.resolve();
      }
    });
  }

  /** Writes data (after forgetting what arrived so far) and resolves when `text` has come back. */
  send(data: string, text: string, timeoutMs = KEY_TIMEOUT_MS): Promise<void> {
    this.buffer = '';
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiter = undefined;
        reject(new Error(`no ${JSON.stringify(text)} within ${timeoutMs} ms after writing ${JSON.stringify(data)}; got ${JSON.stringify(this.buffer.slice(-500))}`));
      }, timeoutMs);
      this.waiter = {
        text,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      this.term.write(data);
    });
  }

  /** Waits for the remote shell: a command whose answer differs from its echo. Resolves with ms since spawn. */
  async ready(): Promise<number> {
    await this.send("echo BENCH''READY\r", 'BENCHREADY', READY_TIMEOUT_MS);
    return nowMs() - this.startMs;
  }

  /** n keystrokes, alternating "x" and DEL; the round trip of each, in ms. */
  async keystrokes(n: number): Promise<number[]> {
    const times: number[] = [];
    for (let i = 0; i < n; i++) {
      const [key, echo] = this.onLine === 0 ? ['x', 'x'] : ['\x7f', '\b'];
      const t0 = nowMs();
      await this.send(key, echo);
      times.push(nowMs() - t0);
      this.onLine = 1 - this.onLine;
    }
    return times;
  }

  async close(): Promise<void> {
    // Clear the line, then leave; kill the client if the shell does not go.
    this.term.write('\x15exit\r');
    const timer = setTimeout(() => this.term.kill('SIGKILL'), 10_000);
    await this.exit;
    clearTimeout(timer);
  }
}

interface Gateway {
  proxy: RunningGateway;
  agent: RunningGateway;
  /** ssh_config written by `gwsh config` (ProxyCommand gwsh proxy ssh, KnownHostsCommand). */
  sshConfig: string;
}

/** The gateway: a Proxy (auth + proxy) and an agent with the SSH Service, joined with a token, on loopback; gwsh logged in. */
async function startGatewayPath(dir: string, started: (g: Partial<Gateway>) => void, daemonEnv: Record<string, string>): Promise<Gateway> {
  const webPort = await getPort({ host: PROXY_IP });
  const webAddr = `${PROXY_IP}:${webPort}`;
  const proxy = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-bench',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: bench.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${webAddr}`,
      `  public_addr: ${webAddr}`,
      '',
    ].join('\n'),
    { env: daemonEnv },
  );
  started({ proxy });
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await admin(['status'])).stdout)![1]!;
  const added = await admin(['users', 'add', 'bench', '--roles=access', '--logins=root'], `${PASSWORD}\n`);
  if (added.status !== 0) throw new Error(added.stderr);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
  const agent = await startGateway(['gateway:', '  nodename: web-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n'), {
    env: daemonEnv,
    args: ['--token', token, '--ca-pin', pin, '--proxy', webAddr],
  });
  started({ proxy, agent });
  await agent.waitForLog('reverse tunnel ready', 20_000);
  const gwshEnv = { HOME: dir, GWSH_HOME: join(dir, 'gwsh') };
  const login = await runCli('gwsh', ['login', `--proxy=${webAddr}`, '--user=bench', `--ca-pin=${pin}`], { env: gwshEnv, input: `${PASSWORD}\n` });
  if (login.status !== 0) throw new Error(login.stderr);
  const sshConfig = join(dir, 'gw_ssh_config');
  await writeFile(sshConfig, (await runCli('gwsh', ['config'], { env: gwshEnv })).stdout);
  return { proxy, agent, sshConfig };
}

/**
 * The peers' client side: an ECDSA P-256 user key authorized on both sshds, a known_hosts file with both host
 * keys, and an ssh_config that every ssh of theirs reads (`ssh -J` hands -F to the ssh it runs for the jump, but
 * not -i, -c or -o): same cipher on both hops, strict host key checking, no prompts.
 */
async function writePeerClient(dir: string, cipher: string, sshds: Sshd[]): Promise<string> {
  const userKey = join(dir, 'user_key');
  spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', userKey]);
  await writeFile(join(dir, 'authorized_keys'), readFileSync(`${userKey}.pub`, 'utf8'));
  const knownHosts = join(dir, 'known_hosts');
  await writeFile(knownHosts, sshds.map((s) => `${s.hostKeyLine}\n`).join(''));
  const config = join(dir, 'peer_ssh_config');
  await writeFile(
    config,
    [
      'Host *',
      `  IdentityFile ${userKey}`,
      '  IdentitiesOnly yes',
      `  UserKnownHostsFile ${knownHosts}`,
      '  GlobalKnownHostsFile /dev/null',
      '  StrictHostKeyChecking yes',
      '  BatchMode yes',
      `  Ciphers ${cipher}`,
      '',
    ].join('\n'),
  );
  return config;
}

/** gateway: gwsh's default (end to end with the agent); classic: the same with GWSH_E2E=off (the Proxy terminates the stream's TLS). */
const PATHS = ['gateway', 'classic', 'openssh', 'jump'] as const;
type PathName = (typeof PATHS)[number];

interface Measured {
  times: Record<PathName, number[]>;
  starts: Record<PathName, number[]>;
  /** End-to-end streams the Proxy logged over the run (the gateway path's sessions; the classic ones add none). */
  e2eStreams?: number;
}

/** ROUNDS rounds of a fresh session per path (the first path rotating), warm-up, then the timed keystrokes. */
async function measure(args: Record<PathName, string[]>, env: Record<PathName, Record<string, string>>, sessions: Session[]): Promise<Measured> {
  const times: Record<PathName, number[]> = { gateway: [], classic: [], openssh: [], jump: [] };
  const starts: Record<PathName, number[]> = { gateway: [], classic: [], openssh: [], jump: [] };
  const perRound = Math.ceil(KEYS / ROUNDS);
  for (let round = 0; round < ROUNDS; round++) {
    // Rotate which path goes first, so that none always follows the same one.
    const order = PATHS.map((_, i) => PATHS[(i + round) % PATHS.length]!);
    for (const name of order) {
      const session = new Session([...args[name]], env[name]);
      sessions.push(session);
      starts[name].push(await session.ready());
      await session.keystrokes(WARMUP);
      times[name].push(...(await session.keystrokes(perRound)));
      await session.close();
      sessions.pop();
    }
  }
  return { times, starts };
}

/** "end-to-end stream opened" lines in the agent's JSON log: one per session that went end to end. */
function e2eStreamsLogged(agentLog: string): number {
  return agentLog.split('\n').filter((l) => l.includes('"end-to-end stream opened"')).length;
}

/** The processes of one path's session and the order a keystroke crosses them (roles), there and back. */
interface TracePlan {
  procs: Traced[];
  chain: string[];
}

/** Who is who on each path, once its session is up: the ssh client's descendants, the daemons' and the sshds'. */
interface Daemons {
  proxy: number;
  agent: number;
  sshd: number;
  jump: number;
  proxyLogs: () => string;
  agentLogs: () => string;
}

/** The daemons' garbage collections, one stderr line each: "BENCH_GC <kind> <ms>" (kind: perf_hooks' NODE_PERFORMANCE_GC_* flags). */
const GC_PRELOAD = `const { PerformanceObserver } = require('node:perf_hooks');
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) process.stderr.write('BENCH_GC ' + e.detail.kind + ' ' + e.duration.toFixed(3) + '\\n');
}).observe({ entryTypes: ['gc'] });
`;

/** "n pauses (minor a, major b, incremental c), longest X ms, Y ms in all" from the BENCH_GC lines of a log. */
function gcSummary(log: string): string {
  const pauses = [...log.matchAll(/BENCH_GC (\d+) ([\d.]+)/g)].map((m) => ({ kind: Number(m[1]), ms: Number(m[2]) }));
  if (pauses.length === 0) return 'none';
  const count = (k: number) => pauses.filter((p) => p.kind === k).length;
  const ms = pauses.map((p) => p.ms);
  return `${pauses.length} (minor ${count(1)}, major ${count(4)}, incremental marking ${count(8)}), longest ${Math.max(...ms).toFixed(1)} ms, ${ms.reduce((a, b) => a + b, 0).toFixed(1)} ms in all`;
}

function tracePlan(name: PathName, session: Session, daemons: Daemons): TracePlan {
  const procs: Traced[] = [{ role: 'bench', pid: process.pid }, { role: 'ssh', pid: session.pid }];
  const under = (pid: number, role: (p: number) => string) => descendants(pid).forEach((p) => procs.push({ role: role(p), pid: p }));
  const sshChildren = descendants(session.pid).slice(1);
  const sshd = (p: number) => (commOf(p) === 'bash' ? 'bash' : 'sshd');
  if (name === 'gateway' || name === 'classic') {
    sshChildren.forEach((p) => procs.push({ role: 'gwsh', pid: p }));
    procs.push({ role: 'proxy', pid: daemons.proxy });
    under(daemons.agent, (p) => (p === daemons.agent ? 'agent' : 'bash'));
    return { procs, chain: ['bench', 'ssh', 'gwsh', 'proxy', 'agent', 'bash', 'agent', 'proxy', 'gwsh', 'ssh'] };
  }
  under(daemons.sshd, sshd);
  if (name === 'openssh') return { procs, chain: ['bench', 'ssh', 'sshd', 'bash', 'sshd', 'ssh'] };
  sshChildren.forEach((p) => procs.push({ role: 'ssh -W', pid: p }));
  under(daemons.jump, () => 'jump sshd');
  return { procs, chain: ['bench', 'ssh', 'ssh -W', 'jump sshd', 'sshd', 'bash', 'sshd', 'jump sshd', 'ssh -W', 'ssh'] };
}

/**
 * BENCH_TRACE: one more session per path, its keystrokes traced (bench/keytrace.ts): a summary (the time inside
 * processes against the time between them, per path), then the median, p90 and p99 of each hop, a table per path.
 */
async function traceHops(args: Record<PathName, string[]>, env: Record<PathName, Record<string, string>>, daemons: Daemons, sessions: Session[]): Promise<string[]> {
  const tables: string[] = [];
  const summary: string[] = [];
  let gc = '';
  for (const name of PATHS) {
    const session = new Session([...args[name]], env[name]);
    sessions.push(session);
    await session.ready();
    await session.keystrokes(WARMUP);
    const plan = tracePlan(name, session, daemons);
    const stop = await startTrace(plan.procs, join(tmpdir(), `gw-keytrace-${name}.txt`));
    const logsAt = [daemons.proxyLogs().length, daemons.agentLogs().length];
    await session.keystrokes(TRACE);
    if (name === 'gateway') gc = `Proxy ${gcSummary(daemons.proxyLogs().slice(logsAt[0]))}; agent ${gcSummary(daemons.agentLogs().slice(logsAt[1]))}`;
    const { labels, samples } = hops(await stop(), plan.chain);
    await session.close();
    sessions.pop();
    const p50 = labels.map((_, i) => percentile(samples.map((r) => r[i]!).sort((a, b) => a - b), 50));
    const p90 = labels.map((_, i) => percentile(samples.map((r) => r[i]!).sort((a, b) => a - b), 90));
    const p99 = labels.map((_, i) => percentile(samples.map((r) => r[i]!).sort((a, b) => a - b), 99));
    summary.push(tracedSummary(name, labels, p50));
    tables.push(
      '',
      `${name}, ${samples.length} of ${TRACE} traced keystrokes followed: ${plan.chain.join(' -> ')} -> bench`,
      '',
      '| hop | p50 (µs) | p90 (µs) | p99 (µs) |',
      '|---|---|---|---|',
      ...labels.map((l, i) => `| ${l} | ${p50[i]!.toFixed(0)} | ${p90[i]!.toFixed(0)} | ${p99[i]!.toFixed(0)} |`),
      '',
      slowest(labels, samples),
    );
  }
  return [
    `- Where a keystroke's time goes (BENCH_TRACE=${TRACE}: one more session per path, perf trace of the read/write calls of every process on it, ` +
      `each keystroke followed from process to process; "in X" is from X's read of the bytes to its write of them, "X -> Y" from X's write to ` +
      `Y's read, that is the kernel and waking Y. Tracing slows every call: compare the paths with each other, not with the table above). ` +
      `Medians, µs: ${summary.join('; ')}.`,
    `- Garbage collections in the daemons during the gateway's ${TRACE} traced keystrokes (each pause stops that process's event loop): ${gc}.`,
    ...tables,
  ];
}

/** The slowest 1% of keystrokes: which hop took most of each (its count, and the µs it took in them, summed). */
function slowest(labels: string[], samples: number[][]): string {
  const total = labels.indexOf('total');
  const worst = [...samples].sort((a, b) => b[total]! - a[total]!).slice(0, Math.max(1, Math.round(samples.length / 100)));
  const by = new Map<string, { n: number; us: number; of: number }>();
  for (const row of worst) {
    const i = row.reduce((best, v, k) => (k !== total && v > row[best]! ? k : best), 0);
    const e = by.get(labels[i]!) ?? { n: 0, us: 0, of: 0 };
    by.set(labels[i]!, { n: e.n + 1, us: e.us + row[i]!, of: e.of + row[total]! });
  }
  const parts = [...by].sort((a, b) => b[1].n - a[1].n).map(([l, e]) => `${l} in ${e.n} (${e.us.toFixed(0)} of their ${e.of.toFixed(0)} µs)`);
  return `The slowest ${worst.length} (from ${worst[worst.length - 1]![total]!.toFixed(0)} µs): the largest hop was ${parts.join(', ')}.`;
}

/** "path: total T, in processes I (role a, role b, ...), between processes B": the medians of each hop summed. */
function tracedSummary(name: PathName, labels: string[], p50: number[]): string {
  const inside = new Map<string, number>();
  let between = 0;
  labels.forEach((l, i) => {
    if (l === 'total') return;
    if (l.startsWith('in ')) inside.set(l.slice(3), (inside.get(l.slice(3)) ?? 0) + p50[i]!);
    else between += p50[i]!;
  });
  const sum = [...inside.values()].reduce((a, b) => a + b, 0);
  const parts = [...inside].map(([role, us]) => `${role} ${us.toFixed(0)}`).join(', ');
  return `${name} total ${p50[labels.indexOf('total')]!.toFixed(0)}, in processes ${sum.toFixed(0)} (${parts}, both ways), between processes ${between.toFixed(0)}`;
}

interface RunInfo {
  began: number;
  load0: number;
  load1: number;
  cipher: string;
  sshVersion: string;
}

/** The "## ssh" section: the table (one column per path, a ratio against each peer) and the notes. */
function formatSection(m: Measured, run: RunInfo, traced: string[]): string {
  const stats = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return { p50: percentile(s, 50), p99: percentile(s, 99), mean: s.reduce((a, b) => a + b, 0) / s.length, n: s.length };
  };
  const [g, c, o, j] = PATHS.map((p) => stats(m.times[p]));
  const [gs, cs, os, js] = PATHS.map((p) => median(m.starts[p]));
  const us = (ms: number) => (ms * 1000).toFixed(0);
  const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
  const row = (figure: string, a: number, cl: number, b: number, jd: number, fmt: (x: number) => string) =>
    `| ${figure} | ${fmt(a)} | ${fmt(cl)} | ${fmt(b)} | ${fmt(jd)} | ${ratio(a, b)} | ${ratio(a, jd)} | ${ratio(cl, jd)} |`;
  const cpu = cpus();
  const { began, load0, load1, cipher, sshVersion } = run;
  const goal = g!.p50 / j!.p50;
  return [
    '## ssh',
    '',
    `Run ${new Date(began).toISOString()} with \`npm run bench:ssh\` (${Math.round((Date.now() - began) / 1000)} s). ` +
      `One keystroke's round trip in an interactive pty session (\`ssh -tt\`, driven by node-pty: write one character, wait for the remote ` +
      `shell's echo; "x" and DEL alternate), ${g!.n} keystrokes per path over ${ROUNDS} sessions each (${WARMUP} warm-up keystrokes per session not counted), the paths taking turns. ` +
      `gateway: \`ssh -F <gwsh config> root@web-1\` -> ProxyCommand \`gwsh proxy ssh\` -> the Proxy daemon (auth + proxy) on ${PROXY_IP} (TLS, ALPN gateway-proxy-ssh) ` +
      `-> the agent's reverse tunnel (protocol v2: frames over mutual TLS) -> the agent daemon's SSH Service (ssh2) -> bash -l; all on loopback, no squid. ` +
      `OpenSSH (peer): ssh straight to ${sshVersion} \`sshd\` (own sshd_config) on ${SSHD_IP} -> bash -l. ` +
      `OpenSSH ssh -J (peer): \`ssh -J root@${JUMP_IP} root@${SSHD_IP}\`, ssh -> \`ssh -W\` -> a second sshd (own sshd_config, the jump host) on ${JUMP_IP} -> direct-tcpip -> the same sshd on ${SSHD_IP} -> bash -l. ` +
      `Same client (${sshVersion}), cipher ${cipher} (on both hops of ssh -J), ECDSA P-256 keys, login root on every path, host keys from known_hosts files (strict checking).`,
    `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}; ` +
      `load average ${load0.toFixed(2)} at the start, ${load1.toFixed(2)} at the end${Math.max(load0, load1) > cpu.length ? ' (other work shared the machine)' : ''}.`,
    '',
    '| figure | gateway | gateway classic (GWSH_E2E=off) | OpenSSH straight to sshd (peer) | OpenSSH ssh -J via a jump host (peer) | gateway / OpenSSH | gateway / OpenSSH ssh -J | gateway classic / OpenSSH ssh -J |',
    '|---|---|---|---|---|---|---|---|',
    row('keystroke round trip p50 (µs)', g!.p50, c!.p50, o!.p50, j!.p50, us),
    row('keystroke round trip p99 (µs)', g!.p99, c!.p99, o!.p99, j!.p99, us),
    row('keystroke round trip mean (µs)', g!.mean, c!.mean, o!.mean, j!.mean, us),
    row(`session start, spawn to first answer of the shell (ms, median of ${ROUNDS})`, gs!, cs!, os!, js!, (x) => x.toFixed(0)),
    '',
    `- Goals: keystroke round trip p50 at most 1.3x OpenSSH through a jump host (issue 29; issue 14 asked 1.0x): ${ratio(g!.p50, j!.p50)} with gwsh's default (end to end with the agent), ${goal <= 1.3 ? 'met' : 'not met'}; ${ratio(c!.p50, j!.p50)} on the classic route.`,
    `- gateway is gwsh's default: \`gwsh proxy ssh\` asks the Proxy for a grant and opens TLS with the agent through the Proxy's one port (ALPN gateway-e2e-v1); the Proxy splices the bytes onto a data connection the agent dialled; ` +
      `the run counted ${m.e2eStreams} end-to-end streams in the agent's log ("end-to-end stream opened"), one per gateway session (${ROUNDS} of them) and none for a classic one. gateway classic: the same ssh and gwsh with GWSH_E2E=off: TLS to the Proxy (ALPN gateway-proxy-ssh), framed into the tunnel's TLS.`,
    `- Ratios below 1 would mean the gateway is faster. The gateway's path has as many processes as ssh -J's, each in the same place: gwsh ` +
      `relaying stdin/stdout as the ProxyCommand where ssh -J has \`ssh -W\`, the Proxy where it has the jump host's sshd, the agent (its SSH ` +
      `Service) where it has the target's sshd; two of them are Node.js (JavaScript, an event loop) where ssh -J has C, and the third is Node.js ` +
      `where both have sshd. Encryption: the end-to-end SSH connection on every path; the gateway adds TLS from gwsh to the Proxy and the ` +
      `tunnel's TLS (protocol v2: frames over mutual TLS); ssh -J adds the outer SSH connection to the jump host.`,
    `- Session start includes, for the gateway, starting gwsh (Node) for the ProxyCommand and again for the KnownHostsCommand, and a ping of the Proxy; for ssh -J, a second ssh process and two SSH handshakes one after the other.`,
    `- One-off profiles (2026-11-25, load 2-3, not rerun by this script): \`perf sched record -a\` over 1000 traced keystrokes per path, ` +
      `and the V8 CPU profiler (bench:tunnel's preload, started by a signal) in gwsh, the Proxy and the agent over 2000. CPU of the main thread ` +
      `per keystroke (both ways): Proxy ~127 µs, agent ~141, gwsh ~95, plus ~25-50 in each one's other threads (V8's GC and compiler, ` +
      `libuv), against ~50 for each sshd and ~44 for each ssh of ssh -J; so the Node processes keep a core busy well after they have passed ` +
      `the bytes on (the traced "in X" is only from read to write). Of it, 50-60% is native socket writes (the TLS record and the write ` +
      `call, which on loopback also runs the receiver's TCP input), ssh2's packet work ~10% of the agent's, the rest Node's stream machinery; ` +
      `no JavaScript function of ours stands out. Wake-up to running, average: Proxy 80 µs, gwsh 63, agent 23, ssh 18, bash 16, sshd 20: ` +
      `with two cores, the busier a process the longer it waits for one. The p99 is not garbage collection: with V8's --trace-gc ` +
      `in both daemons (a preload through BENCH_DAEMON_NODE_OPTIONS), a whole run of 4 500 keystrokes saw one mark-compact (at start) and ` +
      `7-8 scavenges in each, far fewer than the 1% of keystrokes above 3 ms; the same holds for gwsh on bench:tunnel's user path (16 GC ` +
      `events, 45 of 2 000 round trips above 1 ms, spread irregularly). What is left is waiting: for a core, with four Node.js processes ` +
      `and ssh and bash on two (Node's average wake-up delay above is 3-5 times ssh's); neither --no-memory-reducer nor ` +
      `--max-semi-space-size=16 in the daemons changed it (two runs each). Warm-up matters: gwsh is a new process in every session, so ` +
      `its first keystrokes run code V8 has not compiled yet; with BENCH_WARMUP=1000 instead of 50 (one run each, load 1.5-1.7) p50 was ` +
      `353 against 412 µs (1.63x against 1.91x ssh -J) and p99 2.8 against 3.6 ms. The table keeps 50: a session starts cold.`,
    ...(traced.length > 0 ? traced : [`- Where a keystroke's time goes, process by process: not traced in this run (${HAS_PERF ? 'BENCH_TRACE=0' : 'perf is not installed'}; bench/keytrace.ts).`]),
    '',
  ].join('\n');
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('bench:ssh runs as root (it starts sshd and logs in as root)');
  const began = Date.now();
  const load0 = loadavg()[0]!;
  const require = createRequire(import.meta.url);
  const cipher = (require('ssh2/lib/protocol/constants.js') as { DEFAULT_CIPHER: string[] }).DEFAULT_CIPHER[0]!;
  const sshVersion = spawnSync('ssh', ['-V'], { encoding: 'utf8' }).stderr.trim().split(',')[0]!;
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-ssh-'));
  await chmod(dir, 0o700);
  const env = { PATH: process.env.PATH ?? '', HOME: dir, TERM: 'xterm', LANG: 'C.UTF-8' };
  let gw: Partial<Gateway> = {};
  const sshds: Sshd[] = [];
  const sessions: Session[] = [];
  try {
    // With BENCH_TRACE the daemons report their garbage collections (a preload: a PerformanceObserver of 'gc').
    const options = [DAEMON_OPTIONS];
    if (TRACE > 0) {
      await writeFile(join(dir, 'gc-preload.cjs'), GC_PRELOAD);
      options.push(`--require ${join(dir, 'gc-preload.cjs')}`);
    }
    const daemonEnv: Record<string, string> = options.join(' ').trim() ? { NODE_OPTIONS: options.join(' ').trim() } : {};
    const gateway = await startGatewayPath(dir, (g) => (gw = g), daemonEnv);
    // The peers: the target sshd and the jump host's, each with its own configuration.
    const target = await startSshd(dir, 'sshd', SSHD_IP);
    sshds.push(target);
    const jump = await startSshd(dir, 'jump', JUMP_IP);
    sshds.push(jump);
    const peerConfig = await writePeerClient(dir, cipher, sshds);
    const straight = ['-F', peerConfig, '-tt', '-p', String(target.port), `root@${SSHD_IP}`];
    const args: Record<PathName, string[]> = {
      gateway: ['-F', gateway.sshConfig, '-c', cipher, '-tt', 'root@web-1'],
      classic: ['-F', gateway.sshConfig, '-c', cipher, '-tt', 'root@web-1'],
      openssh: straight,
      jump: ['-F', peerConfig, '-J', `root@${JUMP_IP}:${jump.port}`, ...straight.slice(2)],
    };
    const envs: Record<PathName, Record<string, string>> = { gateway: env, classic: { ...env, GWSH_E2E: 'off' }, openssh: env, jump: env };
    const measured = await measure(args, envs, sessions);
    measured.e2eStreams = e2eStreamsLogged(gateway.agent.logs());
    // One per gateway session, none for a classic one: else a row would name a route its sessions did not take.
    if (measured.e2eStreams !== ROUNDS) throw new Error(`the agent logged ${measured.e2eStreams} end-to-end streams for ${ROUNDS} gateway sessions:\n${gateway.agent.logs().slice(-3000)}`);
    const daemons = { proxy: gateway.proxy.process.pid!, agent: gateway.agent.process.pid!, sshd: target.pid, jump: jump.pid, proxyLogs: () => gateway.proxy.logs(), agentLogs: () => gateway.agent.logs() };
    const traced = TRACE > 0 ? await traceHops(args, envs, daemons, sessions) : [];
    const section = formatSection(measured, { began, load0, load1: loadavg()[0]!, cipher, sshVersion }, traced);
    process.stdout.write(`\n${section}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('ssh', section);
  } finally {
    for (const s of sessions) await s.close().catch(() => undefined);
    await gw.agent?.stop();
    await gw.proxy?.stop();
    for (const s of sshds) await s.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
