/**
 * BENCH_PROFILE=DIR: the user path's two profiled runs, after its measured ones. For each run the Proxy daemon, the
 * agent daemon and gwsh are restarted as `node --cpu-prof --cpu-prof-dir DIR/<run>/<role>` (real --cpu-prof:
 * each process writes its profile when it exits), warmed up, and then the measured window is timed with
 * process.hrtime (the profiles' clock) and written to DIR/<run>/run.json with each process's user and system CPU
 * over it, all threads and the main thread alone (/proc); then the same work through OpenSSH's `ssh -R` forward
 * (not profiled: sshd, ssh + socat and squid from /proc), and the measured run's CPU figures of both paths:
 *
 *   userpath   one single-stream `iperf3 -c` run of BENCH_IPERF_SECONDS through `gwsh proxy app iperf` (end to end)
 *   connects   BENCH_CONNECTS new connections through `gwsh proxy app echo` (connect, one 64-byte echo, close),
 *              then 50 more on each path, taking turns with 100 ms after each (medians only: paced)
 *   roundtrips 2 000 64-byte round trips on one connection through `gwsh proxy app echo`, after 2 000 unmeasured
 *              (the keystroke's chain of processes without ssh and sshd: bench:ssh has no profiler hook)
 *
 * bench/profile-summary.ts reads the directory. Afterwards the daemons run again without the profiler.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { startGateway } from '../../test/helpers/gateway.js';
import { echoOnce, exited, median, percentile, sleep } from '../common.js';
import { cpuSplit, processTree, splitDelta } from '../lib/proc.js';
import type { PathWindow, RunInfo } from '../profile-summary.js';
import { daemonEnv, startAgent, startGwshProxy, stopGateway, type LocalProxy } from './gateway.js';
import { connectAndEcho } from './measure.js';
import type { Ends, GatewayPath, OpenSshPath, Rig } from './paths.js';
import { runIperf3 } from './peers.js';
import { CONNECTS, IPERF_SECONDS, SSHD_IP } from './settings.js';
import { GW_USER, SSH_USER, type UserPathFigures } from './userpath.js';

/** bench:tunnel's profiled runs (RunInfo names bench:peer's too). */
type TunnelRun = 'userpath' | 'connects' | 'roundtrips';

const hrUs = () => Number(process.hrtime.bigint() / 1000n);
const cpuProf = (dir: string) => ['--cpu-prof', '--cpu-prof-dir', dir];

/** The daemons restarted, under --cpu-prof into runDir/<role> when runDir is given, else plain. */
async function restartDaemons(rig: Rig, ends: Ends, gw: GatewayPath, runDir?: string): Promise<void> {
  await stopGateway(rig.agent);
  rig.agent = undefined;
  await stopGateway(rig.proxy);
  rig.proxy = undefined;
  rig.proxy = await startGateway(gw.proxyYaml, { dataDir: gw.proxyDataDir, env: daemonEnv(), nodeArgs: runDir ? cpuProf(join(runDir, 'proxy')) : [] });
  rig.agent = (await startAgent(rig.proxy, gw.agentYaml, gw.agentDataDir, ends.squid, daemonEnv(), runDir ? cpuProf(join(runDir, 'agent')) : [])).agent;
}

/**
 * gwsh stopped so that --cpu-prof writes: SIGINT, then its own exit (it waits for its connections, which a Proxy's
 * linger may hold up to 30 s), SIGKILL only after 40 s (then its profile is missing, and the summary says so).
 */
async function stopProfiledGwsh(g: LocalProxy): Promise<void> {
  g.process.kill('SIGINT');
  const killer = setTimeout(() => g.process.kill('SIGKILL'), 40_000);
  await exited(g.process);
  clearTimeout(killer);
}

const ROUND_TRIPS = 2000;

/** A plain TCP connection to gwsh's listener (what the round trips use). */
function connected(host: string, port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host, port, noDelay: true }, () => resolve(s));
    s.once('error', reject);
  });
}

/** What comes before the window: one 1 s iperf3 run, 20 new connections, or ROUND_TRIPS round trips. */
async function warmUp(run: TunnelRun, host: string, port: number, echo: net.Socket | undefined): Promise<void> {
  if (run === 'userpath') await runIperf3(host, port, 1, 1);
  else if (run === 'connects') for (let i = 0; i < 20; i++) await connectAndEcho(host, port);
  else for (let i = 0; i < ROUND_TRIPS; i++) await echoOnce(echo!);
}

/** The window's work, through `through` (gwsh proxy app, or ssh -R's forward), and its words. */
async function measureWindow(run: TunnelRun, through: string, host: string, port: number, echo: net.Socket | undefined): Promise<Pick<RunInfo, 'what' | 'gib' | 'connects' | 'connectMsMedian'>> {
  if (run === 'userpath') {
    const res = await runIperf3(host, port, 1, IPERF_SECONDS);
    return { what: `one single-stream iperf3 run of ${IPERF_SECONDS} s through ${through}, ${(res.bitsPerSecond / 8 / 2 ** 20).toFixed(0)} MiB/s`, gib: res.bytes / 2 ** 30 };
  }
  const times: number[] = [];
  if (run === 'connects') {
    for (let i = 0; i < CONNECTS; i++) times.push(await connectAndEcho(host, port));
    return { what: `${CONNECTS} new connections (connect, one 64-byte echo, close) through ${through}, median ${median(times).toFixed(2)} ms`, connects: CONNECTS, connectMsMedian: median(times) };
  }
  for (let i = 0; i < ROUND_TRIPS; i++) times.push(await echoOnce(echo!));
  times.sort((a, b) => a - b);
  return { what: `${ROUND_TRIPS} 64-byte round trips on one connection through ${through}, p50 ${percentile(times, 50).toFixed(0)} µs, p99 ${percentile(times, 99).toFixed(0)} µs`, connects: ROUND_TRIPS };
}

/** A warm-up, then the window: its figures and the user / system CPU of each named set of processes over it. */
async function window(run: TunnelRun, through: string, host: string, port: number, procs: Record<string, number[]>): Promise<PathWindow & { fromUs: number; toUs: number }> {
  const echo = run === 'roundtrips' ? await connected(host, port) : undefined;
  try {
    await warmUp(run, host, port, echo);
    await sleep(200);
    const before = Object.fromEntries(Object.entries(procs).map(([k, pids]) => [k, cpuSplit(pids)]));
    const fromUs = hrUs();
    const info = await measureWindow(run, through, host, port, echo);
    const toUs = hrUs();
    const cpu = Object.fromEntries(Object.entries(procs).map(([k, pids]) => [k, splitDelta(before[k]!, cpuSplit(pids))]));
    return { ...info, cpu, fromUs, toUs };
  } finally {
    echo?.destroy();
  }
}

const PACED = 50;
const PACE_MS = 100;

/**
 * New connections with a pause after each, the two paths taking turns (PACED each): what a connection costs when
 * it starts on a quiet path, next to the back-to-back figures (OpenSSH's connect + echo there can stall for tens of
 * ms, bench/RESULTS.md, issue 29's profiles). Medians in ms.
 */
async function pacedConnects(gwshPort: number, sshEcho: number): Promise<{ gateway: number; openssh: number; pauseMs: number; count: number }> {
  const gateway: number[] = [];
  const openssh: number[] = [];
  for (let i = 0; i < PACED; i++) {
    gateway.push(await connectAndEcho('127.0.0.1', gwshPort));
    await sleep(PACE_MS);
    openssh.push(await connectAndEcho(SSHD_IP, sshEcho));
    await sleep(PACE_MS);
  }
  return { gateway: median(gateway), openssh: median(openssh), pauseMs: PACE_MS, count: PACED };
}

/** One run: the processes started under the profiler, the gateway's window, OpenSSH's, run.json; then ours stopped. */
async function profiledRun(rig: Rig, ends: Ends, gw: GatewayPath, ssh: OpenSshPath, userHome: string, runDir: string, run: TunnelRun, measured: RunInfo['measured']): Promise<void> {
  await restartDaemons(rig, ends, gw, runDir);
  const gwsh = await startGwshProxy(userHome, rig.dir, run === 'userpath' ? 'iperf' : 'echo', {}, undefined, cpuProf(join(runDir, 'gwsh')));
  try {
    const load0 = loadavg();
    const ours = await window(run, `gwsh proxy app ${run === 'userpath' ? 'iperf' : 'echo'} (end to end; Proxy, agent and gwsh under --cpu-prof)`, '127.0.0.1', gwsh.port, {
      gwsh: [gwsh.process.pid!],
      'Proxy daemon': [rig.proxy!.process.pid!],
      'agent daemon': [rig.agent!.process.pid!],
      squid: [rig.squid!.pid],
      ...(run === 'userpath' ? { 'iperf3 -s': [rig.iperf!.pid] } : {}),
    });
    const peer = rig.sshd && rig.ssh
      ? await window(run, "OpenSSH ssh -R's forward", SSHD_IP, run === 'userpath' ? ssh.fwd.iperf : ssh.fwd.echo, {
          sshd: processTree(rig.sshd.pid),
          'ssh + socat': processTree(rig.ssh.process.pid!),
          squid: [rig.squid!.pid],
          ...(run === 'userpath' ? { 'iperf3 -s': [rig.iperfSsh!.pid] } : {}),
        })
      : undefined;
    const paced = run === 'connects' && peer ? { paced: await pacedConnects(gwsh.port, ssh.fwd.echo) } : {};
    const full: RunInfo = { run, ...ours, load: { before: load0, after: loadavg() }, measured, measuredUnit: run === 'userpath' ? 'CPU s/GiB' : 'CPU ms per connection', ...(peer ? { peer } : {}), ...paced };
    await writeFile(join(runDir, 'run.json'), JSON.stringify(full, null, 1));
    rig.say(`profiled ${run}: ${full.what}${peer ? `; ${peer.what}` : ''}`);
  } finally {
    await stopProfiledGwsh(gwsh);
    // The daemons exit on SIGTERM, which writes their profiles.
    await stopGateway(rig.agent);
    rig.agent = undefined;
    await stopGateway(rig.proxy);
    rig.proxy = undefined;
  }
}

/** Both profiled runs into dir, then the daemons back without the profiler. */
export async function profiledRuns(rig: Rig, ends: Ends, gw: GatewayPath, ssh: OpenSshPath, userHome: string, dir: string, user: UserPathFigures): Promise<void> {
  const root = resolve(dir);
  const pick = (m: Map<string, Record<string, number>>) => Object.fromEntries([GW_USER, SSH_USER].filter((p) => m.has(p)).map((p) => [p, m.get(p)!]));
  for (const run of ['userpath', 'connects', 'roundtrips'] as const) {
    const runDir = join(root, run);
    await mkdir(runDir, { recursive: true });
    await profiledRun(rig, ends, gw, ssh, userHome, runDir, run, run === 'userpath' ? pick(user.cpuPerGiB) : run === 'connects' ? pick(user.connectCpu) : {});
  }
  await restartDaemons(rig, ends, gw);
  rig.say(`profiles in ${root}: npx tsx bench/profile-summary.ts ${root}`);
}
