/**
 * bench:ssh — the interactive round trip of one keystroke in a pty session, through the gateway and, as the
 * peer, OpenSSH straight to an sshd on the same machine:
 *
 *   gateway   `ssh -F <gwsh config> -tt root@web-1`: ProxyCommand `gwsh proxy ssh` -> TLS (ALPN
 *             gateway-proxy-ssh) to the Proxy daemon (auth + proxy, real `gateway start`, on PROXY_IP) -> the
 *             agent's reverse tunnel (SSH over TLS) -> the agent daemon's SSH Service (ssh2, real `gateway
 *             start` with ssh_service) -> /bin/bash -l on a pty. Everything on loopback; no squid (the agent's
 *             leg through a CONNECT proxy is measured by bench:tunnel).
 *   OpenSSH   `ssh -tt root@SSHD_IP -p PORT` to Debian's sshd started here with its own sshd_config (authorized
 *             key, no PAM) -> bash -l on a pty.
 *
 * Both clients: OpenSSH's ssh, the same cipher (-c, ssh2's first choice), ECDSA P-256 user keys, driven by
 * node-pty as a terminal would: write one character, wait for the remote shell's echo (readline's), repeat. The
 * characters alternate between "x" and DEL, so the line stays short; both are keystrokes and both are timed.
 * BENCH_ROUNDS rounds, each opening a fresh session on each path (the time from spawning ssh to the first answer
 * of the shell is "session start"), then BENCH_KEYS / BENCH_ROUNDS keystrokes per path, paths alternating.
 *
 * Settings (environment): BENCH_KEYS (3000), BENCH_ROUNDS (3), BENCH_WARMUP (50 per session).
 * Writes the figures, the ratio and the machine to bench/RESULTS.md (section "ssh"). Runs as root (sshd, and
 * the login root on both paths, so that no OS user has to be created).
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


const KEYS = envNumber('BENCH_KEYS', 3000);
const ROUNDS = envNumber('BENCH_ROUNDS', 3);
const WARMUP = envNumber('BENCH_WARMUP', 50, 0);
const PROXY_IP = '127.0.0.7';
const SSHD_IP = '127.0.0.8';
const PASSWORD = 'correct horse battery';
const READY_TIMEOUT_MS = 30_000;
const KEY_TIMEOUT_MS = 10_000;

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
const median = (xs: number[]) => percentile([...xs].sort((a, b) => a - b), 50);
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null ? Promise.resolve() : new Promise((r) => child.once('exit', () => r()));
}

interface Sshd {
  port: number;
  hostKeyLine: string;
  stop(): Promise<void>;
}

async function startSshd(dir: string): Promise<Sshd> {
  // sshd refuses to start without its privilege separation directory (the package creates it at boot only).
  if (!existsSync('/run/sshd')) mkdirSync('/run/sshd', { mode: 0o755 });
  const hostKey = join(dir, 'sshd_host_key');
  const keygen = spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', hostKey], { encoding: 'utf8' });
  if (keygen.status !== 0) throw new Error(`ssh-keygen: ${keygen.stderr}`);
  const port = await getPort({ host: SSHD_IP });
  const cfg = join(dir, 'sshd_config');
  await writeFile(
    cfg,
    [
      `ListenAddress ${SSHD_IP}:${port}`,
      `HostKey ${hostKey}`,
      `AuthorizedKeysFile ${join(dir, 'authorized_keys')}`,
      `PidFile ${join(dir, 'sshd.pid')}`,
      'UsePAM no',
      'StrictModes no',
      'PermitRootLogin prohibit-password',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'X11Forwarding no',
      'PrintMotd no',
      'PrintLastLog no',
      'UseDNS no',
      '',
    ].join('\n'),
  );
  const child = await spawnSshd(cfg);
  const pub = readFileSync(`${hostKey}.pub`, 'utf8').trim().split(' ').slice(0, 2).join(' ');
  return {
    port,
    hostKeyLine: `[${SSHD_IP}]:${port} ${pub}`,
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
  let proxy: RunningGateway | undefined;
  let agent: RunningGateway | undefined;
  let sshd: Sshd | undefined;
  const sessions: Session[] = [];
  try {
    // The gateway: a Proxy (auth + proxy) and an agent with the SSH Service, joined with a token, on loopback.
    const webPort = await getPort({ host: PROXY_IP });
    const webAddr = `${PROXY_IP}:${webPort}`;
    proxy = await startGateway(
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
    const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy!.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
    const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await admin(['status'])).stdout)![1]!;
    const added = await admin(['users', 'add', 'bench', '--roles=access', '--logins=root'], `${PASSWORD}\n`);
    if (added.status !== 0) throw new Error(added.stderr);
    const token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
    agent = await startGateway(['gateway:', '  nodename: web-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n'), {
      args: ['--token', token, '--ca-pin', pin, '--proxy', webAddr],
    });
    await agent.waitForLog('reverse tunnel ready', 20_000);
    const gwshEnv = { HOME: dir, GWSH_HOME: join(dir, 'gwsh') };
    const login = await runCli('gwsh', ['login', `--proxy=${webAddr}`, '--user=bench', `--ca-pin=${pin}`], { env: gwshEnv, input: `${PASSWORD}\n` });
    if (login.status !== 0) throw new Error(login.stderr);
    const gwConfig = join(dir, 'gw_ssh_config');
    await writeFile(gwConfig, (await runCli('gwsh', ['config'], { env: gwshEnv })).stdout);

    // The peer: sshd with its own configuration, an ECDSA P-256 user key, a known_hosts file for it.
    sshd = await startSshd(dir);
    const userKey = join(dir, 'user_key');
    spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', userKey]);
    await writeFile(join(dir, 'authorized_keys'), readFileSync(`${userKey}.pub`, 'utf8'));
    await writeFile(join(dir, 'known_hosts'), `${sshd.hostKeyLine}\n`);

    const paths = {
      gateway: ['-F', gwConfig, '-c', cipher, '-tt', 'root@web-1'],
      openssh: [
        '-F',
        '/dev/null',
        '-i',
        userKey,
        '-o',
        'IdentitiesOnly=yes',
        '-o',
        `UserKnownHostsFile=${join(dir, 'known_hosts')}`,
        '-o',
        'StrictHostKeyChecking=yes',
        '-o',
        'BatchMode=yes',
        '-c',
        cipher,
        '-p',
        String(sshd.port),
        '-tt',
        `root@${SSHD_IP}`,
      ],
    } as const;
    type PathName = keyof typeof paths;
    const times: Record<PathName, number[]> = { gateway: [], openssh: [] };
    const starts: Record<PathName, number[]> = { gateway: [], openssh: [] };
    const perRound = Math.ceil(KEYS / ROUNDS);
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate which path goes first, so that neither always follows the other.
      const order: PathName[] = round % 2 === 0 ? ['gateway', 'openssh'] : ['openssh', 'gateway'];
      for (const name of order) {
        const session = new Session([...paths[name]], env);
        sessions.push(session);
        starts[name].push(await session.ready());
        await session.keystrokes(WARMUP);
        times[name].push(...(await session.keystrokes(perRound)));
        await session.close();
        sessions.pop();
      }
    }
    const load1 = loadavg()[0]!;

    const stats = (xs: number[]) => {
      const s = [...xs].sort((a, b) => a - b);
      return { p50: percentile(s, 50), p99: percentile(s, 99), mean: s.reduce((a, b) => a + b, 0) / s.length, n: s.length };
    };
    const g = stats(times.gateway);
    const o = stats(times.openssh);
    const us = (ms: number) => (ms * 1000).toFixed(0);
    const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}x`;
    const cpu = cpus();
    const section = [
      '## ssh',
      '',
      `Run ${new Date(began).toISOString()} with \`npm run bench:ssh\` (${Math.round((Date.now() - began) / 1000)} s). ` +
        `One keystroke's round trip in an interactive pty session (\`ssh -tt\`, driven by node-pty: write one character, wait for the remote ` +
        `shell's echo; "x" and DEL alternate), ${g.n} keystrokes per path over ${ROUNDS} sessions each (${WARMUP} warm-up keystrokes per session not counted), paths alternating. ` +
        `gateway: \`ssh -F <gwsh config> root@web-1\` -> ProxyCommand \`gwsh proxy ssh\` -> the Proxy daemon (auth + proxy) on ${PROXY_IP} (TLS, ALPN gateway-proxy-ssh) ` +
        `-> the agent's reverse tunnel (SSH over TLS) -> the agent daemon's SSH Service (ssh2) -> bash -l; all on loopback, no squid. ` +
        `OpenSSH (peer): ssh straight to ${sshVersion} \`sshd\` (own sshd_config) on ${SSHD_IP} -> bash -l. Same client (${sshVersion}), cipher ${cipher}, ECDSA P-256 keys, login root on both.`,
      `Machine: ${cpu[0]?.model ?? 'unknown CPU'}, ${cpu.length} cores, ${(totalmem() / 2 ** 30).toFixed(1)} GiB memory, Node ${process.version}; ` +
        `load average ${load0.toFixed(2)} at the start, ${load1.toFixed(2)} at the end${Math.max(load0, load1) > cpu.length ? ' (other work shared the machine)' : ''}.`,
      '',
      '| figure | gateway | OpenSSH straight to sshd (peer) | gateway / OpenSSH |',
      '|---|---|---|---|',
      `| keystroke round trip p50 (µs) | ${us(g.p50)} | ${us(o.p50)} | ${ratio(g.p50, o.p50)} |`,
      `| keystroke round trip p99 (µs) | ${us(g.p99)} | ${us(o.p99)} | ${ratio(g.p99, o.p99)} |`,
      `| keystroke round trip mean (µs) | ${us(g.mean)} | ${us(o.mean)} | ${ratio(g.mean, o.mean)} |`,
      `| session start, spawn to first answer of the shell (ms, median of ${ROUNDS}) | ${median(starts.gateway).toFixed(0)} | ${median(starts.openssh).toFixed(0)} | ${ratio(median(starts.gateway), median(starts.openssh))} |`,
      '',
      `- Ratios below 1 would mean the gateway is faster. The gateway's path has three more hops than OpenSSH's (gwsh relaying stdin/stdout ` +
        `as the ProxyCommand, the Proxy, the agent) and three more layers of encryption (TLS from gwsh to the Proxy; the tunnel's SSH and the TLS ` +
        `under it), each hop a process or event-loop turn per keystroke each way; OpenSSH's path is ssh -> sshd -> bash.`,
      `- Session start includes, for the gateway, starting gwsh (Node) for the ProxyCommand and again for the KnownHostsCommand, and a ping of the Proxy.`,
      '',
    ].join('\n');
    process.stdout.write(`\n${section}\n`);
    await recordSection('ssh', section);
  } finally {
    for (const s of sessions) await s.close().catch(() => undefined);
    await agent?.stop();
    await proxy?.stop();
    await sshd?.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
