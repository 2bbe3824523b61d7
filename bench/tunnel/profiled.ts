/**
 * BENCH_PROFILE=DIR: the user path's two profiled runs, after its measured ones. For each run the Proxy daemon, the
 * agent daemon and gwsh are restarted as `node --cpu-prof --cpu-prof-dir DIR/<run>/<role>` (real --cpu-prof:
 * each process writes its profile when it exits), warmed up, and then the measured window is timed with
 * process.hrtime (the profiles' clock) and written to DIR/<run>/run.json with each process's CPU over it (/proc)
 * and the measured run's CPU figures of every path (OpenSSH's sshd, ssh and squid beside ours):
 *
 *   userpath   one single-stream `iperf3 -c` run of BENCH_IPERF_SECONDS through `gwsh proxy app iperf` (end to end)
 *   connects   BENCH_CONNECTS new connections through `gwsh proxy app echo` (connect, one 64-byte echo, close)
 *
 * bench/profile-summary.ts reads the directory. Afterwards the daemons run again without the profiler.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { join, resolve } from 'node:path';
import { startGateway } from '../../test/helpers/gateway.js';
import { exited, median, sleep } from '../common.js';
import { cpuDelta, cpuSnapshot, type CpuProbe } from '../lib/proc.js';
import type { RunInfo } from '../profile-summary.js';
import { daemonEnv, startAgent, startGwshProxy, stopGateway, type LocalProxy } from './gateway.js';
import { connectAndEcho } from './measure.js';
import type { Ends, GatewayPath, Rig } from './paths.js';
import { runIperf3 } from './peers.js';
import { CONNECTS, IPERF_SECONDS } from './settings.js';
import { GW_USER, SSH_USER, type UserPathFigures } from './userpath.js';

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

/** One run: the processes started under the profiler, a warm-up, the window, run.json; then everything stopped. */
async function profiledRun(rig: Rig, ends: Ends, gw: GatewayPath, userHome: string, runDir: string, run: 'userpath' | 'connects', measured: RunInfo['measured']): Promise<void> {
  await restartDaemons(rig, ends, gw, runDir);
  const app = run === 'userpath' ? 'iperf' : 'echo';
  const gwsh = await startGwshProxy(userHome, rig.dir, app, {}, undefined, cpuProf(join(runDir, 'gwsh')));
  const probe: CpuProbe = {
    gwsh: () => [gwsh.process.pid!],
    'Proxy daemon': () => [rig.proxy!.process.pid!],
    'agent daemon': () => [rig.agent!.process.pid!],
    squid: () => [rig.squid!.pid],
    ...(run === 'userpath' ? { 'iperf3 -s': () => [rig.iperf!.pid] } : {}),
  };
  try {
    if (run === 'userpath') await runIperf3('127.0.0.1', gwsh.port, 1, 1);
    else for (let i = 0; i < 20; i++) await connectAndEcho('127.0.0.1', gwsh.port);
    await sleep(200);
    const before = { load: loadavg(), cpu: cpuSnapshot(probe), fromUs: hrUs() };
    let info: Partial<RunInfo>;
    if (run === 'userpath') {
      const res = await runIperf3('127.0.0.1', gwsh.port, 1, IPERF_SECONDS);
      info = { what: `one single-stream iperf3 run of ${IPERF_SECONDS} s through gwsh proxy app (end to end), ${(res.bitsPerSecond / 8 / 2 ** 20).toFixed(0)} MiB/s under the profiler`, gib: res.bytes / 2 ** 30 };
    } else {
      const times: number[] = [];
      for (let i = 0; i < CONNECTS; i++) times.push(await connectAndEcho('127.0.0.1', gwsh.port));
      info = { what: `${CONNECTS} new connections (connect, one 64-byte echo, close) through gwsh proxy app echo (end to end), median ${median(times).toFixed(2)} ms under the profiler`, connects: CONNECTS, connectMsMedian: median(times) };
    }
    const toUs = hrUs();
    const cpuSeconds = cpuDelta(before.cpu, probe);
    const full: RunInfo = { run, fromUs: before.fromUs, toUs, load: { before: before.load, after: loadavg() }, cpuSeconds, measured, measuredUnit: run === 'userpath' ? 'CPU s/GiB' : 'CPU ms per connection', what: '', ...info };
    await writeFile(join(runDir, 'run.json'), JSON.stringify(full, null, 1));
    rig.say(`profiled ${run}: ${full.what}`);
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
export async function profiledRuns(rig: Rig, ends: Ends, gw: GatewayPath, userHome: string, dir: string, user: UserPathFigures): Promise<void> {
  const root = resolve(dir);
  const pick = (m: Map<string, Record<string, number>>) => Object.fromEntries([GW_USER, SSH_USER].filter((p) => m.has(p)).map((p) => [p, m.get(p)!]));
  for (const run of ['userpath', 'connects'] as const) {
    const runDir = join(root, run);
    await mkdir(runDir, { recursive: true });
    await profiledRun(rig, ends, gw, userHome, runDir, run, pick(run === 'userpath' ? user.cpuPerGiB : user.connectCpu));
  }
  await restartDaemons(rig, ends, gw);
  rig.say(`profiles in ${root}: npx tsx bench/profile-summary.ts ${root}`);
}
