/**
 * bench:userpath — the user path measured the way a user would by hand, beside bench:tunnel's own figure (issue 29
 * asks for both): no medians, no interleaving, no CPU probes, no -J; one plain run of each.
 *
 *   gateway    `iperf3 -c 127.0.0.1 -p <port>` (10 s, iperf3's default) -> `gwsh --debug proxy app iperf --port 0`
 *              -> the Proxy daemon (real `gateway start`) -> the agent daemon, joined through squid (HTTPS_PROXY)
 *              -> `iperf3 -s` (a tcp:// app). Twice: gwsh's default (end to end with the agent; the run is refused
 *              unless gwsh printed "end-to-end to agent") and GWSH_E2E=off (the classic route).
 *   OpenSSH    the same `iperf3 -c` -> the forward of `ssh -N -c aes128-gcm@openssh.com -o ProxyCommand="socat -
 *              PROXY:<squid>..." -R ...` (one forward, no -v: the command a user types) -> sshd -> `iperf3 -s`.
 *
 * Each path once with one stream and once with -P 8, in that order; Gbit/s is iperf3's own "receiver" line (its
 * text output, as a user reads it) and the ratio is against OpenSSH. The daemons, squid and sshd are started as
 * bench:tunnel starts them (bench/tunnel/paths.ts: the same configurations, addresses and names squid alone
 * resolves); nothing else of that bench is used.
 *
 * Settings: BENCH_USERPATH_SECONDS (iperf3's -t; unset: iperf3's default, 10 s), BENCH_RECORD (0: print only),
 * BENCH_USERPATH_E2E_ONLY=1 (the end-to-end path alone, printed, never recorded; with BENCH_DAEMON_NODE_OPTIONS="--require
 * <bench/lib/cpuprofile.ts's PROFILER_PRELOAD with its directory written in>", the Proxy is sent PROFILER_SIGNAL before and after
 * that path's two runs: its profile is of them alone).
 * Writes the section "userpath" of bench/RESULTS.md. Runs as root (sshd).
 */
import { spawn, spawnSync } from 'node:child_process';
import { chmod, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import getPort from 'get-port';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { runCli } from '../test/helpers/gateway.js';
import { exited, sleep } from './common.js';
import { recordSection } from './record.js';
import { startGwshProxy, type LocalProxy } from './tunnel/gateway.js';
import { startSshd } from './tunnel/peers.js';
import { PROFILER_SIGNAL } from './lib/cpuprofile.js';
import { cleanup, startEnds, startGatewayPath, type Rig } from './tunnel/paths.js';
import { PASSWORD, PROXY_IP, PROXY_NAME, SSHD_IP, SSHD_NAME, TARGET_IP } from './tunnel/settings.js';
import { routeTaken } from './tunnel/userpath.js';

const CIPHER = 'aes128-gcm@openssh.com';
const SECONDS = process.env.BENCH_USERPATH_SECONDS;
type Path = 'gateway end to end' | 'gateway classic' | 'OpenSSH ssh -R';

/** `iperf3 -c host -p port [-P n]` as typed; its receiver line's Gbit/s. */
async function iperf(port: number, host: string, streams: number): Promise<{ gbits: number; line: string }> {
  const args = ['-c', host, '-p', String(port), ...(streams > 1 ? ['-P', String(streams)] : []), ...(SECONDS ? ['-t', SECONDS] : [])];
  for (let attempt = 0; ; attempt++) {
    const child = spawn('iperf3', args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (out += c.toString()));
    await exited(child);
    // The server still winding the previous test up answers "busy": a user would run the command again.
    if (/busy/.test(out) && attempt < 20) {
      await sleep(500);
      continue;
    }
    const line = out.split('\n').filter((l) => l.includes('receiver')).at(-1);
    const m = line && /([\d.]+) ([KMG])bits\/sec/.exec(line);
    if (!m) throw new Error(`iperf3 ${args.join(' ')}: no receiver line:\n${out}`);
    const scale = { K: 1e-6, M: 1e-3, G: 1 }[m[2] as 'K' | 'M' | 'G'];
    return { gbits: Number(m[1]) * scale, line: line.trim() };
  }
}

/**
 * Resolves once something listens on host:port, read from `ss` (iproute2): a probe connection to the forward would
 * reach `iperf3 -s` through the tunnel and leave it a control connection that closed at once.
 */
async function listening(host: string, port: number): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (spawnSync('ss', ['-Hltn', `src ${host}:${port}`], { encoding: 'utf8' }).stdout.trim()) return;
    await sleep(20);
  }
  throw new Error(`nothing listens on ${host}:${port}`);
}

/** `ssh -N -R` through squid with socat as ProxyCommand, as a user types it; resolves once the forward accepts. */
async function sshR(dir: string, squid: { host: string; port: number }, sshdPort: number, listen: number, to: number) {
  const child = spawn(
    'ssh',
    ['-N', '-F', '/dev/null', '-i', join(dir, 'user_key'), '-o', 'BatchMode=yes', '-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null',
      '-o', `ProxyCommand=socat - PROXY:${squid.host}:%h:%p,proxyport=${squid.port}`, '-c', CIPHER, '-p', String(sshdPort),
      '-R', `${SSHD_IP}:${listen}:${TARGET_IP}:${to}`, `root@${SSHD_NAME}`],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  child.stderr!.on('data', (c: Buffer) => (log = (log + c.toString()).slice(-4000)));
  await Promise.race([listening(SSHD_IP, listen), exited(child).then(() => Promise.reject(new Error(`ssh -R exited: ${log}`)))]);
  return { child, log: () => log };
}

/** The section: one table (Gbit/s per path and stream count, ratios against OpenSSH) and what ran. */
function section(r: Map<string, number>, lines: string[], load: number[]): string {
  const g = (p: Path, s: number) => r.get(`${p} ${s}`)!;
  const row = (s: number) =>
    `| iperf3 ${s === 1 ? '1 stream' : `-P ${s}`} (Gbit/s, receiver) | ${g('gateway end to end', s).toFixed(2)} | ${g('gateway classic', s).toFixed(2)} | ${g('OpenSSH ssh -R', s).toFixed(2)} | ` +
    `${(g('gateway end to end', s) / g('OpenSSH ssh -R', s)).toFixed(2)}x | ${(g('gateway classic', s) / g('OpenSSH ssh -R', s)).toFixed(2)}x |`;
  return [
    '## userpath',
    '',
    `Run ${new Date().toISOString()} with \`npm run bench:userpath\`: the user path by hand, one run of each, ${SECONDS ? `${SECONDS} s` : "10 s (iperf3's default)"} per run, in this order: ` +
      'end to end 1 stream, -P 8; classic 1 stream, -P 8; OpenSSH 1 stream, -P 8. ' +
      `\`iperf3 -c 127.0.0.1 -p <port>\` -> \`gwsh proxy app iperf\` (gwsh's default: end to end with the agent, checked from its --debug line; then GWSH_E2E=off: the classic route) -> the Proxy on ${PROXY_IP} -> ` +
      `the agent joined through squid to ${PROXY_NAME} -> \`iperf3 -s\` on ${TARGET_IP}; peer: \`iperf3 -c ${SSHD_IP} -p <forward>\` -> \`ssh -N -c ${CIPHER} -o ProxyCommand="socat - PROXY:..." -R\` through the same squid -> its own \`iperf3 -s\`. ` +
      `Load average (1/5/15 min) at the start ${load.slice(0, 3).map((n) => n.toFixed(2)).join('/')}, at the end ${load.slice(3).map((n) => n.toFixed(2)).join('/')}.`,
    '',
    '| figure | gateway | gateway classic | OpenSSH ssh -R (peer) | gateway / OpenSSH | gateway classic / OpenSSH |',
    '|---|---|---|---|---|---|',
    row(1),
    row(8),
    '',
    `- iperf3's receiver lines: ${lines.map((l) => `\`${l.replace(/\s+/g, ' ')}\``).join('; ')}.`,
    '',
  ].join('\n');
}

/** One path: 1 stream then -P 8; the receiver lines kept for the section. */
async function measure(name: Path, host: string, port: number, results: Map<string, number>, lines: string[]): Promise<void> {
  for (const streams of [1, 8]) {
    const { gbits, line } = await iperf(port, host, streams);
    results.set(`${name} ${streams}`, gbits);
    lines.push(`${name}, ${streams === 1 ? '1 stream' : '-P 8'}: ${line}`);
    process.stdout.write(`${name}, ${streams} stream(s): ${gbits.toFixed(2)} Gbit/s\n`);
  }
}

async function main(): Promise<void> {
  const load0 = loadavg();
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-userpath-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n${SSHD_IP} ${SSHD_NAME}\n`, { mode: 0o644 });
  const rig: Rig = { dir, say: (s) => process.stdout.write(`${s}\n`), gwshProxies: [], servers: [], track: { holders: [] } };
  let ssh: Awaited<ReturnType<typeof sshR>> | undefined;
  try {
    const ends = await startEnds(rig);
    const gw = await startGatewayPath(rig, ends);
    const userHome = join(dir, 'gwsh-user');
    const login = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${gw.webPort}`, '--user=bench', `--ca-pin=${gw.pin}`], { env: { HOME: dir, GWSH_HOME: userHome }, input: `${PASSWORD}\n` });
    if (login.status !== 0) throw new Error(`gwsh login: ${login.stderr}`);
    const results = new Map<string, number>();
    const lines: string[] = [];
    const e2eOnly = process.env.BENCH_USERPATH_E2E_ONLY === '1';
    for (const [name, env] of [['gateway end to end', {}], ['gateway classic', { GWSH_E2E: 'off' }]] as const) {
      if (e2eOnly && name !== 'gateway end to end') return;
      const g: LocalProxy = await startGwshProxy(userHome, dir, 'iperf', env);
      rig.gwshProxies.push(g);
      if (e2eOnly) rig.proxy!.process.kill(PROFILER_SIGNAL);
      await measure(name, '127.0.0.1', g.port, results, lines);
      if (e2eOnly) rig.proxy!.process.kill(PROFILER_SIGNAL);
      const want = name === 'gateway end to end' ? 'e2e' : 'classic';
      if (routeTaken(g.output()) !== want) throw new Error(`${name}: gwsh took another route:\n${g.output().slice(-3000)}`);
    }
    // sshd with bench:tunnel's configuration (bench/tunnel/peers.ts), ECDSA P-256 keys, and the user's own ssh -R.
    for (const key of ['host_key', 'user_key']) spawnSync('ssh-keygen', ['-q', '-t', 'ecdsa', '-b', '256', '-N', '', '-f', join(dir, key)]);
    await writeFile(join(dir, 'authorized_keys'), await readFile(join(dir, 'user_key.pub')));
    const sshd = (rig.sshd = await startSshd(dir));
    const forward = await getPort({ host: SSHD_IP, exclude: [sshd.port] });
    ssh = await sshR(dir, ends.squid, sshd.port, forward, ends.iperfSsh.port);
    await measure('OpenSSH ssh -R', SSHD_IP, forward, results, lines).catch((err: Error) => Promise.reject(new Error(`${err.message}\nssh: ${ssh!.log()}`)));
    const text = section(results, lines, [...load0, ...loadavg()]);
    process.stdout.write(`\n${text}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('userpath', text);
  } finally {
    if (ssh && ssh.child.exitCode === null) {
      ssh.child.kill();
      await exited(ssh.child);
    }
    await cleanup(rig);
  }
}

await main();
