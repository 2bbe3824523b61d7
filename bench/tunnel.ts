/**
 * bench:tunnel — the gateway's reverse tunnel through a real squid, against two baselines measured in the same run:
 *
 *   raw TCP    client -> sink/echo server on 127.0.0.3 (the floor)
 *   gateway    client (this process: openResource, TLS with ALPN gateway-tcp and a gwsh profile) -> Proxy daemon
 *              (auth + proxy, real `gateway start`) -> the agent's reverse tunnel (protocol v2: frames over mutual TLS,
 *              over squid CONNECT; the section names what the two negotiated)
 *              -> agent daemon (real `gateway start`, app_service with tcp:// apps) -> sink/echo
 *   OpenSSH    client -> sshd (own config, 127.0.0.4) -> `ssh -N -R` (ProxyCommand socat PROXY: through the same
 *              squid) -> sink/echo. The peer.
 *
 * In both tunnels only the agent's leg goes through squid; the client reaches the Proxy / sshd directly. Both SSH
 * connections use the same cipher (ssh2's first choice on this machine, passed to ssh with -c) and ECDSA P-256
 * keys. The agent dials a Proxy name (proxy.gw.test) and ssh dials an sshd name (sshd.gw.test) that only squid's
 * hosts file resolves, so both tunnels really use the CONNECT proxy.
 *
 * Figures:
 *   throughput        BENCH_MIB MiB pushed on one stream until the sink has them all (median of BENCH_RUNS, paths
 *                     interleaved run by run), and BENCH_STREAMS parallel streams carrying BENCH_MIB MiB together
 *                     (aggregate MiB/s, median of BENCH_RUNS)
 *   round trip        64 bytes written and echoed back over one established stream, BENCH_RTTS samples (p50, p99)
 *   CPU per GiB       user+system CPU of every process on the path (from /proc) during the single-stream runs
 *   tunnel ready      from spawning the agent daemon (stored identity, no token) to its "reverse tunnel ready" log
 *                     line (and the Proxy's "agent connected"); for OpenSSH from spawning ssh to both "remote
 *                     forward success" lines. Median of BENCH_STARTS.
 *   user path         what a user runs: `iperf3 -c` -> a real `gwsh proxy app iperf` process (its own profile,
 *                     signed in to the Proxy's listen address) -> Proxy -> tunnel through squid -> agent -> `iperf3
 *                     -s` (a tcp:// app), against `iperf3 -c` -> a third forward of the same `ssh -R` -> `iperf3 -s`
 *                     (a second server: one per path). iperf3's sum_received (-J) for 1 and BENCH_STREAMS streams,
 *                     BENCH_RUNS runs of BENCH_IPERF_SECONDS alternating the paths (median), CPU seconds per GiB of
 *                     every process of each path, round trips through `gwsh proxy app echo`, and BENCH_CONNECTS new
 *                     connections (connect, one echo, close). With BENCH_PROFILE, gwsh under the sampler for a run.
 *   idle memory       a fresh Proxy daemon (its open-file limit raised to the hard limit, max_connections written);
 *                     BENCH_AGENTS host identities joined with one multi-use token through POST /webapi/join, then
 *                     as many TunnelAgent instances connected (direct, not through squid: what is measured is the
 *                     Proxy), all in BENCH_AGENT_PROCS child processes (bench/tunnel/idle-agents.ts, each from its
 *                     own loopback source addresses); the Proxy's VmRSS before and at a quarter, half
 *                     and all of them connected and idle: per agent overall and over the second half (which leaves
 *                     out what the joins left in the heap), at half and at all; then the Proxy's CPU over
 *                     BENCH_IDLE_CPU_SECS with every agent idle (heartbeats, presence refreshes) and its memory
 *                     once more after that time (V8's memory reducer gives back the pages the connection storm
 *                     left once the process is idle: the steady figure).
 *   profile           (BENCH_PROFILE=1, the default) the Proxy and the agent restarted under the V8 sampling
 *                     profiler (what --cpu-prof uses; started by a preload, see PROFILER_PRELOAD), one
 *                     single-stream run of BENCH_PROFILE_MIB MiB and 2 000 round trips; the heaviest self-time
 *                     frames of each are recorded. Its figures are not the measured ones.
 *   profiled runs     (BENCH_PROFILE=DIR) after the user path's measured runs, the Proxy, the agent and gwsh
 *                     restarted as `node --cpu-prof --cpu-prof-dir DIR/<run>/<role>` for one single-stream iperf3
 *                     run (DIR/userpath), for BENCH_CONNECTS new connections (DIR/connects) and for 2 000 round
 *                     trips on one connection (DIR/roundtrips), each window timed into DIR/<run>/run.json with
 *                     every process's user and system CPU from /proc, then the same work through OpenSSH's forward
 *                     (bench/tunnel/profiled.ts); read them with `npx tsx bench/profile-summary.ts DIR`. Printed,
 *                     not recorded.
 *
 * Settings (environment): BENCH_MIB (512), BENCH_RUNS (3), BENCH_STREAMS (8), BENCH_RTTS (5000), BENCH_RTT_WARMUP (5000), BENCH_STARTS (3),
 * BENCH_AGENTS (10000), BENCH_AGENT_PROCS (2), BENCH_IDLE_CPU_SECS (60: the idle Proxy's CPU over this long, 0: not
 * read), BENCH_IPERF_SECONDS (10, iperf3's default), BENCH_CONNECTS (50),
 * BENCH_PROFILE (1; 0: no profiles; a directory DIR: also the user path's profiled runs, below), BENCH_PROFILE_MIB (256), BENCH_PROFILE_KEEP (a directory to copy the .cpuprofile files to, for Chrome DevTools),
 * BENCH_TUNNEL_ONLY (userpath: set up, run the user path and print it; idle: the idle-memory phase alone; neither is
 * recorded; metrics: the cost of metrics on the data path, off and on in one run, recorded as the section tunnel-metrics,
 * BENCH_METRICS_RUNS runs each, 5 by default: bench/tunnel/metrics.ts), BENCH_IDLE_PROFILE (a directory: the idle Proxy profiled while the last half of the agents connect),
 * BENCH_IDLE_HEAPSNAPSHOT (a directory: the idle Proxy's V8 heap snapshot after each of its full gcs),
 * BENCH_GWSH_BEFORE (another build's gwsh.js, e.g. a copy of dist/ kept inside the repository: run as a third path
 * of the user path, for before/after figures in one run; printed, not recorded), BENCH_GWSH_NODE_OPTIONS (NODE_OPTIONS of the user path's gwsh processes, e.g. a preload; printed runs), BENCH_DAEMON_NODE_OPTIONS (Node options for the data path's Proxy and
 * agent daemons, e.g. "--max-semi-space-size=32"; recorded in the section when set), BENCH_DAEMON_GLIBC_TUNABLES (glibc
 * malloc settings for the same daemons, passed as GLIBC_TUNABLES; recorded when set), BENCH_RECORD (0: print the
 * section, do not write bench/RESULTS.md).
 *
 * This file is the order of the phases; each concern has its file under bench/tunnel/: settings.ts (the environment
 * above), paths.ts (the path setups and their cleanup), gateway.ts (the gateway's daemons and gwsh), peers.ts (sink,
 * OpenSSH, iperf3), measure.ts (throughput, round trips), userpath.ts, idle.ts and idle-agents.ts (the idle-memory
 * phase and its child processes), report.ts (the section); bench/lib/proc.ts reads CPU and memory from /proc,
 * bench/lib/cpuprofile.ts the profiles.
 *
 * Writes the figures, ratios and the machine to bench/RESULTS.md (section "tunnel"). Runs as root (sshd; creates
 * /run/sshd if missing). sshd uses GatewayPorts clientspecified so that the forwards listen on 127.0.0.4 only.
 */
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { chmod, copyFile, mkdir, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger, setRootLogger } from '../src/log.js';
import { runCli, startGateway } from '../test/helpers/gateway.js';
import { median, sleep } from './common.js';
import { newestProfile, PROFILER_PRELOAD, PROFILER_SIGNAL, summarizeProfile, type ProfileSummary } from './lib/cpuprofile.js';
import { cpuDelta, cpuSnapshot, processTree, type CpuProbe } from './lib/proc.js';
import { recordSection } from './record.js';
import { measureTlsFloor } from './tlsfloor.js';
import { profilerEnv, startAgent, startGwshProxy, stopGateway, type LocalProxy } from './tunnel/gateway.js';
import { profiledRuns } from './tunnel/profiled.js';
import { measureMetricsCost, metricsSection } from './tunnel/metrics.js';
import { idleMemoryRows, idleMemoryText, measureIdleMemory, type IdleMemory } from './tunnel/idle.js';
import { roundTrips, throughputOnce } from './tunnel/measure.js';
import { cleanup, dataPaths, startEnds, startGatewayPath, startOpenSshPath, stopDaemons, type Ends, type GatewayPath, type OpenSshPath, type Rig } from './tunnel/paths.js';
import { runIperf3, type CountingSink } from './tunnel/peers.js';
import { tunnelSection, type DataPathFigures, type PathName } from './tunnel/report.js';
import { AGENTS, GWSH_BEFORE, IPERF_SECONDS, MIB, ONLY, PASSWORD, PROFILE, PROFILE_DIR, PROFILE_MIB, PROXY_IP, PROXY_NAME, RTTS, RUNS, SSHD_IP, SSHD_NAME, STREAMS, TLS_FLOOR_CONNECTIONS } from './tunnel/settings.js';
import { CLASSIC_USER, GW_USER, measureUserPath, routeTaken, userPathRows, userPathText, type UserPathFigures, type UserPathName, type UserPathRoute } from './tunnel/userpath.js';

// The agents of the memory test log errors only (1 000 "reverse tunnel ready" and "closed" lines otherwise).
setRootLogger(createLogger({ level: 'error' }));

/**
 * The user's path: iperf3 -> gwsh proxy app -> ... against iperf3 -> ssh -R's forward. gwsh signs in to the Proxy's
 * listen address (its certificate names it), as a user on the Proxy's network would: the client leg goes straight
 * to the Proxy, as ssh -R's client leg goes straight to sshd's forward.
 */
async function userPathPhase(rig: Rig, ends: Ends, gw: GatewayPath, ssh: OpenSshPath): Promise<{ user: UserPathFigures; gwshProfile: ProfileSummary | undefined }> {
  const { dir } = rig;
  const userHome = join(dir, 'gwsh-user');
  const userLogin = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${gw.webPort}`, '--user=bench', `--ca-pin=${gw.pin}`], { env: { HOME: dir, GWSH_HOME: userHome }, input: `${PASSWORD}\n` });
  if (userLogin.status !== 0) throw new Error(`gwsh login: ${userLogin.stderr}`);
  const gwshIperf = await startGwshProxy(userHome, dir, 'iperf');
  const gwshEcho = await startGwshProxy(userHome, dir, 'echo');
  const classic = [await startGwshProxy(userHome, dir, 'iperf', { GWSH_E2E: 'off' }), await startGwshProxy(userHome, dir, 'echo', { GWSH_E2E: 'off' })] as const;
  rig.gwshProxies.push(gwshIperf, gwshEcho, ...classic);
  const userRoutes: UserPathRoute[] = [
    {
      name: 'gateway (gwsh proxy app)',
      iperf: { host: '127.0.0.1', port: gwshIperf.port },
      echo: { host: '127.0.0.1', port: gwshEcho.port },
      cpu: { ...gatewayCpu(rig), gwsh: () => [gwshIperf.process.pid!, gwshEcho.process.pid!] },
    },
    {
      name: CLASSIC_USER,
      iperf: { host: '127.0.0.1', port: classic[0].port },
      echo: { host: '127.0.0.1', port: classic[1].port },
      cpu: { ...gatewayCpu(rig), gwsh: () => classic.map((g) => g.process.pid!) },
    },
    {
      name: 'OpenSSH ssh -R',
      iperf: { host: SSHD_IP, port: ssh.fwd.iperf },
      echo: { host: SSHD_IP, port: ssh.fwd.echo },
      cpu: { sshd: () => processTree(rig.sshd!.pid), squid: () => [rig.squid!.pid], 'ssh + socat': () => processTree(rig.ssh!.process.pid!), 'iperf3 -s': () => [rig.iperfSsh!.pid] },
    },
  ];
  if (GWSH_BEFORE) {
    const before = [await startGwshProxy(userHome, dir, 'iperf', {}, GWSH_BEFORE), await startGwshProxy(userHome, dir, 'echo', {}, GWSH_BEFORE)];
    rig.gwshProxies.push(...before);
    userRoutes.push({
      ...userRoutes[0]!,
      name: 'gateway (BENCH_GWSH_BEFORE)',
      iperf: { host: '127.0.0.1', port: before[0]!.port },
      echo: { host: '127.0.0.1', port: before[1]!.port },
      cpu: { ...userRoutes[0]!.cpu, gwsh: () => before.map((g) => g.process.pid!) },
    });
  }
  const user = await measureUserPath(userRoutes, rig.say);
  checkRoutes({ e2e: [gwshIperf, gwshEcho], classic: [...classic] }, rig.say);
  if (GWSH_BEFORE) sayBeforeAfter(user, rig.say);
  const gwshProfile = PROFILE ? await profileGwsh(rig, gwshIperf, userHome) : undefined;
  if (PROFILE_DIR) await profiledRuns(rig, ends, gw, ssh, userHome, PROFILE_DIR, user);
  for (const g of rig.gwshProxies.splice(0)) await g.stop();
  return { user, gwshProfile };
}

/** The CPU probes of the gateway's user path but gwsh's. */
function gatewayCpu(rig: Rig): CpuProbe {
  return {
    'Proxy daemon': () => [rig.proxy!.process.pid!],
    squid: () => [rig.squid!.pid],
    'agent daemon': () => [rig.agent!.process.pid!],
    'iperf3 -s': () => [rig.iperf!.pid],
  };
}

/**
 * Each gwsh's connections took the route its row names (its --debug lines): a fallback to the classic route under
 * gwsh's default would pass classic figures for end-to-end ones. Throws with gwsh's own words (the reason) if not.
 */
function checkRoutes(gwsh: { e2e: LocalProxy[]; classic: LocalProxy[] }, say: (s: string) => void): void {
  for (const [want, procs] of [['e2e', gwsh.e2e], ['classic', gwsh.classic]] as const) {
    for (const g of procs) {
      const got = routeTaken(g.output());
      if (got !== want) throw new Error(`the user path's ${want} gwsh took the ${got} route:\n${g.output().slice(-3000)}`);
    }
  }
  say('user path routes: every end-to-end gwsh connection said "end-to-end to agent", no GWSH_E2E=off one did');
}

/** BENCH_GWSH_BEFORE: this build's gwsh against the other one, printed. */
function sayBeforeAfter(user: UserPathFigures, say: (s: string) => void): void {
  const total = (p: UserPathName) => Object.values(user.cpuPerGiB.get(p)!).reduce((a, b) => a + b, 0);
  for (const p of [GW_USER, 'gateway (BENCH_GWSH_BEFORE)'] as const) {
    say(`${p}: gwsh ${user.cpuPerGiB.get(p)!.gwsh!.toFixed(3)} CPU-s/GiB, ${user.connectCpu.get(p)!.gwsh!.toFixed(2)} CPU-ms per connection, path ${total(p).toFixed(2)}; MiB/s 1 stream ${user.rates.get(1)!.get(p)!.map((r) => (r / 8.388608).toFixed(0)).join(' ')}, ${STREAMS} streams ${user.rates.get(STREAMS)!.get(p)!.map((r) => (r / 8.388608).toFixed(0)).join(' ')}; rtt p50 ${user.rtt.get(p)!.p50.toFixed(1)} µs; connect ${median(user.connect.get(p)!).toFixed(2)} ms`);
  }
}

/** gwsh again under the sampler, for one single-stream iperf3 run (started after a warm-up run). */
async function profileGwsh(rig: Rig, gwshIperf: LocalProxy, userHome: string): Promise<ProfileSummary | undefined> {
  const { dir } = rig;
  await gwshIperf.stop();
  const profDir = join(dir, 'prof-gwsh');
  const preload = join(dir, 'profiler.cjs');
  await writeFile(preload, PROFILER_PRELOAD);
  const profiled = await startGwshProxy(userHome, dir, 'iperf', { NODE_OPTIONS: `--require ${preload}`, BENCH_CPU_PROF_DIR: profDir });
  rig.gwshProxies.push(profiled);
  await runIperf3('127.0.0.1', profiled.port, 1, 1);
  profiled.process.kill(PROFILER_SIGNAL);
  await runIperf3('127.0.0.1', profiled.port, 1, IPERF_SECONDS);
  profiled.process.kill(PROFILER_SIGNAL);
  for (let i = 0; i < 100 && !newestProfile(profDir); i++) await sleep(50);
  const gp = newestProfile(profDir);
  const keep = process.env.BENCH_PROFILE_KEEP;
  if (gp && keep) {
    await mkdir(keep, { recursive: true });
    await copyFile(gp, join(keep, 'gwsh.cpuprofile'));
  }
  const gwshProfile = gp ? summarizeProfile(gp) : undefined;
  rig.say(`gwsh profile: ${JSON.stringify(gwshProfile, null, 1)}`);
  return gwshProfile;
}

/** Throughput (paths interleaved run by run, CPU per GiB from the single-stream runs), then round trips. */
async function dataPathFigures(paths: ReturnType<typeof dataPaths>, sink: CountingSink, say: (s: string) => void): Promise<DataPathFigures> {
  const bytes = MIB * 2 ** 20;
  const single = new Map<PathName, number[]>();
  const multi = new Map<PathName, number[]>();
  const cpuPerGiB = new Map<PathName, Record<string, number>>();
  for (const p of paths) await throughputOnce(p.sink, sink, 32 * 2 ** 20, 1); // warm-up
  for (let run = 0; run < RUNS; run++) {
    for (const p of paths) {
      const before = cpuSnapshot(p.cpu);
      const rate = await throughputOnce(p.sink, sink, bytes, 1);
      const used = cpuDelta(before, p.cpu);
      const acc = cpuPerGiB.get(p.name) ?? {};
      for (const [k, v] of Object.entries(used)) acc[k] = (acc[k] ?? 0) + v;
      cpuPerGiB.set(p.name, acc);
      single.set(p.name, [...(single.get(p.name) ?? []), rate]);
    }
    say(`single stream run ${run + 1}: ${paths.map((p) => `${p.name} ${single.get(p.name)!.at(-1)!.toFixed(0)}`).join(', ')} MiB/s`);
  }
  const gibMoved = (RUNS * bytes) / 2 ** 30;
  for (const acc of cpuPerGiB.values()) for (const k of Object.keys(acc)) acc[k] = acc[k]! / gibMoved;
  for (let run = 0; run < RUNS; run++) {
    for (const p of paths) multi.set(p.name, [...(multi.get(p.name) ?? []), await throughputOnce(p.sink, sink, bytes, STREAMS)]);
    say(`${STREAMS} streams run ${run + 1}: ${paths.map((p) => `${p.name} ${multi.get(p.name)!.at(-1)!.toFixed(0)}`).join(', ')} MiB/s`);
  }
  const rtt = new Map<PathName, { p50: number; p99: number }>();
  for (const p of paths) {
    rtt.set(p.name, await roundTrips(p.echo, RTTS));
    say(`round trip ${p.name}: p50 ${rtt.get(p.name)!.p50.toFixed(1)} µs, p99 ${rtt.get(p.name)!.p99.toFixed(1)} µs`);
  }
  return { single, multi, cpuPerGiB, rtt };
}

/** Where the gateway's time goes: the Proxy and the agent restarted under the sampler, one stream and 2 000 round trips. */
async function profileDaemons(rig: Rig, ends: Ends, gw: GatewayPath): Promise<{ profiles: { proxy?: ProfileSummary; agent?: ProfileSummary }; profiledRate?: number }> {
  const { dir } = rig;
  const profDir = { proxy: join(dir, 'prof-proxy'), agent: join(dir, 'prof-agent') };
  const preload = join(dir, 'profiler.cjs');
  await writeFile(preload, PROFILER_PRELOAD);
  await stopGateway(rig.agent);
  rig.agent = undefined;
  await stopGateway(rig.proxy);
  const proxy = (rig.proxy = await startGateway(gw.proxyYaml, { dataDir: gw.proxyDataDir, env: profilerEnv(preload, profDir.proxy) }));
  const agent = (rig.agent = (await startAgent(proxy, gw.agentYaml, gw.agentDataDir, ends.squid, profilerEnv(preload, profDir.agent))).agent);
  await throughputOnce(gw.viaGateway('sink'), ends.sink, 32 * 2 ** 20, 1);
  proxy.process.kill(PROFILER_SIGNAL);
  agent.process.kill(PROFILER_SIGNAL);
  await sleep(200);
  const profiledRate = await throughputOnce(gw.viaGateway('sink'), ends.sink, PROFILE_MIB * 2 ** 20, 1);
  await roundTrips(gw.viaGateway('echo'), 2000);
  await stopDaemons(rig);
  const pp = newestProfile(profDir.proxy);
  const ap = newestProfile(profDir.agent);
  const keep = process.env.BENCH_PROFILE_KEEP;
  if (keep) {
    await mkdir(keep, { recursive: true });
    if (pp) await copyFile(pp, join(keep, 'proxy.cpuprofile'));
    if (ap) await copyFile(ap, join(keep, 'agent.cpuprofile'));
  }
  const profiles = { ...(pp ? { proxy: summarizeProfile(pp) } : {}), ...(ap ? { agent: summarizeProfile(ap) } : {}) };
  rig.say(`profiled: ${JSON.stringify(profiles, null, 1)}`);
  return { profiles, profiledRate };
}
/** Memory per idle agent at BENCH_AGENTS agents, and the floor under it: a bare Node.js TLS server with the agent's own host certificate. */
async function idleMemoryPhase(rig: Rig, gw: GatewayPath): Promise<IdleMemory> {
  const mem = await measureIdleMemory(rig.dir, gw.adminEnv, rig.say, rig.track);
  const hostFile = (f: string) => readFile(join(gw.agentDataDir, 'host', f), 'utf8');
  const [hostCert, hostKey, hostCa] = await Promise.all([hostFile('cert.pem'), hostFile('key.pem'), hostFile('host-ca.pem')]);
  mem.floor = await measureTlsFloor({ serverCert: hostCert, serverKey: hostKey, ca: hostCa, clientCert: hostCert, clientKey: hostKey, connections: Math.min(AGENTS, TLS_FLOOR_CONNECTIONS) });
  rig.say(`memory floor: a bare TLS server ${mem.floor.mtlsKiB.toFixed(1)} KiB per connection with a client certificate (${mem.floor.mtlsNoTicketKiB.toFixed(1)} without session tickets), ${mem.floor.tlsKiB.toFixed(1)} without`);
  return mem;
}

/** BENCH_TUNNEL_ONLY=metrics: the gateway's path with metrics off and on (bench/tunnel/metrics.ts), recorded as its own section. */
async function metricsPhase(rig: Rig, ends: Ends, gw: GatewayPath, load0: number): Promise<void> {
  const cost = await measureMetricsCost(rig, ends, gw);
  const text = metricsSection(cost, { before: load0, after: loadavg()[0]! });
  process.stdout.write(`\n${text}\n`);
  if (process.env.BENCH_RECORD !== '0') await recordSection('tunnel-metrics', text);
}

/** The whole bench, phase by phase (BENCH_TUNNEL_ONLY stops after the user path, or runs the idle phase alone). */
async function main(): Promise<void> {
  const began = Date.now();
  const load0 = loadavg()[0]!;
  const dir = await mkdtemp(join(tmpdir(), 'gw-bench-tunnel-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n${SSHD_IP} ${SSHD_NAME}\n`, { mode: 0o644 });
  const require = createRequire(import.meta.url);
  const ssh2Constants = require('ssh2/lib/protocol/constants.js') as { DEFAULT_CIPHER: string[] };
  const cipher = ssh2Constants.DEFAULT_CIPHER[0]!;
  const sshVersion = spawnSync('ssh', ['-V'], { encoding: 'utf8' }).stderr.trim().split(',')[0]!;
  const say = (s: string) => process.stdout.write(`[${((Date.now() - began) / 1000).toFixed(1)} s] ${s}\n`);
  const rig: Rig = { dir, say, gwshProxies: [], servers: [], track: { holders: [] } };
  try {
    if (ONLY === 'idle') {
      // The idle-memory phase alone (BENCH_TUNNEL_ONLY=idle): printed, never recorded.
      const mem = await measureIdleMemory(dir, { HOME: dir }, say, rig.track);
      process.stdout.write(`\n${[...idleMemoryRows(mem), '', idleMemoryText(mem)].join('\n')}\n`);
      return;
    }
    const ends = await startEnds(rig);
    const gw = await startGatewayPath(rig, ends);
    if (ONLY === 'metrics') return await metricsPhase(rig, ends, gw, load0);
    const ssh = await startOpenSshPath(rig, ends, cipher);
    const paths = dataPaths(rig, ends, gw, ssh);
    const { user, gwshProfile } = await userPathPhase(rig, ends, gw, ssh);
    if (ONLY === 'userpath') {
      process.stdout.write(`\n${[...userPathRows(user), '', userPathText(user, gwshProfile)].join('\n')}\n`);
      return;
    }
    const data = await dataPathFigures(paths, ends.sink, say);
    const load1 = loadavg()[0]!;
    await rig.ssh?.stop();
    rig.ssh = undefined;
    // squid logs a CONNECT when it closes: proof that ssh's connection went through it.
    await ends.squid.waitForAccessLog((l) => l.includes(`CONNECT ${SSHD_NAME}:${rig.sshd!.port} 200`), 10_000);
    await rig.sshd!.stop();
    rig.sshd = undefined;
    const prof = PROFILE ? await profileDaemons(rig, ends, gw) : (await stopDaemons(rig), { profiles: {}, profiledRate: undefined });
    const mem = await idleMemoryPhase(rig, gw);
    const text = tunnelSection({
      began, load0, load1, squidHost: ends.squid.host, clientTls: gw.clientTls, sshVersion, cipher, starts: gw.starts, sshStarts: ssh.sshStarts,
      data, user, gwshProfile, mem, profiles: prof.profiles, profiledRate: prof.profiledRate,
    });
    process.stdout.write(`\n${text}\n`);
    if (process.env.BENCH_RECORD !== '0') await recordSection('tunnel', text);
  } finally {
    await cleanup(rig);
  }
}

await main();
