/**
 * bench:ssh — the interactive round trip of one keystroke in a pty session, through the gateway and, as the
 * peers, OpenSSH straight to an sshd on the same machine and OpenSSH through a jump host (`ssh -J`, the path
 * users compare a gateway with):
 *
 *   gateway   `ssh -F <gwsh config> -tt root@web-1`: ProxyCommand `gwsh proxy ssh` -> TLS (ALPN
 *             gateway-proxy-ssh) to the Proxy daemon (auth + proxy, real `gateway start`, on PROXY_IP) -> the
 *             agent's reverse tunnel (SSH over TLS) -> the agent daemon's SSH Service (ssh2, real `gateway
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
 * Settings (environment): BENCH_KEYS (3000), BENCH_ROUNDS (3), BENCH_WARMUP (50 per session), BENCH_RECORD (0:
 * print the section only). Writes the figures, the ratios and the machine to bench/RESULTS.md (section "ssh").
 * Runs as root (sshd, and the login root on every path, so that no OS user has to be created).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import getPort from 'get-port';
import * as nodePty from 'node-pty';
import { runCli, startGateway, type RunningGateway } from '../test/helpers/gateway.js';
import { recordSection } from './record.js';
import { envNumber, spawnSshd } from './common.js';
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
const TRACE = envNumber('BENCH_TRACE', 0, 0);

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
const median = (xs: number[]) => percentile([...xs].sort((a, b) => a - b), 50);
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

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
async function startGatewayPath(dir: string, started: (g: Partial<Gateway>) => void): Promise<Gateway> {
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
  );
  started({ proxy });
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await admin(['status'])).stdout)![1]!;
  const added = await admin(['users', 'add', 'bench', '--roles=access', '--logins=root'], `${PASSWORD}\n`);
  if (added.status !== 0) throw new Error(added.stderr);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
  const agent = await startGateway(['gateway:', '  nodename: web-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n'), {
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

const PATHS = ['gateway', 'openssh', 'jump'] as const;
type PathName = (typeof PATHS)[number];

interface Measured {
  times: Record<PathName, number[]>;
  starts: Record<PathName, number[]>;
}

/** ROUNDS rounds of a fresh session per path (the first path rotating), warm-up, then the timed keystrokes. */
async function measure(args: Record<PathName, string[]>, env: Record<string, string>, sessions: Session[]): Promise<Measured> {
  const times: Record<PathName, number[]> = { gateway: [], openssh: [], jump: [] };
  const starts: Record<PathName, number[]> = { gateway: [], openssh: [], jump: [] };
  const perRound = Math.ceil(KEYS / ROUNDS);
  for (let round = 0; round < ROUNDS; round++) {
    // Rotate which path goes first, so that none always follows the same one.
    const order = PATHS.map((_, i) => PATHS[(i + round) % PATHS.length]!);
    for (const name of order) {
      const session = new Session([...args[name]], env);
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

/** The processes of one path's session and the order a keystroke crosses them (roles), there and back. */
interface TracePlan {
  procs: Traced[];
  chain: string[];
}

/** Who is who on each path, once its session is up: the ssh client's descendants, the daemons' and the sshds'. */
function tracePlan(name: PathName, session: Session, daemons: { proxy: number; agent: number; sshd: number; jump: number }): TracePlan {
  const procs: Traced[] = [{ role: 'bench', pid: process.pid }, { role: 'ssh', pid: session.pid }];
  const under = (pid: number, role: (p: number) => string) => descendants(pid).forEach((p) => procs.push({ role: role(p), pid: p }));
  const sshChildren = descendants(session.pid).slice(1);
  const sshd = (p: number) => (commOf(p) === 'bash' ? 'bash' : 'sshd');
  if (name === 'gateway') {
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
 * BENCH_TRACE: one more session per path, its keystrokes traced (bench/keytrace.ts): the median and p90 of each
 * hop (the time in each process, and between processes), as a table per path.
 */
async function traceHops(args: Record<PathName, string[]>, env: Record<string, string>, dir: string, daemons: Parameters<typeof tracePlan>[2], sessions: Session[]): Promise<string[]> {
  const lines: string[] = [];
  for (const name of PATHS) {
    const session = new Session([...args[name]], env);
    sessions.push(session);
    await session.ready();
    await session.keystrokes(WARMUP);
    const plan = tracePlan(name, session, daemons);
    const stop = await startTrace(plan.procs, join(tmpdir(), `gw-keytrace-${name}.txt`));
    await session.keystrokes(TRACE);
    const { labels, samples } = hops(await stop(), plan.chain);
    await session.close();
    sessions.pop();
    const col = (i: number) => samples.map((r) => r[i]!).sort((a, b) => a - b);
    lines.push(
      '',
      `${name} (${samples.length} of ${TRACE} keystrokes followed): ${plan.chain.join(' -> ')} -> bench`,
      '',
      '| hop | p50 (µs) | p90 (µs) |',
      '|---|---|---|',
      ...labels.map((l, i) => `| ${l} | ${percentile(col(i), 50).toFixed(0)} | ${percentile(col(i), 90).toFixed(0)} |`),
    );
  }
  return lines;
}

interface RunInfo {
  began: number;
  load0: number;
  load1: number;
  cipher: string;
  sshVersion: string;
}

/** The "## ssh" section: the table (one column per path, a ratio against each peer) and the notes. */
function formatSection(m: Measured, run: RunInfo): string {
  const stats = (xs: number[]) => {
    const s = [...xs].sort((a, b) => a - b);
    return { p50: percentile(s, 50), p99: percentile(s, 99), mean: s.reduce((a, b) => a + b, 0) / s.length, n: s.length };
  };
  const [g, o, j] = PATHS.map((p) => stats(m.times[p]));
  const [gs, os, js] = PATHS.map((p) => median(m.starts[p]));
  const us = (ms: number) => (ms * 1000).toFixed(0);
  const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
  const row = (figure: string, a: number, b: number, c: number, fmt: (x: number) => string) => `| ${figure} | ${fmt(a)} | ${fmt(b)} | ${fmt(c)} | ${ratio(a, b)} | ${ratio(a, c)} |`;
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
      `-> the agent's reverse tunnel (SSH over TLS) -> the agent daemon's SSH Service (ssh2) -> bash -l; all on loopback, no squid. ` +
      `OpenSSH (peer): ssh straight to ${sshVersion} \`sshd\` (own sshd_config) on ${SSHD_IP} -> bash -l. ` +
      `OpenSSH ssh -J (peer): \`ssh -J root@${JUMP_IP} root@${SSHD_IP}\`, ssh -> \`ssh -W\` -> a second sshd (own sshd_config, the jump host) on ${JUMP_IP} -> direct-tcpip -> the same sshd on ${SSHD_IP} -> bash -l. ` +
      `Same client (${sshVersion}), cipher ${cipher} (on both hops of ssh -J), ECDSA P-256 keys, login root on every path, host keys from known_hosts files (strict checking).`,
    `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}; ` +
      `load average ${load0.toFixed(2)} at the start, ${load1.toFixed(2)} at the end${Math.max(load0, load1) > cpu.length ? ' (other work shared the machine)' : ''}.`,
    '',
    '| figure | gateway | OpenSSH straight to sshd (peer) | OpenSSH ssh -J via a jump host (peer) | gateway / OpenSSH | gateway / OpenSSH ssh -J |',
    '|---|---|---|---|---|---|',
    row('keystroke round trip p50 (µs)', g!.p50, o!.p50, j!.p50, us),
    row('keystroke round trip p99 (µs)', g!.p99, o!.p99, j!.p99, us),
    row('keystroke round trip mean (µs)', g!.mean, o!.mean, j!.mean, us),
    row(`session start, spawn to first answer of the shell (ms, median of ${ROUNDS})`, gs!, os!, js!, (x) => x.toFixed(0)),
    '',
    `- Goal (issue 14): keystroke round trip p50 at most 1.0x OpenSSH through a jump host: ${ratio(g!.p50, j!.p50)}, ${goal <= 1 ? 'met' : 'not met'}.`,
    `- Ratios below 1 would mean the gateway is faster. The gateway's path has three more hops than OpenSSH straight to sshd (gwsh relaying stdin/stdout ` +
      `as the ProxyCommand, the Proxy, the agent) and three more layers of encryption (TLS from gwsh to the Proxy; the tunnel's SSH and the TLS ` +
      `under it), each hop a process or event-loop turn per keystroke each way; OpenSSH's path is ssh -> sshd -> bash. Through a jump host OpenSSH ` +
      `has two more hops (the \`ssh -W\` process relaying stdin/stdout, the jump host's sshd) and one more layer of encryption (the inner SSH connection inside the outer one).`,
    `- Session start includes, for the gateway, starting gwsh (Node) for the ProxyCommand and again for the KnownHostsCommand, and a ping of the Proxy; for ssh -J, a second ssh process and two SSH handshakes one after the other.`,
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
    const gateway = await startGatewayPath(dir, (g) => (gw = g));
    // The peers: the target sshd and the jump host's, each with its own configuration.
    const target = await startSshd(dir, 'sshd', SSHD_IP);
    sshds.push(target);
    const jump = await startSshd(dir, 'jump', JUMP_IP);
    sshds.push(jump);
    const peerConfig = await writePeerClient(dir, cipher, sshds);
    const straight = ['-F', peerConfig, '-tt', '-p', String(target.port), `root@${SSHD_IP}`];
    const args: Record<PathName, string[]> = {
      gateway: ['-F', gateway.sshConfig, '-c', cipher, '-tt', 'root@web-1'],
      openssh: straight,
      jump: ['-F', peerConfig, '-J', `root@${JUMP_IP}:${jump.port}`, ...straight.slice(2)],
    };
    if (TRACE > 0) {
      const daemons = { proxy: gateway.proxy.process.pid!, agent: gateway.agent.process.pid!, sshd: target.pid, jump: jump.pid };
      process.stdout.write(`${(await traceHops(args, env, dir, daemons, sessions)).join('\n')}\n`);
      return;
    }
    const measured = await measure(args, env, sessions);
    const section = formatSection(measured, { began, load0, load1: loadavg()[0]!, cipher, sshVersion });
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
